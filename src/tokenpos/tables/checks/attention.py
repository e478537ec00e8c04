"""Checks of what enters scaled_dot_product_attention (both backends): q/k/v shapes, key positions, the scheme
object, keys rotated earlier (``rotate_keys=False``), mask and bias shapes, and the ``attn_temperature`` option
(Llama 4).

Shapes: B batch, H heads, Lq query length, Lk key length. Messages say what, got, expected.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tokenpos.tables.checks.rope import rotary_packed_message
from tokenpos.tables.checks.validation import check_float
from tokenpos.tables.errors import ConfigError, DtypeError


def attention_shape_message(q_shape: tuple[int, ...], k_shape: tuple[int, ...], v_shape: tuple[int, ...],
                            packed: bool = False) -> str:
    """The shapes as the caller passed them; ``packed`` (cu_seqlens): one row of T tokens."""
    if packed:
        return (f"attention with cu_seqlens expects q, k (T, H, Dh) and v (T, H, Dv), or (1, H, T, Dh) each, got "
                f"q {tuple(int(s) for s in q_shape)}, k {tuple(int(s) for s in k_shape)}, "
                f"v {tuple(int(s) for s in v_shape)}")
    return (f"attention expects q (B, H, Lq, Dh), k (B, H, Lk, Dh), v (B, H, Lk, Dv) with Lq <= Lk, got "
            f"q {tuple(int(s) for s in q_shape)}, k {tuple(int(s) for s in k_shape)}, "
            f"v {tuple(int(s) for s in v_shape)}")


def key_start_message(q_start: int | None, q_len: int, k_len: int) -> str:
    if q_start is None:
        return (f"with explicit positions and q_len {q_len} != k_len {k_len}, pass key_positions= "
                f"(the positions of the {k_len} keys)")
    return (f"start_pos {q_start} is too small for {k_len} keys ending with {q_len} queries: the first key would "
            f"sit at position {q_start - (k_len - q_len)}; expected start_pos >= {k_len - q_len}")


def rotated_keys_message(layer: str) -> str:
    """``rotate_keys=False`` with a layer that rotates q and k together (``rotates_qk_together``)."""
    return (f"{layer} with rotate_keys=False: it rotates q and k together (rotates_qk_together: k's tables differ "
            f"from q's and depend on the call, as xPos's scale centre), so keys rotated by an earlier call cannot be "
            f"matched to this one; keep the cache's keys before rotation and pass rotate_keys=True (q and the "
            f"cached keys are then rotated together)")


def check_rotated_keys(positional: Any) -> None:
    """``rotate_keys=False`` (the KV cache holds keys rotated by earlier calls) rotates q alone, which a
    rotary layer whose class sets ``rotates_qk_together`` (xPos) cannot do: ConfigError
    (:func:`rotated_keys_message`). Read by both backends' attention functions."""
    if getattr(positional, "rotates_qk_together", False):
        raise ConfigError(rotated_keys_message(type(positional).__name__))


def scheme_object_message(positional: Any) -> str:
    if isinstance(positional, str):
        return (f"positional must be a positional-scheme object or None, got the string {positional!r}; pass the "
                f"scheme object itself, e.g. positional=emb.position (the scheme of a TransformerEmbedding)")
    return (f"positional must be a positional-scheme object (with a 'kind' of 'additive', 'rotary', 'bias' or "
            f"'none') or None, got {type(positional).__name__}")


def check_scheme(positional: Any) -> str:
    """The ``kind`` of a positional-scheme object ("additive", "rotary", "bias", "none"); None -> "none".

    Raises:
        ConfigError: a string (``positional="rope"`` instead of ``emb.position``) or an object without a
            valid ``kind``: never silently treated as "no positions".
    """
    if positional is None:
        return "none"
    kind = getattr(positional, "kind", None)
    if isinstance(positional, str) or kind not in ("additive", "rotary", "bias", "none"):
        raise ConfigError(scheme_object_message(positional))
    return str(kind)


def check_packed_scheme(positional: Any, kind: str) -> None:
    """With cu_seqlens a rotary scheme is rotated at the row's in-document positions, one per token (its packed
    path, or its positions path: M-RoPE's text tokens); a layer whose positions are not one per token
    (``takes_token_positions`` False: 2-D RoPE's (row, column) pairs) is refused with its own ``apply``'s reason.

    Raises:
        ConfigError: a rotary layer that cannot take one position per token.
    """
    if kind == "rotary" and not getattr(positional, "packs", False) \
            and not getattr(positional, "takes_token_positions", True):
        raise ConfigError(rotary_packed_message(type(positional).__name__))


def check_mask_dtype(dtype: Any) -> None:
    """An attention mask is bool (True = attend) or additive floats. An integer one (HF's 0/1
    ``attention_mask``) would be added to the logits, masking nothing; a complex one would lose its imaginary
    part. Raises DtypeError naming the dtype."""
    name = str(dtype).replace("torch.", "")
    if name != "bool" and not (name.startswith("float") or name.startswith("bfloat")):
        raise DtypeError(f"attn_mask must be bool (True = attend) or additive floats, got dtype {name}; for a 0/1 "
                         f"mask (HF's attention_mask) pass mask.bool()")


def check_scale(scale: Any) -> float | None:
    """The logit scale: None (1 / sqrt(Dh)) or a finite number > 0 (ConfigError otherwise)."""
    return None if scale is None else check_float("scale", scale, low=0.0, low_inclusive=False)


def check_bias_positions(positional: Any, kind: str, positions: Any, key_positions: Any, start_pos: Any,
                         q_len: int, k_len: int, temperature: bool) -> None:
    """Positions that no part of the call would read are refused, never ignored. A bias scheme (and no scheme)
    puts query i at key index ``Lk - Lq + i`` of keys counted from 0: ``positions`` and ``key_positions`` must
    say the same (a cache with gaps would otherwise be measured as contiguous), and ``start_pos`` must be None or
    Lk - Lq. Llama 4's ``attn_temperature`` reads ``positions`` and ``start_pos``; rotary schemes read all three.
    ``positions`` / ``key_positions``: NumPy values, or None (not given, or not readable here: the torch twin
    then checks them on the device).

    Raises:
        ConfigError: naming the argument, what was given and what the scheme measures.
    """
    if kind == "rotary":
        return
    what = "there is no positional scheme" if positional is None else f"{type(positional).__name__} reads no positions"
    offset = k_len - q_len

    def refuse(arg: str, got: Any) -> None:
        raise ConfigError(f"{arg} {got} given, but {what}: query i sits at key index Lk - Lq + i "
                          f"= {offset} + i of keys 0 .. {k_len - 1}, and other {arg} would be ignored; pass "
                          f"positions that differ only with a rotary scheme (or attn_temperature)")
    if key_positions is not None and not _rows_equal(key_positions, np.arange(k_len)):
        refuse("key_positions", np.asarray(key_positions).tolist())
    if temperature:
        return
    if positions is not None and not _rows_equal(positions, offset + np.arange(q_len)):
        refuse("positions", np.asarray(positions).tolist())
    if positions is None and start_pos is not None and not (         # (with positions: the start_pos rule)
            isinstance(start_pos, (int, np.integer)) and not isinstance(start_pos, bool) and start_pos == offset):
        refuse("start_pos", repr(start_pos))


def _rows_equal(values: Any, want: np.ndarray) -> bool:
    """Whether every row of ``values`` (..., n) is ``want`` (n,)."""
    v = np.asarray(values)
    return v.ndim >= 1 and v.shape[-1] == want.shape[0] and bool((v == want).all())


def check_mask_shape(mask_shape: tuple[int, ...], target: tuple[int, ...]) -> None:
    """An attention mask must broadcast to ``target`` (B, H, Lq, Lk) without enlarging it.

    Raises:
        ConfigError: naming both shapes.
    """
    mask_shape, target = tuple(int(s) for s in mask_shape), tuple(int(s) for s in target)
    try:
        ok = np.broadcast_shapes(mask_shape, target) == target
    except ValueError:
        ok = False
    if not ok:
        raise ConfigError(f"attn_mask has shape {mask_shape}, which does not broadcast to the logits' shape {target} "
                          f"(B, H, Lq, Lk); expected a shape broadcastable to it")


def check_bias_shape(bias_shape: tuple[int, ...], num_heads: int, q_len: int, k_len: int) -> None:
    """A bias scheme's ``bias(Lq, Lk)`` must be (H, Lq, Lk) with the attention's H heads.

    Raises:
        ConfigError: e.g. an ALiBi / T5 scheme built for 8 heads used with 4.
    """
    bias_shape = tuple(int(s) for s in bias_shape)
    if bias_shape != (int(num_heads), int(q_len), int(k_len)):
        raise ConfigError(f"positional bias has shape {bias_shape}, expected (H, Lq, Lk) = "
                          f"({int(num_heads)}, {int(q_len)}, {int(k_len)}); build the scheme with num_heads="
                          f"{int(num_heads)} (the heads of q)")


def check_temperature(attn_temperature: Any) -> tuple[float, float]:
    """``(floor_scale, attn_scale)``: floor_scale > 0, attn_scale finite."""
    if not isinstance(attn_temperature, (tuple, list)) or len(attn_temperature) != 2:
        raise ConfigError(f"attn_temperature must be (floor_scale, attn_scale), got {attn_temperature!r}")
    floor_scale = check_float("floor_scale", attn_temperature[0], low=0.0, low_inclusive=False)
    return floor_scale, check_float("attn_scale", attn_temperature[1])


def rotary_layout(positional: Any, batch: int) -> str:
    """The declared ``qk_layout`` of a rotary layer the attention functions hand q and k (B, H, L, Dh) to
    (``"bhld"`` when it declares none): a ``"thd"`` layer rotates one packed row, so B must be 1.

    Raises:
        ConfigError: a ``"thd"`` layer with a batch of several rows.
    """
    layout = str(getattr(positional, "qk_layout", "bhld"))
    if layout == "thd" and batch != 1:
        raise ConfigError(f"{type(positional).__name__} with qk_layout='thd' rotates one packed row (T, H, Dh); "
                          f"the attention's q has {batch} rows: use qk_layout='bhld' or 'blhd' for a batch")
    return layout
