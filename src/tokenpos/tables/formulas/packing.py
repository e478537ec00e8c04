"""Packed sequences: per-token positions from ``cu_seqlens`` and back.

Several documents packed into one row, positions restarting at 0 in each (flash-attn varlen,
Hugging Face's ``DataCollatorWithFlattening``). Shapes: N documents, T tokens; ``cu_seqlens``
(N + 1,): 0, the cumulative lengths, T.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tokenpos.tables.checks.packing import check_cu_seqlens, check_document_starts, check_restarting_positions
from tokenpos.tables.checks.validation import check_positions
from tokenpos.tables.errors import ConfigError


def positions_from_cu_seqlens(cu_seqlens: Any, total: int | None = None, *, start_pos: Any = 0) -> np.ndarray:
    """(N + 1,) int32 / int64 ``cu_seqlens`` -> positions (T,) int64, 0, 1, ... inside every document.

    ``total`` (T), when given, must equal ``cu_seqlens[-1]``. ``start_pos``: where each document starts
    counting, an int for all or (N,) ints, one per document (flash-attn's ``seqlen_offsets``: documents
    continuing a KV cache). Example: ``[0, 3, 5] -> [0, 1, 2, 0, 1]``; with ``start_pos=[4, 0]``:
    ``[4, 5, 6, 0, 1]``.
    """
    return document_positions(cu_seqlens, total, start_pos)[0]


def document_positions(cu_seqlens: Any, total: int | None = None, start_pos: Any = 0) -> tuple[np.ndarray, int]:
    """The layers' packed positions: ``cu_seqlens`` and ``start_pos`` checked (``check_cu_seqlens``,
    ``check_document_starts``) -> (positions (T,) int64 of :func:`positions_from_cu_seqlens`, ``max(positions)
    + 1``: the largest start + length over the documents with tokens, 0 for none), so a layer bounds the
    positions without reading them again."""
    cu = check_cu_seqlens(cu_seqlens, total)
    lengths = np.diff(cu)
    starts = check_document_starts(start_pos, lengths)
    end = int((starts + lengths)[lengths > 0].max(initial=0))
    return np.arange(int(cu[-1]), dtype=np.int64) - np.repeat(cu[:-1] - starts, lengths), end


def cu_seqlens_from_positions(positions: Any) -> np.ndarray:
    """Positions (T,) or (1, T) that restart at 0 at each document -> ``cu_seqlens`` (N + 1,) int32
    (flash-attn's dtype), the inverse of :func:`positions_from_cu_seqlens` (no empty documents).

    Raises:
        ConfigError: not (T,) / (1, T). PositionError: not integers >= 0, not 0 first, or a step
            that neither adds 1 nor restarts at 0.
    """
    pos = check_positions(positions)
    if pos.ndim not in (1, 2) or (pos.ndim == 2 and pos.shape[0] != 1):
        raise ConfigError(f"positions of a packed row must have shape (T,) or (1, T), got {pos.shape}")
    pos = pos.reshape(-1)
    check_restarting_positions(pos)
    return np.append(np.flatnonzero(pos == 0), pos.size).astype(np.int32)        # (N + 1,)
