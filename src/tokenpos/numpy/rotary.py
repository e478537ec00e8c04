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

import threading
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from tokenpos._config import kernels_enabled
from tokenpos.kernels.rope import rope_apply, rope_apply_backward
from tokenpos.numpy.module import Module
from tokenpos.tables.errors import ConfigError
from tokenpos.tables.rope import (
    check_heads,
    check_qk_layout,
    expand_to_layout,
    rope_cos_sin,
    rope_dtype_message,
    rope_layout_shape_message,
    rope_length_message,
    rope_positions_message,
    rope_rotate,
    rope_rotate_backward,
)
from tokenpos.tables.rope_scaling import freeze_rope_scaling
from tokenpos.tables.rope_state import rope_kwargs_from_hf_config, rotary_frequencies
from tokenpos.tables.validation import check_int, check_positions

# Positions up to this many times max_seq_len grow the cache; larger ones are computed directly.
CACHE_GROWTH_LIMIT = 16
_FUSED_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


def to_bhld(name: str, x: Any, head_dim: int, qk_layout: str, num_heads: int | None) -> np.ndarray:
    """q or k in the declared layout -> a (B, H, L, Dh) view; float dtype and head count checked.

    A (B, H, L, Dh) result goes back with the same transpose (it is its own inverse).
    """
    x = np.asarray(x)
    if x.ndim != 4 or x.shape[-1] != head_dim:
        raise ConfigError(rope_layout_shape_message(name, x.shape, head_dim, qk_layout))
    if not np.issubdtype(x.dtype, np.floating):
        raise ConfigError(rope_dtype_message(name, x.dtype))
    check_heads(name, x.shape, qk_layout, num_heads)
    return x.transpose(0, 2, 1, 3) if qk_layout == "blhd" else x


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


class _Snapshot(NamedTuple):
    """An immutable cos/sin cache: rows [0, P) of one frequency variant, keyed by all they depend on.

    Never written after it is built (a rebuild or growth makes a new snapshot, swapped under the
    layer's lock), so a call holding one reads consistent rows whatever other threads do.
    ``halves`` maps a dtype to the kernel's (P, R/2) tables cut from it (entries added, never changed).
    """

    key: tuple[Any, ...] | None
    cos: np.ndarray                      # (P, R) float64
    sin: np.ndarray
    halves: dict[np.dtype, tuple[np.ndarray, np.ndarray]]


class RotaryEmbedding(Module):
    """Rotary position embedding with every HF scaling (default, linear, dynamic, yarn, longrope, llama3,
    proportional).

    Args:
        head_dim: Dh.
        base: rope_theta.
        max_seq_len: rows precomputed in the cache; also HF's ``max_position_embeddings`` (dynamic
            NTK's threshold, and the fallback ``original_max_position_embeddings``).
        scaling: None or an HF ``rope_scaling`` / ``rope_parameters`` dict (see ``tables.rope_inv_freq``).
        interleaved: False = half-split pairs (HF / GPT-NeoX), True = adjacent pairs (Meta / GPT-J).
        rotary_dim: R, the first R features of each head rotate (partial rotary); None = Dh.
        qk_layout: "bhld" = q, k are (B, H, L, Dh) (HF's unsqueeze_dim=1); "blhd" = (B, L, H, Dh)
            (unsqueeze_dim=2, flash-attention).
        num_heads: H of q when known: q's head axis must equal it and k's must divide it, so a
            tensor in the other layout is refused instead of silently rotated along heads.
        seed, rng: accepted for the common scheme signature; RoPE has no random state.

    Threads: one layer may serve several threads. The frequency variant and the cache rows of a
    call are taken together under a lock from an immutable snapshot (``_Snapshot``); the rotation
    runs outside the lock.

    Shape:
        apply(q (B, Hq, L, Dh), k (B, Hk, L, Dh), positions (L,) | (1, L) | (B, L) | None) -> (q', k'),
        same shapes (with qk_layout="blhd": (B, L, Hq, Dh), (B, L, Hk, Dh)).
    """

    kind = "rotary"
    name = "rope"

    def __init__(self, head_dim: int, *, base: float = 10000.0, max_seq_len: int = 2048, scaling: Any = None,
                 interleaved: bool = False, rotary_dim: int | None = None, qk_layout: str = "bhld",
                 num_heads: int | None = None, seed: Any = None, rng: Any = None) -> None:
        super().__init__()
        self.head_dim, self.max_seq_len, self.interleaved, self.freqs = rotary_frequencies(
            head_dim, max_seq_len, interleaved, base=base, scaling=scaling, rotary_dim=rotary_dim)
        self.qk_layout, self.num_heads = check_qk_layout(qk_layout, num_heads)
        self.base, self.rotary_dim = self.freqs.base, self.freqs.rotary_dim
        self.scaling = dict(self.freqs.params)
        self.attention_factor = self.freqs.attention_factor
        self._lock = threading.RLock()
        self._last: RotaryCache | None = None
        self.reset_parameters()

    def reset_parameters(self, *, seed: Any = None, rng: Any = None) -> None:
        """Drop the cos/sin cache (it is rebuilt on the next call); no random state to draw."""
        with self._lock:
            self._snap = _Snapshot(None, np.zeros((0, self.rotary_dim)), np.zeros((0, self.rotary_dim)), {})

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.pop("_lock", None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.RLock()

    @classmethod
    def from_hf_config(cls, config: Any, *, layer_type: str | None = None, **kwargs: Any) -> RotaryEmbedding:
        """Build from an HF config (``rope_parameters`` of transformers 5 or ``rope_scaling`` of 4).

        ``layer_type`` picks one entry of per-layer-type parameters (Gemma 3 / 4); see
        ``tokenpos.tables.rope_hf_config`` for every key read (a key that changes the rotation is
        honoured or refused, never ignored).
        """
        return cls(**{**rope_kwargs_from_hf_config(config, layer_type=layer_type), **kwargs})

    @property
    def inv_freq(self) -> np.ndarray:
        """The inverse frequencies serving the last call (F,) float64 (the original ones before any call)."""
        return self.freqs.current_inv_freq

    @property
    def _cos(self) -> np.ndarray:
        return self._snap.cos

    @property
    def _cache_key(self) -> tuple[Any, ...] | None:
        return self._snap.key

    # -- cos / sin -----------------------------------------------------------------------------
    def _key(self, variant: tuple[Any, ...]) -> tuple[Any, ...]:
        return (self.rotary_dim, self.base, self.interleaved, self.attention_factor,
                freeze_rope_scaling(self.scaling), variant)

    def cos_sin(self, positions: np.ndarray, seq_len: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """cos and sin (float64, times the attention factor) of int positions (...) -> (..., R).

        ``seq_len`` picks the frequency variant (dynamic / longrope); default ``max(positions) + 1``.
        """
        return self._tables([(check_positions(positions), None)], seq_len, None)[0]

    def _tables(self, requests: list[tuple[np.ndarray, int | None]], seq_len: int | None,
                dtype: np.dtype | None) -> list[tuple[np.ndarray, np.ndarray]]:
        """cos, sin for each ``(positions (...), start)`` of one call, all from one frequency variant.

        ``dtype`` None: float64 (..., R). Else the kernel's (..., R/2) tables in ``dtype``; ``start`` set
        means the positions are ``start + arange(L)`` (rows are sliced). The variant and the snapshot
        are taken together under the lock; reading rows needs no lock (snapshots never change).
        """
        need = max((int(p.max()) + 1 if p.size else 0) for p, _ in requests)
        with self._lock:
            snap, far = self._cover(need, seq_len)
        out = []
        for pos, start in requests:
            if far is not None:                                     # far out: compute, do not cache
                c, s = rope_cos_sin(pos, far, attention_factor=self.attention_factor, interleaved=self.interleaved)
                out.append((c, s) if dtype is None else (self._half(c, dtype), self._half(s, dtype)))
                continue
            if dtype is None:
                out.append((snap.cos[pos], snap.sin[pos]))
                continue
            hit = snap.halves.get(dtype)
            if hit is None:                                         # idempotent; setdefault keeps the first
                hit = snap.halves.setdefault(dtype, (self._half(snap.cos, dtype), self._half(snap.sin, dtype)))
            if start is not None:
                out.append((hit[0][start:start + pos.shape[0]], hit[1][start:start + pos.shape[0]]))
            else:
                out.append((hit[0][pos], hit[1][pos]))
        return out

    def _cover(self, need: int, seq_len: int | None) -> tuple[_Snapshot, np.ndarray | None]:
        """(Under the lock.) Pick the variant for rows [0, need); swap in a snapshot holding them.

        Returns ``(snapshot, None)``, or ``(snapshot, inv_freq)`` for positions too far out to cache.
        """
        variant, inv_freq = self.freqs.select(max(need, seq_len or 0))
        key, snap = self._key(variant), self._snap
        if key != snap.key:                                         # anything changed: rebuild
            snap = _Snapshot(key, *self._table(inv_freq, self.max_seq_len), {})
        if need > snap.cos.shape[0]:
            if need > CACHE_GROWTH_LIMIT * self.max_seq_len:
                self._snap = snap
                return snap, inv_freq
            snap = _Snapshot(key, *self._table(inv_freq, max(need, 2 * snap.cos.shape[0])), {})
        self._snap = snap
        return snap, None

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

    def _fusable(self, *xs: np.ndarray) -> bool:
        return kernels_enabled() and xs[0].dtype in _FUSED_DTYPES and all(x.dtype == xs[0].dtype for x in xs)

    # -- checks ----------------------------------------------------------------------------------
    def _check(self, name: str, x: Any) -> np.ndarray:
        return to_bhld(name, x, self.head_dim, self.qk_layout, self.num_heads)

    def _out(self, x: np.ndarray) -> np.ndarray:
        return x.transpose(0, 2, 1, 3) if self.qk_layout == "blhd" else x

    def _positions(self, positions: Any, start_pos: int, batch: int, length: int) -> np.ndarray:
        if positions is None:
            start_pos = check_int("start_pos", start_pos, minimum=0)
            return np.arange(start_pos, start_pos + length, dtype=np.int64)
        pos = check_positions(positions)
        if pos.shape == (1, length):                                # HF's (1, L): shared by the batch
            return pos[0]
        if pos.shape not in ((length,), (batch, length)):
            raise ConfigError(rope_positions_message(pos.shape, batch, length))
        return pos

    @staticmethod
    def _broadcast(c: np.ndarray, dtype: np.dtype) -> np.ndarray:
        # (L, R) broadcasts against (B, H, L, R) as is; (B, L, R) needs a head axis
        return (c[:, None] if c.ndim == 3 else c).astype(dtype, copy=False)

    # -- rotation ---------------------------------------------------------------------------------
    def rotate(self, x: Any, positions: Any = None, *, start_pos: int = 0, seq_len: int | None = None) -> np.ndarray:
        """Rotate one tensor x (B, H, L, Dh) at positions (L,) | (1, L) | (B, L) (default start_pos + arange(L))."""
        x = self._check("x", x)
        pos = self._positions(positions, start_pos, x.shape[0], x.shape[2])
        if self._fusable(x):
            tables = self._tables([(pos, start_pos if positions is None else None)], seq_len, x.dtype)[0]
            return self._out(rope_apply(x, None, *tables, layout=self.layout)[0])
        cos, sin = self._tables([(pos, None)], seq_len, None)[0]
        return self._out(rope_rotate(x, self._broadcast(cos, x.dtype), self._broadcast(sin, x.dtype),
                                     interleaved=self.interleaved))

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
            start = start_pos if positions is None else None
            if key_positions is None:
                tq = self._tables([(pos_q, start)], seq_len, q.dtype)[0]
                q_out, k_out = rope_apply(q, k, *tq, layout=self.layout)
                return self._out(q_out), self._out(k_out), RotaryCache(*tq, *tq, layout=self.layout)
            tq, tk = self._tables([(pos_q, start), (pos_k, None)], seq_len, q.dtype)
            q_out = rope_apply(q, None, *tq, layout=self.layout)[0]
            k_out = rope_apply(k, None, *tk, layout=self.layout)[0]
            return self._out(q_out), self._out(k_out), RotaryCache(*tq, *tk, layout=self.layout)
        (cq, sq), (ck, sk) = self._tables([(pos_q, None), (pos_k, None)], seq_len, None)
        cos_q, sin_q = self._broadcast(cq, q.dtype), self._broadcast(sq, q.dtype)
        cos_k, sin_k = self._broadcast(ck, k.dtype), self._broadcast(sk, k.dtype)
        q_out = rope_rotate(q, cos_q, sin_q, interleaved=self.interleaved)
        k_out = rope_rotate(k, cos_k, sin_k, interleaved=self.interleaved)
        return self._out(q_out), self._out(k_out), RotaryCache(cos_q, sin_q, cos_k, sin_k)

    def apply_backward(self, grad_q: Any, grad_k: Any, cache: RotaryCache) -> tuple[np.ndarray, np.ndarray]:
        """Gradients w.r.t. q and k from those w.r.t. q' and k' (declared layout): rotation by -angle."""
        gq, gk = self._out(np.asarray(grad_q)), self._out(np.asarray(grad_k))
        if cache.layout is None:
            return (self._out(rope_rotate_backward(gq, cache.cos_q, cache.sin_q, interleaved=self.interleaved)),
                    self._out(rope_rotate_backward(gk, cache.cos_k, cache.sin_k, interleaved=self.interleaved)))
        if self._fusable(gq, gk):
            if cache.cos_k is cache.cos_q and gq.shape[0] == gk.shape[0] and gq.shape[2] == gk.shape[2]:
                dq, dk = rope_apply_backward(gq, gk, cache.cos_q, cache.sin_q, layout=cache.layout)
                return self._out(dq), self._out(dk)  # type: ignore[arg-type]
            return (self._out(rope_apply_backward(gq, None, cache.cos_q, cache.sin_q, layout=cache.layout)[0]),
                    self._out(rope_apply_backward(gk, None, cache.cos_k, cache.sin_k, layout=cache.layout)[0]))
        # kernels switched off since the forward, or other grad dtypes: the plain path on full tables
        full = [self._broadcast(expand_to_layout(t, interleaved=self.interleaved), t.dtype)
                for t in (cache.cos_q, cache.sin_q, cache.cos_k, cache.sin_k)]
        return (self._out(rope_rotate_backward(gq, full[0], full[1], interleaved=self.interleaved)),
                self._out(rope_rotate_backward(gk, full[2], full[3], interleaved=self.interleaved)))

    def apply(self, q: Any, k: Any, positions: Any = None, *, start_pos: int = 0,
              key_positions: Any = None) -> tuple[np.ndarray, np.ndarray]:
        """Rotate q and k (B, H, L, Dh) at positions (L,) | (1, L) | (B, L) (default start_pos + arange(L)).

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
        return (f"head_dim={self.head_dim}, rotary_dim={self.rotary_dim}, base={self.base}, "
                f"max_seq_len={self.max_seq_len}, rope_type={self.freqs.rope_type!r}, layout={self.layout!r}, "
                f"qk_layout={self.qk_layout!r}")
