"""Constructor and input checks of the xPos, 2-D RoPE and M-RoPE layers, written once for both backends.

Shapes: B batch, N patches (or L positions), Dh head dim, R rotary dim, F rotated pairs.
2-D positions: (N, 2) or (B, N, 2) (row, col); M-RoPE positions: (3, B, L), (B, L) or (L,).

The NumPy and torch layers call these with the same arguments, so they accept and refuse the same
settings with the same messages and keep the same attribute values. The checks every rotary layer
shares (q/k layout, heads, rotary dim, 1-D positions) are in ``tables.checks.rope``; the settings
that carry frequencies (``rope2d_layer_args``, ``MRopeSettings``) are formulas.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tokenpos.tables.checks.rope import ROTATE_TOGETHER, check_rotary_dim
from tokenpos.tables.checks.validation import (
    check_float,
    check_int,
    check_positions,
    check_start_pos_with_positions,
)
from tokenpos.tables.errors import ConfigError

# ----------------------------------------------------------------------------------------------
# xPos
# ----------------------------------------------------------------------------------------------

XPOS_TOGETHER_MESSAGE = (f"xPos scales q up and k down: rotate q and k together, {ROTATE_TOGETHER} "
                         "(scaled_dot_product_attention does so)")


def check_xpos_packed_start(start_pos: Any) -> None:
    """A packed xPos call counts every document from 0: its scale centre is the document's own (as if run
    alone), found where the positions restart. ``start_pos`` other than 0 (documents continuing a cache) is
    refused with ConfigError: xPos decodes over a cache with ``key_positions``, unpacked."""
    if not (isinstance(start_pos, (int, np.integer)) and not isinstance(start_pos, bool) and start_pos == 0):
        raise ConfigError(f"xPos packs every document from position 0 (each scaled around its own centre); got "
                          f"start_pos={start_pos!r} with cu_seqlens. To continue a KV cache, rotate unpacked with "
                          f"start_pos and key_positions")


def xpos_layer_args(head_dim: Any, rotary_dim: Any, scale_base: Any, center: Any, interleaved: Any, *,
                    bool_types: tuple[type, ...] = (bool,)) -> tuple[int, int, float, float | None, bool]:
    """``(head_dim, rotary_dim R, scale_base, center, interleaved)`` of an xPos layer, checked.

    ``bool_types``: the types ``interleaved`` may have (the NumPy layer also takes ``np.bool_``).
    """
    head_dim = check_int("head_dim", head_dim, minimum=2)
    rotary_dim = check_rotary_dim(head_dim, rotary_dim)
    scale_base = check_float("scale_base", scale_base, low=0.0, low_inclusive=False)
    center = None if center is None else check_float("center", center)
    if not isinstance(interleaved, bool_types):
        raise ConfigError(f"interleaved must be True or False, got {interleaved!r}")
    return head_dim, rotary_dim, scale_base, center, bool(interleaved)


# ----------------------------------------------------------------------------------------------
# 2-D RoPE
# ----------------------------------------------------------------------------------------------


def check_positions_2d(positions: Any) -> np.ndarray:
    """(..., N, 2) non-negative int positions (row, col) -> the same, int64; else ConfigError / PositionError."""
    pos = check_positions(positions)
    if pos.ndim < 2 or pos.shape[-1] != 2:
        raise ConfigError(f"2-D positions must have shape (N, 2) or (B, N, 2) (row, col), got {tuple(pos.shape)}")
    return pos


def check_rope2d_positions_given(positions: Any, start_pos: Any) -> None:
    """2-D RoPE has no default positions: None is refused; given ones need ``start_pos`` None or 0."""
    if positions is None:
        raise ConfigError("2-D RoPE needs positions of shape (N, 2) or (B, N, 2) (row, col); got None")
    check_start_pos_with_positions(start_pos, positions, none_ok=True)


def check_rope2d_positions_shape(shape: tuple[int, ...], batch: int, length: int) -> None:
    """2-D positions of q (B, H, N, Dh): (N, 2), (1, N, 2) or (B, N, 2); else ``ConfigError``."""
    shape = tuple(int(s) for s in shape)
    if len(shape) not in (2, 3) or shape[-1] != 2 or shape[-2] != length or (
            len(shape) == 3 and shape[0] not in (1, batch)):
        raise ConfigError(f"positions must have shape ({length}, 2) or ({batch}, {length}, 2), got {shape}")


# ----------------------------------------------------------------------------------------------
# M-RoPE
# ----------------------------------------------------------------------------------------------


def mrope_positions_message(shape: tuple[int, ...], batch: int, length: int) -> str:
    return (f"M-RoPE positions must have shape (3, {batch} or 1, {length}), ({batch} or 1, {length}) or "
            f"({length},), got {tuple(int(s) for s in shape)}")


def check_mrope_positions_shape(shape: tuple[int, ...], batch: int, length: int) -> None:
    """M-RoPE positions of q (B, H, L, Dh): (3, B | 1, L), (B | 1, L) or (L,); else ``ConfigError``
    (:func:`mrope_positions_message`). Both backends check the shape with this, after the values."""
    shape = tuple(int(s) for s in shape)
    ok = shape[-1:] == (length,) and (len(shape) == 1 or (len(shape) == 2 and shape[0] in (1, batch)) or (
        len(shape) == 3 and shape[0] == 3 and shape[1] in (1, batch)))
    if not ok:
        raise ConfigError(mrope_positions_message(shape, batch, length))
