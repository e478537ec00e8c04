"""numpy.sinusoidal: the fixed table as a layer; positions beyond max_seq_len are computed."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import tokenpos.numpy as tpn
from tests.numpy.helpers import FAST, dtypes
from tests.tolerances import TOL
from tokenpos.tables import sinusoidal_encoding, sinusoidal_table


def direct(pos: int, d: int, base: float = 10000.0) -> np.ndarray:
    return np.array([math.sin(pos / base ** ((j - j % 2) / d)) if j % 2 == 0 else
                     math.cos(pos / base ** ((j - j % 2) / d)) for j in range(d)])


@pytest.mark.parametrize("d", [1, 7, 8])
def test_table_rows(d):
    layer = tpn.SinusoidalPositionalEncoding(16, d, dtype=np.float64)
    assert layer.kind == "additive"
    out = layer(5)
    assert out.shape == (5, d)
    for pos in range(5):
        np.testing.assert_allclose(out[pos], direct(pos, d), **TOL["sinusoidal.formula"])
    np.testing.assert_array_equal(out[0], np.tile([0.0, 1.0], d)[:d])


@FAST
@given(pos=hnp.arrays(np.int64, hnp.array_shapes(min_dims=0, max_dims=2, min_side=0, max_side=4),
                      elements=st.integers(0, 40)), dtype=dtypes, layout=st.sampled_from(["interleaved", "half"]),
       d=st.integers(1, 9))
def test_positions_inside_and_beyond_max_seq_len(pos, dtype, layout, d):
    layer = tpn.SinusoidalPositionalEncoding(10, d, layout=layout, dtype=dtype)
    out = layer(pos)
    assert out.shape == pos.shape + (d,) and out.dtype == np.dtype(dtype)
    ref = sinusoidal_encoding(pos, d, layout=layout)
    np.testing.assert_array_equal(out, ref.astype(dtype)), "beyond max_seq_len: computed, same values"


def test_seq_len_beyond_max_is_computed_not_refused():
    layer = tpn.SinusoidalPositionalEncoding(4, 6, dtype=np.float64)
    out = layer(9)
    np.testing.assert_allclose(out, sinusoidal_table(9, 6), **TOL["sinusoidal.formula"])
    np.testing.assert_allclose(layer(np.array([10**6])), [direct(10**6, 6)], rtol=1e-9, atol=1e-9)


def test_no_parameters_and_no_gradient():
    layer = tpn.SinusoidalPositionalEncoding(8, 4, base=500.0, layout="half")
    assert layer.parameters() == [] and layer.state_dict() == {}
    out = layer(3)
    assert layer.backward(np.ones_like(out)) is None
    assert layer.table.shape == (8, 4) and layer.table.dtype == np.float32
    np.testing.assert_allclose(layer.table, sinusoidal_table(8, 4, base=500.0, layout="half"), rtol=1e-6, atol=1e-7)


def test_bad_arguments():
    with pytest.raises(ValueError, match="layout"):
        tpn.SinusoidalPositionalEncoding(8, 4, layout="split")
    with pytest.raises(ValueError, match="d_model must be >= 1, got 0"):
        tpn.SinusoidalPositionalEncoding(8, 0)
    with pytest.raises(tpn.PositionError, match="negative"):
        tpn.SinusoidalPositionalEncoding(8, 4)(np.array([-1]))
