"""Offsets and the causal mask shared by both backends' scaled_dot_product_attention.

Shapes: Lq query length, Lk key length (Lq <= Lk). With a KV cache the Lq queries are the last Lq
of the Lk key positions: query i sits at key index ``Lk - Lq + i``. The checks and messages of what enters
attention are in ``tables.checks.attention``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tokenpos.tables.checks.validation import check_int


def resolve_query_start(start_pos: int | None, q_len: int, k_len: int) -> int:
    """The position of the first query: ``start_pos``, or ``Lk - Lq`` when it is None."""
    if start_pos is None:
        return k_len - q_len
    return check_int("start_pos", start_pos, minimum=0)


def causal_keep_mask(q_len: int, k_len: int) -> np.ndarray:
    """True where query i may see key j, i.e. ``j <= Lk - Lq + i``: (Lq, Lk) bool."""
    return np.arange(k_len)[None, :] <= (k_len - q_len + np.arange(q_len))[:, None]


def to_rotary_layout(x: Any, layout: str) -> Any:
    """q or k (B, H, L, Dh) as a view in a rotary layer's ``qk_layout``: ``"blhd"`` (B, L, H, Dh), ``"thd"`` (L, H,
    Dh) (B == 1), ``"bhld"`` as it is. NumPy arrays and torch tensors alike (``swapaxes``, indexing)."""
    if layout == "blhd":
        return x.swapaxes(1, 2)
    if layout == "thd":
        return x[0].swapaxes(0, 1)
    return x


def from_rotary_layout(x: Any, layout: str) -> Any:
    """The inverse view of :func:`to_rotary_layout`: the layer's layout -> (B, H, L, Dh)."""
    if layout == "blhd":
        return x.swapaxes(1, 2)
    if layout == "thd":
        return x.swapaxes(0, 1)[None]
    return x
