"""FIRE for the NumPy backend: a learned MLP of the log-normalised relative distance, with a hand-written backward.

Shapes: H heads, W MLP width, Lq query length, Lk key length (query i sits at key position
``Lk - Lq + i`` by default). Formula, and where it follows the paper's reference listing rather
than its text: ``tokenpos.tables.formulas.fire``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tokenpos.numpy.module import Module, Parameter
from tokenpos.tables.checks.validation import check_dtype, check_float, check_grad, check_positive_int
from tokenpos.tables.formulas.fire import FIRE_EPS, FIRE_INIT_C, FIRE_PARAMS, fire_bias, fire_bias_backward, fire_init
from tokenpos.tables.formulas.init import resolve_rng


class FIRE(Module):
    """FIRE attention bias (Li et al., ICLR 2024), the paper's reference listing.

    Args:
        num_heads: H. width: W (32). init_L: the fixed part of the learned threshold
            ``|L_multiplier * init_L|`` (use the training length). init_c: initial c (0.1).
        eps: added to the normaliser (1e-6). dtype, seed, rng as for every layer.

    Attributes (Parameters, state_dict keys): ``in_weight`` (W,), ``in_bias`` (W,), ``out_weight``
    (W, H), ``out_bias`` (H,), ``c`` (1,), ``L_multiplier`` (1,).

    Shape:
        forward(q_len, k_len) -> (H, Lq, Lk); backward(grad (H, Lq, Lk)) accumulates into every .grad.
    """

    kind = "bias"
    name = "fire"

    def __init__(self, num_heads: int, *, width: int = 32, init_L: float = 512.0, init_c: float = FIRE_INIT_C,
                 eps: float = FIRE_EPS, dtype: Any = np.float32, seed: int | None = None,
                 rng: np.random.Generator | None = None) -> None:
        super().__init__()
        self.num_heads = check_positive_int("num_heads", num_heads)
        self.width = check_positive_int("width", width)
        self.init_L = check_float("init_L", init_L, low=0.0, low_inclusive=False)
        self.init_c = check_float("init_c", init_c)
        self.eps = check_float("eps", eps, low=0.0)
        self.dtype = check_dtype("dtype", dtype)
        values = fire_init(self.num_heads, self.width, resolve_rng(seed, rng), init_c=self.init_c)
        for key in FIRE_PARAMS:
            setattr(self, key, Parameter(values[key].astype(self.dtype)))

    def reset_parameters(self, *, seed: int | None = None, rng: np.random.Generator | None = None) -> None:
        values = fire_init(self.num_heads, self.width, resolve_rng(seed, rng), init_c=self.init_c)
        for key in FIRE_PARAMS:
            param = getattr(self, key)
            param.data[...] = values[key]
            param.zero_grad()

    def _params(self) -> dict[str, np.ndarray]:
        return {key: getattr(self, key).data for key in FIRE_PARAMS}

    def forward(self, q_len: int, k_len: int, *, query_offset: int | None = None) -> np.ndarray:
        """The bias (H, Lq, Lk) in ``dtype`` (computed in float64). Stateless: :meth:`backward`
        recomputes what it needs from the gradient's shape."""
        out, _ = fire_bias(self._params(), q_len, k_len, init_L=self.init_L, query_offset=query_offset, eps=self.eps)
        return out.astype(self.dtype)

    bias = forward

    def backward(self, grad_bias: Any, *, query_offset: int | None = None) -> None:
        """Accumulate d(loss)/d(every parameter) from grad_bias (H, Lq, Lk) (pass the forward's query_offset)."""
        grad = check_grad("grad_bias", grad_bias, (self.num_heads, "Lq", "Lk"))
        params = self._params()
        _, cache = fire_bias(params, grad.shape[1], grad.shape[2], init_L=self.init_L, query_offset=query_offset,
                             eps=self.eps)
        grads = fire_bias_backward(grad, params, cache, init_L=self.init_L)
        for key in FIRE_PARAMS:
            getattr(self, key).accumulate(grads[key].astype(self.dtype))
        return None

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}, width={self.width}, init_L={self.init_L}"
