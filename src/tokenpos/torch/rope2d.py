"""2-D patch positions for the torch backend: axial 2-D RoPE (Pixtral) and the 2-D sin-cos table (ViT-MAE).

Shapes: B batch, H heads, N patches, Dh head dim, F = Dh / 2, D model dim. q, k: (B, H, N, Dh);
positions (N, 2) or (B, N, 2) (row, col). Angles in float64 (float32 on MPS) from the frequencies of
``tokenpos.tables.formulas.rope2d``; one ``tokenpos::rope_qk`` op call per ``apply`` (half layout).
"""

from __future__ import annotations

from typing import Any

import torch

from tokenpos.tables.checks.rope import check_qk_layout, check_qk_lengths
from tokenpos.tables.checks.rotary_layers import check_rope2d_positions_given, check_rope2d_positions_shape
from tokenpos.tables.formulas.rope2d import rope2d_inv_freq, rope2d_layer_args, sincos_2d_table
from tokenpos.tables.hf.models import rope2d_args_from_hf_config
from tokenpos.torch._checks import as_index, check_position_tensor, check_seq_len, is_seq_len, resolve_dtype
from tokenpos.torch._checks import calc_dtype as _calc
from tokenpos.torch._module import TokenposModule
from tokenpos.torch._rotary_base import RotaryBase


class RotaryEmbedding2D(RotaryBase):
    """Axial 2-D RoPE over (row, col) patch positions, as HF Pixtral (see the NumPy twin).

    Shape:
        apply(q (B, Hq, N, Dh), k (B, Hk, N, Dh), positions (N, 2) | (B, N, 2)) -> (q', k').
    """

    kind = "rotary"
    takes_token_positions = False    # (row, column) pairs: packed attention cannot derive them
    name = "rope2d"

    def __init__(self, head_dim: int, *, base: float = 10000.0, qk_layout: str = "bhld", num_heads: int | None = None,
                 seed: Any = None, rng: Any = None, device: Any = None, dtype: Any = None) -> None:
        super().__init__()
        resolve_dtype(dtype)                 # checked as the NumPy twin does; outputs follow the input dtype
        self.head_dim, self.base = rope2d_layer_args(head_dim, base)[:2]    # checks head_dim % 4
        self.qk_layout, self.num_heads = check_qk_layout(qk_layout, num_heads)
        self.axis_map: torch.Tensor
        self._register_empty(device, inv_freq=((0,), None), axis_map=((0,), torch.long))
        self.reset_parameters()

    def _load_tables(self) -> None:
        """(Re)load the frequencies and the axis map from ``tokenpos.tables``."""
        inv, axis = rope2d_inv_freq(self.head_dim, base=self.base)
        self.inv_freq = self._table(inv)
        self.axis_map = torch.from_numpy(axis).to(self.inv_freq.device)

    @classmethod
    def from_hf_config(cls, config: Any, **kwargs: Any) -> RotaryEmbedding2D:
        """From an HF ``PixtralVisionConfig`` (``rope_parameters`` of type "axial")."""
        head_dim, base = rope2d_args_from_hf_config(config)
        return cls(head_dim, base=base, **kwargs)

    def cos_sin(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin (..., N, F) of (row, col) positions (..., N, 2): one entry per rotated pair."""
        pos = positions.movedim(-1, 0)[self.axis_map]                         # (F, ..., N)
        ang = pos.to(self.inv_freq.dtype).movedim(0, -1) * self.inv_freq      # (..., N, F)
        return torch.cos(ang), torch.sin(ang)

    def rotate(self, x: Any, positions: Any = None, *, start_pos: Any = None, seq_len: Any = None) -> torch.Tensor:
        """Rotate one tensor x (B, H, N, Dh) at (row, col) positions (N, 2) | (B, N, 2) (``start_pos``:
        None or 0, as :meth:`apply`)."""
        return self.apply(x, x, positions, start_pos=start_pos)[0]  # type: ignore[no-any-return]

    def apply(self, q: Any, k: Any = None, positions: Any = None, *, start_pos: Any = None,  # type: ignore[override]
              key_positions: Any = None, cu_seqlens: Any = None) -> Any:
        """Rotate q and k at (row, col) positions (explicit, so ``start_pos`` must be None or 0, else
        ConfigError: it would be ignored; ``key_positions`` must equal them); ``apply(fn)`` is nn.Module's."""
        return super().apply(q, k, positions, start_pos=start_pos, key_positions=key_positions,
                             cu_seqlens=cu_seqlens)

    forward = apply

    def _rotate_bhld(self, q: torch.Tensor, k: torch.Tensor, positions: Any, start_pos: Any, key_positions: Any
                     ) -> tuple[torch.Tensor, torch.Tensor]:
        """q, k (B, H, N, Dh) rotated at the same (row, col) positions (``start_pos``: None or 0;
        ``key_positions``, if given, must equal them)."""
        check_qk_lengths(tuple(q.shape), tuple(k.shape), self.qk_layout)
        check_rope2d_positions_given(positions, start_pos)
        pos = check_position_tensor(positions, device=self.inv_freq.device)
        check_rope2d_positions_shape(tuple(pos.shape), q.shape[0], q.shape[2])
        self._same_key_positions("2-D RoPE", pos, key_positions)
        tables = self.cos_sin(pos)
        return self._rotate_pair(q, k, tables, None if q.dtype == k.dtype else tables, False)

    def extra_repr(self) -> str:
        return f"head_dim={self.head_dim}, base={self.base}, qk_layout={self.qk_layout!r}"


class SinCos2DPositionalEncoding(TokenposModule):
    """The fixed 2-D sin-cos table of an (H, W) patch grid (ViT-MAE) as a non-persistent float64 buffer
    ``table64``; row p is patch p in row-major order (after the CLS row when ``cls_token``).

    An additive scheme (``TransformerEmbedding(positional=...)``): ``table`` is the (P, D) table in the
    layer's dtype, P = ``max_seq_len`` = H * W [+ 1]; a position >= P has no row (PositionError).

    Shape:
        forward() -> (P, D); forward(L) -> (L, D); forward(positions (...)) -> (..., D): in the layer's
        dtype, rounded once from float64, a fresh tensor.
    """

    kind = "additive"
    name = "sincos2d"
    extends = False          # a patch grid: positions >= H * W [+ 1] have no row
    padding_idx = None

    def __init__(self, height: int, width: int, d_model: int, *, base: float = 10000.0, cls_token: bool = False,
                 seed: Any = None, rng: Any = None, device: Any = None, dtype: Any = None) -> None:
        super().__init__()
        self.height, self.width, self.d_model, self.cls_token, self.base = height, width, d_model, cls_token, base
        self.max_seq_len = height * width + int(bool(cls_token))
        self.out_dtype = resolve_dtype(dtype)
        dev = torch.empty(0, device=device).device
        self.table64: torch.Tensor
        self.register_buffer("table64", torch.empty(0, device=dev, dtype=_calc(dev)), persistent=False)
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self, *, seed: Any = None, rng: Any = None) -> None:
        """(Re)compute the table from ``tokenpos.tables`` (no randomness)."""
        if self.table64.is_meta:
            return
        t = sincos_2d_table(self.height, self.width, self.d_model, base=self.base, cls_token=self.cls_token)
        self.table64 = torch.from_numpy(t).to(self.table64.device, _calc(self.table64.device))

    @property
    def table(self) -> torch.Tensor:
        """The (P, D) table in the layer's dtype (rounded once from float64)."""
        return self.table64.to(self.out_dtype)

    def forward(self, seq_len_or_positions: Any = None) -> torch.Tensor:
        """The whole table, its first L rows, or its rows at positions; never a view of the buffer."""
        if seq_len_or_positions is None:
            return self.table64.to(self.out_dtype, copy=True)
        if is_seq_len(seq_len_or_positions):
            return self.table64[:check_seq_len(seq_len_or_positions, self.max_seq_len)].to(self.out_dtype, copy=True)
        pos = check_position_tensor(seq_len_or_positions, self.max_seq_len, device=self.table64.device)
        return self.table64[as_index(pos)].to(self.out_dtype)
