"""LearnedPositionalEmbedding: outputs never alias the table; padding row; one op call."""

from __future__ import annotations

import pytest
import torch

import tokenpos
import tokenpos.torch as tpt


@pytest.mark.parametrize("kernels", [True, False])
@pytest.mark.parametrize("arg", [5, torch.tensor([0, 3, 3])])
def test_an_output_never_aliases_the_table(kernels: bool, arg) -> None:
    tokenpos.set_kernels(kernels)
    try:
        layer = tpt.LearnedPositionalEmbedding(8, 4, seed=0)
        before = layer.weight.detach().clone()
        out = layer(arg)
        out += 1                                                   # in place on an autograd output
        with torch.no_grad():
            layer(arg).zero_()
        assert torch.equal(layer.weight, before)
    finally:
        tokenpos.set_kernels(True)


def test_rows_and_padding_gradient() -> None:
    layer = tpt.LearnedPositionalEmbedding(8, 4, padding_idx=1, seed=0)
    assert torch.equal(layer(3), layer.weight[:3])
    layer(torch.tensor([[0, 1, 1, 2]])).sum().backward()
    assert not layer.weight.grad[1].any() and layer.weight.grad[0].eq(1).all()
    with pytest.raises(tpt.PositionError, match="8"):
        layer(torch.tensor([8]))
