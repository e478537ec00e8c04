"""tables.formulas.dropout: the counter-based keep mask, against a pure-Python statement of the formula."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenpos.tables import dropout_keep_mask
from tokenpos.tables.formulas.dropout import SEED_MASK, draw_seed

FAST = settings(max_examples=40, deadline=None)
M64 = (1 << 64) - 1
GOLDEN, MIX1, MIX2 = 0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB


def _mix(z: int) -> int:
    z = ((z ^ (z >> 30)) * MIX1) & M64
    z = ((z ^ (z >> 27)) * MIX2) & M64
    return z ^ (z >> 31)


def keep_python(seed: int, i: int, p: float) -> bool:
    """The documented formula with Python integers: keep iff uniform24(word i % 2 of hash(seed, i // 2)) >= p."""
    key = _mix(((seed & SEED_MASK) + GOLDEN) & M64)
    z = _mix(key ^ (((i // 2) * GOLDEN) & M64))
    word = (z >> (32 * (i % 2))) & 0xFFFFFFFF
    return (word >> 8) / 2**24 >= p


@pytest.mark.parametrize("seed", [0, 1, 12345, SEED_MASK - 1])
@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
@pytest.mark.parametrize("offset", [0, 1000, 1001])
def test_matches_the_formula(seed, p, offset):
    mask = dropout_keep_mask(seed, (65,), p, offset=offset)
    expected = [keep_python(seed, offset + i, p) for i in range(65)]
    np.testing.assert_array_equal(mask, expected)


@pytest.mark.parametrize("p", [0.1, 0.5])
@pytest.mark.parametrize("odd", [0, 1])
def test_the_two_counters_of_one_hash_are_independent(p, odd):
    """Counters 2j and 2j + 1 share one hash (its two words): both are dropped at rate p**2, and
    a pair's two decisions are uncorrelated, as are the neighbours across pairs (odd = 1)."""
    n = 400_000
    m = dropout_keep_mask(9, (n + 1,), p)[odd:odd + n].reshape(-1, 2)
    both = (~m[:, 0] & ~m[:, 1]).mean()
    assert abs(both - p * p) < 5 * np.sqrt(p * p * (1 - p * p) / (n // 2))
    corr = np.corrcoef(m[:, 0], m[:, 1])[0, 1]
    assert abs(corr) < 5 / np.sqrt(n // 2)


@pytest.mark.parametrize("p", [0.1, 0.3, 0.5, 0.9])
def test_keep_rate(p):
    n = 200_000
    rate = dropout_keep_mask(42, (n,), p).mean()
    sigma = np.sqrt(p * (1 - p) / n)
    assert abs(rate - (1 - p)) < 5 * sigma


def test_p_zero_keeps_everything():
    assert dropout_keep_mask(3, (7, 9), 0.0).all()


def test_deterministic_and_seed_dependent():
    a = dropout_keep_mask(5, (50, 40), 0.5)
    np.testing.assert_array_equal(a, dropout_keep_mask(5, (50, 40), 0.5))
    assert not np.array_equal(a, dropout_keep_mask(6, (50, 40), 0.5))
    assert a.dtype == np.bool_ and a.shape == (50, 40)


@FAST
@given(seed=st.integers(0, SEED_MASK), n=st.integers(0, 300), k=st.integers(0, 10**12),
       p=st.floats(0.0, 0.99))
def test_offset_consistency(seed, n, k, p):
    """Element i of a mask at offset k is element k + i of the mask from 0: a block can be computed alone."""
    whole = dropout_keep_mask(seed, (n + 5,), p, offset=k)
    np.testing.assert_array_equal(dropout_keep_mask(seed, (n,), p, offset=k + 5), whole[5:])


@FAST
@given(seed=st.integers(0, SEED_MASK), a=st.integers(0, 6), b=st.integers(0, 6), c=st.integers(1, 5))
def test_depends_only_on_the_flat_index(seed, a, b, c):
    m = dropout_keep_mask(seed, (a, b, c), 0.4)
    np.testing.assert_array_equal(m.reshape(-1), dropout_keep_mask(seed, (a * b * c,), 0.4))


@FAST
@given(seed=st.integers(0, SEED_MASK), p1=st.floats(0.0, 0.99), p2=st.floats(0.0, 0.99))
def test_monotone_in_p(seed, p1, p2):
    lo, hi = sorted((p1, p2))
    assert np.all(dropout_keep_mask(seed, (200,), hi) <= dropout_keep_mask(seed, (200,), lo))


def test_draw_seed():
    seeds = [draw_seed(np.random.default_rng(0)) for _ in range(2)]
    assert seeds[0] == seeds[1]
    g = np.random.default_rng(1)
    drawn = [draw_seed(g) for _ in range(100)]
    assert all(0 <= s < SEED_MASK for s in drawn)
    assert len(set(drawn)) == 100


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_dropout_is_a_multiply_so_nan_and_inf_propagate(dtype):
    """x * m: a NaN row stays NaN in kept and dropped elements; Inf * 0 is NaN; finite rows are x/(1-p) or 0."""
    from tokenpos.tables.formulas.dropout import apply_dropout, dropout_multiplier

    x = np.ones((3, 256), dtype)
    x[0] = np.nan
    x[1] = np.inf
    y = apply_dropout(x, seed=5, p=0.5)
    keep = dropout_keep_mask(5, x.shape, 0.5)
    assert y.dtype == x.dtype
    assert np.isnan(y[0]).all()
    assert np.isinf(y[1][keep[1]]).all() and np.isnan(y[1][~keep[1]]).all()
    assert np.array_equal(y[2], np.where(keep[2], dtype(2.0), dtype(0.0)))
    m = dropout_multiplier(5, x.shape, 0.5)
    assert m.dtype == np.float32 and np.array_equal(m != 0, keep)


def test_float16_dropout_rounds_once_from_float32():
    from tokenpos.tables.formulas.dropout import apply_dropout

    x = np.random.default_rng(0).standard_normal(4096).astype(np.float16)
    p = 0.1
    y = apply_dropout(x, seed=3, p=p)
    keep = dropout_keep_mask(3, x.shape, p)
    want = (x.astype(np.float32) * np.where(keep, np.float32(1 / (1 - p)), np.float32(0))).astype(np.float16)
    assert np.array_equal(y.view(np.uint16), want.view(np.uint16))


def test_every_implementation_propagates_nan_with_bit_identical_masks():
    """tables (NumPy), torch, the numba kernel and its reference: same mask, NaN everywhere in a NaN row."""
    torch = pytest.importorskip("torch")
    from tokenpos.kernels import embedding_forward
    from tokenpos.kernels.reference import embedding_forward_ref
    from tokenpos.tables.formulas.dropout import apply_dropout
    from tokenpos.torch._dropout import dropout_keep_mask_torch, dropout_torch

    seed, p, shape = 11, 0.3, (2, 3, 40)
    keep = dropout_keep_mask(seed, shape, p)
    assert np.array_equal(dropout_keep_mask_torch(seed, shape, p).numpy(), keep)
    w = np.ones((4, 40), np.float32)
    w[1] = np.nan
    ids = np.array([[1, 0, 2], [3, 1, 0]])
    x = w[ids]
    outs = {
        "tables": apply_dropout(x, seed, p),
        "torch": dropout_torch(torch.from_numpy(x), p, seed).numpy(),
        "kernel": embedding_forward(w, ids, dropout_p=p, seed=seed),
        "reference": embedding_forward_ref(w, ids, dropout_p=p, seed=seed),
    }
    for name, y in outs.items():
        nan_rows = ids == 1
        assert np.isnan(y[nan_rows]).all(), name
        assert np.array_equal(y[~nan_rows] != 0, keep[~nan_rows]), name
        assert np.array_equal(y[~nan_rows], outs["tables"][~nan_rows]), name
    xt = torch.from_numpy(x.copy()).requires_grad_()
    dropout_torch(xt, p, seed).backward(torch.full(shape, float("nan")))
    assert torch.isnan(xt.grad).all()                       # backward is grad * m too
