"""tokenpos.numpy.T5RelativePositionBias: forward, backward (finite differences), init, state."""

from __future__ import annotations

import numpy as np
import pytest

from tests.numpy.gradcheck import check_grads
from tokenpos.numpy.t5_bias import T5RelativePositionBias
from tokenpos.tables import ConfigError, t5_bucket_matrix


def make(**kw):
    return lambda: T5RelativePositionBias(3, num_buckets=8, max_distance=12, dtype=np.float64, seed=0, **kw)


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize(("q_len", "k_len"), [(5, 5), (2, 7), (1, 30)])
def test_backward_matches_finite_differences(bidirectional: bool, q_len: int, k_len: int) -> None:
    check_grads(make(bidirectional=bidirectional), (q_len, k_len), run=lambda layer, x: layer(*x),
                tol="fd.linear")


def test_forward_gathers_hf_layout() -> None:
    layer = make()()
    out = layer(4, 6)
    b = t5_bucket_matrix(4, 6, num_buckets=8, max_distance=12)
    assert out.shape == (3, 4, 6) and layer.weight.data.shape == (8, 3)
    np.testing.assert_array_equal(out, np.moveaxis(layer.weight.data[b], -1, 0))
    np.testing.assert_array_equal(layer.bias(4, 6), out)
    np.testing.assert_array_equal(layer(2, 6), out[:, 2:])                     # cache offset: last Lq queries
    np.testing.assert_array_equal(layer(2, 6, query_offset=0), layer(6, 6)[:, :2])   # HF compute_bias default


def test_backward_accumulates_and_takes_offset() -> None:
    layer = make()()
    g = np.random.default_rng(0).standard_normal((3, 2, 6))
    layer.backward(g, query_offset=0)
    first = layer.weight.grad.copy()
    layer.backward(g, query_offset=0)
    np.testing.assert_allclose(layer.weight.grad, 2 * first)
    ref = np.zeros((8, 3))
    np.add.at(ref, t5_bucket_matrix(2, 6, num_buckets=8, max_distance=12, query_offset=0).reshape(-1),
              np.moveaxis(g, 0, -1).reshape(-1, 3))
    np.testing.assert_allclose(first, ref, rtol=1e-14)
    with pytest.raises(ValueError, match=r"grad_bias must have shape \(3, Lq, Lk\)"):
        layer.backward(np.zeros((2, 2, 2)))


def test_init_state_and_errors() -> None:
    a, b = make()(), make()()
    np.testing.assert_array_equal(a.weight.data, b.weight.data)                # same seed, same weights
    assert list(a.state_dict()) == ["weight"] and a.kind == "bias"
    assert T5RelativePositionBias(2).weight.dtype == np.float32
    c = T5RelativePositionBias(3, num_buckets=8, max_distance=12, dtype=np.float64, seed=1)
    c.load_state_dict(a.state_dict())
    np.testing.assert_array_equal(c(3, 3), a(3, 3))
    with pytest.raises(ConfigError, match="max_distance"):
        T5RelativePositionBias(2, num_buckets=32, max_distance=8)
    with pytest.raises(ConfigError, match="num_heads"):
        T5RelativePositionBias(0)
