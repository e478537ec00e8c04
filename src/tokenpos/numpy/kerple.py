"""KERPLE (log variant) for the NumPy backend: ``-r1 * log(1 + r2 * |i - j|)`` per head, hand-written backward.

Shapes: H heads, Lq query length, Lk key length (query i sits at key position ``Lk - Lq + i`` by
default). Formula, initialisation and the reference code's in-place positivity projection:
``tokenpos.tables.formulas.kerple``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tokenpos.numpy.module import Module, Parameter
from tokenpos.tables.checks.bias import check_kerple_eps
from tokenpos.tables.checks.validation import check_dtype, check_grad, check_positive_int
from tokenpos.tables.formulas.init import resolve_rng
from tokenpos.tables.formulas.kerple import (
    KERPLE_EPS,
    kerple_bias,
    kerple_bias_backward,
    kerple_distance,
    kerple_init,
    kerple_project,
)


class KERPLE(Module):
    """KERPLE-log attention bias (Chi et al., NeurIPS 2022), as the reference code computes it.

    :meth:`forward` first clamps ``r1`` and ``r2`` in place to at least ``eps`` (the reference code's
    projection), then returns ``-r1 * log1p(r2 * d)`` (computed in float64).

    Args:
        num_heads: H. eps: the clamp floor (1e-2). dtype, seed, rng as for every layer.

    Attributes (Parameters, state_dict keys): ``r1`` (H,) (the code's ``bias_p``), ``r2`` (H,) (``bias_a``).

    Shape:
        forward(q_len, k_len) -> (H, Lq, Lk); backward(grad (H, Lq, Lk)) accumulates into r1.grad, r2.grad.
    """

    kind = "bias"
    name = "kerple"

    def __init__(self, num_heads: int, *, eps: float = KERPLE_EPS, dtype: Any = np.float32,
                 seed: int | None = None, rng: np.random.Generator | None = None) -> None:
        super().__init__()
        self.num_heads = check_positive_int("num_heads", num_heads)
        self.eps = check_kerple_eps(eps)
        self.dtype = check_dtype("dtype", dtype)
        r1, r2 = kerple_init(self.num_heads, resolve_rng(seed, rng))
        self.r1 = Parameter(r1.astype(self.dtype))
        self.r2 = Parameter(r2.astype(self.dtype))

    def reset_parameters(self, *, seed: int | None = None, rng: np.random.Generator | None = None) -> None:
        r1, r2 = kerple_init(self.num_heads, resolve_rng(seed, rng))
        self.r1.data[...], self.r2.data[...] = r1, r2
        self.r1.zero_grad()
        self.r2.zero_grad()

    def forward(self, q_len: int, k_len: int, *, query_offset: int | None = None) -> np.ndarray:
        """Project r1, r2 to >= eps in place, then the bias (H, Lq, Lk) in ``dtype``."""
        dist = kerple_distance(q_len, k_len, query_offset)                 # checks the lengths first
        self.r1.data[...] = kerple_project(self.r1.data, self.eps)
        self.r2.data[...] = kerple_project(self.r2.data, self.eps)
        return kerple_bias(self.r1.data.astype(np.float64), self.r2.data.astype(np.float64), dist).astype(self.dtype)

    bias = forward

    def backward(self, grad_bias: Any, *, query_offset: int | None = None) -> None:
        """Accumulate d(loss)/d(r1, r2) from grad_bias (H, Lq, Lk) (pass the forward's query_offset)."""
        grad = check_grad("grad_bias", grad_bias, (self.num_heads, "Lq", "Lk"))
        dist = kerple_distance(grad.shape[1], grad.shape[2], query_offset)
        d_r1, d_r2 = kerple_bias_backward(grad.astype(np.float64), self.r1.data.astype(np.float64),
                                          self.r2.data.astype(np.float64), dist)
        self.r1.accumulate(d_r1.astype(self.dtype))
        self.r2.accumulate(d_r2.astype(self.dtype))
        return None

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}, eps={self.eps}"
