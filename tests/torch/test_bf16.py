"""Positions are computed in float64 whatever the module dtype; only the result is rounded."""

from __future__ import annotations

import torch

import tokenpos.torch as tpt
from tests.tolerances import TOL
from tokenpos.tables.formulas.sinusoidal import sinusoidal_encoding, sinusoidal_table


def test_bf16_sinusoidal_table_is_the_float64_truth_rounded_once() -> None:
    truth = torch.from_numpy(sinusoidal_table(2048, 64))
    bf = tpt.SinusoidalPositionalEncoding(2048, 64, dtype=torch.bfloat16)
    fp = tpt.SinusoidalPositionalEncoding(2048, 64, dtype=torch.float32)
    assert torch.equal(bf(2048), truth.to(torch.bfloat16))
    # bf16 vs fp32: equal up to bf16 rounding of the result
    assert (bf(2048).float() - fp(2048)).abs().max() <= TOL["bf16.positions"]["atol"]
    # a naive bf16 computation of the angles is far off at large positions; ours is not
    naive = torch.sin(torch.arange(2048, dtype=torch.bfloat16)[:, None] * torch.ones(1, dtype=torch.bfloat16))
    assert (naive.float() - truth[:, :1].float()).abs().max() > 0.1


def test_bf16_beyond_table_and_after_to() -> None:
    pos = torch.tensor([3, 5000, 70000])
    bf = tpt.SinusoidalPositionalEncoding(16, 32, layout="half", dtype=torch.bfloat16)
    want = torch.from_numpy(sinusoidal_encoding(pos.numpy(), 32, layout="half")).to(torch.bfloat16)
    assert torch.equal(bf(pos), want)
    moved = tpt.SinusoidalPositionalEncoding(16, 32, layout="half").to(torch.bfloat16)
    assert moved.inv_freq.dtype == torch.float64 and moved.table.dtype == torch.bfloat16
    assert torch.equal(moved(pos), want)
    back = moved.float()
    assert torch.equal(back(pos), torch.from_numpy(sinusoidal_encoding(pos.numpy(), 32, layout="half")).float())


def test_bf16_transformer_embedding_positions() -> None:
    kw = {"positional": "sinusoidal", "scale": True}
    fp = tpt.TransformerEmbedding(100, 32, 64, seed=0, **kw)
    bf = tpt.TransformerEmbedding(100, 32, 64, seed=0, dtype=torch.bfloat16, **kw)
    assert torch.equal(bf.token.weight, fp.token.weight.to(torch.bfloat16))     # same init, rounded
    assert torch.equal(bf.position(64), fp.position(64).to(torch.bfloat16))
    ids = torch.randint(0, 100, (2, 64))
    out_bf, out_fp = bf(ids, start_pos=7), fp(ids, start_pos=7)
    assert out_bf.dtype == torch.bfloat16
    scale = out_fp.abs().max()
    assert (out_bf.float() - out_fp).abs().max() <= 2 * 2.0 ** -8 * scale


def test_bf16_learned_table_is_rounded_fp32_table() -> None:
    fp = tpt.LearnedPositionalEmbedding(32, 8, seed=3)
    bf = tpt.LearnedPositionalEmbedding(32, 8, seed=3, dtype=torch.bfloat16)
    assert torch.equal(bf(32), fp(32).to(torch.bfloat16))
