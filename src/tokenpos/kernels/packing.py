"""Packed documents: per-token positions from ``cu_seqlens`` in one compiled pass.

Shapes: N documents, T tokens; ``cu_seqlens`` (N + 1,) int32 / int64: 0, the cumulative lengths, T.
The formula and its rules are ``tables.formulas.packing.document_positions`` (the twin, which the
kernels-off path runs): positions restart at 0 in every document, and the longest document's
length bounds them. A layer computes these on every packed call, where a dozen NumPy calls on
fresh arrays cost about 130 us with the caches cold right after a model's matmul, against about 40 us for
this one call (benchmarks/HISTORY.md, 2026-11-27).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import njit

from tokenpos._config import kernels_enabled
from tokenpos.tables.checks.packing import CU_SEQLENS_DTYPES, check_cu_seqlens, check_document_starts
from tokenpos.tables.checks.validation import check_int
from tokenpos.tables.formulas import packing as formulas

_CU_DTYPES = tuple(np.dtype(name) for name in CU_SEQLENS_DTYPES)   # (dtype.name is Python code)


@njit(cache=True)
def _positions_core(cu, starts, out):  # pragma: no cover - compiled
    """cu (N + 1,) int32 / int64, starts (N,) int64 >= 0 -> ``max(out) + 1`` (0 for no tokens), with ``out``
    (T,) int64 holding the positions ``starts[d] + 0, 1, ...`` of every document d; or -1 when ``cu`` breaks a
    rule (not 0 first, decreasing, above T, not ending at T): the caller then raises. Every write lies in
    ``out``: a document is written only once 0 <= start <= end <= T holds for it, so a bad value anywhere in
    ``cu`` is refused before anything lands outside.
    The caller allocates ``out``: an array made here would be boxed into a NumPy array on return."""
    n, total = cu.shape[0], out.shape[0]
    if cu[0] != 0 or cu[n - 1] != total:
        return -1
    top = 0
    for d in range(n - 1):
        start, end = cu[d], cu[d + 1]
        if end < start or end > total:                   # start >= 0: cu[0] == 0, then never decreasing
            return -1
        shift = starts[d] - start
        if end > start:
            top = max(top, shift + end)
        for t in range(start, end):
            out[t] = t + shift
    return top


def document_positions(cu_seqlens: Any, total: int, start_pos: Any = 0) -> tuple[np.ndarray, int]:
    """``cu_seqlens`` (N + 1,) checked, ending at ``total``, and ``start_pos`` (an int, or (N,) ints: where each
    document starts counting) -> (positions (T,) int64, ``max(positions) + 1``):
    ``tables.formulas.packing.document_positions``, compiled when the kernels are on.

    Raises:
        DtypeError, ConfigError, PositionError: the rules and messages of
            ``tables.checks.packing.check_cu_seqlens`` and ``check_document_starts``.
    """
    cu = np.asarray(cu_seqlens)
    if not kernels_enabled() or cu.dtype not in _CU_DTYPES or cu.ndim != 1 or not cu.size:
        return formulas.document_positions(cu, total, start_pos)   # the twin; it raises for a bad layout
    positions = np.empty(check_int("total", total, minimum=0), np.int64)   # else ConfigError
    if type(start_pos) is int and start_pos == 0:
        starts = np.zeros(cu.size - 1, np.int64)
    else:                                                      # cu first, as the twin: its errors come first
        starts = check_document_starts(start_pos, np.diff(check_cu_seqlens(cu, total)))
    top = _positions_core(cu, starts, positions)
    if top < 0:
        check_cu_seqlens(cu, total)                            # raises the shared, located message
    return positions, top
