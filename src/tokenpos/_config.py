"""Process-wide switches: the only global state in tokenpos (randomness is never global).

- ``set_kernels(enabled)`` / ``kernels_enabled()`` / ``use_kernels(enabled)``: whether the fused
  kernels (numba on CPU, Triton on CUDA) run where they apply, in both backends. Off, every layer and
  op runs its plain NumPy / plain torch path: the same results up to float rounding, the same
  dropout masks bit for bit. Read by the torch ops at run time (so a compiled graph follows it too).
- ``set_device_checks(enabled)`` / ``device_checks_enabled()``: how the torch layers check id /
  position values on non-CPU devices. Off (the default): one device-side assert per checked tensor,
  no host read (a bad value fails loudly at the next sync; never a silent row). On: the values are
  read on the host for the CPU's typed error (one host sync per check). CPU tensors are always
  checked on the host; nothing is read inside ``torch.compile`` or ``torch.func`` transforms.
- ``set_output_cache(max_bytes)`` / ``output_cache_bytes()``: the cache of released output blocks
  (:data:`OUTPUTS`, :mod:`tokenpos._outputs`). The kernels' CPU outputs of 1 MiB and more (the
  embedding forward, RoPE) reuse memory that earlier outputs released, so a fresh
  output does not page-fault. A block is reused only after every array, tensor, view and DLPack
  capsule of the old output is gone (a ``weakref`` callback on its owner; no reference counts are read). At most
  ``max_bytes`` of free blocks are kept, default :data:`DEFAULT_OUTPUT_CACHE` (256 MiB); 0 turns
  it off and frees them. Thread-safe (a lock) and fork-safe (a child starts with empty free lists).

The switches are plain module attributes written under the GIL: set them once at start-up, not
while other threads are calling layers (a call sees either the old or the new value, never a mix
within one op). ``use_kernels`` is the exception: a per-thread override, safe to use from any thread.
One more process-wide choice is made outside this file, once: the numba threading layer, picked
when ``tokenpos.kernels`` is first imported (``tokenpos.kernels._threading``). It is TBB (the
``tbb`` dependency), which is fork-safe and thread-safe, so forked children (``multiprocessing``,
DataLoader workers) and several threads may call the kernels. If TBB cannot be loaded it is
``workqueue`` (fork-safe) with one lock so that tokenpos's parallel launches take turns. A layer the
user chose (``NUMBA_THREADING_LAYER``), or numba threads started before tokenpos was imported, are
kept; with ``omp``, forking after a kernel call is unsafe.

Four memoised lookups live beside the code that uses them; none is a setting, and none changes a
result:

- ``tokenpos.torch.transformer.default_positions``: one int64 ``arange`` per device (its length a
  power of two), the default positions of ``TransformerEmbedding`` being a view of it, so a call
  launches no kernel for them (decode steps included). The ops never write their inputs; written
  through a graph's ``grad_fn.saved_tensors``, it is dropped and rebuilt before the next call reads
  it (its version counter says so). The no-dropout seed (``tokenpos.torch.ops.entry.no_seed``, one
  zero per device) is guarded the same way.
- ``tokenpos.tables.formulas.positions.shared_default_positions``: the NumPy twin, one read-only int64
  ``arange`` per (length, start) (an LRU of 64); NumPy refuses any write to it.
- ``tokenpos._hugepages``: libc's ``madvise``, looked up once. Large CPU torch tables ask for
  transparent huge pages before their first write (advice: only the page size changes).
- ``tokenpos.torch.ops._dispatch``: the Triton kernel module, imported on the first CUDA call.

Nothing else is process-wide: no change of numba's thread count
(``NUMBA_NUM_THREADS`` / ``numba.set_num_threads`` are the user's), no cached tables shared across
layers.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from tokenpos._outputs import OutputCache

_KERNELS_ENABLED = True
_DEVICE_CHECKS = False
DEFAULT_OUTPUT_CACHE = 256 << 20
OUTPUTS = OutputCache(DEFAULT_OUTPUT_CACHE)       # the kernels' reused output blocks


def _check_bool(name: str, enabled: object) -> bool:
    if not isinstance(enabled, bool):
        raise TypeError(f"{name} expects a bool, got {enabled!r}")
    return enabled


def set_kernels(enabled: bool) -> None:
    """Turn the fused kernels on or off for both backends."""
    global _KERNELS_ENABLED
    _KERNELS_ENABLED = _check_bool("set_kernels", enabled)


_LOCAL = threading.local()                       # use_kernels' override, per thread


def kernels_enabled() -> bool:
    """Whether the fused kernels are used where they apply (in this thread: :func:`use_kernels` overrides)."""
    override = getattr(_LOCAL, "kernels", None)
    return _KERNELS_ENABLED if override is None else bool(override)


@contextmanager
def use_kernels(enabled: bool) -> Iterator[None]:
    """``with use_kernels(False): ...`` runs the block on the plain paths, in this thread only: an override of
    :func:`set_kernels`'s process-wide switch that other threads never see and that nests. (A process-wide
    save and restore, as before, let two overlapping blocks in two threads leave the kernels off for good.)
    The autograd backward of a CUDA graph runs on torch's device threads, which keep the process-wide switch."""
    enabled = _check_bool("use_kernels", enabled)
    old = getattr(_LOCAL, "kernels", None)
    _LOCAL.kernels = enabled
    try:
        yield
    finally:
        _LOCAL.kernels = old


def set_device_checks(enabled: bool) -> None:
    """On non-CPU devices, read id / position values on the host for the typed error (one host sync
    per check) instead of the default device-side assert."""
    global _DEVICE_CHECKS
    _DEVICE_CHECKS = _check_bool("set_device_checks", enabled)


def device_checks_enabled() -> bool:
    """Whether non-CPU ids / positions are read on the host for their check (else a device-side assert)."""
    return _DEVICE_CHECKS


def set_output_cache(max_bytes: int) -> None:
    """Keep at most ``max_bytes`` of released output blocks for reuse (0: off, and free them now)."""
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 0:
        raise TypeError(f"set_output_cache expects an int >= 0 (bytes), got {max_bytes!r}")
    OUTPUTS.max_bytes = max_bytes
    if OUTPUTS.free_bytes() > max_bytes:
        OUTPUTS.clear()


def output_cache_bytes() -> int:
    """The most bytes of released output blocks kept for reuse (0: the cache is off)."""
    return OUTPUTS.max_bytes
