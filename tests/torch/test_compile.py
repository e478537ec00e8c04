"""torch.compile(fullgraph=True): no graph breaks, and the tokenpos ops stay in the graph.

A custom backend records the FX graphs dynamo captures; the fused ``tokenpos::embedding`` op must
appear in them (so the numba kernel runs inside the compiled model), for train and eval, with
gradients, and compiled == eager. One inductor run covers the full block in training mode (the
in-graph dropout seed and the op as an inductor fallback kernel); the other layers are traced
whole-graph with the eager backend, which is what catches graph breaks, at a fraction of the cost.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

import tokenpos.torch as tpt
from tests.tolerances import TOL
from tokenpos.tables.registry import SHORTCUTS

pytestmark = pytest.mark.slow   # torch.compile

IDS = torch.tensor([[3, 7, 9, 0], [0, 4, 5, 6]])


def capture(module: Any) -> tuple[Any, list[torch.fx.GraphModule]]:
    graphs: list[torch.fx.GraphModule] = []

    def backend(gm: torch.fx.GraphModule, example_inputs: Any) -> Any:
        graphs.append(gm)
        return gm.forward

    return torch.compile(module, fullgraph=True, backend=backend, dynamic=False), graphs


def tokenpos_ops(graphs: list[torch.fx.GraphModule]) -> set[str]:
    """The tokenpos ops called in the graphs, as "tokenpos.<name>" (overload suffix dropped)."""
    return {str(n.target).removesuffix(".default") for g in graphs for n in g.graph.nodes
            if n.op == "call_function" and str(n.target).startswith("tokenpos.")}


@pytest.mark.parametrize("train", [True, False])
@pytest.mark.parametrize("positional", SHORTCUTS)
def test_fused_op_stays_in_the_graph(train: bool, positional: str) -> None:
    """Every registered shortcut, whatever rows it adds (a table the op reads, none for the schemes that act in
    attention), keeps the fused op in the graph."""
    torch._dynamo.reset()
    layer = tpt.TransformerEmbedding(50, 8, 16, positional=positional, num_heads=2, dropout=0.3, scale=True,
                                     seed=0).train(train)
    compiled, graphs = capture(layer)
    out = compiled(IDS, start_pos=2)
    assert "tokenpos.embedding" in tokenpos_ops(graphs)
    if train:                                                   # an in-graph seed: compare the mask rate
        assert 0 < (out == 0).float().mean() < 0.7
        out.pow(2).sum().backward()
        assert layer.token.weight.grad is not None and layer.token.weight.grad.abs().sum() > 0
    else:
        assert torch.equal(out, layer(IDS, start_pos=2))
        out.sum().backward()
        grads = {n: None if p.grad is None else p.grad.clone() for n, p in layer.named_parameters()}
        layer.zero_grad()
        layer(IDS, start_pos=2).sum().backward()
        for n, p in layer.named_parameters():          # a bias scheme's weights act in attention: no gradient here
            assert p.grad is None if grads[n] is None else torch.equal(grads[n], p.grad), n


def test_a_bad_id_or_position_in_a_compiled_graph_is_named_with_its_range() -> None:
    """A traced graph cannot read values, so the layer's entry check is left to the kernel, which
    skips the row and raises the eager message (value, index, range) as a KernelBoundError (a
    TokenIdError and a PositionError). The compiled call's dropout seed is drawn before the kernel
    finds the row: unlike an eager call, a refused compiled call in training moves the random stream."""
    torch._dynamo.reset()
    layer = tpt.TransformerEmbedding(10, 8, 16, positional="learned", seed=0).eval()
    compiled, _ = capture(layer)
    compiled(torch.tensor([[1, 2, 3]]))
    with pytest.raises(tpt.TokenIdError, match=r"token id 99 at index \(0, 1\) is out of range \[0, 10\)"):
        compiled(torch.tensor([[1, 99, 3]]))
    with pytest.raises(tpt.PositionError, match=r"position 40 at index \(0, 2\) is out of range \[0, 16\)"):
        compiled(torch.tensor([[1, 2, 3]]), torch.tensor([[0, 1, 40]]))


@pytest.mark.slow
def test_inductor_compiles_the_full_block_in_training() -> None:
    torch._dynamo.reset()
    ids, tt = IDS, torch.tensor([[0, 0, 1, 1], [0, 0, 0, 1]])
    layer = tpt.TransformerEmbedding(50, 8, 16, dropout=0.3, num_token_types=2, norm="layernorm",
                                     padding_idx=0, position_ids="padding", seed=0)
    compiled = torch.compile(layer, fullgraph=True, dynamic=False)
    out = compiled(ids, start_pos=2, token_type_ids=tt)
    ref = layer.eval()(ids, start_pos=2, token_type_ids=tt).detach()
    kept = out != 0
    assert 0 < (~kept).float().mean() < 0.7
    scale = TOL["parity.f32"]["scale"]
    assert ((out - ref / 0.7) * kept).abs().max() <= scale * ref.abs().max() / 0.7
    out.pow(2).sum().backward()
    assert all(p.grad is not None for p in layer.parameters())
    fused = tpt.TransformerEmbedding(50, 8, 16, scale=True, seed=0).eval()
    assert torch.equal(torch.compile(fused, fullgraph=True, dynamic=False)(ids), fused(ids))


def test_other_layers_compile_whole_graph() -> None:
    torch._dynamo.reset()
    others = [
        (tpt.TransformerEmbedding(50, 8, 16, norm="rmsnorm", seed=0).eval(), (IDS, torch.tensor([1, 3, 5, 7]))),
        (tpt.TransformerEmbedding(50, 8, 16, positional="sinusoidal", seed=0).eval(),
         (IDS, torch.tensor([1, 3, 5, 30]))),                          # beyond the table: the formula
        (tpt.TokenEmbedding(50, 8, scale=True, padding_idx=0, seed=0), (IDS,)),
        (tpt.LearnedPositionalEmbedding(16, 8, seed=0), (torch.tensor([1, 2, 3]),)),
        (tpt.SinusoidalPositionalEncoding(16, 8), (torch.tensor([[1, 30]]),)),
        (tpt.LayerNorm(8), (torch.randn(2, 8),)),
    ]
    for module, args in others:
        compiled, graphs = capture(module)
        got = compiled(*args)
        assert torch.allclose(got, module(*args), rtol=0, atol=1e-6), type(module).__name__
