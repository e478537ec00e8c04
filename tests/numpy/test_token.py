"""numpy.token: TokenEmbedding lookup, row-sparse backward, attend, resize, from_pretrained, init."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import tokenpos.numpy as tpn
from tests.numpy.gradcheck import check_grads
from tests.numpy.helpers import FAST, dense_lookup_grad, dtypes, id_arrays
from tests.tolerances import TOL

V, D = 9, 4


def emb(**kw):
    kw.setdefault("seed", 0)
    kw.setdefault("dtype", np.float64)
    kw.setdefault("init", "standard_normal")
    return tpn.TokenEmbedding(V, D, **kw)


# -- forward ---------------------------------------------------------------------------------------

@FAST
@given(data=st.data(), dtype=dtypes, scale=st.booleans(), padding_idx=st.sampled_from([None, 0, 5]))
def test_forward_is_a_row_lookup(data, dtype, scale, padding_idx):
    layer = emb(dtype=dtype, scale=scale, padding_idx=padding_idx)
    ids = data.draw(id_arrays(V, padding_idx=padding_idx))
    out = layer(ids)
    assert out.shape == ids.shape + (D,) and out.dtype == np.dtype(dtype)
    ref = layer.weight.data.astype(np.float64)[ids] * (math.sqrt(D) if scale else 1.0)
    np.testing.assert_allclose(out, ref, **TOL[f"forward.{np.dtype(dtype).name}"])
    assert not np.shares_memory(out, layer.weight.data)


def test_forward_shapes():
    layer = emb()
    assert layer(np.array(3)).shape == (D,)
    assert layer(np.array([3, 1])).shape == (2, D)
    assert layer(np.zeros((2, 3, 5), dtype=np.int32)).shape == (2, 3, 5, D)
    assert layer([[1, 2]]).shape == (1, 2, D)
    assert layer.weight.shape == (V, D) and layer.weight.dtype == np.float64


def test_scale_multiplies_by_sqrt_d_model():
    a, b = emb(scale=False), emb(scale=True)
    ids = np.array([[1, 2, 8]])
    np.testing.assert_allclose(b(ids), a(ids) * math.sqrt(D), rtol=1e-15)
    assert b.multiplier == 2.0 and a.multiplier == 1.0


def test_padding_row_starts_at_zero():
    for init in ("normal", "trunc_normal", "xavier_uniform", "standard_normal"):
        layer = emb(init=init, padding_idx=3)
        assert not layer.weight.data[3].any()
        assert np.all(np.delete(layer.weight.data, 3, axis=0) != 0)


# -- backward --------------------------------------------------------------------------------------

@FAST
@given(data=st.data(), dtype=dtypes, scale=st.booleans(), padding_idx=st.sampled_from([None, 0, 5]))
def test_backward_matches_add_at_reference(data, dtype, scale, padding_idx):
    layer = emb(dtype=dtype, scale=scale, padding_idx=padding_idx)
    ids = data.draw(id_arrays(V, padding_idx=padding_idx))
    out = layer(ids)
    g = np.random.default_rng(0).standard_normal(out.shape).astype(dtype)
    assert layer.backward(g) is None, "ids are not a float input: no input gradient"
    ref = dense_lookup_grad(ids, g, V, multiplier=layer.multiplier, padding_idx=padding_idx)
    sg = layer.weight.sparse_grad
    used = np.unique(ids[ids != padding_idx]) if padding_idx is not None else np.unique(ids)
    assert sg is not None, "a lookup keeps its gradient row-sparse"
    np.testing.assert_array_equal(sg.indices, used)
    assert sg.rows.dtype == np.dtype(dtype)
    np.testing.assert_allclose(sg.rows, ref[used], **TOL[f"grad.{np.dtype(dtype).name}"])
    dense = layer.weight.grad
    assert dense.shape == (V, D) and dense.dtype == np.dtype(dtype)
    np.testing.assert_allclose(dense, ref, **TOL[f"grad.{np.dtype(dtype).name}"])
    if padding_idx is not None:
        assert not dense[padding_idx].any(), "the padding row never receives gradient"


def test_duplicates_and_repeated_backward_accumulate():
    layer = emb()
    ids = np.array([[2, 2, 7], [2, 0, 7]])
    layer(ids)
    g = np.ones((2, 3, D))
    layer.backward(g)
    layer.backward(2 * g)
    assert layer.weight.grad[2].tolist() == [9.0] * D      # 3 uses x (1 + 2)
    assert layer.weight.grad[7].tolist() == [6.0] * D
    assert layer.weight.grad[0].tolist() == [3.0] * D
    assert not layer.weight.grad[[1, 3, 4, 5, 6, 8]].any()
    layer(np.array([1]))
    layer.backward(np.ones((1, D)))
    assert layer.weight.grad[1].tolist() == [1.0] * D and layer.weight.grad[2].tolist() == [9.0] * D
    layer.zero_grad()
    assert layer.weight.grad is None


def test_backward_checks_the_gradient_shape():
    layer = emb()
    layer(np.array([[1, 2]]))
    with pytest.raises(ValueError, match=r"grad_output must have shape \(1, 2, 4\), got \(2, 4\)"):
        layer.backward(np.ones((2, D)))


@pytest.mark.parametrize("scale", [False, True])
@pytest.mark.parametrize("padding_idx", [None, 2])
def test_lookup_finite_differences(scale, padding_idx):
    ids = np.array([[2, 5, 2], [8, 0, 5]])
    grads = check_grads(lambda: emb(scale=scale, padding_idx=padding_idx), ids,
                        no_grad_rows={"weight": padding_idx} if padding_idx is not None else None)
    unused = [1, 3, 4, 6, 7]
    assert not grads["weight"][unused].any(), "rows that were not looked up get no gradient"


def test_empty_batch():
    layer = emb(padding_idx=0)
    for shape in [(0,), (0, 3), (2, 0)]:
        ids = np.zeros(shape, dtype=np.int64)
        out = layer(ids)
        assert out.shape == shape + (D,)
        layer.backward(np.zeros(out.shape))
    assert not layer.weight.grad.any()


# -- attend (tied output projection) ---------------------------------------------------------------

def test_attend_is_h_times_weight_transposed():
    layer = emb()
    h = np.random.default_rng(1).standard_normal((2, 3, D))
    logits = layer.attend(h)
    assert logits.shape == (2, 3, V)
    np.testing.assert_allclose(logits, h @ layer.weight.data.T, rtol=1e-12)
    np.testing.assert_allclose(logits[1, 2, 4], h[1, 2] @ layer.weight.data[4], rtol=1e-12)


@pytest.mark.parametrize("shape", [(D,), (3, D), (2, 3, D)])
def test_attend_finite_differences(shape):
    h = np.random.default_rng(2).standard_normal(shape)
    grads = check_grads(lambda: emb(padding_idx=1), h, run=lambda layer, x: layer.attend(x),
                        backward=lambda layer, g: layer.attend_backward(g), x_is_float=True)
    assert grads["weight"][1].any(), "the tied projection is dense: the padding row gets gradient too"


def test_attend_checks_shapes():
    layer = emb()
    with pytest.raises(ValueError, match="last dimension 4"):
        layer.attend(np.ones((2, 5)))
    layer.attend(np.ones((2, D)))
    with pytest.raises(ValueError, match=r"grad_logits must have shape \(2, 9\)"):
        layer.attend_backward(np.ones((2, D)))


def test_lookup_and_attend_gradients_add_up():
    layer = emb()
    ids = np.array([1, 4])
    h = layer(ids)
    logits = layer.attend(h)
    gl = np.ones_like(logits)
    gh = layer.attend_backward(gl)
    layer.backward(gh)
    expected = gl.T @ h
    np.add.at(expected, ids, gh)
    np.testing.assert_allclose(layer.weight.grad, expected, rtol=1e-12)


# -- init ------------------------------------------------------------------------------------------

def test_init_schemes_through_the_layer():
    big = dict(seed=0, dtype=np.float64)
    w = tpn.TokenEmbedding(300, 200, init="normal", std=0.05, **big).weight.data
    assert w.std() == pytest.approx(0.05, rel=0.03)
    w = tpn.TokenEmbedding(300, 200, init="trunc_normal", std=0.05, **big).weight.data
    assert np.abs(w).max() <= 0.1
    w = tpn.TokenEmbedding(300, 200, init="xavier_uniform", **big).weight.data
    assert np.abs(w).max() <= math.sqrt(6 / 500) and np.abs(w).max() > 0.99 * math.sqrt(6 / 500)
    w = tpn.TokenEmbedding(300, 200, init="standard_normal", **big).weight.data
    assert w.std() == pytest.approx(1.0, rel=0.03)
    w = tpn.TokenEmbedding(300, 200, **big).weight.data
    assert w.std() == pytest.approx(0.02, rel=0.03), "the default init is N(0, 0.02)"
    assert tpn.TokenEmbedding(3, 2).weight.dtype == np.float32, "the default dtype is float32"


def test_seeded_determinism():
    a, b = tpn.TokenEmbedding(20, 6, seed=3), tpn.TokenEmbedding(20, 6, seed=3)
    np.testing.assert_array_equal(a.weight.data, b.weight.data)
    c = tpn.TokenEmbedding(20, 6, rng=np.random.default_rng(3))
    np.testing.assert_array_equal(a.weight.data, c.weight.data)
    assert not np.array_equal(a.weight.data, tpn.TokenEmbedding(20, 6, seed=4).weight.data)
    a.reset_parameters(seed=9)
    b.reset_parameters(seed=9)
    np.testing.assert_array_equal(a.weight.data, b.weight.data)
    assert not np.array_equal(a.weight.data, c.weight.data)


# -- resize ----------------------------------------------------------------------------------------

def test_resize_grows_with_mean_rows():
    layer = emb(padding_idx=0)
    old = layer.weight.data.copy()
    layer(np.array([1]))
    layer.backward(np.ones((1, D)))
    assert layer.resize(12) is layer
    assert layer.vocab_size == 12 and layer.weight.shape == (12, D)
    np.testing.assert_array_equal(layer.weight.data[:V], old)
    np.testing.assert_allclose(layer.weight.data[V:], np.broadcast_to(old.mean(axis=0), (3, D)), rtol=1e-12)
    assert not layer.weight.data[0].any(), "the padding row stays zero"
    assert layer.weight.grad is None, "resize clears gradients"
    assert layer(np.array([11])).shape == (1, D)
    with pytest.raises(RuntimeError):   # the old cache is gone
        tpn.TokenEmbedding(3, 2, seed=0).resize(4).backward(np.ones((1, 2)))


def test_resize_pad_to_multiple_of_and_schemes():
    layer = emb()
    layer.resize(10, pad_to_multiple_of=8)
    assert layer.vocab_size == 16
    layer.resize(16, pad_to_multiple_of=8)
    assert layer.vocab_size == 16
    a, b = emb(), emb()
    a.resize(20, init="normal", seed=1)
    b.resize(20, init="normal", seed=1)
    np.testing.assert_array_equal(a.weight.data, b.weight.data)
    assert np.abs(a.weight.data[V:]).max() < 0.2 and a.weight.data[V:].std() > 0
    z = emb().resize(11, init="zeros")
    assert not z.weight.data[V:].any()


def test_resize_refuses_to_shrink_unless_allowed():
    layer = emb(padding_idx=4)
    old = layer.weight.data.copy()
    with pytest.raises(ValueError, match="shrink vocab_size from 9 to 5; pass allow_shrink=True"):
        layer.resize(5)
    assert layer.vocab_size == V
    np.testing.assert_array_equal(layer.weight.data, old)
    layer.resize(5, allow_shrink=True)
    assert layer.vocab_size == 5
    np.testing.assert_array_equal(layer.weight.data, old[:5])
    with pytest.raises(tpn.TokenIdError, match=r"\[0, 5\)"):
        layer(np.array([5]))
    with pytest.raises(ValueError, match="padding_idx 4 would fall outside the new vocab"):
        layer.resize(3, allow_shrink=True)
    assert layer.vocab_size == 5
    with pytest.raises(ValueError, match="new_vocab_size must be >= 1, got 0"):
        layer.resize(0, allow_shrink=True)
    with pytest.raises(ValueError, match="init must be one of"):
        layer.resize(8, init="bogus")
    assert layer.weight.shape == (5, D)


# -- from_pretrained -------------------------------------------------------------------------------

def test_from_pretrained_copies_and_freezes():
    w = np.random.default_rng(0).standard_normal((6, 3))
    layer = tpn.TokenEmbedding.from_pretrained(w)
    np.testing.assert_array_equal(layer.weight.data, w)
    w[0] = 100.0
    assert layer.weight.data[0, 0] != 100.0, "the weights are copied"
    assert layer.weight.dtype == np.float64 and layer.vocab_size == 6 and layer.d_model == 3
    assert layer.parameters() == [] and not layer.weight.requires_grad
    layer(np.array([1, 2]))
    layer.backward(np.ones((2, 3)))
    assert layer.weight.grad is None, "a frozen table gets no gradient"
    assert set(layer.state_dict()) == {"weight"}


def test_from_pretrained_trainable_padding_scale():
    w = np.arange(12, dtype=np.float32).reshape(4, 3)
    layer = tpn.TokenEmbedding.from_pretrained(w, freeze=False, padding_idx=1, scale=True)
    assert layer.parameters() == [layer.weight]
    np.testing.assert_array_equal(layer.weight.data, w), "pretrained rows are kept as given"
    np.testing.assert_allclose(layer(np.array([2])), w[[2]] * math.sqrt(3), rtol=1e-6)
    layer.backward(np.ones((1, 3)))
    np.testing.assert_allclose(layer.weight.grad[2], [math.sqrt(3)] * 3, rtol=1e-6)
    assert not layer.weight.grad[1].any()
    with pytest.raises(ValueError, match="2-D"):
        tpn.TokenEmbedding.from_pretrained(np.ones(3))


def test_from_pretrained_torch_tensor():
    torch = pytest.importorskip("torch")
    t = torch.randn(5, 2)
    layer = tpn.TokenEmbedding.from_pretrained(t)
    np.testing.assert_array_equal(layer.weight.data, t.numpy())


# -- float16 scaling rounds once; kept ids are copies ---------------------------------------------

def test_float16_scale_is_not_rounded_to_float16_before_the_multiply(kernel_mode):
    """d=3072: sqrt(d) rounded to float16 first makes ~31 % of outputs 1 ulp off; we round once."""
    d = 3072
    layer = tpn.TokenEmbedding(64, d, scale=True, dtype=np.float16, seed=0)
    ids = np.arange(64)
    exact = layer.weight.data.astype(np.float64) * math.sqrt(d)              # float64, rounded once below
    np.testing.assert_array_equal(layer(ids), exact.astype(np.float16))
    g = np.random.default_rng(1).standard_normal((64, d)).astype(np.float16)
    layer.backward(g)                                                        # unique ids: no sums
    np.testing.assert_array_equal(layer.weight.grad, (g.astype(np.float64) * math.sqrt(d)).astype(np.float16))


def test_refilling_the_ids_buffer_before_backward_cannot_redirect_the_gradient(kernel_mode):
    layer = tpn.TokenEmbedding(10, 3, seed=0)
    batch = np.array([[1, 2], [3, 4]])
    out = layer(batch)
    batch[...] = 9                                                           # the next batch, loaded early
    layer.backward(np.ones_like(out))
    assert set(np.flatnonzero(layer.weight.grad.any(axis=1))) == {1, 2, 3, 4}



def test_refilling_h_before_attend_backward_cannot_change_the_weight_gradient():
    layer = tpn.TokenEmbedding(5, 3, dtype=np.float64, seed=0)
    h = np.random.default_rng(0).standard_normal((2, 3))
    expected = np.ones((5, 2)) @ h                                         # dW = g.T @ h
    layer.attend(h)
    h[...] = 0.0
    layer.attend_backward(np.ones((2, 5)))
    np.testing.assert_allclose(layer.weight.grad, expected, **TOL["grad.float64"])
