"""TP-invariant initialisation: rank r's rows of the one-process table, drawn without holding it.

V vocab (unpadded), D d_model, [start, end) this rank's rows of the padded vocab (rows >= V are padding).

The one-process ``TokenEmbedding(V, D, init=..., seed=s)`` table is ``tables.formulas.init.init_weight((V, D), ...)``
from ``np.random.default_rng(s)``. NumPy's Generator draws a C-order array value by value, so drawing
the same (V, D) table in row blocks gives the same numbers; the rows before ``start`` are drawn and
dropped, those in the shard kept. Memory stays O(block * D + shard) instead of O(V * D) per rank.
``trunc_normal`` resamples out-of-bound values after the whole draw, so it draws the full table
(O(V * D) float64 once) and slices it. Either way the generator ends in the same state as after the
one-process draw, so a generator shared by the following layers stays in step with a one-process model.
"""

from __future__ import annotations

import numpy as np

from tokenpos.tables.checks.validation import check_choice, check_float
from tokenpos.tables.formulas.init import init_weight

BLOCK_VALUES = 1 << 22          # values drawn per block (32 MiB of float64)
_BLOCKWISE = ("normal", "standard_normal", "xavier_uniform", "zeros")


def _draw_block(rng: np.random.Generator, scheme: str, rows: int, cols: int, std: float,
                limit: float) -> np.ndarray:
    if scheme == "normal":
        return rng.normal(0.0, std, size=(rows, cols))
    if scheme == "standard_normal":
        return rng.standard_normal((rows, cols))
    if scheme == "xavier_uniform":
        return rng.uniform(-limit, limit, size=(rows, cols))
    return np.zeros((rows, cols))


def shard_init(vocab_size: int, d_model: int, start: int, end: int, scheme: str, *, std: float,
               rng: np.random.Generator, padding_idx: int | None = None) -> np.ndarray:
    """Rows [start, end) of ``init_weight((vocab_size, d_model), scheme, std=std, rng=rng,
    padding_idx=padding_idx)`` as float64 (end - start, D); rows >= vocab_size (padding) are zero.
    """
    V, D = int(vocab_size), int(d_model)
    out = np.zeros((end - start, D), dtype=np.float64)
    stop = min(end, V)
    if check_choice("init", scheme, ("trunc_normal",) + _BLOCKWISE) == "trunc_normal":
        full = init_weight((V, D), scheme, std=std, rng=rng, padding_idx=padding_idx)
        if stop > start:
            out[: stop - start] = full[start:stop]
        return out
    if scheme == "normal":
        std = check_float("std", std, low=0.0)
    limit = float(np.sqrt(6.0 / (V + D)))          # xavier_uniform's bound of the full (V, D) table
    block = max(1, BLOCK_VALUES // D)
    for r0 in range(0, V, block):
        r1 = min(V, r0 + block)
        rows = _draw_block(rng, scheme, r1 - r0, D, std, limit)    # (r1 - r0, D)
        lo, hi = max(r0, start), min(r1, stop)
        if lo < hi:
            out[lo - start: hi - start] = rows[lo - r0: hi - r0]
    if padding_idx is not None and start <= padding_idx < stop:
        out[padding_idx - start] = 0.0
    return out
