"""RoPE-family input checks and their messages, written once for both backends.

Shapes: B batch, H heads, L length, Dh head dim, R rotary dim. q, k: (B, H, L, Dh) with
``qk_layout="bhld"`` or (B, L, H, Dh) with ``qk_layout="blhd"``; positions (L,), (1, L) or (B, L).

Every RoPE-family layer (RoPE, M-RoPE, xPos, 2-D RoPE) of the NumPy and torch backends raises
these texts; each layer's own checks are in ``tables.checks.rotary_layers``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tokenpos.tables.checks.validation import check_choice, check_int
from tokenpos.tables.errors import ConfigError

# Axis order of q / k: (B, H, L, Dh) as HF's default unsqueeze_dim=1, (B, L, H, Dh) as unsqueeze_dim=2
# and flash-attention, or (T, H, Dh): one packed row of T tokens (flash-attention's varlen layout).
QK_LAYOUTS = ("bhld", "blhd", "thd")
# the head axis of q / k in each layout
HEAD_AXIS = {"bhld": 1, "blhd": 2, "thd": 1}


def rope_shape_message(name: str, shape: tuple[int, ...], head_dim: int) -> str:
    """``q must have shape (B, H, L, 64), got (2, 8, 64)``."""
    return f"{name} must have shape (B, H, L, {head_dim}), got {tuple(int(s) for s in shape)}"


def rope_layout_shape_message(name: str, shape: tuple[int, ...], head_dim: int, qk_layout: str) -> str:
    """``q must have shape (B, L, H, 64) (qk_layout='blhd'), got (2, 8, 64)``."""
    if qk_layout == "bhld":
        return rope_shape_message(name, shape, head_dim)
    want = "(T, H" if qk_layout == "thd" else "(B, L, H"
    return f"{name} must have shape {want}, {head_dim}) (qk_layout={qk_layout!r}), got {tuple(int(s) for s in shape)}"


def rope_heads_message(name: str, shape: tuple[int, ...], qk_layout: str, num_heads: int) -> str:
    """The declared layout does not fit the known head count (q: H == num_heads; k: H divides it)."""
    axis = HEAD_AXIS[qk_layout]
    rule = f"== num_heads={num_heads}" if name == "q" else f"dividing num_heads={num_heads}"
    return (f"{name} has shape {tuple(int(s) for s in shape)}: its head axis {axis} (qk_layout={qk_layout!r}) "
            f"is {int(shape[axis])}; expected a head count {rule}. Is the layout right?")


def check_same_key_positions(scheme: str, query_positions: Any, key_positions: Any) -> None:
    """Schemes that rotate q and k together (M-RoPE, xPos, 2-D RoPE) accept ``key_positions`` only equal to q's."""
    if key_positions is None:
        return
    a, b = np.asarray(query_positions), np.asarray(key_positions)
    try:
        ba, bb = np.broadcast_arrays(a, b)
        same = bool(np.array_equal(ba, bb))
    except ValueError:
        same = False
    if not same:
        raise ConfigError(f"{scheme} rotates q and k at the same positions; got key_positions of shape {b.shape} "
                          f"that differ from the query positions of shape {a.shape}")


def rope_dtype_message(name: str, dtype: Any) -> str:
    """Integer / bool q or k would make cos and sin integers: refused."""
    return f"{name} must be a floating-point array (float16, bfloat16, float32 or float64), got dtype {dtype}"


# What a rotary layer's caller does with q and k of two lengths: each call below is one the layers accept
# (tests/tables/checks/test_rope_advice.py makes every rotary layer of both backends take the call its text
# names). A layer that rotates q and k together (``rotates_qk_together``, xPos) has no one-tensor rotate().
ROTATE_EACH = "rotate(x, positions)"
ROTATE_TOGETHER = "apply(q, k, positions, key_positions=...)"
LAYER_LENGTH_ADVICE = (f"rotate each alone with {ROTATE_EACH}, or, on a layer that rotates q and k together "
                       f"(rotates_qk_together: xPos), give k its own positions with {ROTATE_TOGETHER}")
# the op's: tokenpos::rope_qk rotates both at one table; tokenpos::rope takes one tensor
OP_LENGTH_ADVICE = "call tokenpos::rope once per tensor, each with its own cos / sin"


def rope_length_message(q_shape: tuple[int, ...], k_shape: tuple[int, ...], advice: str = LAYER_LENGTH_ADVICE) -> str:
    """q and k of two batches or lengths where one set of positions serves both; ``advice``: what to call
    instead (:data:`LAYER_LENGTH_ADVICE` for the layers, :data:`OP_LENGTH_ADVICE` for the op)."""
    return (f"q and k must have the same batch and length to share positions, got q {tuple(q_shape)} and "
            f"k {tuple(k_shape)}; when they differ, {advice}")


def rope_positions_message(shape: tuple[int, ...], batch: int, length: int) -> str:
    shapes = f"({length},) or (1, {length})" + ("" if batch == 1 else f" or ({batch}, {length})")
    return f"positions must have shape {shapes}, got {tuple(int(s) for s in shape)}"


def one_head(q: Any, qk_layout: str) -> Any:
    """The first head of q (a NumPy array or a tensor in ``qk_layout``), a view: the keys of a call that
    rotates q alone (``apply(q)``: one head of work more than q's, not twice). A q with too few dims
    comes back as it is: the layer checks q first and refuses it."""
    axis = HEAD_AXIS[qk_layout]
    if getattr(q, "ndim", 0) <= axis:
        return q
    return q[(slice(None),) * axis + (slice(0, 1),)]


def check_no_key_positions(key_positions: Any) -> None:
    """``apply(q)`` without k takes no ``key_positions`` (they are k's)."""
    if key_positions is not None:
        raise ConfigError("key_positions given without k: they are the positions of k; pass k too, or leave "
                          "key_positions out")


def check_qk_layout(qk_layout: Any, num_heads: Any = None) -> tuple[str, int | None]:
    """``(qk_layout, num_heads)`` checked: a layout of QK_LAYOUTS and None or a positive head count."""
    check_choice("qk_layout", qk_layout, QK_LAYOUTS)
    return qk_layout, None if num_heads is None else check_int("num_heads", num_heads, minimum=1)


def check_heads(name: str, shape: tuple[int, ...], qk_layout: str, num_heads: int | None) -> None:
    """q's head axis must be ``num_heads`` and k's must divide it (GQA), when the count is known."""
    if num_heads is None:
        return
    heads = int(shape[HEAD_AXIS[qk_layout]])
    if (name == "q" and heads != num_heads) or (name != "q" and (heads < 1 or num_heads % heads)):
        raise ConfigError(rope_heads_message(name, shape, qk_layout, num_heads))


def check_rotary_dim(head_dim: int, rotary_dim: Any = None) -> int:
    """R: ``rotary_dim`` (or Dh when None), even and in [2, Dh]."""
    head_dim = check_int("head_dim", head_dim, minimum=2)
    r = head_dim if rotary_dim is None else check_int("rotary_dim", rotary_dim, minimum=2)
    if r > head_dim or r % 2:
        raise ConfigError(f"rotary_dim must be an even number in [2, head_dim={head_dim}], got {r}")
    return r


def caller_shape(bhld_shape: tuple[int, ...], qk_layout: str) -> tuple[int, ...]:
    """The shape the caller passed, from its (B, H, L, Dh) view in ``qk_layout`` (``"thd"``: (1, H, T, Dh) ->
    (T, H, Dh)): what an error quotes, never the internal view."""
    B, H, L, Dh = (int(s) for s in bhld_shape)
    if qk_layout == "thd":
        return (L, H, Dh)
    return (B, L, H, Dh) if qk_layout == "blhd" else (B, H, L, Dh)


def check_qk_lengths(q_shape: tuple[int, ...], k_shape: tuple[int, ...], qk_layout: str = "bhld") -> None:
    """q (B, Hq, L, Dh) and k (B, Hk, L, Dh) (both as (B, H, L, Dh) views of ``qk_layout``) share batch and length;
    the error quotes the shapes as the caller passed them."""
    if q_shape[0] != k_shape[0] or q_shape[2] != k_shape[2]:
        raise ConfigError(rope_length_message(caller_shape(q_shape, qk_layout), caller_shape(k_shape, qk_layout)))


#: the token axis of q / k in each layout, and the batch axis (None: "thd" is one row)
TOKEN_AXIS = {"bhld": 2, "blhd": 1, "thd": 0}
BATCH_AXIS = {"bhld": 0, "blhd": 0, "thd": None}


def check_packed_qk(q_shape: tuple[int, ...], k_shape: tuple[int, ...], qk_layout: str) -> None:
    """With cu_seqlens, q and k (as the caller passed them, ``qk_layout`` checked) are one packed row of the same
    T tokens: batch 1 (``"bhld"`` / ``"blhd"``) and one T.

    Raises:
        ConfigError: quoting both shapes as given.
    """
    t, b = TOKEN_AXIS[qk_layout], BATCH_AXIS[qk_layout]
    form = {"thd": "(T, H, Dh)", "blhd": "(1, T, H, Dh)", "bhld": "(1, H, T, Dh)"}[qk_layout]
    for name, shape in (("q", q_shape), ("k", k_shape)):
        if b is not None and shape[b] != 1:
            raise ConfigError(f"a packed batch is one row: with cu_seqlens expected {name} of shape {form} "
                              f"(qk_layout={qk_layout!r}), got shape {tuple(int(s) for s in shape)}")
    if q_shape[t] != k_shape[t]:
        raise ConfigError(f"with cu_seqlens q and k are one packed row of the same T tokens, {form} "
                          f"(qk_layout={qk_layout!r}); got q {tuple(int(s) for s in q_shape)} and k "
                          f"{tuple(int(s) for s in k_shape)}")


def check_positions_shape(shape: tuple[int, ...], batch: int, length: int) -> bool:
    """Positions of shape (L,), (1, L) or (B, L); True when it is HF's (1, L) (the caller takes row 0).

    Raises ``ConfigError`` (:func:`rope_positions_message`) for any other shape.
    """
    shape = tuple(shape)
    if shape == (1, length):                                    # HF's (1, L): shared by the batch
        return True
    if shape not in ((length,), (batch, length)):
        raise ConfigError(rope_positions_message(shape, batch, length))
    return False


_NOT_PACKED = {   # why a rotary layer's positions do not follow from cu_seqlens, and what to pass instead
    "MRotaryEmbedding": "its positions are three axes per token (temporal, height, width); pass them as "
                        "positions (3, 1, T): mrope_position_ids(token_types, ..., cu_seqlens=cu_seqlens) gives them, "
                        "every sample counted from 0",
    "RotaryEmbedding2D": "its positions are a (row, column) pair per patch of an image grid; pass them as "
                         "positions",
}


def rotary_packed_message(layer: str) -> str:
    """A rotary layer whose positions are not one index per token refuses ``cu_seqlens``: why, and what to
    pass instead."""
    why = _NOT_PACKED.get(layer, "its positions are not one index per token restarting per document; pass "
                                 "its own positions")
    return f"{layer} does not take cu_seqlens: {why}"
