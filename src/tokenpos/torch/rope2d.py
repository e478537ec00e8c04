"""2-D patch positions for the torch backend: axial 2-D RoPE (Pixtral) and the 2-D sin-cos table (ViT-MAE).

Shapes: B batch, H heads, N patches, Dh head dim, F = Dh / 2, D model dim. q, k: (B, H, N, Dh);
positions (N, 2) or (B, N, 2) (row, col). Angles in float64 (float32 on MPS) from the frequencies of
``tokenpos.tables.rope2d``; one ``tokenpos::rope_qk`` op call per ``apply`` (half layout).
"""

from __future__ import annotations

from typing import Any

import torch

from tokenpos.tables.errors import ConfigError
from tokenpos.tables.rope import check_qk_layout, check_same_key_positions, rope_length_message
from tokenpos.tables.rope2d import rope2d_inv_freq, sincos_2d_table
from tokenpos.tables.validation import check_float, check_int
from tokenpos.torch import ops
from tokenpos.torch._checks import check_position_tensor
from tokenpos.torch._module import TokenposModule
from tokenpos.torch.rotary import to_bhld


def _calc(device: torch.device) -> torch.dtype:
    return torch.float32 if device.type == "mps" else torch.float64


class RotaryEmbedding2D(TokenposModule):
    """Axial 2-D RoPE over (row, col) patch positions, as HF Pixtral (see the NumPy twin).

    Shape:
        apply(q (B, Hq, N, Dh), k (B, Hk, N, Dh), positions (N, 2) | (B, N, 2)) -> (q', k').
    """

    kind = "rotary"
    name = "rope2d"

    def __init__(self, head_dim: int, *, base: float = 10000.0, qk_layout: str = "bhld", num_heads: int | None = None,
                 seed: Any = None, rng: Any = None, device: Any = None, dtype: Any = None) -> None:
        super().__init__()
        self.head_dim, self.base = check_int("head_dim", head_dim, minimum=4), check_float("base", base, low=1.0)
        rope2d_inv_freq(self.head_dim, base=self.base)                       # checks head_dim % 4
        self.qk_layout, self.num_heads = check_qk_layout(qk_layout, num_heads)
        dev = torch.empty(0, device=device).device
        self.inv_freq: torch.Tensor
        self.axis_map: torch.Tensor
        self.register_buffer("inv_freq", torch.empty(0, device=dev, dtype=_calc(dev)), persistent=False)
        self.register_buffer("axis_map", torch.empty(0, device=dev, dtype=torch.long), persistent=False)
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self, *, seed: Any = None, rng: Any = None) -> None:
        """(Re)load the frequencies and the axis map from ``tokenpos.tables`` (no randomness)."""
        if self.inv_freq.is_meta:
            return
        inv, axis = rope2d_inv_freq(self.head_dim, base=self.base)
        dev = self.inv_freq.device
        self.inv_freq = torch.from_numpy(inv).to(dev, _calc(dev))
        self.axis_map = torch.from_numpy(axis).to(dev)

    def _apply(self, fn: Any, recurse: bool = True) -> Any:
        out = super()._apply(fn, recurse)             # .half() must not cast the frequencies: reload them
        if not self.inv_freq.is_meta and self.inv_freq.dtype not in (torch.float64, torch.float32):
            self.reset_parameters()
        return out

    @classmethod
    def from_hf_config(cls, config: Any, **kwargs: Any) -> RotaryEmbedding2D:
        """From an HF ``PixtralVisionConfig`` (``rope_parameters`` of type "axial")."""
        params = dict(getattr(config, "rope_parameters", None) or {})
        if params.get("rope_type", "axial") != "axial" or set(params) - {"rope_type", "rope_theta"}:
            raise ConfigError(f"2-D RoPE reads rope_parameters {{'rope_type': 'axial', 'rope_theta'}}, got {params}")
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        return cls(int(head_dim), base=float(params.get("rope_theta", 10000.0)), **kwargs)

    def cos_sin(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin (..., N, F) of (row, col) positions (..., N, 2): one entry per rotated pair."""
        pos = positions.movedim(-1, 0)[self.axis_map]                         # (F, ..., N)
        ang = pos.to(self.inv_freq.dtype).movedim(0, -1) * self.inv_freq      # (..., N, F)
        return torch.cos(ang), torch.sin(ang)

    def rotate(self, x: Any, positions: Any = None, *, start_pos: Any = None, seq_len: Any = None) -> torch.Tensor:
        """Rotate one tensor x (B, H, N, Dh) at (row, col) positions (N, 2) | (B, N, 2)."""
        return self.apply(x, x, positions)[0]  # type: ignore[no-any-return]

    def apply(self, q: Any, k: Any = None, positions: Any = None, *, start_pos: Any = None,  # type: ignore[override]
              key_positions: Any = None) -> Any:
        """Rotate q and k at (row, col) positions (``start_pos`` ignored; ``key_positions`` must equal them);
        ``apply(fn)`` is nn.Module's."""
        if k is None and callable(q) and not isinstance(q, torch.Tensor):
            return super().apply(q)
        q = to_bhld("q", q, self.head_dim, self.qk_layout, self.num_heads)
        k = to_bhld("k", k, self.head_dim, self.qk_layout, self.num_heads)
        if q.shape[0] != k.shape[0] or q.shape[2] != k.shape[2]:
            raise ConfigError(rope_length_message(tuple(q.shape), tuple(k.shape)))
        if positions is None:
            raise ConfigError("2-D RoPE needs positions of shape (N, 2) or (B, N, 2) (row, col); got None")
        pos = check_position_tensor(positions, device=self.inv_freq.device)
        shape = tuple(pos.shape)
        if len(shape) not in (2, 3) or shape[-1] != 2 or shape[-2] != q.shape[2] or (
                len(shape) == 3 and shape[0] not in (1, q.shape[0])):
            raise ConfigError(f"positions must have shape ({q.shape[2]}, 2) or ({q.shape[0]}, {q.shape[2]}, 2), "
                              f"got {shape}")
        if key_positions is not None:
            check_same_key_positions("2-D RoPE", pos.cpu().numpy(),
                                     check_position_tensor(key_positions, device=pos.device).cpu().numpy())
        cos, sin = self.cos_sin(pos)

        def cast(t: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
            return t.to(x.dtype) if x.dtype in (torch.float32, torch.float64) else t

        if q.dtype == k.dtype:
            q_out, k_out = ops.rotate_qk(q, k, cast(cos, q), cast(sin, q), False)
        else:
            q_out, k_out = ops.rotate(q, cast(cos, q), cast(sin, q), False), ops.rotate(k, cast(cos, k), cast(sin, k),
                                                                                       False)
        if self.qk_layout == "blhd":
            return q_out.transpose(1, 2), k_out.transpose(1, 2)
        return q_out, k_out

    forward = apply

    def extra_repr(self) -> str:
        return f"head_dim={self.head_dim}, base={self.base}, qk_layout={self.qk_layout!r}"


class SinCos2DPositionalEncoding(TokenposModule):
    """The fixed 2-D sin-cos table of an (H, W) patch grid (ViT-MAE) as a non-persistent float64 buffer.

    Shape:
        forward() -> (H * W [+ 1], D) in the layer's dtype (a fresh tensor; rounded once from float64).
    """

    kind = "additive"
    name = "sincos2d"

    def __init__(self, height: int, width: int, d_model: int, *, base: float = 10000.0, cls_token: bool = False,
                 seed: Any = None, rng: Any = None, device: Any = None, dtype: Any = None) -> None:
        super().__init__()
        self.height, self.width, self.d_model, self.cls_token, self.base = height, width, d_model, cls_token, base
        self.out_dtype = dtype or torch.get_default_dtype()
        dev = torch.empty(0, device=device).device
        self.table: torch.Tensor
        self.register_buffer("table", torch.empty(0, device=dev, dtype=_calc(dev)), persistent=False)
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self, *, seed: Any = None, rng: Any = None) -> None:
        """(Re)compute the table from ``tokenpos.tables`` (no randomness)."""
        if self.table.is_meta:
            return
        t = sincos_2d_table(self.height, self.width, self.d_model, base=self.base, cls_token=self.cls_token)
        self.table = torch.from_numpy(t).to(self.table.device, _calc(self.table.device))

    def forward(self) -> torch.Tensor:
        """(H * W [+ 1], D), never a view of the buffer."""
        return self.table.to(self.out_dtype, copy=True)
