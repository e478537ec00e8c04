"""The compiled dropout hash is the tables formula, bit for bit."""

from __future__ import annotations

import numpy as np
import pytest

from tokenpos.kernels import embedding_backward, embedding_forward
from tokenpos.kernels._rng import keep_mask
from tokenpos.tables.formulas.dropout import dropout_keep_mask


@pytest.mark.parametrize("seed", [0, 1, 12345, 2**62 + 17, 2**63 - 2])
@pytest.mark.parametrize("p", [0.0, 0.1, 0.5, 0.9])
@pytest.mark.parametrize("offset", [0, 7, 2**40])
def test_keep_mask_matches_tables(seed: int, p: float, offset: int) -> None:
    got = keep_mask(seed, 4099, p, offset=offset)
    want = dropout_keep_mask(seed, (4099,), p, offset=offset)
    assert np.array_equal(got, want)


@pytest.mark.parametrize("p", [0.1, 0.5])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, "bf16"])
@pytest.mark.parametrize("D", [33, 64, 96])
@pytest.mark.parametrize("offset", [3, 4])
def test_forward_mask_is_tables_mask(p: float, dtype, D: int, offset: int) -> None:
    """With a table of ones and no scale, the output is exactly keep / (1 - p): whole 64-byte lines
    whose first counter is even (one hash per two lanes) or odd (one per lane), and tails."""
    bf16 = dtype == "bf16"
    weight = np.full((5, D), 0x3F80, np.uint16) if bf16 else np.ones((5, D), dtype)   # bf16 bits of 1.0
    ids = np.array([[0, 1, 2, 3], [4, 4, 0, 1], [2, 2, 2, 2]])
    out = embedding_forward(weight, ids, dropout_p=p, seed=99, dropout_offset=offset, bf16=bf16)
    mask = dropout_keep_mask(99, out.shape, p, offset=offset)
    assert np.array_equal(out != 0, mask)
    kept = np.float32(1.0 / (1.0 - p)) if bf16 else dtype(1.0 / (1.0 - p))
    if bf16:
        kept = (np.array([kept]).view(np.uint32) + 0x7FFF + ((np.array([kept]).view(np.uint32) >> 16) & 1)) >> 16
    assert np.all(out[mask] == kept)


@pytest.mark.parametrize("offset", [0, 5])
@pytest.mark.parametrize("D", [1, 33, 64])
def test_backward_mask_is_tables_mask(offset: int, D: int) -> None:
    """The backward recomputes the forward's mask (pairs of counters, an odd first one, a tail)."""
    ids = np.array([[0, 1, 2], [2, 1, 0]])
    g = np.ones((2, 3, D))
    uniq, rows, _ = embedding_backward(g, ids, dropout_p=0.3, seed=11, dropout_offset=offset)
    m = dropout_keep_mask(11, g.shape, 0.3, offset=offset) / 0.7
    want = np.stack([m[ids == u].sum(axis=0) for u in uniq])
    np.testing.assert_allclose(rows, want, rtol=1e-12)


@pytest.mark.parametrize("p", [0.1, 0.5])
def test_keep_rate(p: float) -> None:
    """The keep rate is 1 - p within 5 standard deviations, and seeds give different masks."""
    n = 200_000
    a = keep_mask(7, n, p)
    sd = np.sqrt(p * (1 - p) / n)
    assert abs(a.mean() - (1 - p)) < 5 * sd
    b = keep_mask(8, n, p)
    assert not np.array_equal(a, b)
    # neighbouring elements are not correlated
    c = np.corrcoef(a[:-1].astype(float), a[1:].astype(float))[0, 1]
    assert abs(c) < 5 / np.sqrt(n)


def test_p_zero_keeps_everything() -> None:
    assert keep_mask(3, 1000, 0.0).all()
