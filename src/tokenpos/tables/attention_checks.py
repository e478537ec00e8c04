"""Checks of what enters scaled_dot_product_attention (both backends): the scheme object, mask and bias shapes.

Shapes: B batch, H heads, Lq query length, Lk key length. Messages say what, got, expected.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tokenpos.tables.errors import ConfigError


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
