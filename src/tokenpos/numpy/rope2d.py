"""2-D patch positions for the NumPy backend: axial 2-D RoPE (Pixtral) and the 2-D sin-cos table (ViT-MAE).

Shapes: B batch, H heads, N patches, Dh head dim, F = Dh / 2, D model dim. q, k: (B, H, N, Dh);
positions (N, 2) or (B, N, 2) (row, col). The rotation runs through ``functional.rope_qk_forward``
(half layout) with cos / sin (N, F) or (B, N, F) from ``tokenpos.tables.formulas.rope2d`` in float64.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tokenpos.numpy import functional as F
from tokenpos.numpy._rotary_base import RotaryBase, RotaryCache, to_bhld
from tokenpos.numpy.module import Module
from tokenpos.tables.checks.rope import check_qk_layout, check_qk_lengths, check_same_key_positions
from tokenpos.tables.checks.rotary_layers import (
    check_positions_2d,
    check_rope2d_positions_given,
    check_rope2d_positions_shape,
)
from tokenpos.tables.checks.validation import check_dtype, check_positions, check_seq_len_or_positions
from tokenpos.tables.formulas.mrope import mrope_angles
from tokenpos.tables.formulas.rope2d import rope2d_layer_args, sincos_2d_table
from tokenpos.tables.hf.models import rope2d_args_from_hf_config


class RotaryEmbedding2D(RotaryBase):
    """Axial 2-D RoPE over (row, col) patch positions, as HF Pixtral.

    Args:
        head_dim: Dh (divisible by 4). base: rope_theta. qk_layout, num_heads: as RotaryEmbedding.
        seed, rng: accepted for the common scheme signature; no random state.
        dtype: as RotaryEmbedding (checked; outputs follow the input dtype).

    Shape:
        apply(q (B, Hq, N, Dh), k (B, Hk, N, Dh), positions (N, 2) | (B, N, 2)) -> (q', k');
        rotate(x (B, H, N, Dh), positions (N, 2) | (B, N, 2)) -> x' (one tensor).
    """

    kind = "rotary"
    takes_token_positions = False    # (row, column) pairs: packed attention cannot derive them
    name = "rope2d"

    def __init__(self, head_dim: int, *, base: float = 10000.0, qk_layout: str = "bhld", num_heads: int | None = None,
                 seed: Any = None, rng: Any = None, dtype: Any = None) -> None:
        super().__init__()
        check_dtype("dtype", dtype)
        self.head_dim, self.base, self.inv_freq, self.axis_map = rope2d_layer_args(head_dim, base)
        self.qk_layout, self.num_heads = check_qk_layout(qk_layout, num_heads)
        self._last: RotaryCache | None = None

    @classmethod
    def from_hf_config(cls, config: Any, **kwargs: Any) -> RotaryEmbedding2D:
        """From an HF ``PixtralVisionConfig`` (``rope_parameters`` of type "axial")."""
        head_dim, base = rope2d_args_from_hf_config(config)
        return cls(head_dim, base=base, **kwargs)

    def cos_sin(self, positions: Any) -> tuple[np.ndarray, np.ndarray]:
        """cos, sin (..., N, F) float64 of (row, col) positions (..., N, 2): one entry per rotated pair."""
        ang = mrope_angles(np.moveaxis(check_positions_2d(positions), -1, 0), self.inv_freq, self.axis_map)
        return np.cos(ang), np.sin(ang)

    def rotate(self, x: Any, positions: Any = None, *, start_pos: Any = None, seq_len: Any = None) -> np.ndarray:
        """Rotate one tensor x (B, H, N, Dh) at (row, col) positions (N, 2) | (B, N, 2) (``start_pos``: None
        or 0, as :meth:`apply`), as the torch layer; nothing is kept (as ``RotaryEmbedding.rotate``)."""
        x = to_bhld("x", x, self.head_dim, self.qk_layout, self.num_heads)
        check_rope2d_positions_given(positions, start_pos)
        pos = check_positions(positions)
        check_rope2d_positions_shape(pos.shape, x.shape[0], x.shape[2])
        cos, sin = self.cos_sin(pos)
        return self._out(F.rope_forward(x, cos.astype(x.dtype), sin.astype(x.dtype), interleaved=False)[0])

    def _rotate_bhld(self, q: np.ndarray, k: np.ndarray, positions: Any, start_pos: Any, key_positions: Any
                     ) -> tuple[np.ndarray, np.ndarray, RotaryCache]:
        """q, k (B, H, N, Dh) rotated at the same (row, col) positions (explicit, so ``start_pos`` must be
        None or 0, else ConfigError: it would be ignored; ``key_positions``, if given, must equal them)."""
        check_qk_lengths(q.shape, k.shape, self.qk_layout)
        check_rope2d_positions_given(positions, start_pos)
        pos = check_positions(positions)
        check_rope2d_positions_shape(pos.shape, q.shape[0], q.shape[2])
        check_same_key_positions("2-D RoPE", pos, key_positions)
        cos, sin = self.cos_sin(pos)                                       # float64, cast once per tensor dtype
        tables_k = None if q.dtype == k.dtype else (cos.astype(k.dtype), sin.astype(k.dtype))
        return self._rotate_pair(q, k, (cos.astype(q.dtype), sin.astype(q.dtype)), tables_k, False)

    def apply_forward(self, q: Any, k: Any, positions: Any, *, start_pos: Any = None,  # type: ignore[override]
                      key_positions: Any = None, cu_seqlens: Any = None) -> tuple[np.ndarray, np.ndarray, RotaryCache]:
        """``(q', k', cache)`` (see :meth:`_rotate_bhld`; ``start_pos``: None or 0; ``cu_seqlens``: refused)."""
        return super().apply_forward(q, k, positions, start_pos=start_pos, key_positions=key_positions,
                                     cu_seqlens=cu_seqlens)

    def apply(self, q: Any, k: Any = None, positions: Any = None, *, start_pos: Any = None,  # type: ignore[override]
              key_positions: Any = None, cu_seqlens: Any = None) -> tuple[np.ndarray, np.ndarray | None]:
        """Rotate q and k at (row, col) positions (``start_pos``: None or 0, as :meth:`apply_forward`);
        keeps what :meth:`backward` needs. ``k`` None: (q', None)."""
        return super().apply(q, k, positions, start_pos=start_pos, key_positions=key_positions,
                             cu_seqlens=cu_seqlens)

    forward = apply  # type: ignore[assignment]

    def extra_repr(self) -> str:
        return f"head_dim={self.head_dim}, base={self.base}, qk_layout={self.qk_layout!r}"


class SinCos2DPositionalEncoding(Module):
    """The fixed 2-D sin-cos table of an (H, W) patch grid (ViT-MAE), added to patch embeddings; row p is
    patch p in row-major order (after the CLS row when ``cls_token``).

    An additive scheme (``TransformerEmbedding(positional=...)``): ``table`` is the (P, D) table in
    ``dtype``, P = ``max_seq_len`` = H * W [+ 1]; a position >= P has no row (PositionError).

    Shape:
        forward() -> (P, D); forward(L) -> (L, D); forward(positions (...)) -> (..., D), in ``dtype``; the
        table is computed in float64 and rounded once.
    """

    kind = "additive"
    name = "sincos2d"
    extends = False          # a patch grid: positions >= H * W [+ 1] have no row
    padding_idx = None
    table_param = None       # a fixed table: no gradient

    def __init__(self, height: int, width: int, d_model: int, *, base: float = 10000.0, cls_token: bool = False,
                 dtype: Any = np.float32, seed: Any = None, rng: Any = None) -> None:
        super().__init__()
        self.table64 = sincos_2d_table(height, width, d_model, base=base, cls_token=cls_token)
        self.dtype = check_dtype("dtype", dtype)
        self.table = self.table64.astype(self.dtype)                          # (P, D), read by the embedding op
        self.height, self.width, self.d_model, self.cls_token = height, width, d_model, cls_token
        self.max_seq_len = self.table.shape[0]

    def reset_parameters(self, *, seed: Any = None, rng: Any = None) -> None:
        """Nothing to reset (a fixed table)."""

    def forward(self, seq_len_or_positions: Any = None) -> np.ndarray:
        """A fresh copy of the whole table, of its first L rows, or of its rows at positions: changing it
        never changes the layer."""
        if seq_len_or_positions is None:
            return self.table64.astype(self.dtype)
        pos = check_seq_len_or_positions(seq_len_or_positions, self.max_seq_len)
        return self.table64[pos].astype(self.dtype)

    def backward(self, grad_output: Any) -> None:
        """The table is fixed: no parameter gradient, no input gradient."""
        return None
