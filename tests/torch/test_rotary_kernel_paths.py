"""TRANSITIONAL: RotaryEmbedding's kernel path (``torch/_fused.py``) equals its plain torch path.

The embedding kernel-path tests moved to test_token.py / test_transformer.py / test_ops.py (through
the ``tokenpos::embedding`` op). These RoPE ones stay until ``torch/rotary.py`` calls the
``tokenpos::rope`` ops; then they fold into test_rotary.py and this file goes with ``_fused.py``.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch

import tokenpos
import tokenpos.torch as tpt
from tests.tolerances import TOL
from tokenpos.torch import _fused

KERNELS = ("rope_apply", "rope_apply_backward")


@pytest.fixture
def calls(monkeypatch):
    """Counts of kernel calls made through ``tokenpos.torch._fused``; kernels back on afterwards."""
    counts: Counter[str] = Counter()
    for name in KERNELS:
        fn = getattr(_fused, name)

        def spy(*args, _fn=fn, _name=name, **kwargs):
            counts[_name] += 1
            return _fn(*args, **kwargs)

        monkeypatch.setattr(_fused, name, spy)
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
    assert calls["rope_apply"] >= 2 and calls["rope_apply_backward"] >= 2
    ref = run_rope(False, interleaved, rotary_dim, dtype, POSITIONS[where])
    for name, a, b in zip(("q'", "k'", "dq", "dk", "rotate"), got, ref, strict=True):
        assert a.dtype == b.dtype == dtype and a.shape == b.shape
        close(a, b, dtype, name)


def test_rope_gradient_only_for_inputs_that_need_it(calls):
    rope = tpt.RotaryEmbedding(8)
    q = torch.randn(1, 2, 3, 8, requires_grad=True)
    k = torch.randn(1, 2, 3, 8)
    oq, ok = rope.apply(q, k)
    assert oq.requires_grad and not ok.requires_grad                     # as the plain path
    oq.sum().backward()
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


def test_rope_fallbacks_and_cache_of_kernel_tables(calls):
    rope = tpt.RotaryEmbedding(16, max_seq_len=8)
    for dtype in (torch.bfloat16, torch.float16):
        q = torch.randn(1, 2, 3, 16).to(dtype).requires_grad_()
        oq, ok = rope.apply(q, q.detach())
        oq.float().sum().backward()
        assert oq.dtype == ok.dtype == dtype and q.grad is not None
    q32, k64 = torch.randn(1, 2, 3, 16), torch.randn(1, 2, 3, 16, dtype=torch.float64)
    rope.apply(q32, k64)                                                   # mixed dtypes: plain path
    assert calls["rope_apply"] == 0
    rope.apply(q32, q32)
    first = rope._halves[torch.float32]
    rope.apply(q32, q32, start_pos=2)
    assert rope._halves[torch.float32] is first                           # reused, not rebuilt
    rope.apply(q32, q32, start_pos=20)                                     # grows the cache: cut again
    assert rope.cos_cached.shape[0] >= 23 and rope._halves_of is rope.cos_cached
    assert calls["rope_apply"] == 3
