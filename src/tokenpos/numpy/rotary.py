"""RotaryEmbedding (RoPE) for the NumPy backend: rotates q and k, with the backward of the rotation.

Shapes: B batch, H heads (q and k may differ, e.g. GQA), L length, Dh head dim, R rotary dim,
P cached positions. q, k: (B, H, L, Dh); positions: (L,) or (B, L) integers.

cos/sin come from positions in float64 (``tokenpos.tables.rope``), times the scaling's attention
factor, and are cast to the input dtype before the multiply (as HF does). The cos/sin cache holds
rows for positions [0, P) and grows on demand; its key holds everything the rows depend on.

Kernel: with ``tokenpos.kernels_enabled()`` and float32 / float64 inputs, the rotation and its
backward run the fused numba pass (``tokenpos.kernels.rope_apply``) on the same tables cast to the
input dtype, cut to one entry per pair, (L, R/2) or (B, L, R/2), and kept per dtype until the
cache is rebuilt. Results equal the plain path's up to float rounding.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from tokenpos._config import kernels_enabled
from tokenpos.kernels.rope import rope_apply, rope_apply_backward
from tokenpos.numpy.module import Module
from tokenpos.tables.errors import ConfigError
from tokenpos.tables.rope import (
    expand_to_layout,
    rope_cos_sin,
    rope_length_message,
    rope_positions_message,
    rope_rotate,
    rope_rotate_backward,
    rope_shape_message,
)
from tokenpos.tables.rope_scaling import freeze_rope_scaling
from tokenpos.tables.rope_state import rope_kwargs_from_hf_config, rotary_frequencies
from tokenpos.tables.validation import check_int, check_positions

# Positions up to this many times max_seq_len grow the cache; larger ones are computed directly.
CACHE_GROWTH_LIMIT = 16
_FUSED_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


@dataclass(frozen=True)
class RotaryCache:
    """What ``apply_backward`` needs: cos/sin (input dtype) for q and for k.

    Plain path (``layout`` None): each (L, R) or (B, 1, L, R). Kernel path (``layout`` "half" or
    "interleaved"): the kernel's tables, each (L, R/2) or (B, L, R/2).
    """

    cos_q: np.ndarray
    sin_q: np.ndarray
    cos_k: np.ndarray
    sin_k: np.ndarray
    layout: str | None = None


class RotaryEmbedding(Module):
    """Rotary position embedding with every HF scaling (default, linear, dynamic, yarn, longrope, llama3).

    Args:
        head_dim: Dh.
        base: rope_theta.
        max_seq_len: rows precomputed in the cache; also HF's ``max_position_embeddings`` (dynamic
            NTK's threshold, and the fallback ``original_max_position_embeddings``).
        scaling: None or an HF ``rope_scaling`` / ``rope_parameters`` dict (see ``tables.rope_inv_freq``).
        interleaved: False = half-split pairs (HF / GPT-NeoX), True = adjacent pairs (Meta / GPT-J).
        rotary_dim: R, the first R features of each head rotate (partial rotary); None = Dh.

    Shape:
        apply(q (B, Hq, L, Dh), k (B, Hk, L, Dh), positions (L,) | (B, L) | None) -> (q', k'), same shapes.
    """

    kind = "rotary"
    name = "rope"

    def __init__(self, head_dim: int, *, base: float = 10000.0, max_seq_len: int = 2048, scaling: Any = None,
                 interleaved: bool = False, rotary_dim: int | None = None, seed: int | None = None,
                 rng: np.random.Generator | None = None) -> None:
        super().__init__()
        self.head_dim, self.max_seq_len, self.interleaved, self.freqs = rotary_frequencies(
            head_dim, max_seq_len, interleaved, base=base, scaling=scaling, rotary_dim=rotary_dim)
        self.base, self.rotary_dim = self.freqs.base, self.freqs.rotary_dim
        self.scaling = dict(self.freqs.params)
        self.attention_factor = self.freqs.attention_factor
        self._cache_key: tuple[Any, ...] | None = None
        self._cos = self._sin = np.zeros((0, self.rotary_dim))     # (P, R) float64
        self._last: RotaryCache | None = None
        self._halves_of: np.ndarray | None = None                   # the cache the kernel tables were cut from
        self._halves: dict[np.dtype, tuple[np.ndarray, np.ndarray]] = {}

    def reset_parameters(self, *, seed: int | None = None, rng: np.random.Generator | None = None) -> None:
        """Nothing to draw: the frequencies are fixed (seed/rng accepted so every scheme resets alike)."""

    @classmethod
    def from_hf_config(cls, config: Any, **kwargs: Any) -> RotaryEmbedding:
        """Build from an HF config (``rope_parameters`` of transformers 5 or ``rope_scaling`` of 4)."""
        return cls(**{**rope_kwargs_from_hf_config(config), **kwargs})

    @property
    def inv_freq(self) -> np.ndarray:
        """The inverse frequencies serving the last call (F,) float64 (the original ones before any call)."""
        return self.freqs.current_inv_freq

    # -- cos / sin -----------------------------------------------------------------------------
    def _key(self, variant: tuple[Any, ...]) -> tuple[Any, ...]:
        return (self.rotary_dim, self.base, self.interleaved, self.attention_factor,
                freeze_rope_scaling(self.scaling), variant)

    def cos_sin(self, positions: np.ndarray, seq_len: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """cos and sin (float64, times the attention factor) of int positions (...) -> (..., R).

        ``seq_len`` picks the frequency variant (dynamic / longrope); default ``max(positions) + 1``.
        """
        pos = check_positions(positions)
        inv_freq = self._cover(int(pos.max()) + 1 if pos.size else 0, seq_len)
        if inv_freq is not None:                                    # far out: compute, do not cache
            return rope_cos_sin(pos, inv_freq, attention_factor=self.attention_factor, interleaved=self.interleaved)
        return self._cos[pos], self._sin[pos]

    def _cover(self, need: int, seq_len: int | None) -> np.ndarray | None:
        """Pick the variant for rows [0, need) and make the cache hold them (rebuilt or grown).

        Returns None when it does, else the inverse frequencies (positions too far out to cache).
        """
        variant, inv_freq = self.freqs.select(max(need, seq_len or 0))
        key = self._key(variant)
        if key != self._cache_key:                                  # anything changed: rebuild
            self._cache_key, self._cos, self._sin = key, *self._table(inv_freq, self.max_seq_len)
        if need > self._cos.shape[0]:
            if need > CACHE_GROWTH_LIMIT * self.max_seq_len:
                return inv_freq
            self._cos, self._sin = self._table(inv_freq, max(need, 2 * self._cos.shape[0]))
        return None

    def _table(self, inv_freq: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
        return rope_cos_sin(np.arange(n), inv_freq, attention_factor=self.attention_factor,
                            interleaved=self.interleaved)

    # -- the fused kernel's tables ---------------------------------------------------------------
    @property
    def layout(self) -> str:
        """"interleaved" or "half"."""
        return "interleaved" if self.interleaved else "half"

    def _half(self, table: np.ndarray, dtype: np.dtype) -> np.ndarray:
        """(..., R) in the layout -> the kernel's (..., R/2) (one entry per pair), C-contiguous, ``dtype``."""
        h = table[..., 0::2] if self.interleaved else table[..., : self.rotary_dim // 2]
        return np.ascontiguousarray(h, dtype=dtype)

    def _kernel_tables(self, pos: np.ndarray, start: int | None, seq_len: int | None,
                       dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
        """cos, sin for int positions (...) as the kernel wants them, (..., R/2) in ``dtype``, by the
        rules of :meth:`cos_sin`. ``start`` set means ``pos`` is ``start + arange(L)`` (rows are sliced).
        """
        inv_freq = self._cover(int(pos.max()) + 1 if pos.size else 0, seq_len)
        if inv_freq is not None:
            cos, sin = rope_cos_sin(pos, inv_freq, attention_factor=self.attention_factor,
                                    interleaved=self.interleaved)
            return self._half(cos, dtype), self._half(sin, dtype)
        if self._halves_of is not self._cos:                        # the cache changed: cut it again
            self._halves_of, self._halves = self._cos, {}
        hit = self._halves.get(dtype)
        if hit is None:
            hit = self._halves[dtype] = (self._half(self._cos, dtype), self._half(self._sin, dtype))
        if start is not None:
            return hit[0][start:start + pos.shape[0]], hit[1][start:start + pos.shape[0]]
        return hit[0][pos], hit[1][pos]

    def _fusable(self, *xs: np.ndarray) -> bool:
        return kernels_enabled() and xs[0].dtype in _FUSED_DTYPES and all(x.dtype == xs[0].dtype for x in xs)

    # -- checks ----------------------------------------------------------------------------------
    def _check(self, name: str, x: Any) -> np.ndarray:
        x = np.asarray(x)
        if x.ndim != 4 or x.shape[-1] != self.head_dim:
            raise ConfigError(rope_shape_message(name, x.shape, self.head_dim))
        return x

    def _positions(self, positions: Any, start_pos: int, batch: int, length: int) -> np.ndarray:
        if positions is None:
            start_pos = check_int("start_pos", start_pos, minimum=0)
            return np.arange(start_pos, start_pos + length, dtype=np.int64)
        pos = check_positions(positions)
        if pos.shape not in ((length,), (batch, length)):
            raise ConfigError(rope_positions_message(pos.shape, batch, length))
        return pos

    @staticmethod
    def _broadcast(c: np.ndarray, dtype: np.dtype) -> np.ndarray:
        # (L, R) broadcasts against (B, H, L, R) as is; (B, L, R) needs a head axis
        return (c[:, None] if c.ndim == 3 else c).astype(dtype, copy=False)

    # -- rotation ---------------------------------------------------------------------------------
    def rotate(self, x: Any, positions: Any = None, *, start_pos: int = 0, seq_len: int | None = None) -> np.ndarray:
        """Rotate one tensor x (B, H, L, Dh) at positions (L,) | (B, L) (default start_pos + arange(L))."""
        x = self._check("x", x)
        pos = self._positions(positions, start_pos, x.shape[0], x.shape[2])
        if self._fusable(x):
            tables = self._kernel_tables(pos, start_pos if positions is None else None, seq_len, x.dtype)
            return rope_apply(x, None, *tables, layout=self.layout)[0]
        cos, sin = self.cos_sin(pos, seq_len)
        return rope_rotate(x, self._broadcast(cos, x.dtype), self._broadcast(sin, x.dtype),
                           interleaved=self.interleaved)

    def apply_forward(self, q: Any, k: Any, positions: Any = None, *, start_pos: int = 0,
                      key_positions: Any = None) -> tuple[np.ndarray, np.ndarray, RotaryCache]:
        """The functional forward: ``(q', k', cache)`` for :meth:`apply_backward`; no state kept.

        ``key_positions`` (Lk,) | (B, Lk) rotates k at other positions than q (a KV cache); by
        default k uses q's positions, which needs the same length. Both use one frequency variant,
        chosen by the largest position of the call.
        """
        q, k = self._check("q", q), self._check("k", k)
        pos_q = self._positions(positions, start_pos, q.shape[0], q.shape[2])
        if key_positions is None:
            if q.shape[0] != k.shape[0] or q.shape[2] != k.shape[2]:
                raise ConfigError(rope_length_message(q.shape, k.shape))
            pos_k = pos_q
        else:
            pos_k = self._positions(key_positions, 0, k.shape[0], k.shape[2])
        seq_len = max(int(pos_q.max(initial=-1)), int(pos_k.max(initial=-1))) + 1
        if self._fusable(q, k):
            return self._apply_fused(q, k, pos_q, pos_k, start_pos if positions is None else None,
                                     key_positions is None, seq_len)
        cos_q, sin_q = (self._broadcast(c, q.dtype) for c in self.cos_sin(pos_q, seq_len))
        cos_k, sin_k = (self._broadcast(c, k.dtype) for c in self.cos_sin(pos_k, seq_len))
        q_out = rope_rotate(q, cos_q, sin_q, interleaved=self.interleaved)
        k_out = rope_rotate(k, cos_k, sin_k, interleaved=self.interleaved)
        return q_out, k_out, RotaryCache(cos_q, sin_q, cos_k, sin_k)

    def _apply_fused(self, q: np.ndarray, k: np.ndarray, pos_q: np.ndarray, pos_k: np.ndarray, start: int | None,
                     shared: bool, seq_len: int) -> tuple[np.ndarray, np.ndarray, RotaryCache]:
        """:meth:`apply_forward` through the kernel: one pass over q and k when they share positions."""
        tq = self._kernel_tables(pos_q, start, seq_len, q.dtype)
        if shared:
            q_out, k_out = rope_apply(q, k, *tq, layout=self.layout)
            return q_out, k_out, RotaryCache(*tq, *tq, layout=self.layout)  # type: ignore[return-value]
        tk = self._kernel_tables(pos_k, None, seq_len, k.dtype)
        q_out = rope_apply(q, None, *tq, layout=self.layout)[0]
        k_out = rope_apply(k, None, *tk, layout=self.layout)[0]
        return q_out, k_out, RotaryCache(*tq, *tk, layout=self.layout)

    def apply_backward(self, grad_q: Any, grad_k: Any, cache: RotaryCache) -> tuple[np.ndarray, np.ndarray]:
        """Gradients w.r.t. q and k from those w.r.t. q' and k': rotation by -angle (times the factor)."""
        gq, gk = np.asarray(grad_q), np.asarray(grad_k)
        if cache.layout is None:
            return (rope_rotate_backward(gq, cache.cos_q, cache.sin_q, interleaved=self.interleaved),
                    rope_rotate_backward(gk, cache.cos_k, cache.sin_k, interleaved=self.interleaved))
        if self._fusable(gq, gk):
            if cache.cos_k is cache.cos_q and gq.shape[0] == gk.shape[0] and gq.shape[2] == gk.shape[2]:
                dq, dk = rope_apply_backward(gq, gk, cache.cos_q, cache.sin_q, layout=cache.layout)
                return dq, dk  # type: ignore[return-value]
            return (rope_apply_backward(gq, None, cache.cos_q, cache.sin_q, layout=cache.layout)[0],
                    rope_apply_backward(gk, None, cache.cos_k, cache.sin_k, layout=cache.layout)[0])
        # kernels switched off since the forward, or other grad dtypes: the plain path on full tables
        full = [self._broadcast(expand_to_layout(t, interleaved=self.interleaved), t.dtype)
                for t in (cache.cos_q, cache.sin_q, cache.cos_k, cache.sin_k)]
        return (rope_rotate_backward(gq, full[0], full[1], interleaved=self.interleaved),
                rope_rotate_backward(gk, full[2], full[3], interleaved=self.interleaved))

    def apply(self, q: Any, k: Any, positions: Any = None, *, start_pos: int = 0,
              key_positions: Any = None) -> tuple[np.ndarray, np.ndarray]:
        """Rotate q and k (B, H, L, Dh) at positions (L,) | (B, L) (default start_pos + arange(L)).

        Keeps what :meth:`backward` needs. Returns (q', k') with the input shapes and dtypes.
        """
        q_out, k_out, self._last = self.apply_forward(q, k, positions, start_pos=start_pos,
                                                      key_positions=key_positions)
        return q_out, k_out

    forward = apply

    def backward(self, grad_q: Any, grad_k: Any) -> tuple[np.ndarray, np.ndarray]:
        """Gradients (dq, dk) of the last :meth:`apply`."""
        return self.apply_backward(grad_q, grad_k, self._cached(self._last))

    def extra_repr(self) -> str:
        layout = "interleaved" if self.interleaved else "half"
        return (f"head_dim={self.head_dim}, rotary_dim={self.rotary_dim}, base={self.base}, "
                f"max_seq_len={self.max_seq_len}, rope_type={self.freqs.rope_type!r}, layout={layout!r}")
