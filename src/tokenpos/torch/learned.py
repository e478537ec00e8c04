"""LearnedPositionalEmbedding: a trainable (P, D) table indexed by position (GPT-2's wpe, BERT's).

Shapes: P = max_seq_len, D = d_model, positions (...) -> (..., D).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

from tokenpos.tables.checks.validation import check_choice, check_padding_idx, check_positive_int
from tokenpos.tables.formulas.init import INIT_SCHEMES
from tokenpos.torch._checks import check_position_tensor, check_seq_len, is_seq_len, resolve_dtype
from tokenpos.torch._init import fill_init_, resolve_torch_rng
from tokenpos.torch._module import TokenposModule
from tokenpos.torch.ops import embed


class LearnedPositionalEmbedding(TokenposModule):
    """A learned absolute position table; it cannot represent positions >= max_seq_len.

    Args:
        max_seq_len: P > 0, the number of positions.
        d_model: D > 0.
        init, std: the init scheme (see ``tokenpos.tables.init_weight``).
        padding_idx: a position whose row starts at zero and never receives gradient (RoBERTa's
            padding position); None for none.
        device, dtype: factory kwargs (dtype: float16, bfloat16, float32, float64; None = default).
        seed / rng: NumPy-backend-identical initialisation; generator: a torch.Generator to seed from.

    Shape:
        forward(L: int) -> (L, D); forward(positions (...)) -> (..., D).
        A position >= max_seq_len raises PositionError (a ValueError) naming both.

    state_dict: ``weight`` (P, D).
    """

    kind = "additive"
    name = "learned"
    extends = False          # positions >= max_seq_len have no row (PositionError)

    def __init__(self, max_seq_len: int, d_model: int, *, init: str = "normal", std: float = 0.02,
                 padding_idx: int | None = None, device: Any = None, dtype: Any = None, seed: int | None = None,
                 rng: np.random.Generator | None = None, generator: torch.Generator | None = None) -> None:
        super().__init__()
        self.max_seq_len = check_positive_int("max_seq_len", max_seq_len)
        self.d_model = check_positive_int("d_model", d_model)
        self.padding_idx = check_padding_idx(padding_idx, self.max_seq_len)
        self.init, self.std = check_choice("init", init, INIT_SCHEMES), std
        self.weight = nn.Parameter(torch.empty(self.max_seq_len, self.d_model, device=device,
                                               dtype=resolve_dtype(dtype)))
        self.reset_parameters(seed=seed, rng=rng, generator=generator)

    def reset_parameters(self, *, seed: int | None = None, rng: np.random.Generator | None = None,
                         generator: torch.Generator | None = None) -> None:
        """Re-draw the table (seed/rng: the NumPy numbers; else seeded from torch's generator)."""
        fill_init_(self.weight, self.init, self.std, resolve_torch_rng(seed, rng, generator), self.padding_idx)

    @property
    def table(self) -> torch.Tensor:
        """The (P, D) table whose rows the embedding op adds (the additive-scheme protocol): ``weight``."""
        return self.weight

    def forward(self, seq_len_or_positions: Any) -> torch.Tensor:
        """An int L gives rows 0..L-1, (L, D); positions (...) give (..., D). Always a new tensor
        (never a view of ``weight``, so in-place ops on the output leave the layer unchanged)."""
        if is_seq_len(seq_len_or_positions):
            L = check_seq_len(seq_len_or_positions, self.max_seq_len)
            pos = torch.arange(L, device=self.weight.device)
        else:
            pos = check_position_tensor(seq_len_or_positions, self.max_seq_len, device=self.weight.device)
        return embed(self.weight, pos, padding_idx=-1 if self.padding_idx is None else self.padding_idx)

    def extra_repr(self) -> str:
        return f"{self.max_seq_len}, {self.d_model}, dtype={self.weight.dtype}"


PositionalEmbedding = LearnedPositionalEmbedding
