"""SinusoidalPositionalEncoding: outputs never alias the precomputed table."""

from __future__ import annotations

import torch

import tokenpos.torch as tpt
from tokenpos.tables.formulas.sinusoidal import sinusoidal_table


def test_an_output_never_aliases_the_table() -> None:
    layer = tpt.SinusoidalPositionalEncoding(8, 6)
    before = layer.table.clone()
    for arg in (5, torch.tensor([0, 3, 3]), 12):
        out = layer(arg)
        out += 1
        out.zero_()
    assert torch.equal(layer.table, before)
    assert torch.equal(layer(8), torch.from_numpy(sinusoidal_table(8, 6)).float())


def test_positions_under_vmap_give_the_same_bits_as_the_table():
    """Under torch.func the positions cannot be read, so the layer computes its formula instead of
    indexing the table; the two must agree to the bit (odd and even D, both layouts)."""
    for D, layout in ((8, "interleaved"), (7, "interleaved"), (768, "interleaved"), (64, "half")):
        enc = tpt.SinusoidalPositionalEncoding(512, D, layout=layout)
        pos = torch.arange(512).reshape(4, 128)
        assert torch.equal(torch.func.vmap(enc)(pos), enc(pos))
