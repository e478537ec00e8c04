"""XPosRotaryEmbedding (xPos) for the NumPy backend: RoPE with q scaled up and k scaled down per pair.

Shapes: B batch, H heads, L length, Dh head dim, R rotary dim, F = R / 2. q, k: (B, H, L, Dh);
positions (L,) / (1, L) / (B, L). cos, sin and the xPos scale come from ``tokenpos.tables`` in float64
and are folded into per-tensor tables (``tables.xpos``), which run through the same functional RoPE
pair (``functional.rope_forward``) as plain RoPE; so the backward is the transpose of the scaled
rotation with no extra code. No cache: nothing is shared between threads.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tokenpos.numpy import functional as F
from tokenpos.numpy.module import Module
from tokenpos.numpy.rotary import to_bhld
from tokenpos.tables.errors import ConfigError
from tokenpos.tables.rope import (
    check_qk_layout,
    check_rotary_dim,
    check_same_key_positions,
    rope_angles,
    rope_inv_freq,
    rope_length_message,
    rope_positions_message,
)
from tokenpos.tables.validation import check_float, check_int, check_positions
from tokenpos.tables.xpos import XPOS_TOGETHER_MESSAGE, xpos_scale


class XPosRotaryEmbedding(Module):
    """xPos: ``q' = s * R(n) q``, ``k' = R(n) k / s`` with s the per-pair decay scale (see ``tables.xpos``).

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
        self.head_dim = check_int("head_dim", head_dim, minimum=2)
        self.rotary_dim = check_rotary_dim(self.head_dim, rotary_dim)
        self.scale_base = check_float("scale_base", scale_base, low=0.0, low_inclusive=False)
        self.center = None if center is None else check_float("center", center)
        if not isinstance(interleaved, (bool, np.bool_)):
            raise ConfigError(f"interleaved must be True or False, got {interleaved!r}")
        self.interleaved = bool(interleaved)
        self.qk_layout, self.num_heads = check_qk_layout(qk_layout, num_heads)
        self.inv_freq, _ = rope_inv_freq(self.rotary_dim, base=base)
        self.base = float(base)
        self._last: tuple[F.RopeCache, F.RopeCache] | None = None

    def reset_parameters(self, *, seed: Any = None, rng: Any = None) -> None:
        """Nothing to reset (no parameters, no cache)."""

    def tables(self, positions: Any, length: int) -> tuple[np.ndarray, ...]:
        """``(cos_q, sin_q, cos_k, sin_k)`` (..., F) float64 for int positions (...)."""
        pos = check_positions(positions)
        ang = rope_angles(pos, self.inv_freq)
        center = length // 2 if self.center is None else self.center
        s = xpos_scale(pos, self.rotary_dim, scale_base=self.scale_base, center=center)
        cos, sin = np.cos(ang), np.sin(ang)
        return cos * s, sin * s, cos / s, sin / s

    def _out(self, x: np.ndarray) -> np.ndarray:
        return x.transpose(0, 2, 1, 3) if self.qk_layout == "blhd" else x

    def apply_forward(self, q: Any, k: Any, positions: Any = None, *, start_pos: int = 0, key_positions: Any = None
                      ) -> tuple[np.ndarray, np.ndarray, tuple[F.RopeCache, F.RopeCache]]:
        """``(q', k', cache)``; q and k share positions (``key_positions``, if given, must equal them)."""
        q = to_bhld("q", q, self.head_dim, self.qk_layout, self.num_heads)
        k = to_bhld("k", k, self.head_dim, self.qk_layout, self.num_heads)
        b, length = q.shape[0], q.shape[2]
        if k.shape[0] != b or k.shape[2] != length:
            raise ConfigError(rope_length_message(q.shape, k.shape))
        if positions is None and key_positions is not None:      # the attention's KV path: as torch, refused
            raise ConfigError(XPOS_TOGETHER_MESSAGE)
        if positions is None:
            start_pos = check_int("start_pos", start_pos, minimum=0)
            pos = np.arange(start_pos, start_pos + length, dtype=np.int64)
        else:
            pos = check_positions(positions)
            pos = pos[0] if pos.shape == (1, length) else pos
            if pos.shape not in ((length,), (b, length)):
                raise ConfigError(rope_positions_message(pos.shape, b, length))
        check_same_key_positions("xPos", pos, key_positions)
        cq, sq, ck, sk = (t.astype(q.dtype if i < 2 else k.dtype) for i, t in enumerate(self.tables(pos, length)))
        q_out, cache_q = F.rope_forward(q, cq, sq, interleaved=self.interleaved)
        k_out, cache_k = F.rope_forward(k, ck, sk, interleaved=self.interleaved)
        return self._out(q_out), self._out(k_out), (cache_q, cache_k)

    def apply_backward(self, grad_q: Any, grad_k: Any, cache: tuple[F.RopeCache, F.RopeCache]
                       ) -> tuple[np.ndarray, np.ndarray]:
        """(dq, dk): the transposed scaled rotations."""
        gq, gk = self._out(np.asarray(grad_q)), self._out(np.asarray(grad_k))
        return self._out(F.rope_backward(gq, cache[0])), self._out(F.rope_backward(gk, cache[1]))

    def apply(self, q: Any, k: Any, positions: Any = None, *, start_pos: int = 0,
              key_positions: Any = None) -> tuple[np.ndarray, np.ndarray]:
        """Rotate and scale q and k; keeps what :meth:`backward` needs."""
        q_out, k_out, self._last = self.apply_forward(q, k, positions, start_pos=start_pos,
                                                      key_positions=key_positions)
        return q_out, k_out

    forward = apply

    def backward(self, grad_q: Any, grad_k: Any) -> tuple[np.ndarray, np.ndarray]:
        """Gradients (dq, dk) of the last :meth:`apply`."""
        return self.apply_backward(grad_q, grad_k, self._cached(self._last))

    def extra_repr(self) -> str:
        return (f"head_dim={self.head_dim}, rotary_dim={self.rotary_dim}, base={self.base}, "
                f"scale_base={self.scale_base}, interleaved={self.interleaved}, center={self.center}")
