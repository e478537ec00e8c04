"""numpy.per_layer: PerLayerEmbedding lookup (..., L, P), HF's scale, out_of_range, row-sparse backward, optimisers."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import tokenpos.numpy as tpn
from tests.numpy.gradcheck import check_grads
from tests.numpy.helpers import FAST, dtypes, id_arrays
from tests.tolerances import TOL
from tokenpos.tables.formulas.per_layer import per_layer_multiplier

V, L, P = 11, 3, 5


def table(**kw):
    kw.setdefault("seed", 0)
    kw.setdefault("dtype", np.float64)
    kw.setdefault("init", "standard_normal")
    return tpn.PerLayerEmbedding(V, L, P, **kw)


def reference(layer, ids):
    """The definition in float64: W[ids] * multiplier, the last axis read as (L, P)."""
    w = layer.weight.data.astype(np.float64)
    return (w[np.asarray(ids)] * layer.multiplier).reshape(*np.shape(ids), L, P)


# -- forward ---------------------------------------------------------------------------------------

@FAST
@given(data=st.data(), dtype=dtypes, scale=st.booleans(), padding_idx=st.sampled_from([None, 0, 7]))
def test_forward_is_the_table_row_read_as_layers(data, dtype, scale, padding_idx):
    layer = table(dtype=dtype, scale=scale, padding_idx=padding_idx)
    ids = data.draw(id_arrays(V, padding_idx=padding_idx))
    out = layer(ids)
    assert out.shape == ids.shape + (L, P) and out.dtype == np.dtype(dtype)
    np.testing.assert_allclose(out, reference(layer, ids), **TOL[f"forward.{np.dtype(dtype).name}"])
    assert not np.shares_memory(out, layer.weight.data)


def test_layer_l_of_a_token_is_columns_l_p_to_l_p_plus_p_of_its_row():
    layer = table()
    out = layer(np.array([[4, 9]]))
    for j, t in enumerate((4, 9)):
        for layer_index in range(L):
            np.testing.assert_array_equal(
                out[0, j, layer_index],
                layer.weight.data[t, layer_index * P:(layer_index + 1) * P] * layer.multiplier)


def test_forward_shapes_and_state_dict():
    layer = table()
    assert layer(np.array(3)).shape == (L, P)
    assert layer([[1, 2]]).shape == (1, 2, L, P)
    assert layer(np.zeros((2, 0), dtype=np.int32)).shape == (2, 0, L, P)
    state = layer.state_dict()
    assert list(state) == ["weight"] and state["weight"].shape == (V, L * P)
    other = table(seed=5)
    other.load_state_dict(state)
    np.testing.assert_array_equal(other(np.array([1, 10])), layer(np.array([1, 10])))


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_the_multiplier_is_hfs_sqrt_rounded_to_float32_then_the_table_dtype(dtype):
    layer = table(dtype=dtype)
    assert layer.multiplier == per_layer_multiplier(P, np.dtype(dtype).name)
    assert layer.multiplier == float(np.float32(np.float32(P ** 0.5)).astype(dtype))
    assert table(dtype=dtype, scale=False).multiplier == 1.0
    ids = np.arange(V)
    got = layer(ids)
    want = (layer.weight.data.astype(np.float32 if dtype == np.float16 else dtype)[ids]
            * np.dtype(np.float32 if dtype == np.float16 else dtype).type(layer.multiplier)).astype(dtype)
    np.testing.assert_array_equal(got, want.reshape(V, L, P))        # one rounded product, as HF's


def test_padding_row_starts_at_zero():
    layer = table(padding_idx=2)
    assert not layer(np.array([2])).any()


# -- ids ---------------------------------------------------------------------------------------------

def test_an_id_out_of_range_raises_by_default_and_keeps_the_state():
    layer = table()
    layer(np.array([1, 2]))
    kept = layer._cache
    for bad, text in (([1, V], rf"token id {V} at index \(1,\) is out of range \[0, {V}\)"),
                      ([[0, -1]], r"token id -1 at index \(0, 1\)"), ([0.0, 1.0], "float64")):
        with pytest.raises(tpn.TokenIdError, match=text):
            layer(np.array(bad))
        assert layer._cache is kept
    layer.backward(np.ones((2, L, P)))                          # the cache of the last good call
    assert list(layer.weight.sparse_grad.indices) == [1, 2]


@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.uint8, np.uint64])
def test_out_of_range_zero_reads_row_zero_for_ids_past_the_table(dtype):
    layer = table(out_of_range="zero")
    raw = np.array([[3, V, V + 4], [200, 0, 10]], dtype=dtype)
    mapped = np.where(raw < V, raw, 0).astype(np.int64)
    np.testing.assert_array_equal(layer(raw), reference(layer, mapped))
    assert layer(raw).shape == raw.shape + (L, P)
    np.testing.assert_array_equal(layer([V + 1, 2]), reference(layer, [0, 2]))


def test_out_of_range_zero_still_refuses_negative_and_non_integer_ids():
    layer = table(out_of_range="zero")
    with pytest.raises(tpn.TokenIdError, match=r"token id -3 at index \(1,\)"):
        layer(np.array([V + 2, -3]))
    with pytest.raises(tpn.TokenIdError, match="float"):
        layer(np.array([1.0]))
    with pytest.raises(tpn.TokenIdError):
        layer(np.array([True]))


def test_bad_constructor_arguments_name_the_argument():
    for kw, text in (({"out_of_range": "clip"}, "out_of_range must be one of 'raise', 'zero'; got 'clip'"),
                     ({"padding_idx": V}, f"padding_idx must be in \\[0, {V}\\)"),
                     ({"init": "orthogonal"}, "init must be one of"),
                     ({"dtype": np.int32}, "dtype must be one of")):
        with pytest.raises(tpn.ConfigError, match=text):
            table(**kw)
    for args, name in (((0, L, P), "vocab_size"), ((V, 0, P), "num_layers"), ((V, L, -1), "dim")):
        with pytest.raises(tpn.ConfigError, match=name):
            tpn.PerLayerEmbedding(*args)


# -- backward ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("kw", [{}, {"padding_idx": 4}, {"scale": False}, {"out_of_range": "zero"},
                                {"out_of_range": "zero", "padding_idx": 0}])
def test_backward_matches_finite_differences(kw):
    ids = np.array([[1, 4, 1], [V + 3, 9, 4]]) if kw.get("out_of_range") else np.array([[1, 4, 1], [0, 9, 4]])
    pad = kw.get("padding_idx")
    check_grads(lambda: table(**kw), ids, no_grad_rows=None if pad is None else {"weight": [pad]})


def test_backward_is_row_sparse_and_refuses_another_shape():
    layer = table(dtype=np.float32, padding_idx=0)
    ids = np.array([[5, 0, 5, 2]])
    layer(ids)
    g = np.random.default_rng(0).standard_normal((1, 4, L, P)).astype(np.float32)
    layer.backward(g)
    sparse = layer.weight.sparse_grad
    assert list(sparse.indices) == [2, 5]                          # the padding row is left out
    want = np.zeros((V, L * P))
    np.add.at(want, ids[0], g[0].reshape(4, L * P).astype(np.float64) * layer.multiplier)
    want[0] = 0
    np.testing.assert_allclose(layer.weight.grad, want, **TOL["grad.float32"])
    with pytest.raises(tpn.ConfigError, match=r"grad_output must have shape \(1, 4, 3, 5\)"):
        layer.backward(np.ones((1, 4, L * P), np.float32))


def test_a_frozen_table_gets_no_gradient():
    layer = table()
    layer.weight.requires_grad = False
    layer(np.array([1]))
    layer.backward(np.ones((1, L, P)))
    assert layer.weight.grad is None and layer.parameters() == []


@pytest.mark.parametrize("opt", ["SGD", "Adam", "AdamW"])
def test_a_lazy_optimiser_steps_only_the_rows_used(opt):
    layer = table(dtype=np.float32, padding_idx=0)
    before = layer.weight.data.copy()
    optimiser = getattr(tpn.optim, opt)(layer.parameters(), lr=0.1, sparse_mode="lazy")
    for ids in (np.array([[3, 7, 0]]), np.array([[7, 9]])):
        optimiser.zero_grad()
        out = layer(ids)
        layer.backward(np.ones_like(out))
        optimiser.step()
    changed = np.flatnonzero(np.any(layer.weight.data != before, axis=1))
    assert list(changed) == [3, 7, 9]                              # row 0 is padding: no gradient, no step


# -- int8 tables (weight_dtype=np.int8) --------------------------------------------------------------

@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_an_int8_table_reads_its_definition_q_times_scale_times_multiplier(dtype):
    layer = table(dtype=dtype, weight_dtype=np.int8, padding_idx=2)
    assert layer.weight.data.dtype == np.int8 and layer.weight_scale.data.dtype == np.dtype(dtype)
    assert list(layer.state_dict()) == ["weight", "weight_scale"] and layer.parameters() == []
    ids = np.array([[1, 2, 10], [4, 4, 0]])
    ct = np.float64 if dtype == np.float64 else np.float32
    q, s = layer.weight.data, layer.weight_scale.data
    want = np.empty((2, 3, L * P), ct)
    for i, j in np.ndindex(2, 3):                            # element by element, no shared code
        for c in range(L * P):
            want[i, j, c] = ct(ct(q[ids[i, j], c]) * ct(s[ids[i, j]])) * ct(layer.multiplier)
    got = layer(ids)
    assert got.dtype == np.dtype(dtype) and got.shape == (2, 3, L, P)
    np.testing.assert_array_equal(got, want.astype(dtype).reshape(2, 3, L, P))
    assert not got[0, 1].any()                                # the padding row quantises to zeros


def test_an_int8_table_is_the_float_table_within_half_a_step_per_row():
    flat = table(dtype=np.float32, padding_idx=0)
    quant = table(dtype=np.float32, padding_idx=0, weight_dtype=np.int8)
    ids = np.arange(V)
    step = quant.weight_scale.data.astype(np.float64)[:, None, None] * quant.multiplier
    err = np.abs(quant(ids).astype(np.float64) - flat(ids).astype(np.float64))
    assert np.all(err <= step / 2 * (1 + 1e-6) + 1e-7)
    assert np.all(np.abs(quant.weight.data).max(axis=1)[1:] == 127)    # each row's largest entry: +-127
    assert quant.weight_scale.data[0] == 0 and not quant.weight.data[0].any()


def test_an_int8_table_loads_its_state_refuses_backward_and_a_bad_weight_dtype():
    layer = table(dtype=np.float32, weight_dtype=np.int8, out_of_range="zero")
    other = table(dtype=np.float32, weight_dtype=np.int8, out_of_range="zero", seed=4)
    other.load_state_dict(layer.state_dict())
    np.testing.assert_array_equal(other([1, V + 2]), layer([1, 0]))
    with pytest.raises(tpn.ConfigError, match="inference only"):
        layer.backward(np.ones((2, L, P), np.float32))
    with pytest.raises(tpn.TokenIdError, match=r"token id -1 at index \(0,\)"):
        layer([-1])
    with pytest.raises(tpn.ConfigError, match="weight_dtype must be None"):
        table(weight_dtype=np.int16)
