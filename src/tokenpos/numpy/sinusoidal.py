"""SinusoidalPositionalEncoding: the fixed Vaswani table, not trainable, defined for every position.

Shapes: P = max_seq_len (the precomputed rows), D = d_model, positions (...) -> (..., D).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tokenpos.numpy import functional as F
from tokenpos.numpy.module import Module
from tokenpos.tables.checks.validation import (
    check_choice,
    check_dtype,
    check_float,
    check_positive_int,
    check_seq_len_or_positions,
)
from tokenpos.tables.formulas.sinusoidal import LAYOUTS, sinusoidal_encoding, sinusoidal_table


class SinusoidalPositionalEncoding(Module):
    """``PE[pos, 2i] = sin(pos / base**(2i/D))``, ``PE[pos, 2i+1] = cos(...)`` (or the "half" layout).

    The first ``max_seq_len`` rows are precomputed in float64 and cast once; positions beyond it are
    computed on demand (never refused). It has no parameters and an empty state_dict.

    Shape:
        forward(L: int) -> (L, D); forward(positions (...)) -> (..., D).
    """

    kind = "additive"
    name = "sinusoidal"
    extends = True           # positions beyond the table are computed (:meth:`encode`)
    padding_idx = None       # no padding row

    def __init__(self, max_seq_len: int, d_model: int, *, base: float = 10000.0, layout: str = "interleaved",
                 dtype: Any = np.float32, seed: int | None = None, rng: np.random.Generator | None = None) -> None:
        # seed/rng are accepted so every layer has the same constructor; the table is deterministic.
        super().__init__()
        self.max_seq_len = check_positive_int("max_seq_len", max_seq_len)
        self.d_model = check_positive_int("d_model", d_model)
        self.base = check_float("base", base, low=1.0, low_inclusive=False)
        self.layout = check_choice("layout", layout, LAYOUTS)
        self.dtype = check_dtype("dtype", dtype)
        self.table = sinusoidal_table(self.max_seq_len, self.d_model, base=self.base,
                                      layout=self.layout).astype(self.dtype)   # (P, D) buffer

    def reset_parameters(self, *, seed: int | None = None, rng: np.random.Generator | None = None) -> None:
        """Nothing to draw: the table is fixed (seed/rng accepted so every scheme resets alike)."""

    table_param = None       # a fixed table: no gradient

    def forward(self, seq_len_or_positions: Any) -> np.ndarray:
        """Rows of the table, (L, D) or (..., D); positions >= max_seq_len are computed in float64, then cast."""
        pos = check_seq_len_or_positions(seq_len_or_positions)
        if pos.size == 0 or int(pos.max()) < self.max_seq_len:
            return F.embedding_forward(self.table, pos)[0]
        return self.encode(pos)

    def encode(self, positions: np.ndarray) -> np.ndarray:
        """The formula for any positions (...) -> (..., D): float64, cast once (the table's bits)."""
        rows = sinusoidal_encoding(positions.reshape(-1), self.d_model, base=self.base, layout=self.layout)
        return rows.astype(self.dtype).reshape(*positions.shape, self.d_model)

    def backward(self, grad_output: np.ndarray) -> None:
        """Nothing to learn: the table is fixed."""
        return None

    def extra_repr(self) -> str:
        return f"{self.max_seq_len}, {self.d_model}, base={self.base}, layout={self.layout!r}"
