"""Scaled dot-product attention that runs with any positional scheme (torch backend; autograd backward).

Shapes: B batch, H heads, Lq query length, Lk key length (Lq <= Lk), Dh head dim.
q (B, H, Lq, Dh), k and v (B, H, Lk, Dh) -> out (B, H, Lq, Dh).

Same contract as ``tokenpos.numpy.attention`` (see its docstring): ``positional.kind`` decides
what happens ("rotary" rotates q and k, "bias" adds ``bias(Lq, Lk)``, "additive"/"none" nothing);
with a KV cache (Lq < Lk) query i sits at key position ``Lk - Lq + i``, the causal mask follows
that offset, and the cache holds keys before rotation (``rotate_keys=False`` if yours holds rotated
keys). Rotary positions: queries at ``positions`` or ``start_pos + arange(Lq)`` (``start_pos=None``
means ``Lk - Lq``), keys at ``key_positions`` or ending where the queries end; with ``positions``
given, ``start_pos`` must be None or 0 (else ConfigError: it would be ignored).

Packed documents (``cu_seqlens`` (N + 1,) on q's device): q, k, v one row of T tokens, (T, H, Dh) or
(1, H, T, Dh); block-diagonal attention, rotary positions restarting per document, bias schemes read at
the in-document positions (see the NumPy twin); no host sync (``tokenpos.torch.packing``).

The logits, softmax and weighted sum run in float32 at least (float64 for float64 inputs); the
output is cast to q's dtype. Fully masked rows give zeros. With ``positions=None`` every shape
decision uses Python ints, so the function runs under ``torch.compile(fullgraph=True)``.
"""

from __future__ import annotations

import math
from typing import Any

import torch

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
    check_temperature,
    key_start_message,
    rotary_layout,
)
from tokenpos.tables.checks.packing import check_packed_attention_args
from tokenpos.tables.checks.validation import check_start_pos, check_start_pos_with_positions
from tokenpos.tables.errors import ConfigError, PositionError
from tokenpos.tables.formulas.attention import from_rotary_layout, resolve_query_start, to_rotary_layout
from tokenpos.tables.formulas.llama4 import query_temperature
from tokenpos.torch._checks import calc_dtype, check_float_tensor, check_position_tensor, values_readable
from tokenpos.torch.packing import check_cu_seqlens_tensor, packed_positions


def _bhld(x: Any) -> Any:
    """A packed (T, H, Dh) -> (1, H, T, Dh) view; anything else as it is (checked next)."""
    return x.transpose(0, 1)[None] if isinstance(x, torch.Tensor) and x.dim() == 3 else x


def _check_shapes(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, given: tuple[tuple[int, ...], ...],
                  packed: bool) -> None:
    """q, k, v as (B, H, L, D) views; the error quotes ``given`` (the caller's shapes)."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_float_tensor(name, t)
    ok = q.dim() == k.dim() == v.dim() == 4 and q.shape[:2] == k.shape[:2] == v.shape[:2] \
        and k.shape[2] == v.shape[2] and q.shape[3] == k.shape[3] and q.shape[2] <= k.shape[2]
    if not ok:
        raise ConfigError(attention_shape_message(given[0], given[1], given[2], packed=packed))


def _host_values(x: Any) -> Any:
    """Positions as values the shared checks can read: a CPU tensor's (outside compile / torch.func), anything
    else not a tensor as it is; None for a tensor elsewhere (reading it would sync)."""
    if not isinstance(x, torch.Tensor):
        return x
    return x.detach().numpy() if x.is_cpu and values_readable(x) else None


def _rotate(positional: Any, q: torch.Tensor, k: torch.Tensor, lq: int, lk: int, positions: Any,
            start_pos: int | None, key_positions: Any, rotate_keys: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """q, k (in the layer's qk_layout; Lq and Lk queries and keys) rotated at their positions. ``start_pos`` was
    checked against ``positions`` by the caller; the layer gets start 0 with given positions (used as given)."""
    if positions is not None and lq != lk and key_positions is None and rotate_keys:
        raise ConfigError(key_start_message(None, lq, lk))
    q_start = 0 if positions is not None else resolve_query_start(start_pos, lq, lk)
    if not rotate_keys:
        check_rotated_keys(positional)
        return positional.rotate(q, positions, start_pos=q_start), k
    if positions is None and key_positions is None:
        k_start = q_start - (lk - lq)
        if k_start < 0:
            raise PositionError(key_start_message(q_start, lq, lk))
        if getattr(positional, "rotates_qk_together", False):   # one call for q and the keys, keys by position
            check_start_pos(q_start, lq)          # the keys end where the queries do: refused before the arange
            return positional.apply(q, k, start_pos=q_start,
                                    key_positions=torch.arange(k_start, k_start + lk, device=q.device))
        need = q_start + lq
        return (positional.rotate(q, start_pos=q_start, seq_len=need),
                positional.rotate(k, start_pos=k_start, seq_len=need))
    return positional.apply(q, k, positions, start_pos=q_start, key_positions=key_positions)


def _query_temperature(attn_temperature: Any, positions: Any, start_pos: int | None, lq: int, lk: int,
                       device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """Llama 4's per-query scales (B|1, 1, Lq, 1) in ``dtype`` on ``device``: on the CPU from
    ``tables.formulas.llama4.query_temperature``; elsewhere its formula in tensor ops on the device
    (``log1p(floor((n + 1) / floor_scale)) * attn_scale + 1`` in float64; float32 on MPS), so no
    position is read on the host and nothing is copied to the device."""
    if device.type == "cpu":
        return torch.from_numpy(query_temperature(attn_temperature, positions, start_pos, lq, lk)).to(dtype)
    floor_scale, attn_scale = check_temperature(attn_temperature)
    if positions is None:
        start = resolve_query_start(start_pos, lq, lk)
        pos = torch.arange(start, start + lq, device=device)
    else:
        pos = check_position_tensor(positions, device=device)
        if pos.shape[-1] != lq or pos.dim() > 2:
            raise ConfigError(f"positions for attn_temperature must have shape ({lq},) or (B, {lq}), "
                              f"got {tuple(pos.shape)}")
    n = pos.to(calc_dtype(device))
    s = torch.log1p(torch.floor((n + 1.0) / floor_scale)) * attn_scale + 1.0
    return (s.reshape(1, 1, lq, 1) if s.dim() == 1 else s[:, None, :, None]).to(dtype)


def scaled_dot_product_attention(
        q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, positional: Any = None, causal: bool = True,
        positions: Any = None, start_pos: int | None = None, key_positions: Any = None,
        attn_mask: torch.Tensor | None = None, scale: float | None = None, rotate_keys: bool = True,
        attn_temperature: Any = None, cu_seqlens: Any = None) -> torch.Tensor:
    """Attention with any positional scheme: out (B, H, Lq, Dh), q's dtype.

    Args:
        q, k, v: (B, H, Lq, Dh), (B, H, Lk, Dh), (B, H, Lk, Dh), Lq <= Lk.
        positional: a scheme object (its ``kind`` decides what happens) or None.
        causal: query i sees keys j <= Lk - Lq + i.
        positions, start_pos, key_positions, rotate_keys: rotary positions (module docstring); with
            ``positions`` given, ``start_pos`` must be None or 0 (else ConfigError).
        attn_mask: optional, broadcastable to (B, H, Lq, Lk): bool (True = attend) or additive floats.
        scale: logit scale, default 1 / sqrt(Dh).
        attn_temperature: Llama 4's NoPE-layer temperature ``(floor_scale, attn_scale)`` (see the NumPy
            twin); None = off.
        cu_seqlens: (N + 1,) int32 / int64 on q's device, packed documents (module docstring): q, k, v
            (T, H, Dh) -> out (T, H, Dh), or (1, H, T, Dh) -> (1, H, T, Dh).
            The output equals the same documents padded in a batch; it equals each document attended alone
            except under a rotary scaling that depends on the batch's longest position (dynamic NTK, longrope).
    """
    thd = cu_seqlens is not None and isinstance(q, torch.Tensor) and q.dim() == 3
    given = (tuple(getattr(q, "shape", ())), tuple(getattr(k, "shape", ())),
             tuple(getattr(v, "shape", ())))                                   # as the caller passed them
    if cu_seqlens is not None:                                                  # (T, H, Dh) -> (1, H, T, Dh)
        q, k, v = _bhld(q), _bhld(k), _bhld(v)
    _check_shapes(q, k, v, given, cu_seqlens is not None)
    kind = check_scheme(positional)
    if cu_seqlens is not None:
        check_packed_scheme(positional, kind)
    if attn_mask is not None:
        if not isinstance(attn_mask, torch.Tensor):                             # a NumPy mask, a list
            attn_mask = torch.as_tensor(attn_mask, device=q.device)
        check_mask_dtype(attn_mask.dtype)
        check_mask_shape(tuple(attn_mask.shape), (q.shape[0], q.shape[1], q.shape[2], k.shape[2]))
    scale = check_scale(scale)
    packed = None
    if cu_seqlens is not None:                                                  # positions inside each document
        n = check_packed_attention_args(tuple(q.shape), tuple(k.shape), positions, start_pos, key_positions,
                                        (given[0], given[1]))
        cu_seqlens = check_cu_seqlens_tensor(cu_seqlens, n, device=q.device)
        packed = positions = packed_positions(cu_seqlens, n)
    else:
        check_bias_positions(positional, kind, _host_values(positions), _host_values(key_positions), start_pos,
                             q.shape[2], k.shape[2], attn_temperature is not None)
    check_start_pos_with_positions(start_pos, positions, none_ok=True)
    out_dtype = q.dtype
    compute = torch.promote_types(torch.promote_types(q.dtype, k.dtype), torch.promote_types(v.dtype, torch.float32))
    if kind == "rotary":                            # the layer sees q and k in its own qk_layout, and back
        layout = rotary_layout(positional, q.shape[0])
        ql, kl = to_rotary_layout(q, layout), to_rotary_layout(k, layout)
        if packed is not None and rotate_keys and getattr(positional, "packs", False):
            ql, kl = positional.apply(ql, kl, cu_seqlens=cu_seqlens)        # its packed path: cached rows
        else:
            ql, kl = _rotate(positional, ql, kl, q.shape[2], k.shape[2], positions, start_pos, key_positions,
                             rotate_keys)
        q, k = from_rotary_layout(ql, layout), from_rotary_layout(kl, layout)
    q, k, v = q.to(compute), k.to(compute), v.to(compute)
    if attn_temperature is not None:
        q = q * _query_temperature(attn_temperature, positions, start_pos, q.shape[2], k.shape[2], q.device, compute)
    lq, lk, dh = q.shape[2], k.shape[2], q.shape[3]
    scale = 1.0 / math.sqrt(dh) if scale is None else scale
    logits = torch.matmul(q, k.transpose(-1, -2)) * scale                        # (B, H, Lq, Lk)
    if kind == "bias":
        bias = positional.bias(lq, lk)                                        # (H, Lq, Lk)
        check_bias_shape(tuple(bias.shape), q.shape[1], lq, lk)
        if packed is not None:                                                # each pair at its in-document positions
            bias = bias[:, packed[:, None], packed[None, :]]
        logits = logits + bias.to(compute)[None]
    keep = None
    if packed is not None:                                                    # (T, T) block-diagonal
        doc = torch.cumsum(packed == 0, 0)
        keep = doc[:, None] == doc[None, :]
        if causal:
            keep = keep & (packed[None, :] <= packed[:, None])
    elif causal:
        key_idx = torch.arange(lk, device=q.device)
        keep = key_idx[None, :] <= (lk - lq + torch.arange(lq, device=q.device))[:, None]   # (Lq, Lk)
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            keep = attn_mask if keep is None else keep & attn_mask
        else:
            logits = logits + attn_mask.to(compute)
    if keep is not None:
        logits = logits.masked_fill(~keep, float("-inf"))
    row_max = logits.amax(dim=-1, keepdim=True).detach() if lk else logits.new_zeros((*logits.shape[:-1], 1))
    row_max = torch.where(torch.isfinite(row_max), row_max, torch.zeros_like(row_max))
    e = torch.exp(logits - row_max)
    total = e.sum(dim=-1, keepdim=True)
    probs = e / torch.where(total > 0, total, torch.ones_like(total))            # (B, H, Lq, Lk)
    out = torch.matmul(probs, v).to(out_dtype)                                  # (B, H, Lq, Dh)
    return out[0].transpose(0, 1) if thd else out
