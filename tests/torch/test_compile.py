"""torch.compile(fullgraph=True): no graph breaks. The one compile test of the suite (slow on a CPU).

Inductor compiles the full TransformerEmbedding in training mode (dropout with the counter-based
mask, so the int64 hash goes through inductor's codegen); the other layers and modes are traced
whole-graph by dynamo with the eager backend, which is what catches graph breaks, at a fraction of
the cost.
"""

from __future__ import annotations

import pytest
import torch

import tokenpos.torch as tpt
from tests.tolerances import TOL
from tokenpos.tables.dropout import dropout_keep_mask


@pytest.mark.slow
def test_compile_fullgraph() -> None:
    torch._dynamo.reset()
    ids = torch.tensor([[3, 7, 9, 0], [0, 4, 5, 6]])
    tt = torch.tensor([[0, 0, 1, 1], [0, 0, 0, 1]])
    layer = tpt.TransformerEmbedding(50, 8, 16, dropout=0.3, num_token_types=2, norm="layernorm",
                                     padding_idx=0, position_ids="padding", seed=0)
    layer._fixed_dropout_seed = 77
    compiled = torch.compile(layer, fullgraph=True, dynamic=False)
    out = compiled(ids, start_pos=2, token_type_ids=tt)
    ref = layer(ids, start_pos=2, token_type_ids=tt)
    keep = torch.from_numpy(dropout_keep_mask(77, (2, 4, 8), 0.3))
    assert torch.equal(out != 0, keep) and torch.equal(ref != 0, keep)
    scale = TOL["parity.f32"]["scale"]
    assert (out - ref).abs().max() <= scale * ref.abs().max()
    (out * ref.detach()).sum().backward()
    grads = {n: p.grad.clone() for n, p in layer.named_parameters()}
    layer.zero_grad()
    (ref * ref.detach()).sum().backward()
    for n, p in layer.named_parameters():
        assert (grads[n] - p.grad).abs().max() <= scale * p.grad.abs().max(), n

    others = [
        (layer.eval(), (ids,), {"token_type_ids": tt}),
        (tpt.TransformerEmbedding(50, 8, 16, positional="sinusoidal", dropout=0.5, seed=0), (ids,), {}),
        (tpt.TransformerEmbedding(50, 8, 16, norm="rmsnorm", seed=0).eval(), (ids, torch.tensor([1, 3, 5, 7])), {}),
        (tpt.TokenEmbedding(50, 8, scale=True, padding_idx=0, seed=0), (ids,), {}),
        (tpt.LearnedPositionalEmbedding(16, 8, seed=0), (torch.tensor([1, 2, 3]),), {}),
        (tpt.SinusoidalPositionalEncoding(16, 8), (torch.tensor([[1, 30]]),), {}),
        (tpt.LayerNorm(8), (torch.randn(2, 8),), {}),
    ]
    for module, args, kwargs in others:
        got = torch.compile(module, fullgraph=True, backend="eager")(*args, **kwargs)
        if not module.training or not getattr(module, "dropout", 0):
            assert torch.allclose(got, module(*args, **kwargs), rtol=0, atol=1e-6), type(module).__name__
        else:                                                             # fresh in-graph dropout seed
            assert 0 < (got == 0).float().mean() < 1
