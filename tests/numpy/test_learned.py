"""numpy.learned: LearnedPositionalEmbedding (alias PositionalEmbedding)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import tokenpos.numpy as tpn
from tests.numpy.gradcheck import check_grads
from tests.numpy.helpers import FAST, dtypes
from tests.tolerances import TOL

P, D = 7, 3


def learned(**kw):
    kw.setdefault("seed", 0)
    kw.setdefault("dtype", np.float64)
    return tpn.LearnedPositionalEmbedding(P, D, **kw)


def test_alias_and_kind():
    assert tpn.PositionalEmbedding is tpn.LearnedPositionalEmbedding
    assert tpn.LearnedPositionalEmbedding.kind == "additive"
    assert learned().weight.shape == (P, D)


def test_forward_seq_len():
    layer = learned()
    np.testing.assert_array_equal(layer(4), layer.weight.data[:4])
    np.testing.assert_array_equal(layer(P), layer.weight.data)
    assert layer(0).shape == (0, D)
    np.testing.assert_array_equal(layer(np.int64(2)), layer.weight.data[:2])
    np.testing.assert_array_equal(layer(3), layer(5)[:3]), "a prefix of positions gives a prefix of rows"


@FAST
@given(pos=hnp.arrays(np.int64, hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=4),
                      elements=st.integers(0, P - 1)), dtype=dtypes)
def test_forward_positions_any_shape(pos, dtype):
    layer = learned(dtype=dtype)
    out = layer(pos)
    assert out.shape == pos.shape + (D,) and out.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(out, layer.weight.data[pos])
    g = np.ones(out.shape, dtype=dtype)
    layer.backward(g)
    counts = np.bincount(pos.reshape(-1), minlength=P).astype(np.float64)
    np.testing.assert_allclose(layer.weight.grad, np.repeat(counts[:, None], D, axis=1),
                               **TOL[f"grad.{np.dtype(dtype).name}"])


def test_positions_beyond_the_table_are_refused():
    layer = learned()
    with pytest.raises(tpn.PositionError, match=rf"seq_len 8 exceeds max_seq_len {P}"):
        layer(8)
    with pytest.raises(ValueError, match=r"position 7 at index \(1, 0\) is out of range \[0, 7\) \(max_seq_len=7\)"):
        layer(np.array([[0, 1], [7, 2]]))
    with pytest.raises(IndexError):
        layer(np.array([-1]))


def test_finite_differences_with_duplicates():
    pos = np.array([[0, 3, 3], [6, 0, 3]])
    grads = check_grads(learned, pos)
    assert not grads["weight"][[1, 2, 4, 5]].any()
    check_grads(learned, 5)


def test_gradient_accumulates():
    layer = learned()
    layer(3)
    layer.backward(np.ones((3, D)))
    layer(np.array([2, 2]))
    layer.backward(np.ones((2, D)))
    np.testing.assert_array_equal(layer.weight.grad[:, 0], [1, 1, 3, 0, 0, 0, 0])


def test_init_and_determinism():
    np.testing.assert_array_equal(learned(seed=1).weight.data, learned(seed=1).weight.data)
    assert not np.array_equal(learned(seed=1).weight.data, learned(seed=2).weight.data)
    w = tpn.LearnedPositionalEmbedding(400, 100, seed=0, init="trunc_normal", std=0.1).weight.data
    assert np.abs(w).max() <= 0.2
    assert tpn.LearnedPositionalEmbedding(4, 2).weight.dtype == np.float32


def test_padding_idx_row_starts_at_zero_and_gets_no_gradient():
    layer = tpn.LearnedPositionalEmbedding(8, 4, padding_idx=1, seed=0)
    assert np.all(layer.weight.data[1] == 0)
    out = layer(np.array([[1, 2, 3, 1], [1, 1, 4, 5]]))
    layer.backward(np.ones_like(out))
    grad = layer.weight.grad
    assert np.all(grad[1] == 0)
    np.testing.assert_array_equal(grad[[2, 3, 4, 5], 0], [1, 1, 1, 1])


def test_roberta_positions_keep_the_padding_position_row_out_of_training():
    emb = tpn.TransformerEmbedding(20, 4, 12, padding_idx=1, position_ids="padding", seed=0)
    assert emb.position.padding_idx == 1
    out = emb(np.array([[0, 5, 9, 1, 1], [1, 1, 0, 7, 2]]))
    emb.backward(np.ones_like(out))
    assert np.all(emb.position.weight.grad[1] == 0)
    assert np.any(emb.position.weight.grad[2] != 0)
    with pytest.raises(ValueError, match="padding_idx"):
        tpn.LearnedPositionalEmbedding(8, 4, padding_idx=8)


def test_refilling_the_positions_buffer_before_backward_cannot_redirect_the_gradient(kernel_mode):
    layer = tpn.LearnedPositionalEmbedding(8, 3, seed=0)
    pos = np.array([0, 1, 2])
    out = layer(pos)
    pos[...] = 7
    layer.backward(np.ones_like(out))
    assert set(np.flatnonzero(layer.weight.grad.any(axis=1))) == {0, 1, 2}


@pytest.mark.parametrize("make", [lambda: tpn.LearnedPositionalEmbedding(8, 3, seed=0),
                                  lambda: tpn.SinusoidalPositionalEncoding(8, 3),
                                  lambda: tpn.TokenEmbedding(8, 3, seed=0)])
def test_an_output_never_aliases_the_layers_table(kernel_mode, make):
    layer = make()
    before = layer(np.arange(8)).copy()
    out = layer(np.arange(8))
    out += 1.0                                                             # in place on the output
    np.testing.assert_array_equal(layer(np.arange(8)), before)
