"""tokenpos.numpy.MRotaryEmbedding: backward by finite differences, the float64 formula, bad inputs."""

from __future__ import annotations

import numpy as np
import pytest

from tests.numpy.gradcheck import check_grads
from tests.tolerances import TOL
from tokenpos.numpy.mrope import MRotaryEmbedding
from tokenpos.tables import ConfigError

DH = 12                                                              # F = 6


@pytest.mark.slow  # finite differences
@pytest.mark.parametrize("layout", ["sections", "interleaved"])
@pytest.mark.parametrize("qk_layout", ["bhld", "blhd"])
def test_backward_matches_finite_differences(layout: str, qk_layout: str) -> None:
    rng = np.random.default_rng(0)
    shape = (2, 2, 3, DH) if qk_layout == "bhld" else (2, 3, 2, DH)  # L = 3
    x = rng.standard_normal((2, *shape))
    pos = rng.integers(0, 50, (3, 2, 3))

    def run(layer, xx):
        return np.stack(layer.apply(xx[0], xx[1], pos))

    def backward(layer, g):
        return np.stack(layer.backward(g[0], g[1]))

    check_grads(lambda: MRotaryEmbedding(DH, mrope_section=[2, 2, 2], mrope_layout=layout, qk_layout=qk_layout),
                x, run=run, backward=backward, x_is_float=True, eps=1e-3)   # linear in x: exact differences


def test_forward_is_the_formula() -> None:
    rope = MRotaryEmbedding(DH, mrope_section=[2, 1, 3], base=500.0)
    rng = np.random.default_rng(1)
    q = rng.standard_normal((1, 1, 4, DH))
    pos = rng.integers(0, 30, (3, 1, 4))
    out = rope.apply(q, q, pos)[0]
    axis = [0, 0, 1, 2, 2, 2]
    inv = 500.0 ** (-np.arange(0, DH, 2) / DH)
    ang = np.stack([pos[axis[j], 0] * inv[j] for j in range(6)], axis=-1)             # (L, F)
    x1, x2 = q[0, 0, :, :6], q[0, 0, :, 6:]
    want = np.concatenate([x1 * np.cos(ang) - x2 * np.sin(ang), x2 * np.cos(ang) + x1 * np.sin(ang)], -1)
    np.testing.assert_allclose(out[0, 0], want, **TOL["forward.float64"])


def test_bad_inputs_raise_config_errors() -> None:
    with pytest.raises(ConfigError, match="sums to 7; expected head_dim / 2 = 6"):
        MRotaryEmbedding(DH, mrope_section=[2, 2, 3])
    with pytest.raises(ConfigError, match="3 non-negative ints"):
        MRotaryEmbedding(DH, mrope_section=[6])
    with pytest.raises(ConfigError, match="static scalings"):
        MRotaryEmbedding(DH, mrope_section=[2, 2, 2], scaling={"rope_type": "dynamic", "factor": 2.0})
    rope = MRotaryEmbedding(DH, mrope_section=[2, 2, 2])
    q = np.zeros((2, 1, 4, DH))
    with pytest.raises(ConfigError, match=r"\(3, B, L\)"):
        rope.apply(q, q, np.zeros((4, 2, 4), dtype=np.int64))
    with pytest.raises(ConfigError, match=r"got \(3, 2, 5\)"):
        rope.apply(q, q, np.zeros((3, 2, 5), dtype=np.int64))
    with pytest.raises(ConfigError, match="floating-point"):
        rope.apply(q.astype(np.int32), q)
