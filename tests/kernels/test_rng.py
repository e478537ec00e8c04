"""The compiled dropout hash is the tables formula, bit for bit."""

from __future__ import annotations

import numpy as np
import pytest

from tokenpos.kernels import embedding_forward
from tokenpos.kernels._rng import keep_mask
from tokenpos.tables.dropout import dropout_keep_mask


@pytest.mark.parametrize("seed", [0, 1, 12345, 2**62 + 17, 2**63 - 2])
@pytest.mark.parametrize("p", [0.0, 0.1, 0.5, 0.9])
@pytest.mark.parametrize("offset", [0, 7, 2**40])
def test_keep_mask_matches_tables(seed: int, p: float, offset: int) -> None:
    got = keep_mask(seed, 4099, p, offset=offset)
    want = dropout_keep_mask(seed, (4099,), p, offset=offset)
    assert np.array_equal(got, want)


@pytest.mark.parametrize("p", [0.1, 0.5])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_forward_mask_is_tables_mask(p: float, dtype: type) -> None:
    """With a table of ones and no scale, the output is exactly keep / (1 - p)."""
    weight = np.ones((5, 33), dtype)
    ids = np.array([[0, 1, 2, 3], [4, 4, 0, 1], [2, 2, 2, 2]])
    out = embedding_forward(weight, ids, dropout_p=p, seed=99, dropout_offset=3)
    mask = dropout_keep_mask(99, out.shape, p, offset=3)
    assert np.array_equal(out != 0, mask)
    assert np.all(out[mask] == dtype(1.0 / (1.0 - p)))


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
