"""XPosRotaryEmbedding (xPos) for the torch backend: the NumPy twin's scaled tables through ``tokenpos::rope``.

Shapes: B batch, H heads, L length, Dh head dim, R rotary dim, F = R / 2. q, k: (B, H, L, Dh);
positions (L,) / (1, L) / (B, L). Angles and scales are computed per call in float64 (float32 on MPS),
the scale by the one xPos formula of ``tokenpos.tables.formulas.xpos`` (``xpos_scale_of``, written for NumPy
arrays and tensors alike); q and k each go through one ``tokenpos::rope`` op with their own scaled
tables (autograd registered).
"""

from __future__ import annotations

from typing import Any

import torch

from tokenpos.tables.checks.rope import check_qk_layout
from tokenpos.tables.checks.rotary_layers import XPOS_TOGETHER_MESSAGE, check_xpos_packed_start, xpos_layer_args
from tokenpos.tables.errors import ConfigError
from tokenpos.tables.formulas.rope import rope_inv_freq
from tokenpos.tables.formulas.xpos import xpos_center, xpos_scale_of, xpos_scaled_tables, xpos_zeta
from tokenpos.torch._checks import resolve_dtype
from tokenpos.torch._rotary_base import RotaryBase


def _document_centres(pos: torch.Tensor) -> torch.Tensor:
    """``tables.formulas.xpos.xpos_document_centres`` in torch ops of fixed sizes (no host sync): packed
    positions (any shape, tokens in order), restarting at 0 per document -> each token's document
    length // 2, the same shape."""
    flat = pos.reshape(-1)
    doc = torch.cumsum(flat == 0, 0) - 1                                   # (T,) the token's document
    lengths = torch.zeros_like(flat).scatter_reduce(0, doc, flat + 1, "amax")
    return (lengths[doc] // 2).view(pos.shape)


class XPosRotaryEmbedding(RotaryBase):
    """xPos (see the NumPy twin for the arguments); ``device`` places the tables, ``dtype`` is accepted.

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
                 num_heads: int | None = None, seed: Any = None, rng: Any = None, device: Any = None,
                 dtype: Any = None) -> None:
        super().__init__()
        resolve_dtype(dtype)                 # checked as the NumPy twin does; outputs follow the input dtype
        self.head_dim, self.rotary_dim, self.scale_base, self.center, self.interleaved = xpos_layer_args(
            head_dim, rotary_dim, scale_base, center, interleaved)
        self.qk_layout, self.num_heads = check_qk_layout(qk_layout, num_heads)
        self.base = float(base)
        self.zeta: torch.Tensor
        self._register_empty(device, inv_freq=((0,), None), zeta=((0,), None))
        self.reset_parameters()

    def _load_tables(self) -> None:
        """(Re)load the frequencies and the per-pair zeta from ``tokenpos.tables``."""
        self.inv_freq = self._table(rope_inv_freq(self.rotary_dim, base=self.base)[0])
        self.zeta = self._table(xpos_zeta(self.rotary_dim))

    def tables(self, pos: torch.Tensor, length: int) -> tuple[torch.Tensor, ...]:
        """``(cos_q, sin_q, cos_k, sin_k)`` (..., F) in float64 for an int tensor of positions (...), the
        centre that of a call of ``length`` (``center``, or ``length // 2``)."""
        return self._tables_at(pos, xpos_center(self.center, length))

    def _tables_at(self, pos: torch.Tensor, centre: Any) -> tuple[torch.Tensor, ...]:
        p = pos.to(self.inv_freq.dtype)
        ang = p[..., None] * self.inv_freq
        c = centre.to(p.dtype) if isinstance(centre, torch.Tensor) else centre
        s = xpos_scale_of(self.zeta, p, scale_base=self.scale_base, center=c)
        return xpos_scaled_tables(torch.cos(ang), torch.sin(ang), s)

    def rotate(self, x: Any, positions: Any = None, *, start_pos: int = 0, seq_len: Any = None) -> Any:
        """Refused: xPos scales q and k differently, so one tensor alone is ambiguous (use :meth:`apply`;
        in the attention functions pass ``positions=`` so they call ``apply``)."""
        raise ConfigError(XPOS_TOGETHER_MESSAGE)

    def _packed_positions(self, q: torch.Tensor, positions: Any, start_pos: Any, key_positions: Any,
                          cu_seqlens: Any) -> tuple[torch.Tensor, int | None]:
        """The base's, every document counted from 0 (:func:`check_xpos_packed_start`)."""
        check_xpos_packed_start(start_pos)
        return super()._packed_positions(q, positions, start_pos, key_positions, cu_seqlens)

    def _rotate_packed(self, q: torch.Tensor, k: torch.Tensor, pos: torch.Tensor, end: int | None
                       ) -> tuple[torch.Tensor, torch.Tensor]:
        """q, k packed views at the packed positions (their (B, L)): every document scaled around its own
        centre (``center``, or its length // 2), as if it were run alone; on the device (no host sync)."""
        centre = _document_centres(pos) if self.center is None else self.center
        cq, sq, ck, sk = self._tables_at(pos, centre)
        return self._rotate_pair(q, k, (cq, sq), (ck, sk), self.interleaved)

    def _rotate_bhld(self, q: torch.Tensor, k: torch.Tensor, positions: Any, start_pos: Any, key_positions: Any
                     ) -> tuple[torch.Tensor, torch.Tensor]:
        """q (B, H, Lq, Dh) and k (B, Hk, Lk, Dh) rotated and scaled. q at ``positions`` (default
        start_pos + arange(Lq); given positions need ``start_pos=0``, else ConfigError); k at q's
        positions (Lq == Lk), or at ``key_positions`` (Lk,) | (1, Lk) | (B, Lk): a KV cache of keys
        before rotation. One centre for q and k (``center``, or ``Lk // 2``: a decode step over the
        cache gets the tables of the full call over the same keys), so a score depends on the
        distance only."""
        pos_q, pos_k = self._qk_positions(q, k, positions, start_pos, key_positions)
        centre = xpos_center(self.center, k.shape[2])
        cq, sq, ck, sk = self._tables_at(pos_q, centre)
        if key_positions is not None:
            _, _, ck, sk = self._tables_at(pos_k, centre)
        return self._rotate_pair(q, k, (cq, sq), (ck, sk), self.interleaved)

    def extra_repr(self) -> str:
        return (f"head_dim={self.head_dim}, rotary_dim={self.rotary_dim}, base={self.base}, "
                f"scale_base={self.scale_base}, interleaved={self.interleaved}, center={self.center}")
