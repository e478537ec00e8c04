"""Regressions from users' trackers: gpt-neox's fp16 cos error at position 1857 does not occur; a Meta
(interleaved) checkpoint converted with the wrong permutation is detected by its attention scores."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tokenpos.tables import rope_cos_sin, rope_inv_freq, rope_rotate
from tokenpos.tables.formulas.rope import permute_qk_weight
from tokenpos.torch import RotaryEmbedding

FP16_SCALE = 2.0 ** -9        # a few fp16 ulps at 1.0, relative to max|x|


@pytest.mark.parametrize("dh", [64, 128])
def test_fp16_at_position_1857_keeps_accurate_angles(dh: int) -> None:
    pos = torch.arange(1850, 1862)
    x = torch.randn(1, 2, pos.numel(), dh, generator=torch.Generator().manual_seed(0)).half()
    out = RotaryEmbedding(dh).rotate(x, pos)
    inv, _ = rope_inv_freq(dh)
    cos, sin = rope_cos_sin(pos.numpy(), inv)
    truth = rope_rotate(x.double().numpy(), cos, sin)
    err = float(np.abs(out.double().numpy() - truth).max()) / float(x.abs().max())
    assert out.dtype == torch.float16 and err <= FP16_SCALE
    # what a cache built in fp16 gives (gpt-neox): angles t * inv_freq rounded to fp16
    ang16 = (pos.half()[:, None] * torch.from_numpy(inv).half()).double()
    assert float((ang16.cos().numpy() - np.cos(pos.numpy()[:, None] * inv)).__abs__().max()) > 0.1


def _scores(wq: torch.Tensor, wk: torch.Tensor, h: torch.Tensor, rope: RotaryEmbedding, heads: int) -> torch.Tensor:
    b, length, _ = h.shape
    q = (h @ wq.T).view(b, length, heads, -1).transpose(1, 2)
    k = (h @ wk.T).view(b, length, heads, -1).transpose(1, 2)
    q, k = rope.apply(q, k)
    return q @ k.transpose(-1, -2)


@pytest.mark.parametrize("rotary_dim", [None, 8])
def test_meta_checkpoint_with_the_wrong_permutation_is_detected(rotary_dim: int | None) -> None:
    heads, dh, d = 2, 16, 32
    g = torch.Generator().manual_seed(0)
    wq, wk = torch.randn(heads * dh, d, generator=g, dtype=torch.float64), torch.randn(heads * dh, d, generator=g,
                                                                                       dtype=torch.float64)
    h = torch.randn(1, 9, d, generator=g, dtype=torch.float64)
    meta = _scores(wq, wk, h, RotaryEmbedding(dh, interleaved=True, rotary_dim=rotary_dim), heads)
    half = RotaryEmbedding(dh, rotary_dim=rotary_dim)
    right = _scores(permute_qk_weight(wq, heads, to="half", rotary_dim=rotary_dim),
                    permute_qk_weight(wk, heads, to="half", rotary_dim=rotary_dim), h, half, heads)
    torch.testing.assert_close(right, meta, rtol=1e-12, atol=1e-10)
    wrongs = {
        "no permutation": (wq, wk),
        "the inverse permutation": (permute_qk_weight(wq, heads, to="interleaved", rotary_dim=rotary_dim),
                                    permute_qk_weight(wk, heads, to="interleaved", rotary_dim=rotary_dim)),
        "permuted over the whole head": (permute_qk_weight(wq, heads, to="half"),
                                         permute_qk_weight(wk, heads, to="half")),
    }
    for what, (a, b) in wrongs.items():
        if rotary_dim is None and what == "permuted over the whole head":
            continue
        err = float((_scores(a, b, h, half, heads) - meta).abs().max()) / float(meta.abs().max())
        assert err > 1e-2, f"{what}: scores differ by only {err:.2g}; the wrong conversion went unnoticed"
