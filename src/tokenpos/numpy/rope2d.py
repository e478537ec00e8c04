"""2-D patch positions for the NumPy backend: axial 2-D RoPE (Pixtral) and the 2-D sin-cos table (ViT-MAE).

Shapes: B batch, H heads, N patches, Dh head dim, F = Dh / 2, D model dim. q, k: (B, H, N, Dh);
positions (N, 2) or (B, N, 2) (row, col). The rotation runs through ``functional.rope_qk_forward``
(half layout) with cos / sin (N, F) or (B, N, F) from ``tokenpos.tables.rope2d`` in float64.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tokenpos.numpy import functional as F
from tokenpos.numpy.module import Module
from tokenpos.numpy.rotary import to_bhld
from tokenpos.tables.errors import ConfigError
from tokenpos.tables.mrope import mrope_angles
from tokenpos.tables.rope import check_qk_layout, check_same_key_positions, rope_length_message
from tokenpos.tables.rope2d import check_positions_2d, rope2d_inv_freq, sincos_2d_table
from tokenpos.tables.validation import check_float, check_int


class RotaryEmbedding2D(Module):
    """Axial 2-D RoPE over (row, col) patch positions, as HF Pixtral.

    Args:
        head_dim: Dh (divisible by 4). base: rope_theta. qk_layout, num_heads: as RotaryEmbedding.
        seed, rng: accepted for the common scheme signature; no random state.

    Shape:
        apply(q (B, Hq, N, Dh), k (B, Hk, N, Dh), positions (N, 2) | (B, N, 2)) -> (q', k').
    """

    kind = "rotary"
    name = "rope2d"

    def __init__(self, head_dim: int, *, base: float = 10000.0, qk_layout: str = "bhld", num_heads: int | None = None,
                 seed: Any = None, rng: Any = None) -> None:
        super().__init__()
        self.head_dim, self.base = check_int("head_dim", head_dim, minimum=4), check_float("base", base, low=1.0)
        self.inv_freq, self.axis_map = rope2d_inv_freq(self.head_dim, base=self.base)
        self.qk_layout, self.num_heads = check_qk_layout(qk_layout, num_heads)
        self._last: F.RopeCache | None = None

    def reset_parameters(self, *, seed: Any = None, rng: Any = None) -> None:
        """Nothing to reset (no parameters, no cache)."""

    @classmethod
    def from_hf_config(cls, config: Any, **kwargs: Any) -> RotaryEmbedding2D:
        """From an HF ``PixtralVisionConfig`` (``rope_parameters`` of type "axial")."""
        params = dict(getattr(config, "rope_parameters", None) or {})
        if params.get("rope_type", "axial") != "axial" or set(params) - {"rope_type", "rope_theta"}:
            raise ConfigError(f"2-D RoPE reads rope_parameters {{'rope_type': 'axial', 'rope_theta'}}, got {params}")
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        return cls(int(head_dim), base=float(params.get("rope_theta", 10000.0)), **kwargs)

    def cos_sin(self, positions: Any) -> tuple[np.ndarray, np.ndarray]:
        """cos, sin (..., N, F) float64 of (row, col) positions (..., N, 2): one entry per rotated pair."""
        ang = mrope_angles(np.moveaxis(check_positions_2d(positions), -1, 0), self.inv_freq, self.axis_map)
        return np.cos(ang), np.sin(ang)

    def _out(self, x: np.ndarray) -> np.ndarray:
        return x.transpose(0, 2, 1, 3) if self.qk_layout == "blhd" else x

    def apply_forward(self, q: Any, k: Any, positions: Any, *, start_pos: Any = None,
                      key_positions: Any = None) -> tuple[np.ndarray, np.ndarray, F.RopeCache]:
        """``(q', k', cache)``; q and k share the patch positions (``start_pos`` is ignored: positions are
        explicit; ``key_positions``, if given, must equal them)."""
        q = to_bhld("q", q, self.head_dim, self.qk_layout, self.num_heads)
        k = to_bhld("k", k, self.head_dim, self.qk_layout, self.num_heads)
        if q.shape[0] != k.shape[0] or q.shape[2] != k.shape[2]:
            raise ConfigError(rope_length_message(q.shape, k.shape))
        pos = check_positions_2d(positions)
        if pos.shape[-2] != q.shape[2] or (pos.ndim == 3 and pos.shape[0] not in (1, q.shape[0])) or pos.ndim > 3:
            raise ConfigError(f"positions must have shape ({q.shape[2]}, 2) or ({q.shape[0]}, {q.shape[2]}, 2), "
                              f"got {tuple(pos.shape)}")
        check_same_key_positions("2-D RoPE", pos, key_positions)
        cos, sin = (t.astype(q.dtype) for t in self.cos_sin(pos))
        if q.dtype == k.dtype:
            q_out, k_out, cache = F.rope_qk_forward(q, k, cos, sin, interleaved=False)
        else:
            q_out, cache = F.rope_forward(q, cos, sin, interleaved=False)
            k_out = F.rope_forward(k, cos.astype(k.dtype), sin.astype(k.dtype), interleaved=False)[0]
        return self._out(q_out), self._out(k_out), cache

    def apply_backward(self, grad_q: Any, grad_k: Any, cache: F.RopeCache) -> tuple[np.ndarray, np.ndarray]:
        """(dq, dk): the rotation by -angle."""
        gq, gk = self._out(np.asarray(grad_q)), self._out(np.asarray(grad_k))
        return self._out(F.rope_backward(gq, cache)), self._out(F.rope_backward(gk, cache))

    def apply(self, q: Any, k: Any, positions: Any, *, start_pos: Any = None,
              key_positions: Any = None) -> tuple[np.ndarray, np.ndarray]:
        """Rotate q and k at (row, col) positions; keeps what :meth:`backward` needs."""
        q_out, k_out, self._last = self.apply_forward(q, k, positions, key_positions=key_positions)
        return q_out, k_out

    forward = apply

    def backward(self, grad_q: Any, grad_k: Any) -> tuple[np.ndarray, np.ndarray]:
        """Gradients (dq, dk) of the last :meth:`apply`."""
        return self.apply_backward(grad_q, grad_k, self._cached(self._last))

    def extra_repr(self) -> str:
        return f"head_dim={self.head_dim}, base={self.base}, qk_layout={self.qk_layout!r}"


class SinCos2DPositionalEncoding(Module):
    """The fixed 2-D sin-cos table of an (H, W) patch grid (ViT-MAE), added to patch embeddings.

    Shape:
        forward() -> (H * W [+ 1], D) in ``dtype``; the table is computed in float64 and rounded once.
    """

    kind = "additive"
    name = "sincos2d"

    def __init__(self, height: int, width: int, d_model: int, *, base: float = 10000.0, cls_token: bool = False,
                 dtype: Any = np.float32, seed: Any = None, rng: Any = None) -> None:
        super().__init__()
        self.table64 = sincos_2d_table(height, width, d_model, base=base, cls_token=cls_token)
        self.dtype = np.dtype(dtype)
        self.height, self.width, self.d_model, self.cls_token = height, width, d_model, cls_token

    def reset_parameters(self, *, seed: Any = None, rng: Any = None) -> None:
        """Nothing to reset (a fixed table)."""

    def forward(self) -> np.ndarray:
        """A fresh copy of the table (H * W [+ 1], D): changing it never changes the layer."""
        return self.table64.astype(self.dtype)

    def backward(self, grad_output: Any) -> None:
        """The table is fixed: no parameter gradient, no input gradient."""
        return None
