"""tables.formulas.sinusoidal: the Vaswani table in both layouts, against the formula and HF Marian."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.tolerances import TOL
from tokenpos.tables import ConfigError, PositionError, sinusoidal_encoding, sinusoidal_inv_freq, sinusoidal_table

FAST = settings(max_examples=40, deadline=None)


def formula_interleaved(num_positions: int, d: int, base: float = 10000.0) -> np.ndarray:
    """PE[pos, 2i] = sin(pos / base**(2i/d)), PE[pos, 2i+1] = cos(pos / base**(2i/d)), element by element."""
    pe = np.zeros((num_positions, d))
    for pos in range(num_positions):
        for j in range(d):
            two_i = j - (j % 2)
            angle = pos / base ** (two_i / d)
            pe[pos, j] = math.sin(angle) if j % 2 == 0 else math.cos(angle)
    return pe


def formula_half(num_positions: int, d: int, base: float = 10000.0) -> np.ndarray:
    """[sin(pos * w_0..w_{F-1}) | cos(pos * w_0..w_{d-F-1})] with F = ceil(d/2)."""
    F = (d + 1) // 2
    pe = np.zeros((num_positions, d))
    for pos in range(num_positions):
        for i in range(F):
            pe[pos, i] = math.sin(pos / base ** (2 * i / d))
        for i in range(d - F):
            pe[pos, F + i] = math.cos(pos / base ** (2 * i / d))
    return pe


@pytest.mark.parametrize("d", [1, 2, 3, 7, 8, 16, 33])
@pytest.mark.parametrize("base", [10000.0, 500.0])
def test_interleaved_matches_formula(d, base):
    got = sinusoidal_table(12, d, base=base)
    assert got.shape == (12, d) and got.dtype == np.float64
    np.testing.assert_allclose(got, formula_interleaved(12, d, base), **TOL["sinusoidal.formula"])


@pytest.mark.parametrize("d", [1, 2, 3, 7, 8, 16, 33])
def test_half_matches_formula(d):
    got = sinusoidal_table(12, d, layout="half")
    np.testing.assert_allclose(got, formula_half(12, d), **TOL["sinusoidal.formula"])


@pytest.mark.parametrize("d", [2, 7, 8, 16, 33])
def test_half_layout_matches_hf_marian(d):
    pytest.importorskip("torch")
    marian = pytest.importorskip("transformers.models.marian.modeling_marian")
    module = marian.MarianSinusoidalPositionalEmbedding(20, d)   # built locally, nothing downloaded
    ref = module.create_weight().double().numpy()
    np.testing.assert_allclose(sinusoidal_table(20, d, layout="half"), ref, **TOL["sinusoidal.marian"])


def test_half_is_a_column_permutation_of_interleaved():
    d = 10
    inter, half = sinusoidal_table(9, d), sinusoidal_table(9, d, layout="half")
    perm = np.r_[np.arange(0, d, 2), np.arange(1, d, 2)]
    np.testing.assert_array_equal(half, inter[:, perm])


@pytest.mark.parametrize("d", [1, 6, 7, 768])
def test_position_zero_is_zero_one_pattern(d):
    row = sinusoidal_table(1, d)[0]
    expected = np.tile([0.0, 1.0], d)[:d]
    np.testing.assert_array_equal(row, expected)
    half = sinusoidal_table(1, d, layout="half")[0]
    np.testing.assert_array_equal(half, np.r_[np.zeros((d + 1) // 2), np.ones(d // 2)])


def test_inv_freq():
    w = sinusoidal_inv_freq(8, base=10000.0)
    np.testing.assert_allclose(w, [1.0, 10000 ** -0.25, 10000 ** -0.5, 10000 ** -0.75], rtol=1e-15)
    assert sinusoidal_inv_freq(7).shape == (4,)
    assert np.all(np.diff(sinusoidal_inv_freq(64)) < 0), "frequencies must decrease with the dimension"


def test_positions_far_beyond_any_table_are_computed():
    pos = np.array([[0, 5], [100_000, 3_000_000]])
    enc = sinusoidal_encoding(pos, 6)
    assert enc.shape == (2, 2, 6)
    np.testing.assert_allclose(enc[1, 1, 0], math.sin(3_000_000.0), rtol=1e-12)
    np.testing.assert_allclose(enc[1, 1, 1], math.cos(3_000_000.0), rtol=1e-12)


@FAST
@given(d=st.integers(1, 24), layout=st.sampled_from(["interleaved", "half"]),
       positions=st.lists(st.integers(0, 5000), min_size=0, max_size=8))
def test_encoding_equals_table_rows(d, layout, positions):
    pos = np.array(positions, dtype=np.int64)
    enc = sinusoidal_encoding(pos, d, layout=layout)
    assert enc.shape == (len(positions), d)
    assert np.all(np.abs(enc) <= 1.0)
    if positions:
        table = sinusoidal_table(max(positions) + 1, d, layout=layout)
        np.testing.assert_array_equal(enc, table[pos])


@FAST
@given(d=st.integers(2, 20), p=st.integers(0, 200), k=st.integers(0, 200))
def test_shift_is_a_rotation_of_each_frequency_pair(d, p, k):
    """[sin, cos](p + k) = R(k w_i) [sin, cos](p): the relative-position property of the paper."""
    w = sinusoidal_inv_freq(d)[: d // 2]
    a, b = sinusoidal_encoding(np.array([p]), d)[0], sinusoidal_encoding(np.array([p + k]), d)[0]
    s, c = a[0 : 2 * len(w) : 2], a[1 : 2 * len(w) : 2]
    rot_s = s * np.cos(k * w) + c * np.sin(k * w)
    rot_c = c * np.cos(k * w) - s * np.sin(k * w)
    np.testing.assert_allclose(b[0 : 2 * len(w) : 2], rot_s, atol=1e-9)
    np.testing.assert_allclose(b[1 : 2 * len(w) : 2], rot_c, atol=1e-9)
    np.testing.assert_allclose(s**2 + c**2, 1.0, atol=1e-12)


def test_bad_arguments():
    with pytest.raises(ConfigError, match="layout"):
        sinusoidal_table(4, 4, layout="concat")
    with pytest.raises(ConfigError, match="d_model must be >= 1, got 0"):
        sinusoidal_table(4, 0)
    with pytest.raises(ConfigError, match="base"):
        sinusoidal_table(4, 4, base=1.0)
    with pytest.raises(PositionError, match="-1"):
        sinusoidal_encoding(np.array([0, -1]), 4)
    with pytest.raises(PositionError, match="float"):
        sinusoidal_encoding(np.array([0.5]), 4)
    assert sinusoidal_table(0, 4).shape == (0, 4)
