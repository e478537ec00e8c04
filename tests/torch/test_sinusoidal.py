"""SinusoidalPositionalEncoding: outputs never alias the precomputed table."""

from __future__ import annotations

import torch

import tokenpos.torch as tpt
from tokenpos.tables.sinusoidal import sinusoidal_table


def test_an_output_never_aliases_the_table() -> None:
    layer = tpt.SinusoidalPositionalEncoding(8, 6)
    before = layer.table.clone()
    for arg in (5, torch.tensor([0, 3, 3]), 12):
        out = layer(arg)
        out += 1
        out.zero_()
    assert torch.equal(layer.table, before)
    assert torch.equal(layer(8), torch.from_numpy(sinusoidal_table(8, 6)).float())
