"""MRotaryEmbedding (M-RoPE: Qwen2-VL / Qwen2.5-VL section layout, Qwen3-VL interleaved layout), torch.

Shapes: B batch, H heads, L length, Dh head dim, F = Dh / 2. q, k: (B, H, L, Dh) (or (B, L, H, Dh)
with ``qk_layout="blhd"``); positions (3, B, L) / (3, 1, L) or text positions (B, L) / (1, L) / (L,).

Angles, cos and sin are computed per call in float64 (float32 on MPS) from the frequencies of
``tokenpos.tables``, one entry per pair, and rotate through one ``tokenpos::rope_qk`` op call (fused
CPU kernel / Triton / plain torch; registered autograd).
No cache, so nothing is shared between threads.
"""

from __future__ import annotations

from typing import Any

import torch

from tokenpos.tables.checks.rotary_layers import check_mrope_positions_shape
from tokenpos.tables.checks.validation import check_start_pos, check_start_pos_with_positions
from tokenpos.tables.formulas.mrope import MRopeSettings
from tokenpos.tables.hf.models import mrope_kwargs_from_hf_config
from tokenpos.torch import ops
from tokenpos.torch._checks import check_position_tensor, resolve_dtype
from tokenpos.torch._rotary_base import RotaryBase


class MRotaryEmbedding(RotaryBase):
    """Multimodal RoPE: each frequency reads the temporal, height or width position (see the NumPy twin).

    Shape:
        apply(q (B, Hq, L, Dh), k (B, Hk, L, Dh), positions (3, B, L) | (B, L) | (L,) | None) -> (q', k').
    """

    kind = "rotary"
    name = "mrope"

    def __init__(self, head_dim: int, *, mrope_section: Any, mrope_layout: str = "sections", base: float = 10000.0,
                 max_seq_len: int = 2048, scaling: Any = None, qk_layout: str = "bhld", num_heads: int | None = None,
                 seed: Any = None, rng: Any = None, device: Any = None, dtype: Any = None) -> None:
        super().__init__()
        resolve_dtype(dtype)                 # checked as the NumPy twin does; outputs follow the input dtype
        self.settings = MRopeSettings(head_dim, base=base, max_seq_len=max_seq_len, scaling=scaling,
                                      mrope_section=mrope_section, mrope_layout=mrope_layout, qk_layout=qk_layout,
                                      num_heads=num_heads)
        st = self.settings
        self.head_dim, self.max_seq_len, self.qk_layout, self.num_heads = st.head_dim, st.max_seq_len, \
            st.qk_layout, st.num_heads
        self.attention_factor = st.attention_factor
        self.axis_map: torch.Tensor
        self._register_empty(device, inv_freq=((0,), None), axis_map=((0,), torch.long))
        self.reset_parameters()

    def _load_tables(self) -> None:
        """(Re)load the frequencies and the axis map from ``tokenpos.tables``."""
        self.inv_freq = self._table(self.settings.inv_freq)
        self.axis_map = torch.from_numpy(self.settings.axis_map).to(self.inv_freq.device)

    @classmethod
    def from_hf_config(cls, config: Any, **kwargs: Any) -> MRotaryEmbedding:
        """Build from a Qwen2-VL / Qwen2.5-VL / Qwen3-VL config (or its ``text_config``)."""
        return cls(**{**mrope_kwargs_from_hf_config(config), **kwargs})

    def _pairs(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin (..., L, F) in float64 of positions (3, ..., L): one entry per rotated pair."""
        ang = positions[self.axis_map].to(self.inv_freq.dtype).movedim(0, -1) * self.inv_freq   # (..., L, F)
        return torch.cos(ang) * self.attention_factor, torch.sin(ang) * self.attention_factor

    def cos_sin(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin (..., L, Dh) in float64 of positions (3, ..., L), half layout (as HF returns them)."""
        cos, sin = self._pairs(positions)
        return torch.cat((cos, cos), -1), torch.cat((sin, sin), -1)

    def _positions(self, positions: Any, start_pos: Any, batch: int, length: int) -> torch.Tensor:
        """M-RoPE's positions (3, ..., L) of a (B, H, L, Dh) tensor (the base's, on three axes): start_pos +
        arange(L) on every axis when ``positions`` is None, else (3, B | 1, L) or text positions (B | 1, L) |
        (L,) repeated on the three axes; given ones need ``start_pos`` 0."""
        if positions is None:
            start_pos = check_start_pos(start_pos, length)
            pos = torch.arange(start_pos, start_pos + length, device=self.inv_freq.device)
        else:
            check_start_pos_with_positions(start_pos, positions)
            pos = check_position_tensor(positions, device=self.inv_freq.device)
        check_mrope_positions_shape(tuple(pos.shape), batch, length)
        return pos if pos.dim() == 3 else pos.expand(3, *pos.shape)

    def rotate(self, x: Any, positions: Any = None, *, start_pos: int = 0, seq_len: Any = None) -> torch.Tensor:
        """Rotate one tensor x (B, H, L, Dh) at positions (3, B, L) | (B, L) | (L,) | None (start_pos + arange;
        given positions need start_pos=0, else ConfigError)."""
        x = self._check("x", x)
        cos, sin = self._pairs(self._positions(positions, start_pos, x.shape[0], x.shape[2]))
        return self._out(ops.rotate(x, self._op_tables(cos, x), self._op_tables(sin, x), False))

    def _rotate_bhld(self, q: torch.Tensor, k: torch.Tensor, positions: Any, start_pos: Any, key_positions: Any
                     ) -> tuple[torch.Tensor, torch.Tensor]:
        """q, k (B, H, L, Dh) rotated (one ``tokenpos::rope_qk`` call); ``key_positions`` rotates k at its
        own positions (a KV cache)."""
        pos_q, pos_k = self._qk_positions(q, k, positions, start_pos, key_positions)
        tables_q = self._pairs(pos_q)                                        # (B|1, L, F) | (L, F)
        if key_positions is None:
            return self._rotate_pair(q, k, tables_q, None if q.dtype == k.dtype else tables_q, False)
        return self._rotate_pair(q, k, tables_q, self._pairs(pos_k), False)

    def extra_repr(self) -> str:
        return (f"head_dim={self.head_dim}, mrope_section={self.settings.mrope_section}, "
                f"mrope_layout={self.settings.mrope_layout!r}, qk_layout={self.qk_layout!r}")
