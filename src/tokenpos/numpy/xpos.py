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
    check_qk_layout,
)
from tokenpos.tables.checks.rotary_layers import XPOS_TOGETHER_MESSAGE, check_xpos_packed_start, xpos_layer_args
from tokenpos.tables.checks.validation import check_dtype, check_positions
from tokenpos.tables.errors import ConfigError
from tokenpos.tables.formulas.rope import rope_angles, rope_inv_freq
from tokenpos.tables.formulas.xpos import xpos_center, xpos_document_centres, xpos_scale, xpos_scaled_tables


class XPosRotaryEmbedding(RotaryBase):
    """xPos: ``q' = s * R(n) q``, ``k' = R(n) k / s`` with s the per-pair decay scale (see ``tables.formulas.xpos``).

    Args:
        head_dim: Dh. rotary_dim: R (None = Dh). base: rope_theta.
        scale_base: xPos's ``scale_base`` (rotary-embedding-torch ``xpos_scale_base``, default 512).
        interleaved: pair layout; True (default) as rotary-embedding-torch, False = half split.
        center: the position where the scale is 1; None = ``L // 2`` of each call (as rotary-embedding-torch).
            Scores do not depend on it; a fixed value makes q' and k' independent of the call's length
            (needed for a cache of keys rotated by earlier calls: with None each call has its own centre).
        qk_layout, num_heads: as RotaryEmbedding. seed, rng: accepted; no random state. dtype: as RotaryEmbedding
            (checked; outputs follow the input dtype).

    Shape:
        apply(q (B, Hq, L, Dh), k (B, Hk, L, Dh), positions (L,) | (1, L) | (B, L) | None) -> (q', k');
        with a KV cache of keys before rotation: apply(q (B, Hq, Lq, Dh), k (B, Hk, Lk, Dh), start_pos=Lk - Lq,
        key_positions=arange(Lk)), one scale centre for both (``center``, or Lk // 2), so a decode step
        gets the full call's rows (scaled_dot_product_attention does this for xPos).
    """

    kind = "rotary"
    name = "xpos"
    rotates_qk_together = True       # k scaled down, q up, around one centre of the call
    packs = True                     # cu_seqlens: one centre per document

    def __init__(self, head_dim: int, *, base: float = 10000.0, scale_base: float = 512.0,
                 rotary_dim: int | None = None, interleaved: bool = True, center: float | None = None,
                 qk_layout: str = "bhld",
                 num_heads: int | None = None, seed: Any = None, rng: Any = None, dtype: Any = None) -> None:
        super().__init__()
        check_dtype("dtype", dtype)
        self.head_dim, self.rotary_dim, self.scale_base, self.center, self.interleaved = xpos_layer_args(
            head_dim, rotary_dim, scale_base, center, interleaved, bool_types=(bool, np.bool_))
        self.qk_layout, self.num_heads = check_qk_layout(qk_layout, num_heads)
        self.inv_freq, _ = rope_inv_freq(self.rotary_dim, base=base)
        self.base = float(base)
        self._last: RotaryCache | None = None

    def tables(self, positions: Any, length: int) -> tuple[np.ndarray, ...]:
        """``(cos_q, sin_q, cos_k, sin_k)`` (..., F) float64 for int positions (...), the centre that of a
        call of ``length`` (``center``, or ``length // 2``)."""
        return self._tables_at(check_positions(positions), xpos_center(self.center, length))

    def _tables_at(self, pos: np.ndarray, centre: Any) -> tuple[np.ndarray, ...]:
        ang = rope_angles(pos, self.inv_freq)
        s = xpos_scale(pos, self.rotary_dim, scale_base=self.scale_base, center=centre)
        return xpos_scaled_tables(np.cos(ang), np.sin(ang), s)

    def rotate(self, x: Any, positions: Any = None, *, start_pos: int = 0, seq_len: Any = None) -> Any:
        """Refused, as in the torch twin: xPos scales q and k differently, so one tensor alone is ambiguous
        (use :meth:`apply`; in the attention functions pass ``positions=`` so they call ``apply``)."""
        raise ConfigError(XPOS_TOGETHER_MESSAGE)

    def _packed_positions(self, q: np.ndarray, positions: Any, start_pos: Any, key_positions: Any,
                          cu_seqlens: Any) -> tuple[np.ndarray, int]:
        """The base's, every document counted from 0 (:func:`check_xpos_packed_start`)."""
        check_xpos_packed_start(start_pos)
        return super()._packed_positions(q, positions, start_pos, key_positions, cu_seqlens)

    def _rotate_packed(self, q: np.ndarray, k: np.ndarray, pos: np.ndarray, end: int
                       ) -> tuple[np.ndarray, np.ndarray, RotaryCache]:
        """q, k (1, H, T, Dh) at packed positions (T,): every document scaled around its own centre
        (``center``, or its length // 2), as if it were run alone."""
        centre = xpos_document_centres(pos) if self.center is None else self.center
        cq, sq, ck, sk = self._tables_at(pos, centre)
        cq, sq, ck, sk = cq.astype(q.dtype), sq.astype(q.dtype), ck.astype(k.dtype), sk.astype(k.dtype)
        return self._rotate_pair(q, k, (cq, sq), (ck, sk), self.interleaved)

    def _rotate_bhld(self, q: np.ndarray, k: np.ndarray, positions: Any, start_pos: Any, key_positions: Any
                     ) -> tuple[np.ndarray, np.ndarray, RotaryCache]:
        """q (B, H, Lq, Dh) and k (B, Hk, Lk, Dh) rotated and scaled: q at ``positions`` (default
        start_pos + arange(Lq); given positions need ``start_pos=0``, else ConfigError), k at q's
        positions (Lq == Lk) or at ``key_positions`` (a KV cache of keys before rotation). One centre
        for both (``center``, or ``Lk // 2``), so a score depends on the distance only and a decode
        step over the cache gets the tables of the full call."""
        pos_q, pos_k = self._qk_positions(q, k, positions, start_pos, key_positions)
        centre = xpos_center(self.center, k.shape[2])
        cq, sq, ck, sk = self._tables_at(pos_q, centre)
        if key_positions is not None:
            _, _, ck, sk = self._tables_at(pos_k, centre)
        cq, sq, ck, sk = cq.astype(q.dtype), sq.astype(q.dtype), ck.astype(k.dtype), sk.astype(k.dtype)
        return self._rotate_pair(q, k, (cq, sq), (ck, sk), self.interleaved)   # backward: the transposed maps

    def extra_repr(self) -> str:
        return (f"head_dim={self.head_dim}, rotary_dim={self.rotary_dim}, base={self.base}, "
                f"scale_base={self.scale_base}, interleaved={self.interleaved}, center={self.center}")
