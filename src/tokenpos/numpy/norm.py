"""Post-embedding normalisation: LayerNorm (BERT) and RMSNorm, with their backward.

Shapes: x (..., D) -> (..., D); statistics over the last axis. Computed in the input dtype,
with the mean/variance accumulated in float64 for float16 inputs.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from tokenpos.numpy.module import Module, Parameter
from tokenpos.tables.validation import check_dtype, check_feature_dim, check_float, check_positive_int

NORMS = ("layernorm", "rmsnorm")


class LayerNorm(Module):
    """``y = (x - mean) / sqrt(var + eps) * weight + bias`` over the last axis (biased variance)."""

    def __init__(self, d_model: int, *, eps: float = 1e-5, dtype: Any = np.float32) -> None:
        super().__init__()
        self.d_model = check_positive_int("d_model", d_model)
        self.eps = check_float("eps", eps, low=0.0, low_inclusive=False)
        dt = check_dtype("dtype", dtype)
        self.weight = Parameter(np.ones(self.d_model, dt))
        self.bias = Parameter(np.zeros(self.d_model, dt))
        self._cache: tuple[np.ndarray, np.ndarray] | None = None

    def forward(self, x: np.ndarray) -> np.ndarray:
        check_feature_dim("x", x.shape, self.d_model)
        mu = x.mean(axis=-1, keepdims=True)
        xc = x - mu
        rstd = 1.0 / np.sqrt((xc * xc).mean(axis=-1, keepdims=True) + self.eps)
        xhat = xc * rstd                                              # (..., D)
        self._cache = (xhat, rstd)
        return xhat * self.weight.data + self.bias.data

    def backward(self, grad_output: np.ndarray) -> np.ndarray:
        """dy (..., D) -> dx (..., D); accumulates d weight and d bias."""
        xhat, rstd = self._cached(self._cache)
        g = np.asarray(grad_output)
        self.weight.accumulate((g * xhat).reshape(-1, self.d_model).sum(axis=0))
        self.bias.accumulate(g.reshape(-1, self.d_model).sum(axis=0))
        gx = g * self.weight.data                                     # d xhat
        return rstd * (gx - gx.mean(axis=-1, keepdims=True) - xhat * (gx * xhat).mean(axis=-1, keepdims=True))

    def extra_repr(self) -> str:
        return f"{self.d_model}, eps={self.eps}"


class RMSNorm(Module):
    """``y = x / sqrt(mean(x**2) + eps) * weight`` over the last axis (Zhang & Sennrich 2019)."""

    def __init__(self, d_model: int, *, eps: float = 1e-6, dtype: Any = np.float32) -> None:
        super().__init__()
        self.d_model = check_positive_int("d_model", d_model)
        self.eps = check_float("eps", eps, low=0.0, low_inclusive=False)
        dt = check_dtype("dtype", dtype)
        self.weight = Parameter(np.ones(self.d_model, dt))
        self._cache: tuple[np.ndarray, np.ndarray] | None = None

    def forward(self, x: np.ndarray) -> np.ndarray:
        check_feature_dim("x", x.shape, self.d_model)
        rrms = 1.0 / np.sqrt((x * x).mean(axis=-1, keepdims=True) + self.eps)
        xhat = x * rrms
        self._cache = (xhat, rrms)
        return xhat * self.weight.data

    def backward(self, grad_output: np.ndarray) -> np.ndarray:
        xhat, rrms = self._cached(self._cache)
        g = np.asarray(grad_output)
        self.weight.accumulate((g * xhat).reshape(-1, self.d_model).sum(axis=0))
        gx = g * self.weight.data
        return rrms * (gx - xhat * (gx * xhat).mean(axis=-1, keepdims=True))

    def extra_repr(self) -> str:
        return f"{self.d_model}, eps={self.eps}"


def build_norm(kind: str | None, d_model: int, eps: float, dtype: Any) -> Module | None:
    """None, "layernorm" or "rmsnorm" -> the module (or None)."""
    from tokenpos.tables.validation import check_choice

    if kind is None:
        return None
    check_choice("norm", kind, NORMS)
    return LayerNorm(d_model, eps=eps, dtype=dtype) if kind == "layernorm" else RMSNorm(d_model, eps=eps, dtype=dtype)
