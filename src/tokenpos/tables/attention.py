"""Offsets, the causal mask and the messages shared by both backends' scaled_dot_product_attention.

Shapes: Lq query length, Lk key length (Lq <= Lk). With a KV cache the Lq queries are the last Lq
of the Lk key positions: query i sits at key index ``Lk - Lq + i``.
"""

from __future__ import annotations

import numpy as np

from tokenpos.tables.validation import check_int


def attention_shape_message(q_shape: tuple[int, ...], k_shape: tuple[int, ...], v_shape: tuple[int, ...]) -> str:
    return (f"attention expects q (B, H, Lq, Dh), k (B, H, Lk, Dh), v (B, H, Lk, Dv) with Lq <= Lk, got "
            f"q {tuple(int(s) for s in q_shape)}, k {tuple(int(s) for s in k_shape)}, "
            f"v {tuple(int(s) for s in v_shape)}")


def key_start_message(q_start: int | None, q_len: int, k_len: int) -> str:
    if q_start is None:
        return (f"with explicit positions and q_len {q_len} != k_len {k_len}, pass key_positions= "
                f"(the positions of the {k_len} keys)")
    return (f"start_pos {q_start} is too small for {k_len} keys ending with {q_len} queries: the first key would "
            f"sit at position {q_start - (k_len - q_len)}; expected start_pos >= {k_len - q_len}")


def resolve_query_start(start_pos: int | None, q_len: int, k_len: int) -> int:
    """The position of the first query: ``start_pos``, or ``Lk - Lq`` when it is None."""
    if start_pos is None:
        return k_len - q_len
    return check_int("start_pos", start_pos, minimum=0)


def causal_keep_mask(q_len: int, k_len: int) -> np.ndarray:
    """True where query i may see key j, i.e. ``j <= Lk - Lq + i``: (Lq, Lk) bool."""
    return np.arange(k_len)[None, :] <= (k_len - q_len + np.arange(q_len))[:, None]
