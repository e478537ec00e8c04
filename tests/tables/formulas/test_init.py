"""tables.formulas.init: the init schemes' distributions, bounds and determinism."""

from __future__ import annotations

import numpy as np
import pytest

from tokenpos.tables import INIT_SCHEMES, ConfigError, init_weight, resolve_rng

SHAPE = (400, 250)   # 100k draws: std estimates within ~0.5 %


def test_normal_std():
    w = init_weight(SHAPE, "normal", std=0.02, rng=resolve_rng(0))
    assert w.dtype == np.float64 and w.shape == SHAPE
    assert abs(w.mean()) < 0.02 * 0.02
    assert w.std() == pytest.approx(0.02, rel=0.02)


def test_trunc_normal_bounds_and_std():
    w = init_weight(SHAPE, "trunc_normal", std=0.05, rng=resolve_rng(1))
    assert np.abs(w).max() <= 2 * 0.05
    assert np.abs(w).max() > 1.9 * 0.05, "the tails up to 2 std are reached"
    # std of N(0, 1) truncated at +-2: sqrt(1 - 2*2*phi(2) / (Phi(2) - Phi(-2))) = 0.8796
    assert w.std() == pytest.approx(0.05 * 0.8796, rel=0.02)


def test_xavier_uniform_limit():
    V, D = SHAPE
    limit = np.sqrt(6.0 / (V + D))
    w = init_weight(SHAPE, "xavier_uniform", rng=resolve_rng(2))
    assert np.abs(w).max() <= limit
    assert np.abs(w).max() > 0.99 * limit
    assert w.std() == pytest.approx(limit / np.sqrt(3.0), rel=0.02)


def test_standard_normal_and_zeros():
    w = init_weight(SHAPE, "standard_normal", std=0.02, rng=resolve_rng(3))
    assert w.std() == pytest.approx(1.0, rel=0.02), "standard_normal ignores std (torch's nn.Embedding default)"
    assert not init_weight((3, 4), "zeros", rng=resolve_rng(3)).any()


@pytest.mark.parametrize("scheme", INIT_SCHEMES)
def test_same_seed_same_weights_different_seed_differ(scheme):
    a = init_weight((20, 8), scheme, rng=resolve_rng(7))
    b = init_weight((20, 8), scheme, rng=resolve_rng(7))
    c = init_weight((20, 8), scheme, rng=np.random.default_rng(7))
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(a, c)
    if scheme != "zeros":
        assert not np.array_equal(a, init_weight((20, 8), scheme, rng=resolve_rng(8)))


def test_resolve_rng():
    g = np.random.default_rng(0)
    assert resolve_rng(rng=g) is g
    assert isinstance(resolve_rng(), np.random.Generator)
    assert resolve_rng(np.int64(3)).integers(1000) == np.random.default_rng(3).integers(1000)
    with pytest.raises(ConfigError, match="not both"):
        resolve_rng(1, g)
    with pytest.raises(ConfigError, match="Generator"):
        resolve_rng(rng=np.random.RandomState(0))
    with pytest.raises(ConfigError, match="seed"):
        resolve_rng(True)
    with pytest.raises(ConfigError, match="seed"):
        resolve_rng(1.5)


def test_bad_scheme_and_std():
    with pytest.raises(ConfigError, match="'normal'.*'xavier_uniform'.*got 'kaiming'"):
        init_weight((2, 2), "kaiming", rng=resolve_rng(0))
    with pytest.raises(ConfigError, match="std"):
        init_weight((2, 2), "normal", std=-1.0, rng=resolve_rng(0))
    with pytest.raises(ConfigError, match="std"):
        init_weight((2, 2), "trunc_normal", std=float("nan"), rng=resolve_rng(0))
