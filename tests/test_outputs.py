"""tokenpos._outputs: released output blocks are reused, and never while anything still uses them."""

from __future__ import annotations

import gc
import multiprocessing
import threading

import numpy as np
import pytest
import torch

import tokenpos
from tests.threads import run_threads
from tokenpos._config import OUTPUTS
from tokenpos._outputs import ALIGN, MIN_BYTES, OutputCache
from tokenpos.torch.ops._dispatch import cpu_empty

SHAPE = (64, 8192)                      # 2 MiB of float32: cached by the caches made here (min_bytes 1 MiB)
SMALL = (4, 16)                         # under min_bytes: plain np.empty
BIG = (OUTPUTS.min_bytes // 4,)         # float32 large enough for the process-wide cache
MiB = 1 << 20


def test_a_released_block_is_handed_out_again() -> None:
    cache = OutputCache(64 << 20, MiB)
    a = cache.empty(SHAPE, np.float32)
    assert a.shape == SHAPE and a.dtype == np.float32 and a.flags.c_contiguous and a.flags.writeable
    assert a.ctypes.data % ALIGN == 0
    addr = a.ctypes.data
    del a
    assert cache.free_bytes() == 2 << 20
    b = cache.empty(SHAPE, np.float32)
    assert b.ctypes.data == addr and cache.free_bytes() == 0
    c = cache.empty((2 << 20,), np.uint8)                                  # same bytes, other dtype/shape
    assert c.ctypes.data != addr


def _keep(how: str, a: np.ndarray) -> object:
    """Something that refers to ``a``'s memory without being ``a``."""
    if how == "view":
        return a[3:5]
    if how == "reshape":
        return a.reshape(-1)[::7]
    if how == "torch":
        return torch.from_numpy(a)
    if how == "torch_view_numpy":
        return torch.from_numpy(a)[2].numpy()
    if how == "dlpack":
        return torch.from_dlpack(torch.from_numpy(a))
    return memoryview(a)


@pytest.mark.slow  # gc and reuse, one process each
@pytest.mark.parametrize("keep", ["view", "reshape", "torch", "torch_view_numpy", "dlpack", "memoryview"])
def test_a_block_is_not_reused_while_anything_refers_to_it(keep: str) -> None:
    cache = OutputCache(64 << 20, MiB)
    a = cache.empty(SHAPE, np.float32)
    a[:] = 1.0
    kept = _keep(keep, a)
    addr = a.ctypes.data
    del a
    gc.collect()
    assert cache.free_bytes() == 0
    b = cache.empty(SHAPE, np.float32)
    assert b.ctypes.data != addr
    b[:] = 2.0
    assert np.all(np.asarray(kept) == 1.0)
    del kept, b
    gc.collect()
    assert cache.free_bytes() == 2 * (2 << 20)


def test_small_outputs_and_a_zero_budget_bypass_the_cache() -> None:
    cache = OutputCache(64 << 20, MiB)
    s = cache.empty(SMALL, np.float32)
    assert s.flags.owndata and s.nbytes < MiB
    off = OutputCache(0, MiB)
    big = off.empty(SHAPE, np.float32)
    assert big.flags.owndata
    del big
    assert off.free_bytes() == 0


def test_the_budget_bounds_the_free_blocks() -> None:
    cache = OutputCache(3 << 20, MiB)                                           # room for one 2 MiB block
    a, b = cache.empty(SHAPE, np.float32), cache.empty(SHAPE, np.float32)
    del a, b
    assert cache.free_bytes() == 2 << 20
    cache.clear()
    assert cache.free_bytes() == 0
    huge = cache.empty((4 << 20,), np.uint8)                               # larger than the budget: dropped
    del huge
    assert cache.free_bytes() == 0


def test_the_size_released_longest_ago_makes_room() -> None:
    """Shapes that change over time: new sizes evict old ones instead of being dropped."""
    cache = OutputCache(5 << 20, MiB)
    old = cache.empty(SHAPE, np.float32)                                   # 2 MiB
    del old
    new = cache.empty((3 << 20,), np.uint8)                                # 3 MiB: fits beside it
    del new
    assert cache.free_bytes() == 5 << 20
    newer = cache.empty((4 << 20,), np.uint8)                              # 4 MiB: evicts both older sizes
    del newer
    assert cache.free_bytes() == 4 << 20
    again = cache.empty(SHAPE, np.float32)                                 # no 2 MiB block left: new memory
    assert cache.free_bytes() == 4 << 20 and again.nbytes == 2 << 20
    reuse = cache.empty((4 << 20,), np.uint8)
    assert cache.free_bytes() == 0 and reuse.nbytes == 4 << 20


def test_set_output_cache_validates_and_frees() -> None:
    old = tokenpos.output_cache_bytes()
    try:
        for bad in (-1, 1.5, True, "1"):
            with pytest.raises(TypeError, match="set_output_cache expects an int >= 0"):
                tokenpos.set_output_cache(bad)                             # type: ignore[arg-type]
        assert tokenpos.output_cache_bytes() == old
        a = OUTPUTS.empty(BIG, np.float32)
        del a
        assert OUTPUTS.free_bytes() >= OUTPUTS.min_bytes
        tokenpos.set_output_cache(0)
        assert OUTPUTS.free_bytes() == 0 and tokenpos.output_cache_bytes() == 0
        t, arr = cpu_empty(BIG, torch.float32)                                  # plain np.empty when off
        del t, arr
        assert OUTPUTS.free_bytes() == 0
    finally:
        tokenpos.set_output_cache(old)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_cpu_empty_gives_a_torch_tensor_and_the_array_over_its_memory(dtype: torch.dtype) -> None:
    for shape in (BIG, SHAPE, SMALL):                                   # cached block, np.empty (malloc)
        t, arr = cpu_empty(shape, dtype)
        assert t.shape == shape and t.dtype == dtype and t.is_contiguous() and arr.shape == shape
        assert arr.ctypes.data == t.data_ptr() and arr.itemsize == t.element_size()
        arr[...] = 1 if dtype == torch.bfloat16 else 1.5                      # the kernel writes the tensor
        assert bool((t == (torch.tensor(1, dtype=torch.int16).view(torch.bfloat16) if dtype == torch.bfloat16
                           else 1.5)).all())


def test_threads_get_distinct_live_blocks() -> None:
    cache = OutputCache(256 << 20, MiB)

    def worker(k: int) -> None:
        for i in range(50):
            a = cache.empty(SHAPE, np.float32)
            a.fill(k * 1000 + i)
            b = cache.empty(SHAPE, np.float32)
            b.fill(-1)
            assert np.all(a == k * 1000 + i)                               # b is never a's block
            del a, b

    run_threads(worker)
    assert cache.free_bytes() <= 8 * (2 << 20)


def _send(q, done) -> None:                                                 # pragma: no cover - in the child
    torch.set_num_threads(1)       # as DataLoader workers do: torch's OpenMP pool does not survive a fork
    t, _ = cpu_empty(BIG, torch.float32)
    t.fill_(5.0)
    q.put(t)
    done.wait(30)


@pytest.mark.skipif("fork" not in multiprocessing.get_all_start_methods(), reason="no fork on this platform")
def test_an_output_crosses_a_torch_multiprocessing_queue() -> None:
    """A DataLoader worker's output (a cached block) reaches the parent through shared memory."""
    import torch.multiprocessing as mp

    ctx = mp.get_context("fork")
    q, done = ctx.Queue(), ctx.Event()
    p = ctx.Process(target=_send, args=(q, done))
    p.start()
    try:
        got = q.get(timeout=30)
        assert got.shape == BIG and bool((got == 5.0).all())
    finally:
        done.set()
        p.join(30)
    assert p.exitcode == 0


def test_a_cached_output_cannot_grow_in_place() -> None:
    """The documented difference from torch.empty (as for any torch.from_numpy tensor)."""
    for shape in (BIG, SHAPE):                                               # cached block, np.empty
        t, _ = cpu_empty(shape, torch.float32)
        with pytest.raises(RuntimeError, match="not resizable"):
            t.resize_(2 * t.numel())


def _child(q) -> None:                                                      # pragma: no cover - in the child
    a = OUTPUTS.empty(BIG, np.float32)
    a.fill(3.0)
    del a
    b = OUTPUTS.empty(BIG, np.float32)
    q.put(float(b.shape[0]))


@pytest.mark.skipif("fork" not in multiprocessing.get_all_start_methods(), reason="no fork on this platform")
def test_a_forked_child_starts_with_an_empty_usable_cache() -> None:
    hold = threading.Event()
    release = threading.Event()

    def holder() -> None:                                                   # the lock is held at fork time
        with OUTPUTS._lock:
            hold.set()
            release.wait(5)

    t = threading.Thread(target=holder)
    t.start()
    hold.wait(5)
    try:
        ctx = multiprocessing.get_context("fork")
        q = ctx.Queue()
        p = ctx.Process(target=_child, args=(q,))
        p.start()
        assert q.get(timeout=30) == BIG[0]
        p.join(30)
        assert p.exitcode == 0
    finally:
        release.set()
        t.join()


def test_a_layer_output_beside_torch_allocations_of_its_size_reuses_its_block() -> None:
    """Why outputs from MIN_BYTES up come from the cache and not from ``malloc``: whether glibc hands
    a freed block back depends on what else the process allocated and freed since (torch's own ops,
    between the layers of any model, allocate blocks of the output's size); when it trims its heap,
    the next output faults on every page again (measured in a bench-like run: 485 faults per
    12.5 MB bf16 output). A released cached block comes back whatever else was allocated: same
    address, no faults."""
    import resource

    import tokenpos.torch as tpt

    assert OUTPUTS.caches(MIN_BYTES) and MIN_BYTES <= 1 << 20
    layer = tpt.TransformerEmbedding(64, 768, 512, dtype=torch.bfloat16, seed=0).eval()
    W, P = layer.token.weight.detach(), layer.position.weight.detach()
    ids = torch.randint(0, 64, (16, 512))                                     # 12.6 MB of bf16 output
    with torch.no_grad():
        addr = layer(ids).data_ptr()                                         # released at once
        faults = []
        for _ in range(4):
            y = torch.nn.functional.embedding(ids, W) * 27.7 + P[:512]         # torch's blocks of that size
            del y
            before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            out = layer(ids)
            faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
            assert out.data_ptr() == addr
            del out
    assert max(faults) < 16 * 512 * 768 * 2 // 4096 // 20, faults
