"""Post-embedding normalisation layers: LayerNorm (BERT) and RMSNorm, over the last axis.

Shapes: x (..., D) -> (..., D). The computation is ``tokenpos.numpy.functional.norm`` (normalised
in float64 and cast back to the input dtype once).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tokenpos.numpy import functional as F
from tokenpos.numpy.module import Module, Parameter
from tokenpos.tables.checks.validation import (
    check_choice,
    check_dtype,
    check_feature_dim,
    check_float,
    check_float_array,
    check_grad,
    check_positive_int,
)

NORMS = ("layernorm", "rmsnorm")


class _Norm(Module):
    """What LayerNorm and RMSNorm share: d_model, eps, the weight, the input check, and forward /
    backward as the pair :meth:`norm_forward` / :meth:`norm_backward` with the cache kept here.

    Shape: forward x (..., D) -> (..., D); backward dy (..., D) -> dx (..., D).
    """

    def __init__(self, d_model: int, eps: float, dtype: Any) -> None:
        super().__init__()
        self.d_model = check_positive_int("d_model", d_model)
        self.eps = check_float("eps", eps, low=0.0, low_inclusive=False)
        self.weight = Parameter(np.ones(self.d_model, check_dtype("dtype", dtype)))
        self._cache: F.NormCache | None = None

    def _checked(self, x: Any) -> np.ndarray:
        """x (..., D), a float array whose last axis is d_model."""
        x = check_float_array("x", x)
        check_feature_dim("x", x.shape, self.d_model)
        return x

    def norm_forward(self, x: Any) -> tuple[np.ndarray, F.NormCache]:
        raise NotImplementedError

    def norm_backward(self, grad_output: Any, cache: F.NormCache) -> np.ndarray:
        raise NotImplementedError

    def forward(self, x: Any) -> np.ndarray:
        y, self._cache = self.norm_forward(x)
        return y

    def backward(self, grad_output: Any) -> np.ndarray:
        """dy (..., D) -> dx (..., D) of the last forward; accumulates the parameters' gradients."""
        return self.norm_backward(grad_output, self._cached(self._cache))

    def extra_repr(self) -> str:
        return f"{self.d_model}, eps={self.eps}"


class LayerNorm(_Norm):
    """``y = (x - mean) / sqrt(var + eps) * weight + bias`` over the last axis (biased variance).

    Shape: forward x (..., D) -> (..., D); backward dy (..., D) -> dx (..., D).
    """

    def __init__(self, d_model: int, *, eps: float = 1e-5, dtype: Any = np.float32) -> None:
        super().__init__(d_model, eps, dtype)
        self.bias = Parameter(np.zeros(self.d_model, self.weight.data.dtype))

    def reset_parameters(self) -> None:
        """weight = 1, bias = 0 (the identity affine map)."""
        self.weight.data[...] = 1
        self.bias.data[...] = 0
        self.weight.zero_grad()
        self.bias.zero_grad()

    def norm_forward(self, x: Any) -> tuple[np.ndarray, F.NormCache]:
        """x (..., D) -> (y, cache) without keeping anything (for callers that keep their own cache)."""
        return F.layernorm_forward(self._checked(x), self.weight.data, self.bias.data, self.eps)

    def norm_backward(self, grad_output: Any, cache: F.NormCache) -> np.ndarray:
        """dy (..., D) -> dx (..., D); accumulates d weight and d bias."""
        dx, dw, db = F.layernorm_backward(check_grad("grad_output", grad_output, cache.xhat.shape), cache)
        self.weight.accumulate(dw)
        self.bias.accumulate(db)
        return dx


class RMSNorm(_Norm):
    """``y = x / sqrt(mean(x**2) + eps) * weight`` over the last axis (Zhang & Sennrich 2019).

    Shape: forward x (..., D) -> (..., D); backward dy (..., D) -> dx (..., D).
    """

    def __init__(self, d_model: int, *, eps: float = 1e-6, dtype: Any = np.float32) -> None:
        super().__init__(d_model, eps, dtype)

    def reset_parameters(self) -> None:
        """weight = 1."""
        self.weight.data[...] = 1
        self.weight.zero_grad()

    def norm_forward(self, x: Any) -> tuple[np.ndarray, F.NormCache]:
        """x (..., D) -> (y, cache) without keeping anything."""
        return F.rmsnorm_forward(self._checked(x), self.weight.data, self.eps)

    def norm_backward(self, grad_output: Any, cache: F.NormCache) -> np.ndarray:
        """dy (..., D) -> dx (..., D); accumulates d weight."""
        dx, dw = F.rmsnorm_backward(check_grad("grad_output", grad_output, cache.xhat.shape), cache)
        self.weight.accumulate(dw)
        return dx


def build_norm(norm: str | None, d_model: int, eps: float, dtype: Any) -> LayerNorm | RMSNorm | None:
    """None, "layernorm" or "rmsnorm" -> the module (or None)."""
    if norm is None:
        return None
    check_choice("norm", norm, NORMS)
    return LayerNorm(d_model, eps=eps, dtype=dtype) if norm == "layernorm" else RMSNorm(d_model, eps=eps, dtype=dtype)
