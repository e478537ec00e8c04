"""TokenEmbedding: one validated call of ``tokenpos::embedding``; kernel path == plain path."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import tokenpos
import tokenpos.torch as tpt
from tests.tolerances import TOL

IDS = torch.tensor([[0, 0, 0, 5, 9, 5, 49], [3, 3, 7, 0, 11, 2, 5]])          # padding and duplicates


def close(a: torch.Tensor, b: torch.Tensor, dtype: torch.dtype) -> None:
    tol = TOL["kernels.float32"] if dtype == torch.float32 else TOL["kernels.float64"]
    np.testing.assert_allclose(a.detach().numpy(), b.detach().numpy(), **tol)


@pytest.mark.parametrize("scale", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_kernel_path_equals_plain_path(kernel_calls, scale: bool, dtype: torch.dtype) -> None:
    results = []
    for kernels in (True, False):
        tokenpos.set_kernels(kernels)
        tok = tpt.TokenEmbedding(50, 8, scale=scale, padding_idx=5, dtype=dtype, seed=0)
        out = tok(IDS)
        out.sin().sum().backward()
        results.append((out, tok.weight.grad))
    assert kernel_calls["forward"] == 1 and kernel_calls["backward"] == 1
    (out_k, g_k), (out_r, g_r) = results
    assert torch.equal(out_k, out_r)                                      # same arithmetic, same order
    close(g_k, g_r, dtype)
    assert not g_k[5].any()                                               # padding row: no gradient


def test_scale_is_a_bool_and_multiplier_the_float() -> None:
    tok = tpt.TokenEmbedding(10, 16, scale=True, seed=0)
    assert tok.scale is True and tok.multiplier == 4.0
    assert torch.equal(tok(torch.tensor([3])), tok.weight[3:4].detach() * 4.0)


def test_meta_ids_on_a_cpu_layer_are_a_typed_error() -> None:
    tok = tpt.TokenEmbedding(10, 4, seed=0)
    with pytest.raises(tpt.TokenIdError, match="meta"):
        tok(torch.zeros(2, 3, dtype=torch.int64, device="meta"))
    with pytest.raises(tpt.TokenIdError, match="meta"):
        tpt.TransformerEmbedding(10, 4, 8, seed=0)(torch.zeros(2, 3, dtype=torch.int64, device="meta"))
    meta = tpt.TokenEmbedding(10, 4, device="meta")                     # meta layer: meta in, meta out
    assert meta(torch.zeros(2, 3, dtype=torch.int64, device="meta")).shape == (2, 3, 4)


def test_bf16_kernel_fp16_plain_and_sparse_paths(kernel_calls) -> None:
    for dtype in (torch.bfloat16, torch.float16):
        tok = tpt.TokenEmbedding(50, 8, scale=True, dtype=dtype, seed=0)
        out = tok(IDS)
        out.float().sum().backward()
        ref = (tok.weight.detach().float()[IDS] * tok.multiplier).to(dtype)   # fp32 math, one rounding
        assert out.dtype == dtype and torch.equal(out, ref) and tok.weight.grad is not None
    sparse = tpt.TokenEmbedding(50, 8, sparse=True, seed=0)
    sparse(IDS).sum().backward()
    assert sparse.weight.grad.is_sparse
    assert kernel_calls["forward"] == 1 and kernel_calls["backward"] == 0   # bf16 forward: the CPU kernel


@pytest.mark.parametrize("kernels", [True, False])
def test_double_backward(kernels: bool) -> None:
    tokenpos.set_kernels(kernels)
    try:
        tok = tpt.TokenEmbedding(20, 4, scale=True, dtype=torch.float64, seed=0)
        out = tok(IDS % 20)
        (g,) = torch.autograd.grad(out.pow(3).sum(), tok.weight, create_graph=True)
        (gg,) = torch.autograd.grad(g.pow(2).sum(), tok.weight)
        w = tok.weight.detach().requires_grad_()
        ref = torch.autograd.grad(torch.autograd.grad((w[IDS % 20] * 4 ** 0.5).pow(3).sum(), w,
                                                      create_graph=True)[0].pow(2).sum(), w)[0]
        close(gg, ref, torch.float64)
    finally:
        tokenpos.set_kernels(True)
