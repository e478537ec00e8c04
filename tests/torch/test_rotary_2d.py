"""2-D positions against HF itself: axial 2-D RoPE vs HF Pixtral's rotary module and apply_rotary_pos_emb;
the 2-D sin-cos table vs HF ViT-MAE's build_2d_sinusoidal_position_embedding; NumPy <-> torch parity,
NumPy backward by finite differences, bf16 angles at position 1,000,000."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.numpy.gradcheck import check_grads
from tests.parity.helpers import assert_fn_parity
from tests.tolerances import TOL
from tokenpos.numpy.rope2d import RotaryEmbedding2D as NpRope2D
from tokenpos.numpy.rope2d import SinCos2DPositionalEncoding as NpSinCos2D
from tokenpos.tables import ConfigError, rope_rotate
from tokenpos.tables.formulas.rope2d import patch_positions_2d
from tokenpos.torch.rope2d import RotaryEmbedding2D, SinCos2DPositionalEncoding

transformers = pytest.importorskip("transformers")
from transformers.models.pixtral import modeling_pixtral as px  # noqa: E402
from transformers.models.vit_mae import modeling_vit_mae as mae  # noqa: E402


def test_pixtral_rotary_and_rotation() -> None:
    cfg = transformers.PixtralVisionConfig(hidden_size=64, num_attention_heads=2, intermediate_size=64,
                                           num_hidden_layers=1, image_size=64, patch_size=4)
    hf = px.PixtralVisionRotaryEmbedding(cfg)
    pos = torch.from_numpy(patch_positions_2d([(5, 7), (3, 2)]))                # (N, 2), two images
    g = torch.Generator().manual_seed(0)
    n = pos.shape[0]
    q, k = torch.randn(1, 2, n, 32, generator=g), torch.randn(1, 2, n, 32, generator=g)
    cos, sin = hf(q, pos)
    want_q, want_k = px.apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=0)
    rope = RotaryEmbedding2D.from_hf_config(cfg)
    got_q, got_k = rope.apply(q, k, pos)
    tol = TOL["hf.rope_rotated"]
    bound = (tol["atol"] + tol["per_position"] * 7) * float(q.abs().max())
    assert float((got_q - want_q).abs().max()) <= bound and float((got_k - want_k).abs().max()) <= bound
    with pytest.raises(ConfigError, match=r"must have shape \(41, 2\)"):
        rope.apply(q, k, pos[:, 0])


@pytest.mark.parametrize(("h", "w", "d", "cls"), [(4, 6, 16, False), (7, 3, 32, True), (14, 14, 64, True)])
def test_sincos_2d_matches_vit_mae(h: int, w: int, d: int, cls: bool) -> None:
    want = mae.build_2d_sinusoidal_position_embedding(h, w, d, cls_token=cls, dtype=torch.float64)
    ours = SinCos2DPositionalEncoding(h, w, d, cls_token=cls, dtype=torch.float64)()
    np.testing.assert_allclose(ours.numpy(), want.numpy(), **TOL["sinusoidal.formula"])
    table = NpSinCos2D(h, w, d, cls_token=cls, dtype=np.float64)()
    np.testing.assert_allclose(table, want.numpy(), **TOL["sinusoidal.formula"])
    out = SinCos2DPositionalEncoding(h, w, d)
    out().zero_()
    assert float(out().abs().max()) > 0.5                                       # outputs never alias the table


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_numpy_torch_parity(dtype) -> None:
    np_r, t_r = NpRope2D(16), RotaryEmbedding2D(16)
    rng = np.random.default_rng(0)
    pos = rng.integers(0, 30, (2, 6, 2))
    q, k = rng.standard_normal((2, 3, 6, 16)).astype(dtype), rng.standard_normal((2, 1, 6, 16)).astype(dtype)
    assert_fn_parity(lambda a, b: np_r.apply(a, b, pos), np_r.backward,
                     lambda a, b: t_r.apply(a, b, torch.from_numpy(pos)), (q, k))


@pytest.mark.slow  # finite differences
def test_numpy_backward_finite_differences() -> None:
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 1, 2, 5, 8))
    pos = rng.integers(0, 9, (5, 2))

    def run(layer, xx):
        return np.stack(layer.apply(xx[0], xx[1], pos))

    def backward(layer, g):
        return np.stack(layer.backward(g[0], g[1]))

    check_grads(lambda: NpRope2D(8, base=100.0), x, run=run, backward=backward, x_is_float=True, eps=1e-3)


def test_bf16_at_position_one_million_keeps_accurate_angles() -> None:
    x = torch.randn(1, 2, 4, 64, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    pos = torch.tensor([[1_000_000, 3], [999_999, 1_000_001], [5, 1_000_002], [1_000_003, 1_000_003]])
    out = RotaryEmbedding2D(64).apply(x, x, pos)[0]
    cos, sin = NpRope2D(64).cos_sin(pos.numpy())
    truth = rope_rotate(x.double().numpy(), np.concatenate([cos, cos], -1), np.concatenate([sin, sin], -1))
    err = float(np.abs(out.double().numpy() - truth).max()) / float(x.abs().max())
    assert out.dtype == torch.bfloat16 and err <= TOL["rope.bf16_far"]["scale"]


def test_sincos_2d_refuses_a_dtype_that_is_not_floating() -> None:
    """dtype=torch.int32 gave a truncated table; now refused as every other layer refuses it."""
    with pytest.raises(ConfigError, match="dtype must be one of float16, bfloat16, float32, float64; got int32"):
        SinCos2DPositionalEncoding(2, 2, 4, dtype=torch.int32)
    assert SinCos2DPositionalEncoding(2, 2, 4, dtype=np.float64)().dtype == torch.float64
