"""tokenpos.tables.formulas.kerple: the log kernel, the reference code's init and projection, the gradient."""

from __future__ import annotations

import numpy as np
import pytest

from tests.tolerances import TOL
from tokenpos.tables.checks.bias import check_kerple_eps
from tokenpos.tables.errors import ConfigError
from tokenpos.tables.formulas.kerple import (
    kerple_bias,
    kerple_bias_backward,
    kerple_distance,
    kerple_init,
    kerple_project,
)


def test_formula_and_distance() -> None:
    r1, r2 = np.array([0.5, 2.0]), np.array([0.1, 1.5])
    d = kerple_distance(2, 5)                                     # queries at 3, 4
    np.testing.assert_array_equal(d, [[3, 2, 1, 0, 1], [4, 3, 2, 1, 0]])
    out = kerple_bias(r1, r2, d)
    assert out.shape == (2, 2, 5)
    assert out[1, 0, 0] == pytest.approx(-2.0 * np.log(1 + 1.5 * 3))
    assert np.all(out[:, [0, 1], [3, 4]] == 0.0)                  # the diagonal has no penalty
    assert np.all(np.diff(out[:, 1, :], axis=-1) > 0)             # farther keys get a larger penalty


def test_init_and_projection_follow_the_reference_code() -> None:
    r1, r2 = kerple_init(10_000, np.random.default_rng(0))
    assert 0 <= r1.min() and r1.max() < 2 and 0 <= r2.min() and r2.max() < 1
    assert r1.mean() == pytest.approx(1.0, abs=0.03) and r2.mean() == pytest.approx(0.5, abs=0.02)
    np.testing.assert_array_equal(kerple_project(np.array([-1.0, 0.0, 0.005, 0.3])), [0.01, 0.01, 0.01, 0.3])
    with pytest.raises(ConfigError, match="eps must be > 0.0"):
        check_kerple_eps(0.0)


@pytest.mark.parametrize(("q_len", "k_len", "offset"), [(4, 4, None), (2, 9, None), (3, 3, 6)])
def test_backward_matches_central_differences(q_len: int, k_len: int, offset: int | None) -> None:
    rng = np.random.default_rng(1)
    r1, r2 = rng.uniform(0.2, 2, 3), rng.uniform(0.1, 1, 3)
    d = kerple_distance(q_len, k_len, offset)
    g = rng.standard_normal((3, q_len, k_len))
    d_r1, d_r2 = kerple_bias_backward(g, r1, r2, d)
    for got, which in ((d_r1, 0), (d_r2, 1)):
        num = np.zeros(3)
        for h in range(3):
            a, b = [r1.copy(), r2.copy()], [r1.copy(), r2.copy()]
            a[which][h] += 1e-6
            b[which][h] -= 1e-6
            num[h] = ((kerple_bias(*a, d) - kerple_bias(*b, d)) * g).sum() / 2e-6
        np.testing.assert_allclose(got, num, **TOL["fd.nonlinear"])
