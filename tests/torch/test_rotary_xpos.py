"""xPos against rotary-embedding-torch itself (use_xpos=True), NumPy <-> torch parity through the one helper,
NumPy backward by finite differences, the score decay, and bf16 angles at position 1,000,000."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.numpy.gradcheck import check_grads
from tests.parity.helpers import assert_fn_parity
from tests.tolerances import TOL
from tokenpos.numpy.xpos import XPosRotaryEmbedding as NpXPos
from tokenpos.tables import rope_cos_sin, rope_inv_freq, rope_rotate
from tokenpos.tables.formulas.xpos import xpos_scale
from tokenpos.torch.xpos import XPosRotaryEmbedding

ret = pytest.importorskip("rotary_embedding_torch")


@pytest.mark.parametrize(("dim", "rotary_dim", "length", "scale_base"), [(16, None, 9, 512), (32, 16, 40, 8),
                                                                         (64, None, 300, 64)])
def test_matches_rotary_embedding_torch(dim: int, rotary_dim: int | None, length: int, scale_base: int) -> None:
    r = rotary_dim or dim
    ref = ret.RotaryEmbedding(dim=r, use_xpos=True, xpos_scale_base=scale_base, cache_if_possible=False)
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 3, length, dim, generator=g), torch.randn(2, 3, length, dim, generator=g)
    want_q, want_k = ref.rotate_queries_and_keys(q, k)
    ours = XPosRotaryEmbedding(dim, rotary_dim=rotary_dim, scale_base=scale_base)
    got_q, got_k = ours.apply(q, k)
    tol = TOL["hf.rope_rotated"]                       # the reference computes angles and scales in float32
    for got, want in ((got_q, want_q), (got_k, want_k)):
        bound = (tol["atol"] + tol["per_position"] * length) * float(want.abs().max())
        assert float((got - want).abs().max()) <= bound


def test_scores_decay_with_distance_whatever_the_centre() -> None:
    dim, length = 16, 12
    q = torch.randn(1, 1, length, dim, dtype=torch.float64)
    a = XPosRotaryEmbedding(dim, scale_base=16)
    b = XPosRotaryEmbedding(dim, scale_base=16, center=1000.0)
    sa = (lambda x, y: x @ y.transpose(-1, -2))(*a.apply(q, q))
    sb = (lambda x, y: x @ y.transpose(-1, -2))(*b.apply(q, q))
    torch.testing.assert_close(sa, sb, rtol=1e-10, atol=1e-10)     # relative: the centre cancels


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("interleaved", [True, False])
def test_numpy_torch_parity(dtype, interleaved: bool) -> None:
    kw = {"scale_base": 32.0, "rotary_dim": 6, "interleaved": interleaved}
    np_x, t_x = NpXPos(8, **kw), XPosRotaryEmbedding(8, **kw)
    rng = np.random.default_rng(0)
    q, k = rng.standard_normal((2, 3, 5, 8)).astype(dtype), rng.standard_normal((2, 1, 5, 8)).astype(dtype)
    pos = np.array([[0, 4, 9, 1, 30], [2, 2, 2, 7, 7]])
    assert_fn_parity(lambda a, b: np_x.apply(a, b, pos), np_x.backward,
                     lambda a, b: t_x.apply(a, b, torch.from_numpy(pos)), (q, k))


@pytest.mark.slow  # finite differences
def test_numpy_backward_finite_differences() -> None:
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 2, 2, 4, 8))                        # (q|k, B, H, L, Dh)

    def run(layer, xx):
        return np.stack(layer.apply(xx[0], xx[1], start_pos=3))

    def backward(layer, g):
        return np.stack(layer.backward(g[0], g[1]))

    check_grads(lambda: NpXPos(8, scale_base=4.0), x, run=run, backward=backward, x_is_float=True, eps=1e-3)


def test_bf16_at_position_one_million_keeps_accurate_angles() -> None:
    x = torch.randn(1, 2, 4, 64, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    pos = torch.arange(1_000_000, 1_000_004)
    q, _ = XPosRotaryEmbedding(64, center=1_000_000.0).apply(x, x, pos)
    inv, _ = rope_inv_freq(64)
    cos, sin = rope_cos_sin(pos.numpy(), inv, interleaved=True)
    s = np.repeat(xpos_scale(pos.numpy(), 64, scale_base=512.0, center=1_000_000.0), 2, axis=-1)
    truth = rope_rotate(x.double().numpy(), cos * s, sin * s, interleaved=True)
    err = float(np.abs(q.double().numpy() - truth).max()) / float(x.abs().max())
    assert q.dtype == torch.bfloat16 and err <= TOL["rope.bf16_far"]["scale"]
