"""tokenpos.tables.formulas.fire: the formula of the paper's reference listing, and its hand-written gradient."""

from __future__ import annotations

import numpy as np
import pytest

from tests.tolerances import TOL
from tokenpos.tables.errors import ConfigError
from tokenpos.tables.formulas.fire import FIRE_PARAMS, fire_bias, fire_bias_backward, fire_init, fire_param_shapes


def _params(seed: int = 0, c: float = 0.3, mult: float = 0.7) -> dict[str, np.ndarray]:
    p = fire_init(3, 8, np.random.default_rng(seed))
    p["c"][:], p["L_multiplier"][:] = c, mult
    return p


def test_formula_by_hand() -> None:
    p = _params()
    out, _ = fire_bias(p, 3, 5, init_L=2.5)
    q_pos = np.arange(3) + 2.0                                    # Lk - Lq = 2
    for h, i, j in [(0, 0, 0), (1, 2, 4), (2, 1, 3), (0, 2, 0)]:
        rel = q_pos[i] - j
        norm = max(q_pos[i], abs(0.7 * 2.5))
        x = np.log(abs(0.3 * rel) + 1) / (np.log(abs(0.3 * norm) + 1) + 1e-6)
        hidden = np.maximum(x * p["in_weight"] + p["in_bias"], 0.0)
        assert out[h, i, j] == pytest.approx(hidden @ p["out_weight"][:, h] + p["out_bias"][h], rel=1e-12)


def test_shapes_init_and_threshold_normalises_short_queries() -> None:
    p = fire_init(4, 32, np.random.default_rng(0))
    assert {k: v.shape for k, v in p.items()} == fire_param_shapes(4, 32)
    assert p["c"][0] == 0.1 and p["L_multiplier"][0] == 1.0 and np.abs(p["in_weight"]).max() <= 1.0
    assert np.abs(p["out_weight"]).max() <= 32 ** -0.5
    # below the threshold every query uses the same normaliser, so the bias depends on i - j only
    out, _ = fire_bias(p, 6, 6, init_L=100.0)
    np.testing.assert_allclose(out[:, 5, 3], out[:, 4, 2], rtol=1e-13)
    out, _ = fire_bias(p, 6, 6, init_L=1.0)                       # above it: normalised by the position
    assert not np.allclose(out[:, 5, 3], out[:, 4, 2])


@pytest.mark.parametrize(("q_len", "k_len", "offset", "init_L"), [(4, 4, None, 2.6), (2, 7, None, 9.3),
                                                                  (3, 3, 5, 6.0), (5, 5, None, 2.0)])
def test_backward_matches_central_differences(q_len: int, k_len: int, offset: int | None, init_L: float) -> None:
    """Float64 central differences for every parameter; init_L 6.0 with offset 5 and init_L 2.0 put
    the threshold exactly on a query position (torch's equal split at ties)."""
    p = _params()
    g = np.random.default_rng(1).standard_normal((3, q_len, k_len))
    _, cache = fire_bias(p, q_len, k_len, init_L=init_L, query_offset=offset)
    grads = fire_bias_backward(g, p, cache, init_L=init_L)
    eps = 1e-6
    for key in FIRE_PARAMS:
        num = np.zeros_like(p[key])
        for idx in np.ndindex(p[key].shape):
            if key == "L_multiplier" and abs(abs(p[key][idx] * init_L) - np.round(p[key][idx] * init_L)) < 1e-9:
                continue
            q = {k: v.copy() for k, v in p.items()}
            q[key][idx] += eps
            plus = (fire_bias(q, q_len, k_len, init_L=init_L, query_offset=offset)[0] * g).sum()
            q[key][idx] -= 2 * eps
            minus = (fire_bias(q, q_len, k_len, init_L=init_L, query_offset=offset)[0] * g).sum()
            num[idx] = (plus - minus) / (2 * eps)
        if key == "L_multiplier" and init_L in (2.0, 6.0):
            continue                                              # a kink: checked in the test below
        np.testing.assert_allclose(grads[key], num, **TOL["fd.nonlinear"])


def test_threshold_gradient_splits_at_a_tie_like_torch_maximum() -> None:
    p = _params(mult=1.0)
    g = np.random.default_rng(2).standard_normal((3, 5, 5))
    _, cache = fire_bias(p, 5, 5, init_L=2.0)                     # threshold 2.0 == query position 2
    half = fire_bias_backward(g, p, cache, init_L=2.0)["L_multiplier"][0]
    eps = 1e-6
    slopes = []
    for sign in (1, -1):
        q = {k: v.copy() for k, v in p.items()}
        q["L_multiplier"][0] = 1.0 + sign * eps
        slopes.append(sign * ((fire_bias(q, 5, 5, init_L=2.0)[0] * g).sum() - (fire_bias(p, 5, 5, init_L=2.0)[0] * g)
                              .sum()) / eps)
    assert half == pytest.approx(0.5 * (slopes[0] + slopes[1]), rel=1e-4, abs=1e-7)


def test_bad_lengths_raise() -> None:
    with pytest.raises(ConfigError, match="q_len"):
        fire_bias(_params(), 5, 3, init_L=4.0)
