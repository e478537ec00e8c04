"""The rotation protocol shared by the NumPy RoPE-family layers (RoPE, M-RoPE, xPos, 2-D RoPE).

Shapes: B batch, H heads (q and k may differ, e.g. GQA), L length, Dh head dim, T packed tokens.
q, k: (B, H, L, Dh) (or (B, L, H, Dh) with ``qk_layout="blhd"``, or one packed row (T, H, Dh) with
``qk_layout="thd"``, rotated as (1, H, T, Dh)).

Packed documents: ``cu_seqlens`` (N + 1,) gives positions restarting at 0 in every document
(``kernels.packing.document_positions``: one compiled pass that checks ``cu_seqlens`` too; its
formula twin with the kernels off), which then take the per-token positions path of the layer; a
layer whose positions are not one index per token (``packs = False``) refuses it with ConfigError.

A layer defines ``_rotate_bhld(q, k, positions, start_pos, key_positions) -> (q', k', cache)`` on
(B, H, L, Dh) views, already checked by :meth:`RotaryBase._qk` (the same protocol as the torch
``RotaryBase``, whose layers return ``(q', k')``), rotating through :meth:`RotaryBase._rotate_pair`,
whose :class:`RotaryCache` is the cache. This base adds the layout plumbing, the functional pair
``apply_forward`` / ``apply_backward`` (the rotation by -angle, through ``tokenpos.numpy.functional``)
and the stateful ``apply`` / ``forward`` / ``backward``.

``positions`` None means ``start_pos + arange(L)``; given positions are used as they are, so
``start_pos`` must then be 0 (None for 2-D RoPE, whose default it is): anything else raises
ConfigError (``tables.checks.validation.check_start_pos_with_positions``) before anything is kept.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from tokenpos.kernels.packing import document_positions
from tokenpos.numpy import functional as F
from tokenpos.numpy.module import Module
from tokenpos.tables.checks.packing import check_packed_rotary_args
from tokenpos.tables.checks.rope import (
    caller_shape,
    check_heads,
    check_no_key_positions,
    check_packed_qk,
    check_positions_shape,
    check_qk_lengths,
    one_head,
    rope_dtype_message,
    rope_layout_shape_message,
    rotary_packed_message,
)
from tokenpos.tables.checks.validation import (
    check_grad,
    check_positions,
    check_start_pos,
    check_start_pos_with_positions,
)
from tokenpos.tables.errors import ConfigError


def to_bhld(name: str, x: Any, head_dim: int, qk_layout: str, num_heads: int | None) -> np.ndarray:
    """q or k in the declared layout -> a (B, H, L, Dh) view; float dtype and head count checked.

    A (B, H, L, Dh) result goes back with the same transpose (it is its own inverse).
    """
    x = np.asarray(x)
    if x.ndim != (3 if qk_layout == "thd" else 4) or x.shape[-1] != head_dim:
        raise ConfigError(rope_layout_shape_message(name, x.shape, head_dim, qk_layout))
    if x.dtype.kind != "f":                          # np.issubdtype(dtype, np.floating), without its Python
        raise ConfigError(rope_dtype_message(name, x.dtype))
    if num_heads is not None:
        check_heads(name, x.shape, qk_layout, num_heads)
    return x if qk_layout == "bhld" else _bhld(x, qk_layout)


def _bhld(x: np.ndarray, qk_layout: str) -> np.ndarray:
    """The declared layout -> a (B, H, L, Dh) view (``thd``: (T, H, Dh) -> (1, H, T, Dh))."""
    if qk_layout == "thd":
        return x.transpose(1, 0, 2)[None]
    return x.transpose(0, 2, 1, 3) if qk_layout == "blhd" else x


@dataclass(frozen=True)
class RotaryCache:
    """What ``apply_backward`` needs: the functional cache of q, and of k when k was rotated by its own
    tables (None when one ``rope_qk`` pass rotated both); the shapes of q' and k' as returned (the declared
    layout), which their gradients must have (``k_shape`` None: ``apply`` was called without k)."""

    q: F.RopeCache
    k: F.RopeCache | None
    q_shape: tuple[int, ...] = ()
    k_shape: tuple[int, ...] | None = ()


class RotaryBase(Module):
    """apply / forward / backward / apply_backward of a layer rotating q and k (see the module docstring).

    Shape:
        apply(q (B, Hq, L, Dh), k (B, Hk, L, Dh), positions, ...) -> (q', k'), same shapes and dtypes.
    """

    head_dim: int
    qk_layout: str
    num_heads: int | None
    _last: Any
    packs = False                    # positions one index per token: cu_seqlens accepted (RotaryEmbedding)
    # packed attention rotates a layer that does not pack at the row's (T,) in-document positions: M-RoPE takes
    # them (text tokens: its three axes equal); 2-D RoPE, whose positions are (row, column) pairs, cannot
    # (tables.checks.attention.check_packed_scheme then raises the layer's own reason)
    takes_token_positions = True
    # q and k are rotated only together, in one call: k's tables differ from q's and depend on the call
    # (xPos: k scaled down, q up, around one centre). The attention functions then rotate q and the keys in
    # one apply (keys at their positions) and refuse rotate_keys=False (tables.checks.attention.check_rotated_keys).
    rotates_qk_together = False

    def reset_parameters(self, *, seed: Any = None, rng: Any = None) -> None:
        """Nothing to reset (no parameters, no cache)."""

    # -- layout ------------------------------------------------------------------------------------
    def _qk(self, q: Any, k: Any) -> tuple[np.ndarray, np.ndarray]:
        """q, k in the declared layout -> (B, Hq, L, Dh), (B, Hk, L, Dh) views, each checked (q first)."""
        return (to_bhld("q", q, self.head_dim, self.qk_layout, self.num_heads),
                to_bhld("k", k, self.head_dim, self.qk_layout, self.num_heads))

    def _out(self, x: np.ndarray) -> np.ndarray:
        """(B, H, L, Dh) -> the declared layout (``thd``: (1, H, T, Dh) -> (T, H, Dh))."""
        if self.qk_layout == "thd":
            return x[0].transpose(1, 0, 2)
        return x.transpose(0, 2, 1, 3) if self.qk_layout == "blhd" else x

    # -- positions ---------------------------------------------------------------------------------
    def _positions(self, positions: Any, start_pos: Any, batch: int, length: int) -> np.ndarray:
        """The positions of a (B, H, L, Dh) array: ``start_pos + arange(L)`` (L,) int64 when ``positions`` is
        None (``check_start_pos``), else the given integers >= 0 of shape (L,) | (1, L) | (B, L) (HF's
        (1, L) read as (L,)), which need ``start_pos`` 0 (ConfigError otherwise). M-RoPE overrides it
        (three position axes)."""
        if positions is None:
            start = check_start_pos(start_pos, length)
            return np.arange(start, start + length, dtype=np.int64)
        check_start_pos_with_positions(start_pos, positions)
        pos = check_positions(positions)
        return pos[0] if check_positions_shape(pos.shape, batch, length) else pos

    def _qk_positions(self, q: np.ndarray, k: np.ndarray, positions: Any, start_pos: Any, key_positions: Any
                      ) -> tuple[np.ndarray, np.ndarray]:
        """(q's positions, k's positions) for q (B, Hq, Lq, Dh), k (B, Hk, Lk, Dh) by :meth:`_positions`: k at
        ``key_positions`` (a KV cache of keys before rotation, used as given), else at q's (Lq == Lk, checked
        first: ConfigError)."""
        if key_positions is None:
            check_qk_lengths(q.shape, k.shape, self.qk_layout)
        pos_q = self._positions(positions, start_pos, q.shape[0], q.shape[2])
        return pos_q, pos_q if key_positions is None else self._positions(key_positions, 0, k.shape[0], k.shape[2])

    def _packed_positions(self, q: np.ndarray, positions: Any, start_pos: Any, key_positions: Any,
                          cu_seqlens: Any) -> tuple[np.ndarray, int]:
        """Positions (T,) of q (1, H, T, Dh), counting from ``start_pos`` in every document (0 by default; an
        int, or one per document: flash-attn's ``seqlen_offsets``), and ``max(positions) + 1``, from the one
        compiled pass that also checks ``cu_seqlens`` and ``start_pos`` (``kernels.packing.document_positions``,
        as ``TransformerEmbedding`` and the torch twin take them); every other argument checked."""
        if not self.packs:
            raise ConfigError(rotary_packed_message(type(self).__name__))
        return document_positions(cu_seqlens, check_packed_rotary_args(q.shape, positions, key_positions), start_pos)

    # -- rotation ----------------------------------------------------------------------------------
    @staticmethod
    def _rotate_pair(q: np.ndarray, k: np.ndarray, tables_q: tuple[np.ndarray, np.ndarray],
                     tables_k: tuple[np.ndarray, np.ndarray] | None, interleaved: bool,
                     positions: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, RotaryCache]:
        """Rotate q, k (B, H, L, Dh) by cos / sin (..., F) already in their dtypes -> (B, H, L, Dh) and the cache.

        ``tables_k`` None: one ``rope_qk_forward`` pass with q's tables (a (P, F) table read at
        ``positions`` when given); else one ``rope_forward`` per tensor.
        """
        if tables_k is None:
            q_out, k_out, cache = F.rope_qk_forward(q, k, *tables_q, interleaved=interleaved, positions=positions)
            return q_out, k_out, RotaryCache(cache, None)
        q_out, cache_q = F.rope_forward(q, *tables_q, interleaved=interleaved)
        k_out, cache_k = F.rope_forward(k, *tables_k, interleaved=interleaved)
        return q_out, k_out, RotaryCache(cache_q, cache_k)

    def _rotate_packed(self, q: np.ndarray, k: np.ndarray, pos: np.ndarray, end: int
                       ) -> tuple[np.ndarray, np.ndarray, RotaryCache]:
        """q, k (1, H, T, Dh) rotated at packed positions (T,) in [0, end): the per-token path."""
        return self._rotate_bhld(q, k, pos, 0, None)

    def _rotate_bhld(self, q: np.ndarray, k: np.ndarray, positions: Any, start_pos: Any, key_positions: Any
                     ) -> tuple[np.ndarray, np.ndarray, RotaryCache]:  # pragma: no cover - abstract
        """q, k (B, H, L, Dh) views (checked) -> (q', k') (B, H, L, Dh) and the cache for backward."""
        raise NotImplementedError(f"{type(self).__name__} defines _rotate_bhld")

    def apply_forward(self, q: Any, k: Any, positions: Any = None, *, start_pos: Any = 0,
                      key_positions: Any = None, cu_seqlens: Any = None) -> tuple[np.ndarray, np.ndarray, RotaryCache]:
        """The functional forward: ``(q', k', cache)`` for :meth:`apply_backward`; no state kept.
        ``cu_seqlens`` (N + 1,): q, k one packed row, positions restarting per document."""
        q, k = self._qk(q, k)
        if cu_seqlens is not None:
            if self.packs:                           # the others refuse cu_seqlens itself (_packed_positions)
                L = self.qk_layout
                check_packed_qk(caller_shape(q.shape, L), caller_shape(k.shape, L), L)
            q_out, k_out, cache = self._rotate_packed(q, k, *self._packed_positions(q, positions, start_pos,
                                                                                     key_positions, cu_seqlens))
        else:
            q_out, k_out, cache = self._rotate_bhld(q, k, positions, start_pos, key_positions)
        q_out, k_out = self._out(q_out), self._out(k_out)
        return q_out, k_out, replace(cache, q_shape=q_out.shape, k_shape=k_out.shape)

    def apply_backward(self, grad_q: Any, grad_k: Any, cache: RotaryCache) -> tuple[np.ndarray, np.ndarray | None]:
        """Gradients (dq, dk) w.r.t. q and k from those w.r.t. q' and k' (declared layout): the transpose
        of the forward map (the rotation by -angle, scaled as the forward was). ``grad_k`` None: (dq, None).
        Each gradient must be a floating array of its output's shape (``check_grad``); ``grad_k`` after a call
        without k is refused (ConfigError)."""
        gq = _bhld(check_grad("grad_q", grad_q, cache.q_shape), self.qk_layout)
        if grad_k is None:
            return self._out(F.rope_backward(gq, cache.q)), None
        if cache.k_shape is None:
            raise ConfigError("grad_k given, but apply was called without k (it returned (q', None)); expected "
                              "backward(grad_q) alone")
        gk = _bhld(check_grad("grad_k", grad_k, cache.k_shape), self.qk_layout)
        if cache.k is None:
            dq, dk = F.rope_qk_backward(gq, gk, cache.q)
        else:
            dq, dk = F.rope_backward(gq, cache.q), F.rope_backward(gk, cache.k)
        return self._out(dq), self._out(dk)

    # -- stateful pair -----------------------------------------------------------------------------
    def apply(self, q: Any, k: Any = None, positions: Any = None, *, start_pos: int = 0,
              key_positions: Any = None, cu_seqlens: Any = None) -> tuple[np.ndarray, np.ndarray | None]:
        """Rotate q and k (B, H, L, Dh) at ``positions`` (see the layer; given positions need start_pos=0);
        keeps what :meth:`backward` needs (nothing changes when an input is refused). With
        ``cu_seqlens`` (N + 1,): q (T, H, Dh) and k (T, Hk, Dh) (``qk_layout="thd"``; or one row of the
        declared layout), positions restarting at 0 in every document. ``k`` None: q alone (q rotated
        as in a call with keys of q's length).

        Returns (q', k') with the input shapes and dtypes; (q', None) without k.
        """
        if k is None:
            check_no_key_positions(key_positions)
            q = np.asarray(q)
        q_out, k_out, cache = self.apply_forward(q, one_head(q, self.qk_layout) if k is None else k,
                                                 positions, start_pos=start_pos, key_positions=key_positions,
                                                 cu_seqlens=cu_seqlens)
        self._last = cache if k is not None else replace(cache, k_shape=None)
        return q_out, (None if k is None else k_out)

    forward = apply

    def backward(self, grad_q: Any, grad_k: Any = None) -> tuple[np.ndarray, np.ndarray | None]:
        """Gradients (dq, dk) of the last :meth:`apply`; ``grad_k`` None (a call without k, or no
        gradient reaching k'): (dq, None)."""
        return self.apply_backward(grad_q, grad_k, self._cached(self._last))
