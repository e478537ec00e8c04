"""XPosRotaryEmbedding (xPos) for the torch backend: the NumPy twin's scaled tables through ``tokenpos::rope``.

Shapes: B batch, H heads, L length, Dh head dim, R rotary dim, F = R / 2. q, k: (B, H, L, Dh);
positions (L,) / (1, L) / (B, L). Angles and scales are computed per call in float64 (float32 on MPS);
q and k each go through one ``tokenpos::rope`` op with their own scaled tables (autograd registered).
"""

from __future__ import annotations

from typing import Any

import torch

from tokenpos.tables.errors import ConfigError
from tokenpos.tables.rope import (
    check_qk_layout,
    check_rotary_dim,
    check_same_key_positions,
    rope_inv_freq,
    rope_length_message,
    rope_positions_message,
)
from tokenpos.tables.validation import check_float, check_int
from tokenpos.tables.xpos import XPOS_TOGETHER_MESSAGE, xpos_zeta
from tokenpos.torch import ops
from tokenpos.torch._checks import check_position_tensor
from tokenpos.torch._module import TokenposModule
from tokenpos.torch.rotary import to_bhld


class XPosRotaryEmbedding(TokenposModule):
    """xPos (see the NumPy twin for the arguments); ``device`` places the tables, ``dtype`` is accepted.

    Shape:
        apply(q (B, Hq, L, Dh), k (B, Hk, L, Dh), positions (L,) | (1, L) | (B, L) | None) -> (q', k').
    """

    kind = "rotary"
    name = "xpos"

    def __init__(self, head_dim: int, *, base: float = 10000.0, scale_base: float = 512.0,
                 rotary_dim: int | None = None, interleaved: bool = True, center: float | None = None,
                 qk_layout: str = "bhld",
                 num_heads: int | None = None, seed: Any = None, rng: Any = None, device: Any = None,
                 dtype: Any = None) -> None:
        super().__init__()
        self.head_dim = check_int("head_dim", head_dim, minimum=2)
        self.rotary_dim = check_rotary_dim(self.head_dim, rotary_dim)
        self.scale_base = check_float("scale_base", scale_base, low=0.0, low_inclusive=False)
        self.center = None if center is None else check_float("center", center)
        if not isinstance(interleaved, bool):
            raise ConfigError(f"interleaved must be True or False, got {interleaved!r}")
        self.interleaved = interleaved
        self.qk_layout, self.num_heads = check_qk_layout(qk_layout, num_heads)
        self.base = float(base)
        dev = torch.empty(0, device=device).device
        calc = torch.float32 if dev.type == "mps" else torch.float64
        self.inv_freq: torch.Tensor
        self.zeta: torch.Tensor
        self.register_buffer("inv_freq", torch.empty(0, device=dev, dtype=calc), persistent=False)
        self.register_buffer("zeta", torch.empty(0, device=dev, dtype=calc), persistent=False)
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self, *, seed: Any = None, rng: Any = None) -> None:
        """(Re)load the frequencies and the per-pair zeta from ``tokenpos.tables`` (no randomness)."""
        if self.inv_freq.is_meta:
            return
        dev = self.inv_freq.device
        calc = torch.float32 if dev.type == "mps" else torch.float64
        self.inv_freq = torch.from_numpy(rope_inv_freq(self.rotary_dim, base=self.base)[0]).to(dev, calc)
        self.zeta = torch.from_numpy(xpos_zeta(self.rotary_dim)).to(dev, calc)

    def _apply(self, fn: Any, recurse: bool = True) -> Any:
        out = super()._apply(fn, recurse)             # .half() must not cast the tables: reload them
        if not self.inv_freq.is_meta and self.inv_freq.dtype not in (torch.float64, torch.float32):
            self.reset_parameters()
        return out

    def tables(self, pos: torch.Tensor, length: int) -> tuple[torch.Tensor, ...]:
        """``(cos_q, sin_q, cos_k, sin_k)`` (..., F) in float64 for an int tensor of positions (...)."""
        p = pos.to(self.inv_freq.dtype)[..., None]
        ang = p * self.inv_freq
        center = length // 2 if self.center is None else self.center
        s = self.zeta ** ((p - center) / self.scale_base)
        cos, sin = torch.cos(ang), torch.sin(ang)
        return cos * s, sin * s, cos / s, sin / s

    def rotate(self, x: Any, positions: Any = None, *, start_pos: int = 0, seq_len: Any = None) -> Any:
        """Refused: xPos scales q and k differently, so one tensor alone is ambiguous (use :meth:`apply`;
        in the attention functions pass ``positions=`` so they call ``apply``)."""
        raise ConfigError(XPOS_TOGETHER_MESSAGE)

    def apply(self, q: Any, k: Any = None, positions: Any = None, *, start_pos: int = 0,  # type: ignore[override]
              key_positions: Any = None) -> Any:
        """Rotate and scale q and k; returns (q', k') with the input shapes and dtypes.

        ``key_positions`` (the attention functions pass it) must equal q's positions.
        """
        if k is None and callable(q) and not isinstance(q, torch.Tensor):
            return super().apply(q)
        q = to_bhld("q", q, self.head_dim, self.qk_layout, self.num_heads)
        k = to_bhld("k", k, self.head_dim, self.qk_layout, self.num_heads)
        b, length = q.shape[0], q.shape[2]
        if k.shape[0] != b or k.shape[2] != length:
            raise ConfigError(rope_length_message(tuple(q.shape), tuple(k.shape)))
        if positions is None:
            start_pos = check_int("start_pos", start_pos, minimum=0)
            pos = torch.arange(start_pos, start_pos + length, device=self.inv_freq.device)
        else:
            pos = check_position_tensor(positions, device=self.inv_freq.device)
            pos = pos[0] if tuple(pos.shape) == (1, length) else pos
            if tuple(pos.shape) not in ((length,), (b, length)):
                raise ConfigError(rope_positions_message(tuple(pos.shape), b, length))
        if key_positions is not None:
            check_same_key_positions("xPos", pos.cpu().numpy(),
                                     check_position_tensor(key_positions, device=pos.device).cpu().numpy())
        cq, sq, ck, sk = self.tables(pos, length)

        def cast(t: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
            return t.to(x.dtype) if x.dtype in (torch.float32, torch.float64) else t

        q_out = ops.rotate(q, cast(cq, q), cast(sq, q), self.interleaved)
        k_out = ops.rotate(k, cast(ck, k), cast(sk, k), self.interleaved)
        if self.qk_layout == "blhd":
            return q_out.transpose(1, 2), k_out.transpose(1, 2)
        return q_out, k_out

    forward = apply

    def extra_repr(self) -> str:
        return (f"head_dim={self.head_dim}, rotary_dim={self.rotary_dim}, base={self.base}, "
                f"scale_base={self.scale_base}, interleaved={self.interleaved}, center={self.center}")
