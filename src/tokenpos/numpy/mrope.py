"""MRotaryEmbedding (M-RoPE: Qwen2-VL / Qwen2.5-VL section layout, Qwen3-VL interleaved layout), NumPy.

Shapes: B batch, H heads, L length, Dh head dim, F = Dh / 2. q, k: (B, H, L, Dh) (or (B, L, H, Dh)
with ``qk_layout="blhd"``); positions (3, B, L) / (3, 1, L) (temporal, height, width) or text
positions (B, L) / (1, L) / (L,) (the same id on the three axes).

cos / sin come from positions in float64 (``tokenpos.tables.formulas.mrope``), one entry per pair (B, L, F),
are cast to the input dtype and rotate in the half layout through the functional pair
(``tokenpos.numpy.functional.rope_qk_forward``: fused kernel or plain NumPy); the backward is the
rotation by -angle. No cache: the tables depend
on three position axes, so they are computed per call (nothing is shared between threads).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tokenpos.numpy import functional as F
from tokenpos.numpy._rotary_base import RotaryBase, RotaryCache, to_bhld
from tokenpos.tables.checks.rotary_layers import check_mrope_positions_shape
from tokenpos.tables.checks.validation import check_dtype, check_start_pos, check_start_pos_with_positions
from tokenpos.tables.formulas.mrope import MRopeSettings, mrope_angles, mrope_cos_sin, mrope_positions
from tokenpos.tables.hf.models import mrope_kwargs_from_hf_config


class MRotaryEmbedding(RotaryBase):
    """Multimodal RoPE: each frequency reads the temporal, height or width position.

    Args:
        head_dim: Dh (all of it rotates).
        mrope_section: [t, h, w] frequencies per axis (HF ``rope_parameters["mrope_section"]``).
        mrope_layout: "sections" (Qwen2-VL, Qwen2.5-VL) or "interleaved" (Qwen3-VL).
        base, max_seq_len, scaling: as RotaryEmbedding (static scalings only).
        qk_layout, num_heads: as RotaryEmbedding.
        seed, rng: accepted for the common scheme signature; no random state.
        dtype: as RotaryEmbedding (checked; outputs follow the input dtype).

    Shape:
        apply(q (B, Hq, L, Dh), k (B, Hk, L, Dh), positions (3, B, L) | (B, L) | (L,) | None) -> (q', k');
        rotate(x (B, H, L, Dh), positions) -> x' (one tensor, e.g. k at other positions than q).
    """

    kind = "rotary"
    name = "mrope"

    def __init__(self, head_dim: int, *, mrope_section: Any, mrope_layout: str = "sections", base: float = 10000.0,
                 max_seq_len: int = 2048, scaling: Any = None, qk_layout: str = "bhld", num_heads: int | None = None,
                 seed: Any = None, rng: Any = None, dtype: Any = None) -> None:
        super().__init__()
        check_dtype("dtype", dtype)
        self.settings = MRopeSettings(head_dim, base=base, max_seq_len=max_seq_len, scaling=scaling,
                                      mrope_section=mrope_section, mrope_layout=mrope_layout, qk_layout=qk_layout,
                                      num_heads=num_heads)
        st = self.settings
        self.head_dim, self.max_seq_len, self.qk_layout, self.num_heads = st.head_dim, st.max_seq_len, \
            st.qk_layout, st.num_heads
        self.inv_freq, self.attention_factor, self.axis_map = st.inv_freq, st.attention_factor, st.axis_map
        self._last: RotaryCache | None = None

    @classmethod
    def from_hf_config(cls, config: Any, **kwargs: Any) -> MRotaryEmbedding:
        """Build from a Qwen2-VL / Qwen2.5-VL / Qwen3-VL config (or its ``text_config``)."""
        return cls(**{**mrope_kwargs_from_hf_config(config), **kwargs})

    def cos_sin(self, positions: Any) -> tuple[np.ndarray, np.ndarray]:
        """cos, sin (..., L, Dh) float64 of positions (3, ..., L) or text positions (..., L)."""
        return mrope_cos_sin(mrope_positions(positions), self.inv_freq, self.axis_map,
                             attention_factor=self.attention_factor)

    def _positions(self, positions: Any, start_pos: Any, batch: int, length: int) -> np.ndarray:
        """M-RoPE's positions (3, ..., L) of a (B, H, L, Dh) array (the base's, on three axes): start_pos +
        arange(L) on every axis when ``positions`` is None, else (3, B | 1, L) or text positions (B | 1, L) |
        (L,) repeated on the three axes; given ones need ``start_pos`` 0."""
        if positions is None:
            start_pos = check_start_pos(start_pos, length)
            return mrope_positions(np.arange(start_pos, start_pos + length, dtype=np.int64))
        check_start_pos_with_positions(start_pos, positions)
        pos = mrope_positions(positions)                   # (3, ..., L); its own messages for other ranks
        check_mrope_positions_shape(np.shape(positions), batch, length)
        return pos

    def _tables(self, pos: np.ndarray, dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
        ang = mrope_angles(pos, self.inv_freq, self.axis_map)              # (L, F) | (B, L, F) float64
        return (np.cos(ang) * self.attention_factor).astype(dtype), (np.sin(ang) * self.attention_factor).astype(dtype)

    def rotate(self, x: Any, positions: Any = None, *, start_pos: int = 0, seq_len: Any = None) -> np.ndarray:
        """Rotate one tensor x (B, H, L, Dh) at positions (3, B, L) | (B, L) | (L,) | None (start_pos + arange;
        given positions need start_pos=0, else ConfigError), as the torch layer; nothing is kept (as
        ``RotaryEmbedding.rotate``). ``seq_len``: accepted for the common signature (static frequencies)."""
        x = to_bhld("x", x, self.head_dim, self.qk_layout, self.num_heads)
        cos, sin = self._tables(self._positions(positions, start_pos, x.shape[0], x.shape[2]), x.dtype)
        return self._out(F.rope_forward(x, cos, sin, interleaved=False)[0])

    def _rotate_bhld(self, q: np.ndarray, k: np.ndarray, positions: Any, start_pos: Any, key_positions: Any
                     ) -> tuple[np.ndarray, np.ndarray, RotaryCache]:
        """q, k (B, H, L, Dh) rotated: one functional pass over q and k at the same positions; with
        ``key_positions`` (Lk,) | (3, B, Lk) | ... (a KV cache, as the attention functions pass) k is
        rotated at its own positions. Given ``positions`` need ``start_pos=0`` (else ConfigError)."""
        pos_q, pos_k = self._qk_positions(q, k, positions, start_pos, key_positions)
        tables_q = self._tables(pos_q, q.dtype)
        if key_positions is None and q.dtype == k.dtype:
            return self._rotate_pair(q, k, tables_q, None, False)
        return self._rotate_pair(q, k, tables_q, self._tables(pos_k, k.dtype), False)

    def extra_repr(self) -> str:
        return (f"head_dim={self.head_dim}, mrope_section={self.settings.mrope_section}, "
                f"mrope_layout={self.settings.mrope_layout!r}, qk_layout={self.qk_layout!r}")
