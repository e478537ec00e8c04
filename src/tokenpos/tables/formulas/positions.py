"""Position ids: the default ``start_pos + arange(L)`` and RoBERTa's padding-derived positions.

Shapes: B batch, L length.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from tokenpos.tables.checks.embedding import check_padding_start
from tokenpos.tables.checks.validation import check_start_pos


def default_positions(seq_len: int, start_pos: int = 0) -> np.ndarray:
    """``start_pos + arange(L)``: shape (L,), int64 (decoding with a cache passes start_pos > 0)."""
    start_pos = check_start_pos(start_pos, seq_len)
    return np.arange(seq_len, dtype=np.int64) + np.int64(start_pos)


def shared_default_positions(seq_len: int, start_pos: int = 0) -> np.ndarray:
    """:func:`default_positions` as one read-only array per (seq_len, start_pos) (an LRU of 64), for
    layers that only read them: a new ``arange`` per call costs 20-30 us when caches are cold.
    ``start_pos`` is checked on every call, before the cache (where ``True`` and ``1.0`` would find
    the entry of ``1``)."""
    return _shared_default_positions(int(seq_len), check_start_pos(start_pos, seq_len))


@functools.lru_cache(maxsize=64)
def _shared_default_positions(seq_len: int, start_pos: int) -> np.ndarray:
    pos = default_positions(seq_len, start_pos)
    pos.flags.writeable = False
    return pos


def positions_from_padding(ids: Any, padding_idx: int, start_pos: int = 0) -> np.ndarray:
    """RoBERTa's positions (HF ``create_position_ids_from_input_ids``).

    Non-pad tokens get ``padding_idx + start_pos + (count of non-pad tokens up to and including it)``;
    pad tokens get ``padding_idx``. So the first real token sits at ``padding_idx + 1``.

    Args:
        ids: int array (B, L) or (L,).
    Returns:
        int64 array of the same shape.
    """
    ids = np.asarray(ids)
    start_pos = check_padding_start(start_pos, padding_idx, ids.shape[-1] if ids.ndim else 1)
    mask = (ids != padding_idx).astype(np.int64)
    return (np.cumsum(mask, axis=-1) + start_pos) * mask + padding_idx
