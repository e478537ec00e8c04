"""numpy.norm: LayerNorm and RMSNorm against a float64 reference; backward by finite differences."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import tokenpos.numpy as tpn
from tests.numpy.gradcheck import check_grads
from tests.numpy.helpers import FAST, dtypes
from tests.tolerances import TOL


def layernorm_ref(x, w, b, eps):
    x = x.astype(np.float64)
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + b


def rmsnorm_ref(x, w, eps):
    x = x.astype(np.float64)
    return x / np.sqrt((x**2).mean(-1, keepdims=True) + eps) * w


def with_affine(layer, seed=0):
    rng = np.random.default_rng(seed)
    for p in layer.parameters():
        p.data[...] = rng.standard_normal(p.shape)
    return layer


@FAST
@given(dtype=dtypes, d=st.integers(1, 9), batch=st.lists(st.integers(0, 3), max_size=2), seed=st.integers(0, 99),
       offset=st.sampled_from([0.0, 3.0]))
def test_layernorm_forward(dtype, d, batch, seed, offset):
    layer = with_affine(tpn.LayerNorm(d, eps=1e-5, dtype=dtype), seed)
    x = (np.random.default_rng(seed).standard_normal((*batch, d)) + offset).astype(dtype)
    y = layer(x)
    assert y.shape == x.shape and y.dtype == np.dtype(dtype)
    ref = layernorm_ref(x, layer.weight.data.astype(np.float64), layer.bias.data.astype(np.float64), 1e-5)
    np.testing.assert_allclose(y, ref, **TOL[f"norm.{np.dtype(dtype).name}"])


@FAST
@given(dtype=dtypes, d=st.integers(1, 9), batch=st.lists(st.integers(0, 3), max_size=2), seed=st.integers(0, 99))
def test_rmsnorm_forward(dtype, d, batch, seed):
    layer = with_affine(tpn.RMSNorm(d, dtype=dtype), seed)
    x = np.random.default_rng(seed).standard_normal((*batch, d)).astype(dtype)
    y = layer(x)
    assert y.shape == x.shape and y.dtype == np.dtype(dtype)
    np.testing.assert_allclose(y, rmsnorm_ref(x, layer.weight.data.astype(np.float64), 1e-6),
                               **TOL[f"norm.{np.dtype(dtype).name}"])


def test_defaults():
    ln, rms = tpn.LayerNorm(4), tpn.RMSNorm(4)
    assert ln.eps == 1e-5 and rms.eps == 1e-6
    assert ln.weight.data.tolist() == [1.0] * 4 and ln.bias.data.tolist() == [0.0] * 4
    assert set(ln.state_dict()) == {"weight", "bias"} and set(rms.state_dict()) == {"weight"}
    y = ln(np.array([[1.0, 2.0, 3.0, 4.0]], dtype=np.float32))
    assert abs(float(y.mean())) < 1e-6 and float(y.std()) == pytest.approx(1.0, rel=1e-4)


@pytest.mark.parametrize("shape", [(5,), (2, 5), (2, 3, 5)])
@pytest.mark.parametrize("kind", ["layernorm", "rmsnorm"])
def test_backward_finite_differences(kind, shape):
    x = np.random.default_rng(3).standard_normal(shape) + 0.5
    cls = tpn.LayerNorm if kind == "layernorm" else tpn.RMSNorm
    check_grads(lambda: with_affine(cls(5, dtype=np.float64), 1), x, x_is_float=True, tol="fd.nonlinear")


def test_backward_accumulates_parameter_gradients():
    layer = tpn.LayerNorm(3, dtype=np.float64)
    x = np.array([[1.0, 2.0, 4.0]])
    layer(x)
    layer.backward(np.ones((1, 3)))
    layer.backward(np.ones((1, 3)))
    np.testing.assert_array_equal(layer.bias.grad, [2.0, 2.0, 2.0])


def test_feature_dim_is_checked():
    with pytest.raises(ValueError, match=r"last dimension 4, got shape \(2, 3\)"):
        tpn.LayerNorm(4)(np.ones((2, 3), dtype=np.float32))
    with pytest.raises(ValueError, match="eps"):
        tpn.RMSNorm(4, eps=0.0)


@pytest.mark.parametrize("cls", [tpn.LayerNorm, tpn.RMSNorm])
def test_float16_large_values_do_not_overflow(cls):
    """x * x overflows float16 from |x| = 256 on; the statistics must not (regression)."""
    x = np.array([[-300.0, 300.0, 1000.0, 20.0]], dtype=np.float16)
    layer = cls(4, dtype=np.float16)
    y = layer(x)
    ref = cls(4, dtype=np.float64)(x.astype(np.float64))
    assert y.dtype == np.float16 and np.all(np.isfinite(y))
    np.testing.assert_allclose(y, ref, **TOL["norm.float16"])
    gx = layer.backward(np.ones_like(y))
    assert gx.dtype == np.float16 and np.all(np.isfinite(gx))
    assert layer.weight.grad.dtype == np.float16
