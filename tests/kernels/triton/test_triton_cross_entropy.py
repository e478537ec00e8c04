"""Vocab-parallel cross-entropy (stats per shard, combine, fused backward) against torch's cross_entropy."""

from __future__ import annotations

import numpy as np
import pytest
import torch

triton = pytest.importorskip("triton")          # the optional gpu extra

from tests.tolerances import TOL  # noqa: E402
from tokenpos.kernels.triton import (  # noqa: E402
    combine_cross_entropy_stats,
    cross_entropy,
    cross_entropy_backward,
    cross_entropy_stats,
)
from tokenpos.tables.formulas.vocab_parallel import padded_vocab_size, shard_range  # noqa: E402

TOL_CE = TOL["triton.cross_entropy"]


def torch_reference(logits, targets, grad_loss):
    """float64 torch: per-row loss, logsumexp and d(sum(loss * grad_loss))/d logits."""
    x = logits.double().requires_grad_()
    loss = torch.nn.functional.cross_entropy(x, targets, reduction="none", ignore_index=-100)
    loss.backward(grad_loss.double())
    return loss.detach(), torch.logsumexp(logits.double(), -1), x.grad


def close(a, b, **tol) -> None:
    np.testing.assert_allclose(a.detach().cpu().double().numpy(), b.detach().cpu().double().numpy(), **tol)


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_sharded_loss_and_gradient_equal_torch(world_size, device, gen) -> None:
    V = 37
    Vp = padded_vocab_size(V, 4, world_size)                                  # every rank the same shard width
    N = 6
    logits = 3 * torch.randn(N, Vp, generator=gen)
    targets = torch.randint(0, V, (N,), generator=gen)
    targets[2] = -100                                                         # ignored row
    grad_loss = torch.randn(N, generator=gen)
    ref_loss, ref_lse, ref_grad = torch_reference(logits, targets, grad_loss)
    shards = [shard_range(Vp, r, world_size) for r in range(world_size)]
    x, t, g = logits.to(device), targets.to(device), grad_loss.to(device)
    stats = torch.stack([cross_entropy_stats(x[:, a:b], t, a) for a, b in shards])   # (W, N, 3): the all_gather
    loss, lse = combine_cross_entropy_stats(stats, t)
    close(loss, ref_loss, **TOL_CE)
    close(lse, ref_lse, **TOL_CE)
    grad = torch.cat([cross_entropy_backward(x[:, a:b], t, lse, g, a) for a, b in shards], dim=1)
    close(grad, ref_grad, **TOL_CE)
    assert not grad[2].any()                                                  # ignored row: no gradient


def test_wide_shard_extreme_logits_and_in_place(device, gen) -> None:
    # Vs = 1500 spans two column blocks; huge and -inf logits must neither overflow nor give NaN
    logits = torch.randn(4, 1500, generator=gen)
    logits[0, 7] = 1e4
    logits[1, :700] = float("-inf")
    logits[3, 1200:] = -1e4
    targets = torch.tensor([7, 900, 0, 1499])
    grad_loss = torch.ones(4)
    ref_loss, ref_lse, ref_grad = torch_reference(logits, targets, grad_loss)
    x = logits.to(device)
    loss, lse = cross_entropy(x, targets.to(device))
    close(loss, ref_loss, **TOL_CE)
    close(lse, ref_lse, **TOL_CE)
    out = cross_entropy_backward(x, targets.to(device), lse, grad_loss.to(device), inplace=True)
    assert out is x
    close(out, ref_grad, **TOL_CE)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_logits_compute_in_fp32(dtype, device, gen) -> None:
    logits = (4 * torch.randn(5, 50, generator=gen)).to(dtype)
    targets = torch.randint(0, 50, (5,), generator=gen)
    grad_loss = torch.randn(5, generator=gen)
    ref_loss, ref_lse, ref_grad = torch_reference(logits.float(), targets, grad_loss)
    loss, lse = cross_entropy(logits.to(device), targets.to(device))
    assert loss.dtype == torch.float32
    close(loss, ref_loss, **TOL_CE)                                            # fp32 math on the exact inputs
    grad = cross_entropy_backward(logits.to(device), targets.to(device), lse, grad_loss.to(device)).cpu()
    assert grad.dtype == dtype
    err = (grad.double() - ref_grad).abs().max().item()
    assert err <= TOL[f"triton.grad.{str(dtype)[6:]}"]["scale"] * ref_grad.abs().max().item()


def test_bad_shapes_are_refused(device) -> None:
    with pytest.raises(ValueError, match="targets must have shape"):
        cross_entropy_stats(torch.zeros(3, 4, device=device), torch.zeros(2, dtype=torch.int64, device=device))
    with pytest.raises(ValueError, match="logits must be"):
        cross_entropy_stats(torch.zeros(3, device=device), torch.zeros(3, dtype=torch.int64, device=device))
