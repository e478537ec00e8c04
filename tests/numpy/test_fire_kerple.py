"""tokenpos.numpy.FIRE / KERPLE: the layers' backward by finite differences, state, errors."""

from __future__ import annotations

import numpy as np
import pytest

from tests.numpy.gradcheck import check_grads
from tests.tolerances import TOL
from tokenpos.numpy.fire import FIRE
from tokenpos.numpy.kerple import KERPLE
from tokenpos.tables import ConfigError


def make_fire():
    def build():
        layer = FIRE(3, width=8, init_L=3.5, dtype=np.float64, seed=0)
        layer.c.data[...] = 0.4
        layer.L_multiplier.data[...] = 0.9
        return layer
    return build


def make_kerple():
    return lambda: KERPLE(3, dtype=np.float64, seed=0)


@pytest.mark.parametrize("make", [make_fire, make_kerple])
@pytest.mark.parametrize(("q_len", "k_len"), [(5, 5), (2, 7), (1, 12)])
def test_backward_matches_finite_differences(make, q_len: int, k_len: int) -> None:
    check_grads(make(), (q_len, k_len), run=lambda layer, x: layer(*x), tol="fd.nonlinear")


@pytest.mark.parametrize("make", [make_fire, make_kerple])
def test_state_offset_accumulation_and_errors(make) -> None:
    a, b = make()(), make()()
    for (name, pa), (_, pb) in zip(a.named_parameters(), b.named_parameters(), strict=True):
        np.testing.assert_array_equal(pa.data, pb.data, err_msg=name)       # same seed, same values
    assert a.kind == "bias" and a(4, 6).shape == (3, 4, 6)
    np.testing.assert_array_equal(a(2, 6), a(6, 6)[:, 4:])                  # cache offset: the last Lq queries
    np.testing.assert_array_equal(a(2, 6, query_offset=1), a(6, 6)[:, 1:3])
    g = np.random.default_rng(0).standard_normal((3, 2, 6))
    a.backward(g, query_offset=1)
    first = {n: p.grad.copy() for n, p in a.named_parameters()}
    a.backward(g, query_offset=1)
    for n, p in a.named_parameters():
        np.testing.assert_allclose(p.grad, 2 * first[n], err_msg=n)
    with pytest.raises(ValueError, match=r"grad_bias must have shape \(3, Lq, Lk\)"):
        a.backward(np.zeros((2, 2, 2)))
    with pytest.raises(ConfigError, match="q_len"):
        a(5, 3)
    c = make()()
    c.reset_parameters(seed=5)
    assert not np.array_equal(c(3, 3), b(3, 3)) and all(p.grad is None for p in c.parameters())
    c.load_state_dict(b.state_dict())
    np.testing.assert_array_equal(c(3, 3), b(3, 3))


def test_kerple_projects_parameters_in_place_like_the_reference_code() -> None:
    layer = KERPLE(2, dtype=np.float64, seed=0)
    layer.r1.data[...] = [-0.5, 1.0]
    layer.r2.data[...] = [0.001, 0.5]
    out = layer(1, 3)
    np.testing.assert_array_equal(layer.r1.data, [0.01, 1.0])
    np.testing.assert_array_equal(layer.r2.data, [0.01, 0.5])
    assert out[0, 0, 0] == pytest.approx(-0.01 * np.log1p(0.01 * 2))


def test_defaults_and_bad_arguments() -> None:
    assert FIRE(2).in_weight.dtype == np.float32 and KERPLE(2).r1.dtype == np.float32
    assert list(FIRE(2, seed=0).state_dict()) == ["in_weight", "in_bias", "out_weight", "out_bias", "c",
                                                  "L_multiplier"]
    assert list(KERPLE(2, seed=0).state_dict()) == ["r1", "r2"]
    with pytest.raises(ConfigError, match="num_heads"):
        FIRE(0)
    with pytest.raises(ConfigError, match="init_L must be > 0.0"):
        FIRE(2, init_L=0)
    with pytest.raises(ConfigError, match="eps must be > 0.0"):
        KERPLE(2, eps=-1.0)


@pytest.mark.parametrize("make", [make_fire, make_kerple])
@pytest.mark.parametrize(("lq", "lk"), [(4, 4), (2, 5)])
def test_attention_routes_the_bias_gradient_into_the_parameters(make, lq: int, lk: int) -> None:
    """Finite differences of a loss through numpy attention w.r.t. every FIRE / KERPLE parameter."""
    from tokenpos.numpy.attention import scaled_dot_product_attention, scaled_dot_product_attention_backward
    from tokenpos.numpy.attention import scaled_dot_product_attention_forward as forward

    rng = np.random.default_rng(0)
    q, k, v = rng.standard_normal((2, 3, lq, 4)), rng.standard_normal((2, 3, lk, 4)), rng.standard_normal((2, 3, lk, 4))
    g = rng.standard_normal(q.shape)

    def loss(layer):
        return float(np.sum(scaled_dot_product_attention(q, k, v, positional=layer) * g))

    layer = make()()
    _, cache = forward(q, k, v, positional=layer)
    scaled_dot_product_attention_backward(g, cache)
    for name, param in layer.named_parameters():
        numeric = np.zeros_like(param.data)
        for i in np.ndindex(param.data.shape):
            plus, minus = make()(), make()()
            dict(plus.named_parameters())[name].data[i] += 1e-6
            dict(minus.named_parameters())[name].data[i] -= 1e-6
            numeric[i] = (loss(plus) - loss(minus)) / 2e-6
        np.testing.assert_allclose(param.grad, numeric, **TOL["fd.nonlinear"], err_msg=name)
