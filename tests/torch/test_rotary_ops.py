"""RotaryEmbedding through the ``tokenpos::rope`` / ``rope_qk`` ops: the fused-kernel path equals the plain
torch path (forward, gradients, every position kind), gradients only where needed, low-precision and
mixed-dtype fallbacks, one op call per ``apply``."""

from __future__ import annotations

import importlib
from collections import Counter

import numpy as np
import pytest
import torch

import tokenpos
import tokenpos.torch as tpt
from tests.tolerances import TOL

rope_op = importlib.import_module("tokenpos.torch.ops.rope")   # the module (``ops.rope`` is the op)


@pytest.fixture
def calls(monkeypatch):
    """Counts of numba kernel passes (``run_rope`` for arguments in shape, ``rope_apply`` otherwise,
    as the op module calls them) under the key "rope_apply"; kernels back on afterwards."""
    counts: Counter[str] = Counter()
    for name in ("rope_apply", "run_rope"):
        fn = getattr(rope_op, name)

        def spy(*args, _fn=fn, **kwargs):
            counts["rope_apply"] += 1
            return _fn(*args, **kwargs)

        monkeypatch.setattr(rope_op, name, spy)
    yield counts
    tokenpos.set_kernels(True)


def tol(dtype: torch.dtype) -> dict:
    return TOL["kernels.float32"] if dtype == torch.float32 else TOL["kernels.float64"]


def close(a: torch.Tensor, b: torch.Tensor, dtype: torch.dtype, msg: str = "") -> None:
    np.testing.assert_allclose(a.detach().numpy(), b.detach().numpy(), **tol(dtype), err_msg=msg)


# ----------------------------------------------------------------------------------------------
# RotaryEmbedding
# ----------------------------------------------------------------------------------------------

POSITIONS = {
    "default": {},
    "start_pos": {"start_pos": 5},
    "beyond_cache": {"start_pos": 300},                                   # far: the formula, not cached
    "1d": {"positions": torch.tensor([0, 3, 9, 2, 40])},                  # 40: beyond the cache of 16
    "2d": {"positions": torch.tensor([[0, 3, 9, 2, 4], [1, 1, 1, 7, 15]])},
    "key_positions": {"positions": torch.tensor([4, 5, 6, 7, 8]), "key_positions": torch.arange(9)},
}


def run_rope(kernels: bool, interleaved: bool, rotary_dim, dtype, kwargs):
    tokenpos.set_kernels(kernels)
    rope = tpt.RotaryEmbedding(16, max_seq_len=16, interleaved=interleaved, rotary_dim=rotary_dim)
    gen = torch.Generator().manual_seed(0)
    lk = 9 if "key_positions" in kwargs else 5
    q = torch.randn(2, 4, 5, 16, dtype=dtype, generator=gen, requires_grad=True)
    k = torch.randn(2, 2, lk, 16, dtype=dtype, generator=gen, requires_grad=True)         # GQA
    oq, ok = rope.apply(q, k, **kwargs)
    (oq * torch.randn(oq.shape, dtype=dtype, generator=gen)).sum().backward(retain_graph=True)
    (ok * torch.randn(ok.shape, dtype=dtype, generator=gen)).sum().backward()
    x = rope.rotate(q.detach(), kwargs.get("positions"), start_pos=kwargs.get("start_pos", 0))
    return oq, ok, q.grad, k.grad, x


@pytest.mark.parametrize("where", sorted(POSITIONS))
@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("rotary_dim", [None, 6])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_rope_fused_equals_plain(calls, where, interleaved, rotary_dim, dtype):
    got = run_rope(True, interleaved, rotary_dim, dtype, POSITIONS[where])
    assert calls["rope_apply"] >= 2                 # forward and backward (the op with -sin) both fused
    ref = run_rope(False, interleaved, rotary_dim, dtype, POSITIONS[where])
    for name, a, b in zip(("q'", "k'", "dq", "dk", "rotate"), got, ref, strict=True):
        assert a.dtype == b.dtype == dtype and a.shape == b.shape
        close(a, b, dtype, name)


def test_rope_gradient_only_for_inputs_that_need_it(calls):
    rope = tpt.RotaryEmbedding(8)
    q = torch.randn(1, 2, 3, 8, requires_grad=True)
    k = torch.randn(1, 2, 3, 8)
    oq, ok = rope.apply(q, k)
    assert oq.requires_grad        # (a custom op marks every output differentiable; k gets no gradient anyway)
    (oq.sum() + ok.sum()).backward()
    assert q.grad is not None and k.grad is None
    q2, k2 = torch.randn(1, 2, 3, 8), torch.randn(1, 2, 3, 8, requires_grad=True)
    a, b = rope.apply(q2, k2, torch.tensor([3, 1, 2]))
    b.pow(2).sum().backward()                                              # q' unused: no q gradient pass
    tokenpos.set_kernels(False)
    k3 = k2.detach().clone().requires_grad_()
    rope.apply(q2, k3, torch.tensor([3, 1, 2]))[1].pow(2).sum().backward()
    close(k2.grad, k3.grad, torch.float32)
    with torch.no_grad():
        tokenpos.set_kernels(True)
        assert rope.apply(q, k)[0].grad_fn is None


@pytest.mark.slow  # gradcheck (fast: test_rope_fused_equals_plain)
@pytest.mark.parametrize("interleaved", [False, True])
def test_gradcheck_rope_function(interleaved):
    rope = tpt.RotaryEmbedding(8, max_seq_len=8, interleaved=interleaved, rotary_dim=6)
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(2, 2, 3, 8, dtype=torch.float64, generator=gen, requires_grad=True)
    k = torch.randn(2, 1, 3, 8, dtype=torch.float64, generator=gen, requires_grad=True)
    k4 = torch.randn(2, 1, 4, 8, dtype=torch.float64, generator=gen, requires_grad=True)
    pos = torch.tensor([[0, 5, 20], [3, 4, 7]])
    assert torch.autograd.gradcheck(lambda a, b: rope.apply(a, b, pos), (q, k))
    assert torch.autograd.gradcheck(lambda a, b: rope.apply(a, b, start_pos=2, key_positions=torch.arange(4)),
                                    (q, k4))
    assert torch.autograd.gradcheck(lambda a: rope.rotate(a, start_pos=1), (q,))


def test_rope_fallbacks_and_one_op_call_per_apply(calls, monkeypatch):
    rope = tpt.RotaryEmbedding(16, max_seq_len=8)
    for dtype in (torch.bfloat16, torch.float16):
        q = torch.randn(1, 2, 3, 16).to(dtype).requires_grad_()
        oq, ok = rope.apply(q, q.detach())
        oq.float().sum().backward()
        assert oq.dtype == ok.dtype == dtype and q.grad is not None
    assert calls["rope_apply"] == 0                                        # low precision: plain torch in fp32
    q32, k64 = torch.randn(1, 2, 3, 16), torch.randn(1, 2, 3, 16, dtype=torch.float64)
    a, b = rope.apply(q32, k64)                                            # mixed dtypes: one op per tensor
    assert a.dtype == torch.float32 and b.dtype == torch.float64
    ops_called: Counter[str] = Counter()
    for op in ("rope", "rope_qk"):                                         # op names, not scheme names
        fn = getattr(torch.ops.tokenpos, op)
        monkeypatch.setattr(tpt.rotary.ops, "rotate" if op == "rope" else "rotate_qk",
                            lambda *args, _fn=fn, _op=op: ops_called.update([_op]) or _fn(*args))
    rope.apply(q32, q32)
    rope.apply(q32, q32, start_pos=20)                                     # grows the cache
    rope.apply(q32, q32, torch.tensor([[1, 2, 3]]))
    assert ops_called == Counter({"rope_qk": 3}) and rope.cos_cached.shape[0] >= 23


def test_tables_cast_once_follow_the_cache_when_it_grows_moves_or_changes_dtype() -> None:
    """The float32 copy of the float64 cos / sin cache is rebuilt whenever the cache is."""
    rope = tpt.RotaryEmbedding(16, max_seq_len=8)
    gen = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, 2, 4, 16, generator=gen), torch.randn(1, 2, 4, 16, generator=gen)

    def via_positions(start: int) -> tuple[torch.Tensor, torch.Tensor]:      # the formula, no cache
        return rope.apply(q, k, positions=torch.arange(start, start + 4))

    for start in (0, 6, 13, 2):                                            # 6 and 13 grow the cache
        got = rope.apply(q, k, start_pos=start)
        memo = rope._cast_memo
        assert memo is not None and memo[0] is rope.cos_cached and memo[1] == torch.float32
        for a, b in zip(got, via_positions(start), strict=True):
            close(a, b, torch.float32, f"start {start}")
    got64 = rope.apply(q.double(), k.double(), start_pos=3)                # float64: the cache as it is
    for a, b in zip(got64, rope.apply(q.double(), k.double(), positions=torch.arange(3, 7)), strict=True):
        close(a, b, torch.float64, "float64")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32, torch.float64])
@pytest.mark.parametrize("where", ["start_pos", "positions", "key_positions"])
def test_the_op_gets_float32_tables_for_low_precision_and_float32_inputs(monkeypatch, dtype, where):
    """bf16 / fp16 / float32 inputs hand the op float32 cos / sin (float64 angles rounded once; never the
    Triton kernel's float64 branch), float64 inputs float64; every route (cached range, positions, q and
    k at their own positions). Results stay within bf16 / fp16 rounding of the float64 rotation."""
    seen: list[torch.dtype] = []
    for name in ("rotate", "rotate_qk"):
        fn = getattr(tpt.rotary.ops, name)

        def spy(*args, _fn=fn):
            seen.extend(a.dtype for a in args if isinstance(a, torch.Tensor) and a.dim() in (2, 3))
            return _fn(*args)

        monkeypatch.setattr(tpt.rotary.ops, name, spy)
    rope = tpt.RotaryEmbedding(64, max_seq_len=16)
    gen = torch.Generator().manual_seed(0)
    q64 = torch.randn(2, 4, 6, 64, dtype=torch.float64, generator=gen)
    k64 = torch.randn(2, 2, 6, 64, dtype=torch.float64, generator=gen)
    q, k = q64.to(dtype), k64.to(dtype)
    kwargs = {"start_pos": {"start_pos": 3}, "positions": {"positions": torch.tensor([5, 900, 7, 1_000_000, 2, 40])},
              "key_positions": {"key_positions": torch.arange(6) + 9}}[where]
    got = rope.apply(q, k, **kwargs)
    assert seen and set(seen) == {torch.float64 if dtype == torch.float64 else torch.float32}
    ref = rope.apply(q.double(), k.double(), **kwargs)                      # the same inputs rotated in float64
    for a, b in zip(got, ref, strict=True):
        assert a.dtype == dtype
        err = float((a.double() - b).abs().max()) / float(b.abs().max())
        assert err <= {torch.bfloat16: TOL["rope.bf16_far"]["scale"], torch.float16: 2.0 ** -10,
                       torch.float32: TOL["kernels.float32"]["rtol"], torch.float64: 0.0}[dtype]
