"""RotaryEmbedding input layouts (NumPy): qk_layout="blhd" (HF unsqueeze_dim=2 / flash-attention),
the head-count check of the declared layout, and (1, L) positions broadcast over the batch."""

from __future__ import annotations

import numpy as np
import pytest

import tokenpos
from tests.numpy.gradcheck import check_grads
from tests.tolerances import TOL
from tokenpos.numpy import RotaryEmbedding
from tokenpos.tables import ConfigError

DH = 8
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8}


def _qk(shape_q, shape_k, seed=0, dtype=np.float64):
    rng = np.random.default_rng(seed)
    return rng.standard_normal(shape_q).astype(dtype), rng.standard_normal(shape_k).astype(dtype)


@pytest.mark.parametrize("kernels", [True, False])
@pytest.mark.parametrize("interleaved", [False, True])
def test_blhd_equals_transposed_bhld(kernels: bool, interleaved: bool) -> None:
    previous = tokenpos.kernels_enabled()
    tokenpos.set_kernels(kernels)
    try:
        q, k = _qk((2, 5, 4, DH), (2, 5, 2, DH))                        # (B, L, H, Dh)
        pos = np.array([[0, 3, 9, 2, 1], [7, 7, 7, 1, 0]])
        ours = RotaryEmbedding(DH, scaling=YARN, max_seq_len=8, qk_layout="blhd", num_heads=4, interleaved=interleaved)
        ref = RotaryEmbedding(DH, scaling=YARN, max_seq_len=8, interleaved=interleaved)
        a, b = ours.apply(q, k, pos)
        ra, rb = ref.apply(q.transpose(0, 2, 1, 3), k.transpose(0, 2, 1, 3), pos)
        assert a.shape == q.shape and b.shape == k.shape
        np.testing.assert_allclose(a, ra.transpose(0, 2, 1, 3), **TOL["forward.float64"])
        np.testing.assert_allclose(b, rb.transpose(0, 2, 1, 3), **TOL["forward.float64"])
        np.testing.assert_allclose(ours.rotate(q, pos), a, **TOL["forward.float64"])
        g1, g2 = _qk(q.shape, k.shape, seed=3)
        dq, dk = ours.backward(g1, g2)
        rq, rk = ref.backward(g1.transpose(0, 2, 1, 3), g2.transpose(0, 2, 1, 3))
        np.testing.assert_allclose(dq, rq.transpose(0, 2, 1, 3), **TOL["forward.float64"])
        np.testing.assert_allclose(dk, rk.transpose(0, 2, 1, 3), **TOL["forward.float64"])
    finally:
        tokenpos.set_kernels(previous)


@pytest.mark.slow  # finite differences
@pytest.mark.parametrize("qk_layout", ["bhld", "blhd"])
def test_backward_finite_differences_in_both_layouts(qk_layout: str) -> None:
    shape = (2, 3, 2, DH) if qk_layout == "blhd" else (2, 2, 3, DH)      # L = 3, H = 2
    q, k = _qk(shape, shape)
    pos = np.array([[0, 5, 20], [3, 4, 9]])

    def run(layer, x):
        return np.stack(layer.apply(x[0], x[1], pos))

    def backward(layer, g):
        return np.stack(layer.backward(g[0], g[1]))

    check_grads(lambda: RotaryEmbedding(DH, max_seq_len=8, scaling=YARN, rotary_dim=6, qk_layout=qk_layout),
                np.stack([q, k]), run=run, backward=backward, x_is_float=True, eps=1e-3)  # linear in x: exact


def test_declared_layout_is_checked_against_the_head_count() -> None:
    rope = RotaryEmbedding(DH, qk_layout="blhd", num_heads=4)
    q, k = _qk((2, 4, 5, DH), (2, 4, 5, DH))                            # (B, H, L, Dh) given as blhd
    with pytest.raises(ConfigError, match=r"axis 2 \(qk_layout='blhd'\) is 5; expected a head count == num_heads=4"):
        rope.apply(q, k)
    q, k = _qk((2, 5, 4, DH), (2, 5, 3, DH))
    with pytest.raises(ConfigError, match="k has shape .* dividing num_heads=4"):
        rope.apply(q, k)
    with pytest.raises(ConfigError, match="qk_layout"):
        RotaryEmbedding(DH, qk_layout="bthd")
    with pytest.raises(ConfigError, match=r"\(B, L, H, 8\) \(qk_layout='blhd'\)"):
        rope.apply(np.zeros((2, 5, 4)), np.zeros((2, 5, 4)))


def test_positions_of_shape_one_by_length_broadcast_over_the_batch() -> None:
    rope = RotaryEmbedding(DH, scaling=YARN, max_seq_len=8)
    q, k = _qk((3, 2, 4, DH), (3, 1, 4, DH))
    pos = np.array([[5, 1, 9, 2]])
    a, b = rope.apply(q, k, pos)
    ra, rb = rope.apply(q, k, np.repeat(pos, 3, axis=0))
    np.testing.assert_array_equal(a, ra)
    np.testing.assert_array_equal(b, rb)
    with pytest.raises(ConfigError, match=r"positions must have shape \(4,\) or \(1, 4\) or \(3, 4\), got \(2, 4\)"):
        rope.apply(q, k, np.zeros((2, 4), dtype=np.int64))
