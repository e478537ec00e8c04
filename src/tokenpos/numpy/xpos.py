"""XPosRotaryEmbedding (xPos) for the NumPy backend: RoPE with q scaled up and k scaled down per pair.

Shapes: B batch, H heads, L length, Dh head dim, R rotary dim, F = R / 2. q, k: (B, H, L, Dh);
positions (L,) / (1, L) / (B, L). cos, sin and the xPos scale come from ``tokenpos.tables`` in float64
and are folded into per-tensor tables (``tables.formulas.xpos``), which run through the same functional RoPE
pair (``functional.rope_forward``) as plain RoPE; so the backward is the transpose of the scaled
rotation with no extra code. No cache: nothing is shared between threads.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tokenpos.numpy._rotary_base import RotaryBase, RotaryCache
from tokenpos.tables.checks.rope import (
    check_positions_shape,
    check_qk_layout,
    check_qk_lengths,
    check_same_key_positions,
)
from tokenpos.tables.checks.rotary_layers import XPOS_TOGETHER_MESSAGE, xpos_layer_args
from tokenpos.tables.checks.validation import check_positions, check_start_pos, check_start_pos_with_positions
from tokenpos.tables.errors import ConfigError
from tokenpos.tables.formulas.rope import rope_angles, rope_inv_freq
from tokenpos.tables.formulas.xpos import xpos_center, xpos_scale, xpos_scaled_tables


class XPosRotaryEmbedding(RotaryBase):
    """xPos: ``q' = s * R(n) q``, ``k' = R(n) k / s`` with s the per-pair decay scale (see ``tables.formulas.xpos``).

    Args:
        head_dim: Dh. rotary_dim: R (None = Dh). base: rope_theta.
        scale_base: xPos's ``scale_base`` (rotary-embedding-torch ``xpos_scale_base``, default 512).
        interleaved: pair layout; True (default) as rotary-embedding-torch, False = half split.
        center: the position where the scale is 1; None = ``L // 2`` of each call (as rotary-embedding-torch).
            Scores do not depend on it; a fixed value makes q' and k' independent of the call's length.
        qk_layout, num_heads: as RotaryEmbedding. seed, rng: accepted; no random state.

    Shape:
        apply(q (B, Hq, L, Dh), k (B, Hk, L, Dh), positions (L,) | (1, L) | (B, L) | None) -> (q', k').
    """

    kind = "rotary"
    name = "xpos"

    def __init__(self, head_dim: int, *, base: float = 10000.0, scale_base: float = 512.0,
                 rotary_dim: int | None = None, interleaved: bool = True, center: float | None = None,
                 qk_layout: str = "bhld",
                 num_heads: int | None = None, seed: Any = None, rng: Any = None) -> None:
        super().__init__()
        self.head_dim, self.rotary_dim, self.scale_base, self.center, self.interleaved = xpos_layer_args(
            head_dim, rotary_dim, scale_base, center, interleaved, bool_types=(bool, np.bool_))
        self.qk_layout, self.num_heads = check_qk_layout(qk_layout, num_heads)
        self.inv_freq, _ = rope_inv_freq(self.rotary_dim, base=base)
        self.base = float(base)
        self._last: RotaryCache | None = None

    def tables(self, positions: Any, length: int) -> tuple[np.ndarray, ...]:
        """``(cos_q, sin_q, cos_k, sin_k)`` (..., F) float64 for int positions (...)."""
        pos = check_positions(positions)
        ang = rope_angles(pos, self.inv_freq)
        s = xpos_scale(pos, self.rotary_dim, scale_base=self.scale_base, center=xpos_center(self.center, length))
        return xpos_scaled_tables(np.cos(ang), np.sin(ang), s)

    def _rotate_bhld(self, q: np.ndarray, k: np.ndarray, positions: Any, start_pos: Any, key_positions: Any
                     ) -> tuple[np.ndarray, np.ndarray, RotaryCache]:
        """q, k (B, H, L, Dh) rotated and scaled; they share positions (``key_positions``, if given, must
        equal them; given ``positions`` need ``start_pos=0``, else ConfigError)."""
        b, length = q.shape[0], q.shape[2]
        check_qk_lengths(q.shape, k.shape)
        if positions is None and key_positions is not None:      # the attention's KV path: as torch, refused
            raise ConfigError(XPOS_TOGETHER_MESSAGE)
        if positions is None:
            start_pos = check_start_pos(start_pos, length)
            pos = np.arange(start_pos, start_pos + length, dtype=np.int64)
        else:
            check_start_pos_with_positions(start_pos, positions)
            pos = check_positions(positions)
            pos = pos[0] if check_positions_shape(pos.shape, b, length) else pos
        check_same_key_positions("xPos", pos, key_positions)
        cq, sq, ck, sk = (t.astype(q.dtype if i < 2 else k.dtype) for i, t in enumerate(self.tables(pos, length)))
        return self._rotate_pair(q, k, (cq, sq), (ck, sk), self.interleaved)   # backward: the transposed maps

    def extra_repr(self) -> str:
        return (f"head_dim={self.head_dim}, rotary_dim={self.rotary_dim}, base={self.base}, "
                f"scale_base={self.scale_base}, interleaved={self.interleaved}, center={self.center}")
