"""ALiBi for the NumPy backend: a fixed linear distance bias added to attention logits.

Shapes: H heads, Lq query length, Lk key length (Lq <= Lk; query i sits at key position Lk - Lq + i).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tokenpos.numpy.module import Module
from tokenpos.tables.checks.validation import check_dtype, check_positive_int
from tokenpos.tables.formulas.alibi import alibi_bias, alibi_slopes


class ALiBi(Module):
    """Attention with Linear Biases: ``bias[h, i, j] = -slope_h * |q_pos(i) - j|``.

    No parameters, empty state_dict. Causal masking is the attention's job.

    Args:
        num_heads: H (any positive number; non-powers of two follow the paper / HF Bloom).
        dtype: the dtype of the returned bias (computed in float64, cast at the end).

    Shape:
        bias(q_len, k_len) -> (H, Lq, Lk).
    """

    kind = "bias"
    name = "alibi"

    def __init__(self, num_heads: int, *, dtype: Any = np.float32, seed: int | None = None,
                 rng: np.random.Generator | None = None) -> None:
        super().__init__()
        self.num_heads = check_positive_int("num_heads", num_heads)
        self.dtype = check_dtype("dtype", dtype)
        self.slopes = alibi_slopes(self.num_heads)          # (H,) float64, fixed

    def reset_parameters(self, *, seed: int | None = None, rng: np.random.Generator | None = None) -> None:
        """Nothing to draw: the slopes are fixed (seed/rng accepted so every scheme resets alike)."""

    def bias(self, q_len: int, k_len: int) -> np.ndarray:
        """The (H, Lq, Lk) bias; raises ConfigError when q_len > k_len."""
        return alibi_bias(self.num_heads, q_len, k_len).astype(self.dtype)

    forward = bias

    def backward(self, grad_bias: Any) -> None:
        """Nothing to learn: the slopes are fixed."""
        return None

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}"
