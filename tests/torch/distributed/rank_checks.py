"""The checks each rank runs (spawned by harness.run_world); every check compares with one-process torch.

Shapes: V vocab, D d_model, B batch, L length, Vl local columns. Every check runs the same collectives
on every rank, so a failed assertion on one rank never leaves the others waiting. The cross-entropy checks
are in ce_checks.py.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from tests.torch.distributed.harness import CheckResults, run_checks
from tokenpos import set_kernels
from tokenpos.tables.errors import StateDictError, TokenIdError
from tokenpos.torch import TokenEmbedding
from tokenpos.torch.distributed import VocabParallelEmbedding

D = 4
SEED = 7


COLLECTIVES = ("all_reduce", "all_gather", "all_gather_into_tensor", "broadcast", "reduce_scatter",
               "reduce_scatter_tensor", "all_to_all", "barrier")


@contextmanager
def count_all_reduce() -> Iterator[list[int]]:
    """Count all-reduces (calls of torch.distributed.all_reduce, which the library looks up at call time);
    any other collective issued meanwhile fails the check."""
    calls = [0]
    real = {name: getattr(dist, name) for name in COLLECTIVES}

    def counting(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        return real["all_reduce"](*args, **kwargs)

    def refused(name: str) -> Callable[..., Any]:
        def fn(*args: Any, **kwargs: Any) -> Any:
            raise AssertionError(f"unexpected collective {name}")
        return fn

    for name in COLLECTIVES:
        setattr(dist, name, counting if name == "all_reduce" else refused(name))
    try:
        yield calls
    finally:
        for name, fn in real.items():
            setattr(dist, name, fn)


def _ids(V: int, shape: tuple[int, ...], padding_idx: int | None = None) -> torch.Tensor:
    g = torch.Generator().manual_seed(V)
    ids = torch.randint(0, V, shape, generator=g)
    ids.view(-1)[:3] = torch.tensor([0, V - 1, V // 2])                     # both ends and the middle
    if padding_idx is not None:
        ids.view(-1)[3] = padding_idx
    return ids


def _pair(V: int, **kw: Any) -> tuple[VocabParallelEmbedding, TokenEmbedding]:
    pad = kw.pop("pad_to_multiple_of", 1)
    return VocabParallelEmbedding(V, D, seed=SEED, pad_to_multiple_of=pad, **kw), TokenEmbedding(V, D, seed=SEED, **kw)


def _rows(emb: VocabParallelEmbedding, full: torch.Tensor) -> torch.Tensor:
    return full[emb.vocab_start: emb.vocab_start + emb.num_real_rows]


def check_init(V: int, **kw: Any) -> None:
    emb, ref = _pair(V, **kw)
    assert torch.equal(_rows(emb, ref.weight), emb.weight[: emb.num_real_rows])
    assert not emb.weight[emb.num_real_rows:].any(), "padding rows must be zero"
    assert torch.equal(emb.full_state_dict()["weight"], ref.weight.detach())


def check_unseeded_init(V: int) -> None:
    torch.manual_seed(1000 + dist.get_rank())                                  # different on every rank
    emb = VocabParallelEmbedding(V, D)
    expected = TokenEmbedding(V, D, generator=torch.Generator().manual_seed(1000))   # rank 0's draw
    assert torch.equal(emb.full_state_dict()["weight"], expected.weight.detach())


def check_forward_and_grad(V: int, **kw: Any) -> None:
    emb, ref = _pair(V, **kw)
    ids = _ids(V, (2, 5), kw.get("padding_idx"))
    with count_all_reduce() as calls:
        out = emb(ids)
    fwd = calls[0]
    expected = ref(ids)
    assert torch.equal(out, expected), (out - expected).abs().max()
    gy = torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
    with count_all_reduce() as calls:
        out.backward(gy)
    assert (fwd, calls[0]) == ((1, 0) if dist.get_world_size() > 1 else (0, 0)), (fwd, calls[0])
    expected.backward(gy)
    assert torch.equal(emb.weight.grad[: emb.num_real_rows], _rows(emb, ref.weight.grad))
    assert not emb.weight.grad[emb.num_real_rows:].any()


def check_no_grad_forward(V: int) -> None:
    emb, ref = _pair(V, scale=True)
    ids = _ids(V, (7,))
    with torch.no_grad():
        assert torch.equal(emb(ids), ref(ids))
    assert torch.equal(emb(ids.tolist()), ref(ids.tolist()))                   # lists too


def check_kernels_off(V: int) -> None:
    set_kernels(False)
    try:
        check_forward_and_grad(V, scale=True)
    finally:
        set_kernels(True)


def check_bf16_forward(V: int) -> None:
    emb, ref = _pair(V, scale=True, dtype=torch.bfloat16)
    ids = _ids(V, (3, 4))
    assert torch.equal(emb(ids), ref(ids))
    assert torch.equal(emb.full_state_dict()["weight"], ref.weight.detach())     # gathered bit for bit


def _raises(exc: type[BaseException], fn: Callable[[], Any]) -> str:
    try:
        fn()
    except exc as e:
        return str(e)
    raise AssertionError(f"expected {exc.__name__}")


def check_bad_ids(V: int) -> None:
    emb, ref = _pair(V)
    for bad in (torch.tensor([[0, V]]), torch.tensor([3, -1]), torch.tensor([V + 10 ** 6])):
        assert _raises(TokenIdError, lambda b=bad: emb(b)) == _raises(TokenIdError, lambda b=bad: ref(b))
    assert _raises(TokenIdError, lambda: emb(torch.tensor([0.0, 1.0]))) == _raises(
        TokenIdError, lambda: ref(torch.tensor([0.0, 1.0])))
    ids = _ids(V, (4,))
    assert torch.equal(emb(ids), ref(ids)), "the group still works after the refused calls"


def check_checkpoint(V: int, ckpt: str, write: bool) -> None:
    path = Path(ckpt)
    emb = VocabParallelEmbedding(V, D, seed=SEED + 1, pad_to_multiple_of=3)
    expected = TokenEmbedding(V, D, seed=SEED + 1).weight.detach()
    if write:
        emb.save(path)
    other = VocabParallelEmbedding(V, D, seed=SEED + 2, pad_to_multiple_of=5)
    other.load(path)
    assert torch.equal(other.full_state_dict()["weight"], expected)
    assert not other.weight[other.num_real_rows:].any()
    one = TokenEmbedding(V, D, seed=0)
    one.load(path)                                                             # a one-process layer reads it
    assert torch.equal(one.weight.detach(), expected)
    before = other.weight.detach().clone()
    msg = _raises(StateDictError, lambda: other.load(path.with_name("missing.safetensors")))
    assert "missing.safetensors" in msg
    rank, world = dist.get_rank(), dist.get_world_size()
    mine = path.with_name(f"rank{rank}.safetensors")                       # rank 0: good, the others: garbage
    mine.write_bytes(path.read_bytes() if rank == 0 or world == 1 else b"not a safetensors file")
    if world > 1:
        msg = _raises(StateDictError, lambda: other.load(mine))             # every rank raises, nobody waits
        assert ("another rank" in msg) if rank == 0 else (str(mine) in msg and "not a readable" in msg), msg
    else:
        mine.write_bytes(b"not a safetensors file")
        assert str(mine) in _raises(StateDictError, lambda: other.load(mine))
    if write:
        _raises(OSError, lambda: emb.save(path.with_name("no-such-dir") / "x.safetensors"))   # rank 0 fails: all raise
    _raises(StateDictError, lambda: other.load_full_state_dict({"weight": torch.zeros(V + 1, D)}))
    assert torch.equal(other.weight.detach(), before), "a failed load leaves the layer unchanged"


def check_random_shapes(V: int) -> None:
    """Ids of random shapes (empty ones too), scale and padding: bit-identical to one process.
    Derandomized, so every rank draws the same examples and issues the same collectives."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    emb, ref = _pair(V, scale=True, padding_idx=V - 1, pad_to_multiple_of=16)

    @settings(max_examples=25, derandomize=True, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(shape=st.lists(st.integers(0, 4), max_size=3), seed=st.integers(0, 2 ** 16),
           dtype=st.sampled_from([torch.int64, torch.int32, torch.int16, torch.uint8]))
    def prop(shape: list[int], seed: int, dtype: torch.dtype) -> None:
        high = min(V, 256) if dtype == torch.uint8 else V
        ids = torch.randint(0, high, tuple(shape), generator=torch.Generator().manual_seed(seed)).to(dtype)
        assert torch.equal(emb(ids), ref(ids))

    prop()


def rank_main(rank: int, world: int, ckpt: str, write_ckpt: bool) -> CheckResults:
    from tests.torch.distributed.ce_checks import (
        _targets,
        _tied_loss,
        check_all_ignored,
        check_bad_targets,
        check_gradcheck,
    )

    torch.manual_seed(0)
    checks: list[tuple[str, Callable[[], None]]] = [
        (f"checkpoint_{'written' if write_ckpt else 'loaded'}", partial(check_checkpoint, 1003, ckpt, write_ckpt)),
    ]
    for V in (1003, 50257):
        checks += [
            (f"init_V{V}", partial(check_init, V)),
            (f"init_xavier_pad_V{V}", partial(check_init, V, init="xavier_uniform", padding_idx=V - 2,
                                              pad_to_multiple_of=64)),
            (f"forward_grad_V{V}", partial(check_forward_and_grad, V)),
            (f"forward_grad_scale_pad_V{V}", partial(check_forward_and_grad, V, scale=True, padding_idx=V // 2 + 1,
                                                     pad_to_multiple_of=128)),
            (f"tied_ce_V{V}", partial(_tied_loss, V, 64, _targets(V, (2, 5)))),
        ]
    checks += [
        ("init_trunc_normal", partial(check_init, 1003, init="trunc_normal")),
        ("unseeded_init", partial(check_unseeded_init, 1003)),
        ("no_grad_forward", partial(check_no_grad_forward, 1003)),
        ("kernels_off", partial(check_kernels_off, 1003)),
        ("bf16_forward", partial(check_bf16_forward, 1003)),
        ("tied_ce_ignore_smoothing", partial(_tied_loss, 1003, 8, _targets(1003, (3, 4), ignored=3),
                                             label_smoothing=0.1)),
        ("tied_ce_sum", partial(_tied_loss, 1003, 1, _targets(1003, (6,), ignored=1), reduction="sum")),
        ("tied_ce_none", partial(_tied_loss, 1003, 1, _targets(1003, (2, 3), ignored=2), reduction="none",
                                 label_smoothing=0.3)),
        ("all_ignored", partial(check_all_ignored, 1003)),
        ("gradcheck_f64", partial(check_gradcheck, 7)),
        ("bad_ids", partial(check_bad_ids, 1003)),
        ("bad_targets", partial(check_bad_targets, 1003)),
        ("random_shapes", partial(check_random_shapes, 1003)),
    ]
    return run_checks(checks)

