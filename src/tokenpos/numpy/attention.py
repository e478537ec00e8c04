"""Scaled dot-product attention that runs with any positional scheme, with its backward (NumPy).

Shapes: B batch, H heads, Lq query length, Lk key length (Lq <= Lk), Dh head dim.
q (B, H, Lq, Dh), k and v (B, H, Lk, Dh) -> out (B, H, Lq, Dh).

One block, every scheme (``positional.kind``):
- "additive" / "none" (or ``positional=None``): nothing happens here (additive schemes were added to
  the embeddings already).
- "rotary": q and k are rotated first (``positional.apply_forward``); the gradient flows back
  through the rotation.
- "bias": ``positional.bias(Lq, Lk)`` (H, Lq, Lk) is added to the logits; on backward, the bias
  gradient (summed over the batch) goes to ``positional.backward`` (T5 accumulates ``weight.grad``).

Offsets: with a KV cache (Lq < Lk) query i sits at key position ``Lk - Lq + i``; the causal mask
lets it see keys ``j <= Lk - Lq + i``. Rotary positions: queries at ``positions`` or
``start_pos + arange(Lq)`` (``start_pos=None`` means ``Lk - Lq``); keys at ``key_positions`` or
``start_pos - (Lk - Lq) + arange(Lk)``, i.e. the keys end where the queries end. Given ``positions``
are used as they are, so ``start_pos`` must then be None or 0 (anything else: ConfigError, as it
would be ignored; add the offset to the positions instead). The KV cache holds
keys **before** rotation (all Lk keys are rotated on every call); pass ``rotate_keys=False`` if
your cache holds already-rotated keys (then only q is rotated).

Packed documents (``cu_seqlens`` (N + 1,), flash-attn's varlen convention): q, k, v are one row of T
tokens, (T, H, Dh) (the output too) or (1, H, T, Dh). Attention is block-diagonal over the documents
(causal inside each one when ``causal``), and every scheme measures positions inside its document:
rotary layers rotate at positions restarting at 0 (``positions_from_cu_seqlens``), bias schemes add
``bias(T, T)`` read at those positions (``bias[:, pos_i, pos_j]``: the bias of the same pair in a
document of its own, whatever the scheme), so every token gets the output and gradients of the same
documents padded in (N, L). Positions, key_positions or a start_pos with cu_seqlens: ConfigError.

Softmax runs in float32 at least (float64 for float64 inputs). Fully masked rows give zeros.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from tokenpos.numpy.functional._dispatch import kept
from tokenpos.tables.checks.attention import (
    attention_shape_message,
    check_bias_positions,
    check_bias_shape,
    check_mask_dtype,
    check_mask_shape,
    check_packed_scheme,
    check_rotated_keys,
    check_scale,
    check_scheme,
    key_start_message,
    rotary_layout,
)
from tokenpos.tables.checks.packing import check_packed_attention_args
from tokenpos.tables.checks.validation import check_float_array, check_grad, check_start_pos_with_positions
from tokenpos.tables.errors import ConfigError, PositionError
from tokenpos.tables.formulas.attention import (
    causal_keep_mask,
    from_rotary_layout,
    resolve_query_start,
    to_rotary_layout,
)
from tokenpos.tables.formulas.llama4 import query_temperature
from tokenpos.tables.formulas.packing import positions_from_cu_seqlens


@dataclass(frozen=True)
class AttentionCache:
    """Everything the backward needs (and nothing global)."""

    q: np.ndarray            # (B, H, Lq, Dh) rotated, compute dtype (never the caller's array)
    k: np.ndarray            # (B, H, Lk, Dh) rotated, compute dtype (never the caller's array)
    v: np.ndarray            # (B, H, Lk, Dh) compute dtype, a private copy
    probs: np.ndarray        # (B, H, Lq, Lk)
    scale: float
    positional: Any
    rotary_cache: Any
    rotate_keys: bool
    dtypes: tuple[np.dtype, np.dtype, np.dtype]
    temperature: np.ndarray | None = None      # (B|1, 1, Lq, 1) Llama 4 query temperature
    packed: np.ndarray | None = None           # (T,) positions inside each document (cu_seqlens), else None
    thd: bool = False                          # q, k, v and the output were (T, H, Dh)


def _kind(positional: Any) -> str:
    return "none" if positional is None else str(positional.kind)   # checked by check_scheme in the forward


def _check_shapes(q: np.ndarray, k: np.ndarray, v: np.ndarray, given: tuple[np.ndarray, ...], packed: bool) -> None:
    """q, k, v as (B, H, L, D) views; the error quotes ``given`` (the caller's arrays)."""
    ok = q.ndim == k.ndim == v.ndim == 4 and q.shape[:2] == k.shape[:2] == v.shape[:2] \
        and k.shape[2] == v.shape[2] and q.shape[3] == k.shape[3] and q.shape[2] <= k.shape[2]
    if not ok:
        raise ConfigError(attention_shape_message(given[0].shape, given[1].shape, given[2].shape, packed=packed))


def _bhld(x: np.ndarray) -> np.ndarray:
    """A packed (T, H, Dh) -> (1, H, T, Dh) view; 4-D arrays as they are."""
    return x.transpose(1, 0, 2)[None] if x.ndim == 3 else x


def _thd(x: np.ndarray) -> np.ndarray:
    """(1, H, T, Dh) -> (T, H, Dh), the inverse of :func:`_bhld`."""
    return x[0].transpose(1, 0, 2)


def packed_keep_mask(pos: np.ndarray, causal: bool) -> np.ndarray:
    """(T, T) bool: query i sees key j inside its own document (and j <= i when causal). ``pos`` (T,)
    restarts at 0 in every document, so a running count of the zeros names each token's document."""
    doc = np.cumsum(pos == 0)
    keep = doc[:, None] == doc[None, :]
    return keep & causal_keep_mask(pos.size, pos.size) if causal else keep


def _own(x: np.ndarray, dtype: np.dtype, inputs: tuple[np.ndarray, ...]) -> np.ndarray:
    """x in ``dtype``, never sharing memory with the caller's arrays: the cache keeps it for backward, so
    refilling q, k or v between forward and backward must not change a gradient (``functional._dispatch.kept``)."""
    x = x.astype(dtype, copy=False)
    return kept(x) if any(np.may_share_memory(x, a) for a in inputs) else x


def _rotate(positional: Any, q: np.ndarray, k: np.ndarray, lq: int, lk: int, positions: Any, start_pos: int | None,
            key_positions: Any, rotate_keys: bool) -> tuple[np.ndarray, np.ndarray, Any]:
    """q, k (in the layer's qk_layout; Lq and Lk queries and keys) rotated at their positions, and the rotary
    cache. ``start_pos`` was checked against ``positions`` by the caller; the layer gets start 0 with given
    positions (they are used as given)."""
    if positions is not None and lq != lk and key_positions is None and rotate_keys:
        raise ConfigError(key_start_message(None, lq, lk))
    q_start = 0 if positions is not None else resolve_query_start(start_pos, lq, lk)
    if key_positions is None and positions is None:
        k_start = q_start - (lk - lq)
        if k_start < 0:
            raise PositionError(key_start_message(q_start, lq, lk))
        key_positions = np.arange(k_start, k_start + lk, dtype=np.int64)
    if not rotate_keys:   # the keys are rotated already: rotate q alone (k stands in for the shape)
        check_rotated_keys(positional)
        q_rot, _, rc = positional.apply_forward(q, q, positions, start_pos=q_start)
        return q_rot, k, rc
    return positional.apply_forward(q, k, positions, start_pos=q_start, key_positions=key_positions)


def scaled_dot_product_attention_forward(
        q: Any, k: Any, v: Any, *, positional: Any = None, causal: bool = True, positions: Any = None,
        start_pos: int | None = None, key_positions: Any = None, attn_mask: Any = None, scale: float | None = None,
        rotate_keys: bool = True, attn_temperature: Any = None, cu_seqlens: Any = None
) -> tuple[np.ndarray, AttentionCache]:
    """Attention forward: ``(out (B, H, Lq, Dh), cache)``.

    Args:
        q, k, v: (B, H, Lq, Dh), (B, H, Lk, Dh), (B, H, Lk, Dh), Lq <= Lk.
        positional: a scheme object (its ``kind`` decides what happens) or None.
        causal: mask keys after each query (query i sees keys j <= Lk - Lq + i).
        positions, start_pos, key_positions, rotate_keys: rotary positions (see the module docstring);
            with ``positions`` given, ``start_pos`` must be None or 0 (else ConfigError).
        attn_mask: optional, broadcastable to (B, H, Lq, Lk): bool (True = attend) or additive floats.
        scale: logit scale, default 1 / sqrt(Dh).
        attn_temperature: Llama 4's NoPE-layer temperature ``(floor_scale, attn_scale)``: each query is
            multiplied by ``tables.formulas.llama4.llama4_attn_scales`` of its position (``positions``, else
            start_pos + arange(Lq)) after any rotation; None = off.
        cu_seqlens: (N + 1,) int32 / int64, packed documents (module docstring): q, k, v (T, H, Dh) ->
            out (T, H, Dh), or (1, H, T, Dh) -> (1, H, T, Dh).
            The output equals the same documents padded in a batch; it equals each document attended alone
            except under a rotary scaling that depends on the batch's longest position (dynamic NTK, longrope).
    """
    q, k, v = check_float_array("q", q), check_float_array("k", k), check_float_array("v", v)
    inputs = (q, k, v)
    thd = cu_seqlens is not None and q.ndim == 3
    if cu_seqlens is not None:                                                # packed: (T, H, Dh) -> (1, H, T, Dh)
        q, k, v = _bhld(q), _bhld(k), _bhld(v)
    _check_shapes(q, k, v, inputs, cu_seqlens is not None)
    kind = check_scheme(positional)
    if cu_seqlens is not None:
        check_packed_scheme(positional, kind)
    if attn_mask is not None:
        attn_mask = np.asarray(attn_mask)
        check_mask_dtype(attn_mask.dtype)
        check_mask_shape(attn_mask.shape, (q.shape[0], q.shape[1], q.shape[2], k.shape[2]))
    scale = check_scale(scale)
    packed = None
    if cu_seqlens is not None:                                                # positions inside each document
        n = check_packed_attention_args(q.shape, k.shape, positions, start_pos, key_positions,
                                        (inputs[0].shape, inputs[1].shape))
        packed = positions = positions_from_cu_seqlens(cu_seqlens, n)
    else:
        check_bias_positions(positional, kind, positions, key_positions, start_pos, q.shape[2], k.shape[2],
                             attn_temperature is not None)
    check_start_pos_with_positions(start_pos, positions, none_ok=True)
    dtypes = (q.dtype, k.dtype, v.dtype)
    compute = np.result_type(q.dtype, k.dtype, v.dtype, np.float32)
    rotary_cache = None
    if kind == "rotary":                            # the layer sees q and k in its own qk_layout, and back
        layout = rotary_layout(positional, q.shape[0])
        ql, kl, rotary_cache = _rotate(positional, to_rotary_layout(q, layout), to_rotary_layout(k, layout),
                                       q.shape[2], k.shape[2], positions, start_pos, key_positions, rotate_keys)
        q, k = from_rotary_layout(ql, layout), from_rotary_layout(kl, layout)
    q, k, v = (_own(x, compute, inputs) for x in (q, k, v))                   # kept for backward: private
    temperature = None
    if attn_temperature is not None:
        temperature = query_temperature(attn_temperature, positions, start_pos, q.shape[2], k.shape[2], compute)
        q = q * temperature                                                    # (B|1, 1, Lq, 1)
    lq, lk, dh = q.shape[2], k.shape[2], q.shape[3]
    scale = float(1.0 / np.sqrt(dh)) if scale is None else scale
    logits = (q @ np.swapaxes(k, -1, -2)) * scale                              # (B, H, Lq, Lk)
    if kind == "bias":
        bias = np.asarray(positional.bias(lq, lk))                           # (H, Lq, Lk)
        check_bias_shape(bias.shape, q.shape[1], lq, lk)
        if packed is not None:                                                 # each pair at its in-document positions
            bias = bias[:, packed[:, None], packed[None, :]]
        logits = logits + bias.astype(compute)[None]
    keep = np.ones((lq, lk), dtype=bool)
    if packed is not None:
        keep = packed_keep_mask(packed, causal)                                # (T, T) block-diagonal
    elif causal:
        keep = causal_keep_mask(lq, lk)                                        # (Lq, Lk)
    if attn_mask is not None:
        mask = np.asarray(attn_mask)
        if mask.dtype == np.bool_:
            keep = keep & mask
        else:
            logits = logits + mask.astype(compute)
    logits = np.where(keep, logits, -np.inf)
    row_max = logits.max(axis=-1, keepdims=True, initial=-np.inf)            # (no keys: -inf, then 0)
    row_max = np.where(np.isfinite(row_max), row_max, 0.0)
    e = np.exp(logits - row_max)
    total = e.sum(axis=-1, keepdims=True)
    probs = e / np.where(total > 0, total, 1.0)                                # (B, H, Lq, Lk)
    out = probs @ v                                                            # (B, H, Lq, Dh)
    cache = AttentionCache(q, k, v, probs, scale, positional, rotary_cache, rotate_keys, dtypes, temperature,
                           packed, thd)
    out = out.astype(dtypes[0], copy=False)
    return (_thd(out) if thd else out), cache


def scaled_dot_product_attention_backward(dout: Any, cache: AttentionCache) -> tuple[np.ndarray, np.ndarray,
                                                                                      np.ndarray]:
    """Gradients ``(dq, dk, dv)`` w.r.t. the inputs of the forward (before rotation).

    Bias schemes receive their gradient through ``positional.backward(grad_bias (H, Lq, Lk))``.
    """
    c = cache
    b, h, lq, dv_ = c.probs.shape[:-1] + c.v.shape[-1:]                      # the output, (B, H, Lq, Dv)
    dout = check_grad("dout", dout, (lq, h, dv_) if c.thd else (b, h, lq, dv_)).astype(c.v.dtype, copy=False)
    if c.thd:
        dout = _bhld(dout)
    dv = np.swapaxes(c.probs, -1, -2) @ dout                                  # (B, H, Lk, Dh)
    dprobs = dout @ np.swapaxes(c.v, -1, -2)                                  # (B, H, Lq, Lk)
    dlogits = c.probs * (dprobs - (dprobs * c.probs).sum(axis=-1, keepdims=True))
    kind = _kind(c.positional)
    if kind == "bias" and hasattr(c.positional, "backward"):
        grad_bias = dlogits.sum(axis=0)                                       # (H, Lq, Lk)
        if c.packed is not None:                                              # back to the (H, T, T) bias read
            h, t = grad_bias.shape[0], c.packed.size
            at = (c.packed[:, None] * t + c.packed[None, :]).ravel()          # (T*T,) the entry each pair read
            full = np.zeros((t * t, h), grad_bias.dtype)
            np.add.at(full, at, grad_bias.reshape(h, t * t).T)
            grad_bias = full.T.reshape(h, t, t)
        c.positional.backward(grad_bias)
    dq = (dlogits @ c.k) * c.scale                                            # (B, H, Lq, Dh)
    dk = (np.swapaxes(dlogits, -1, -2) @ c.q) * c.scale                       # (B, H, Lk, Dh)
    if c.temperature is not None:
        dq = dq * c.temperature
    if kind == "rotary":                            # through the layer in its own qk_layout, as the forward went
        layout = rotary_layout(c.positional, dq.shape[0])
        gq, gk = to_rotary_layout(dq, layout), to_rotary_layout(dk if c.rotate_keys else dq, layout)
        gq, gk = c.positional.apply_backward(gq, gk, c.rotary_cache)
        dq = from_rotary_layout(gq, layout)
        if c.rotate_keys:
            dk = from_rotary_layout(gk, layout)
    dq, dk, dv = dq.astype(c.dtypes[0], copy=False), dk.astype(c.dtypes[1], copy=False), dv.astype(c.dtypes[2],
                                                                                                copy=False)
    return (_thd(dq), _thd(dk), _thd(dv)) if c.thd else (dq, dk, dv)


def scaled_dot_product_attention(q: Any, k: Any, v: Any, **kwargs: Any) -> np.ndarray:
    """``scaled_dot_product_attention_forward(...)[0]``: out (B, H, Lq, Dh); keeps no state."""
    return scaled_dot_product_attention_forward(q, k, v, **kwargs)[0]
