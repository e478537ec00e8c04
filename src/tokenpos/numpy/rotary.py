"""RotaryEmbedding (RoPE) for the NumPy backend: rotates q and k, with the backward of the rotation.

Shapes: B batch, H heads (q and k may differ, e.g. GQA), L length, Dh head dim, R rotary dim,
F = R / 2, P cached positions. q, k: (B, H, L, Dh) (or (B, L, H, Dh) with ``qk_layout="blhd"``);
positions: (L,), (1, L) or (B, L) integers.

cos/sin come from positions in float64 (``tokenpos.tables.formulas.rope``), times the scaling's attention
factor, kept as one entry per rotated pair, (P, F), in an immutable snapshot cache keyed by
everything the rows depend on; each call cuts its (L, F) or (B, L, F) rows, cast to the input dtype
(as HF does), and runs one functional pair (``tokenpos.numpy.functional.rope_qk_forward`` /
``rope_forward``), which chooses the fused kernel or plain NumPy. The default call (q and k of one dtype
at ``start_pos + arange(L)``) is :meth:`RotaryEmbedding.apply` in this file, read top to bottom; the other
forms take the general protocol of ``_rotary_base.RotaryBase``, with the same results.
"""

from __future__ import annotations

import threading
from typing import Any, NamedTuple

import numpy as np

from tokenpos.numpy import functional as F
from tokenpos.numpy._rotary_base import RotaryBase, RotaryCache
from tokenpos.numpy._rotary_base import to_bhld as to_bhld
from tokenpos.tables.checks.rope import check_qk_layout, check_qk_lengths
from tokenpos.tables.checks.validation import INT64_MAX, check_dtype, check_positions, check_start_pos
from tokenpos.tables.formulas.rope import expand_to_layout, rope_angles
from tokenpos.tables.formulas.rope_scaling import freeze_rope_scaling
from tokenpos.tables.formulas.rope_state import CACHE_GROWTH_LIMIT as CACHE_GROWTH_LIMIT
from tokenpos.tables.formulas.rope_state import rope_cache_rows, rope_variant, rotary_frequencies
from tokenpos.tables.hf.rope import RopeFromHFConfig


class _Snapshot(NamedTuple):
    """An immutable cos/sin cache: rows [0, P) of one frequency variant, keyed by all they depend on.

    Never written after it is built (a rebuild or growth makes a new snapshot, swapped under the
    layer's lock), so a call holding one reads consistent rows whatever other threads do.
    ``halves`` maps a dtype to the same tables cast to it (entries added, never changed).
    """

    key: tuple[Any, ...] | None
    cos: np.ndarray                      # (P, F) float64, one entry per rotated pair
    sin: np.ndarray
    halves: dict[np.dtype, tuple[np.ndarray, np.ndarray]]


class RotaryEmbedding(RotaryBase, RopeFromHFConfig):
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
            (unsqueeze_dim=2, flash-attention); "thd" = one packed row (T, H, Dh) (flash-attention's
            varlen layout): ``apply(q, k, cu_seqlens=cu)`` restarts the positions at 0 in every
            document (``positions_from_cu_seqlens``), then takes the per-token positions path.
        num_heads: H of q when known: q's head axis must equal it and k's must divide it, so a
            tensor in the other layout is refused instead of silently rotated along heads.
        seed, rng: accepted for the common scheme signature; RoPE has no random state.
        dtype: accepted for the common layer signature (as the torch twin) and checked (float16, float32 or
            float64); outputs follow the input dtype and the tables stay float64.

    Threads: one layer may serve several threads. The frequency variant (``tables.formulas.rope_state.rope_variant``,
    from the layer's frozen ``RopeState``) and the cache rows of a call are taken together under a lock
    from an immutable snapshot (``_Snapshot``), and the new state is kept; the rotation runs outside the lock.
    A static variant's rows are read without the lock from ``_rows_memo``, one tuple of views of the current
    snapshot, made and dropped under the lock (:meth:`_rows`).

    Shape:
        apply(q (B, Hq, L, Dh), k (B, Hk, L, Dh), positions (L,) | (1, L) | (B, L) | None) -> (q', k'),
        same shapes (with qk_layout="blhd": (B, L, Hq, Dh), (B, L, Hk, Dh)).
    """

    kind = "rotary"
    name = "rope"
    packs = True

    def __init__(self, head_dim: int, *, base: float = 10000.0, max_seq_len: int = 2048, scaling: Any = None,
                 interleaved: bool = False, rotary_dim: int | None = None, qk_layout: str = "bhld",
                 num_heads: int | None = None, seed: Any = None, rng: Any = None, dtype: Any = None) -> None:
        super().__init__()
        check_dtype("dtype", dtype)
        self.head_dim, self.max_seq_len, self.interleaved, self.freqs = rotary_frequencies(
            head_dim, max_seq_len, interleaved, base=base, scaling=scaling, rotary_dim=rotary_dim)
        self.qk_layout, self.num_heads = check_qk_layout(qk_layout, num_heads)
        self.base, self.rotary_dim = self.freqs.base, self.freqs.rotary_dim
        self.scaling = dict(self.freqs.params)
        self.attention_factor = self.freqs.attention_factor
        self._lock = threading.RLock()
        self._rope_state = self.freqs.initial_state                 # HF's dynamic state: a frozen value, swapped
        self._last: RotaryCache | None = None
        self._rows_memo: tuple[Any, ...] | None = None             # (dtype, rows, cos, sin, factor): :meth:`_rows`
        self.reset_parameters()

    def reset_parameters(self, *, seed: Any = None, rng: Any = None) -> None:
        """Drop the cos/sin cache (it is rebuilt on the next call); no random state to draw."""
        with self._lock:
            f = self.rotary_dim // 2
            self._snap = _Snapshot(None, np.zeros((0, f)), np.zeros((0, f)), {})
            self._rows_memo = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.pop("_lock", None)
        state.pop("_rows_memo", None)                               # views of the snapshot: made again on a call
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.RLock()
        self._rows_memo = None

    @property
    def inv_freq(self) -> np.ndarray:
        """The inverse frequencies serving the last call (F,) float64 (the original ones before any call)."""
        return self._rope_state.inv_freq

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
        """cos and sin (float64, times the attention factor) of int positions (...) -> (..., R), in the layout.

        ``seq_len`` picks the frequency variant (dynamic / longrope); default ``max(positions) + 1``.
        """
        cos, sin = self._tables([(check_positions(positions), None)], seq_len, None)[0]
        il = self.interleaved
        return expand_to_layout(cos, interleaved=il), expand_to_layout(sin, interleaved=il)

    def _tables(self, requests: list[tuple[np.ndarray, int | None]], seq_len: int | None,
                dtype: np.dtype | None) -> list[tuple[np.ndarray, np.ndarray]]:
        """cos, sin (..., F) for each ``(positions (...), start)`` of one call, all from one frequency variant.

        ``dtype`` None: float64; else cast to ``dtype``. ``start`` set means the positions are
        ``start + arange(L)`` (rows are sliced, not gathered). The variant and the snapshot are taken
        together under the lock; reading rows needs no lock (snapshots never change).
        """
        need = max((int(p.max()) + 1 if p.size else 0) for p, _ in requests)
        with self._lock:
            snap, far = self._cover(need, seq_len)
        out = []
        for pos, start in requests:
            if far is not None:                                     # far out: compute, do not cache
                ang = rope_angles(pos, far)
                c, s = np.cos(ang) * self.attention_factor, np.sin(ang) * self.attention_factor
                out.append((c, s) if dtype is None else (c.astype(dtype), s.astype(dtype)))
                continue
            hit = self._in_dtype(snap, dtype)
            if start is not None:
                out.append((hit[0][start:start + pos.shape[0]], hit[1][start:start + pos.shape[0]]))
            else:
                out.append((hit[0][pos], hit[1][pos]))
        return out

    @staticmethod
    def _in_dtype(snap: _Snapshot, dtype: np.dtype | None) -> tuple[np.ndarray, np.ndarray]:
        """The snapshot's (P, F) cos / sin in ``dtype`` (None: float64), cast once per snapshot."""
        if dtype is None:
            return snap.cos, snap.sin
        return snap.halves.get(dtype) or snap.halves.setdefault(   # idempotent; setdefault keeps the first
            dtype, (snap.cos.astype(dtype), snap.sin.astype(dtype)))

    def _cover(self, need: int, seq_len: int | None) -> tuple[_Snapshot, np.ndarray | None]:
        """(Under the lock.) Pick the variant for rows [0, need), keep the new state, and swap in a
        snapshot holding the rows (``tables.formulas.rope_state.rope_cache_rows``: grown or rebuilt as needed).

        Returns ``(snapshot, None)``, or ``(snapshot, inv_freq)`` for positions too far out to cache.
        """
        key, which, self._rope_state = rope_variant(self.freqs, max(need, seq_len or 0), self._rope_state)
        inv_freq = self.freqs.inv_freq_for(which, self._rope_state)
        key, snap = self._key(key), self._snap
        rows = rope_cache_rows(need, snap.cos.shape[0], key == snap.key, self.max_seq_len)
        if rows is None:                                            # far out: the formula
            return snap, inv_freq
        if key != snap.key or rows != snap.cos.shape[0]:            # rebuilt or grown: a new snapshot
            snap = self._snap = _Snapshot(key, *self._table(inv_freq, rows), {})
            self._rows_memo = None                                  # it read the old one
        return snap, None

    def _rows(self, start: int, length: int, dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
        """cos, sin (L, F) in ``dtype`` for positions ``start + arange(length)`` (``start`` checked), as
        :meth:`_tables` gives them: views of the snapshot's table in ``dtype`` when one static frequency variant
        serves every position and the snapshot holds the rows, kept as ``_rows_memo`` (dtype, rows, cos, sin, the
        attention factor the snapshot was built with), dropped whenever another snapshot is swapped in, so a call
        reads one attribute and slices; otherwise :meth:`_tables`, after which the memo is made again."""
        memo = self._rows_memo
        end = start + length
        if memo is not None and memo[0] == dtype and end <= memo[1] and memo[4] == self.attention_factor:
            return memo[2][start:end], memo[3][start:end]
        cos, sin = self._tables([(np.arange(start, end, dtype=np.int64), start)], end if length else 0, dtype)[0]
        if not self.freqs.length_dependent:                         # static: the variant never changes
            with self._lock:
                snap = self._snap
                if snap.key is not None:
                    self._rows_memo = (dtype, snap.cos.shape[0], *self._in_dtype(snap, dtype), snap.key[3])
        return cos, sin

    def _table(self, inv_freq: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
        ang = rope_angles(np.arange(n), inv_freq)                   # (n, F) float64
        return np.cos(ang) * self.attention_factor, np.sin(ang) * self.attention_factor

    @property
    def layout(self) -> str:
        """"interleaved" or "half"."""
        return "interleaved" if self.interleaved else "half"

    # -- rotation ---------------------------------------------------------------------------------
    def apply(self, q: Any, k: Any = None, positions: Any = None, *, start_pos: int = 0,
              key_positions: Any = None, cu_seqlens: Any = None) -> tuple[np.ndarray, np.ndarray | None]:
        """Rotate q and k at ``start_pos + arange(L)``; returns (q', k') with the input shapes and dtypes and keeps
        what :meth:`backward` needs. The general forms (q alone, given positions, ``key_positions``,
        ``cu_seqlens``, q and k of two dtypes): :meth:`RotaryBase.apply`, the same results.

        With ``cu_seqlens``: a packed row equals the same documents padded in a batch; it equals each document
        rotated alone except under a scaling that depends on the batch's longest position (dynamic NTK, longrope),
        where every document gets the frequencies of the row's largest position, as HF gives a padded batch.

        The default call reads top to bottom: q and k as (B, H, L, Dh) views (layout, dtype, heads checked),
        the cached cos / sin rows of ``start_pos .. start_pos + L`` (:meth:`_rows`), one ``rope_qk_forward`` pass.
        """
        if (positions is not None or key_positions is not None or cu_seqlens is not None
                or not isinstance(k, np.ndarray) or not isinstance(q, np.ndarray) or q.dtype != k.dtype):
            return super().apply(q, k, positions, start_pos=start_pos, key_positions=key_positions,
                                 cu_seqlens=cu_seqlens)
        layout = self.qk_layout
        q4 = to_bhld("q", q, self.head_dim, layout, self.num_heads)                 # (B, Hq, L, Dh) views
        k4 = to_bhld("k", k, self.head_dim, layout, self.num_heads)                 # (B, Hk, L, Dh)
        L = q4.shape[2]
        if k4.shape[0] != q4.shape[0] or k4.shape[2] != L:
            check_qk_lengths(q4.shape, k4.shape, layout)                                    # raises
        start = (start_pos if type(start_pos) is int and 0 <= start_pos <= INT64_MAX - L
                 else check_start_pos(start_pos, L))
        cos, sin = self._rows(start, L, q4.dtype)
        q_out, k_out, cache = F.rope_qk_forward(q4, k4, cos, sin, interleaved=self.interleaved)
        if layout != "bhld":
            q_out, k_out = self._out(q_out), self._out(k_out)
        object.__setattr__(self, "_last", RotaryCache(cache, None, q_out.shape, k_out.shape))   # a plain attribute
        return q_out, k_out

    forward = apply

    def rotate(self, x: Any, positions: Any = None, *, start_pos: int = 0, seq_len: int | None = None) -> np.ndarray:
        """Rotate one tensor x (B, H, L, Dh) at positions (L,) | (1, L) | (B, L) (default start_pos + arange(L);
        given positions are used as they are, so start_pos must then be 0, else ConfigError)."""
        x = to_bhld("x", x, self.head_dim, self.qk_layout, self.num_heads)
        pos = self._positions(positions, start_pos, x.shape[0], x.shape[2])
        cos, sin = self._tables([(pos, start_pos if positions is None else None)], seq_len, x.dtype)[0]
        return self._out(F.rope_forward(x, cos, sin, interleaved=self.interleaved)[0])

    def _rotate_packed(self, q: np.ndarray, k: np.ndarray, pos: np.ndarray, end: int
                       ) -> tuple[np.ndarray, np.ndarray, RotaryCache]:
        """q, k (1, H, T, Dh) at packed positions (T,) in [0, end) (``end``: the longest document): one pass
        reading the cached (P, F) cos / sin at the positions (no per-call tables), with the variant and the
        rows :meth:`_rotate_bhld` would pick (every scaling: the snapshot serves the call's variant);
        positions past the cache and q, k of two dtypes take :meth:`_rotate_bhld`."""
        if q.dtype != k.dtype:
            return self._rotate_bhld(q, k, pos, 0, None)
        with self._lock:
            snap, far = self._cover(end, end)
        if far is not None:
            return self._rotate_bhld(q, k, pos, 0, None)
        return self._rotate_pair(q, k, self._in_dtype(snap, q.dtype), None, self.interleaved, pos)

    def _rotate_bhld(self, q: np.ndarray, k: np.ndarray, positions: Any, start_pos: Any, key_positions: Any
                     ) -> tuple[np.ndarray, np.ndarray, RotaryCache]:
        """q, k (B, H, L, Dh) rotated at positions (L,) | (1, L) | (B, L) (default start_pos + arange(L)).

        ``key_positions`` (Lk,) | (B, Lk) rotates k at other positions than q (a KV cache); by
        default k uses q's positions, which needs the same length. Both use one frequency variant,
        chosen by the largest position of the call. Given ``positions`` need ``start_pos=0`` (ConfigError
        otherwise: it would be ignored); ``key_positions`` are used as given.
        """
        pos_q, pos_k = self._qk_positions(q, k, positions, start_pos, key_positions)
        seq_len = max(int(pos_q.max(initial=-1)), int(pos_k.max(initial=-1))) + 1
        start = start_pos if positions is None else None
        if key_positions is None and q.dtype == k.dtype:            # one pass over q and k
            return self._rotate_pair(q, k, self._tables([(pos_q, start)], seq_len, q.dtype)[0], None,
                                     self.interleaved)
        (cq, sq), (ck, sk) = self._tables([(pos_q, start), (pos_k, None)], seq_len, None)
        return self._rotate_pair(q, k, (cq.astype(q.dtype), sq.astype(q.dtype)),
                                 (ck.astype(k.dtype), sk.astype(k.dtype)), self.interleaved)

    def extra_repr(self) -> str:
        return (f"head_dim={self.head_dim}, rotary_dim={self.rotary_dim}, base={self.base}, "
                f"max_seq_len={self.max_seq_len}, rope_type={self.freqs.rope_type!r}, layout={self.layout!r}, "
                f"qk_layout={self.qk_layout!r}")
