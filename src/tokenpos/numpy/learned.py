"""LearnedPositionalEmbedding: a trainable (P, D) table indexed by position (GPT-2's wpe, BERT's).

Shapes: P = max_seq_len, D = d_model, positions (...) -> (..., D).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tokenpos.numpy import functional as F
from tokenpos.numpy.module import Module, Parameter
from tokenpos.tables.checks.validation import (
    check_dtype,
    check_grad,
    check_padding_idx,
    check_positive_int,
    check_seq_len_or_positions,
)
from tokenpos.tables.formulas.init import init_weight, resolve_rng


class LearnedPositionalEmbedding(Module):
    """A learned absolute position table; it cannot represent positions >= max_seq_len.

    Args:
        max_seq_len: P > 0, the number of positions.
        d_model: D > 0.
        init, std: the init scheme (see ``tokenpos.tables.init_weight``).
        padding_idx: a position whose row starts at zero and never receives gradient (RoBERTa's
            padding position, as HF's ``nn.Embedding(..., padding_idx=pad)``).
        dtype, seed, rng: as for TokenEmbedding.

    Shape:
        forward(L: int) -> (L, D); forward(positions (...)) -> (..., D).
        A position >= max_seq_len raises PositionError (a ValueError) naming both.
    """

    kind = "additive"
    name = "learned"
    extends = False          # positions >= max_seq_len have no row (PositionError)

    def __init__(self, max_seq_len: int, d_model: int, *, init: str = "normal", std: float = 0.02,
                 padding_idx: int | None = None, dtype: Any = np.float32, seed: int | None = None,
                 rng: np.random.Generator | None = None) -> None:
        super().__init__()
        self.max_seq_len = check_positive_int("max_seq_len", max_seq_len)
        self.d_model = check_positive_int("d_model", d_model)
        self.padding_idx = check_padding_idx(padding_idx, self.max_seq_len)
        self.init, self.std = init, std
        self.dtype = check_dtype("dtype", dtype)
        self.weight = Parameter(np.empty((self.max_seq_len, self.d_model), self.dtype))
        self.reset_parameters(rng=resolve_rng(seed, rng))
        self._cache: F.EmbeddingCache | None = None

    def reset_parameters(self, *, seed: int | None = None, rng: np.random.Generator | None = None) -> None:
        self.weight.data[...] = init_weight(self.weight.data.shape, self.init, std=self.std,
                                            rng=resolve_rng(seed, rng), padding_idx=self.padding_idx)
        self.weight.zero_grad()

    def forward(self, seq_len_or_positions: Any) -> np.ndarray:
        """An int L gives rows 0..L-1, (L, D); positions (...) give (..., D)."""
        pos = check_seq_len_or_positions(seq_len_or_positions, self.max_seq_len)
        out, self._cache = F.embedding_forward(self.weight.data, pos, padding_idx=self.padding_idx)
        return out

    @property
    def table(self) -> np.ndarray:
        """The (P, D) table whose rows the embedding op adds (the additive-scheme protocol)."""
        return self.weight.data

    @property
    def table_param(self) -> Parameter:
        """The Parameter that receives the table's gradient."""
        return self.weight

    def backward(self, grad_output: np.ndarray) -> None:
        """Accumulate the gradient of the last forward into the rows used (duplicates add up)."""
        cache = self._cached(self._cache)
        grad = check_grad("grad_output", grad_output, cache.ids.shape + (self.d_model,))
        if self.weight.requires_grad:
            (rows_at, rows), _ = F.embedding_backward(grad, cache)
            self.weight.accumulate_rows(rows_at, rows, coalesced=True)

    def extra_repr(self) -> str:
        return f"{self.max_seq_len}, {self.d_model}, dtype={self.dtype}"


PositionalEmbedding = LearnedPositionalEmbedding
