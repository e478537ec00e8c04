"""Post-embedding normalisation: LayerNorm (BERT) and RMSNorm, with their backward.

Shapes: x (..., D) -> (..., D); statistics over the last axis. Computed in the input dtype,
with the mean/variance accumulated in float64 for float16 inputs.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tokenpos.numpy.module import Module, Parameter
from tokenpos.tables.validation import (
    check_dtype,
    check_feature_dim,
    check_float,
    check_float_array,
    check_positive_int,
)

NORMS = ("layernorm", "rmsnorm")


def _stats_input(x: np.ndarray) -> np.ndarray:
    """float16 inputs are normalised in float64 (x * x overflows float16 from |x| = 256 on)."""
    return x.astype(np.float64) if x.dtype == np.float16 else x


def _like_input(y: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Cast a result computed in float64 for a float16 input back to float16."""
    return y.astype(np.float16) if x.dtype == np.float16 else y


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
        x = check_float_array("x", x)
        check_feature_dim("x", x.shape, self.d_model)
        xs = _stats_input(x)                                          # float16 -> float64
        mu = xs.mean(axis=-1, keepdims=True)
        xc = xs - mu
        rstd = 1.0 / np.sqrt((xc * xc).mean(axis=-1, keepdims=True) + self.eps)
        xhat = xc * rstd                                              # (..., D)
        self._cache = (xhat, rstd)
        return _like_input(xhat * self.weight.data + self.bias.data, x)

    def backward(self, grad_output: np.ndarray) -> np.ndarray:
        """dy (..., D) -> dx (..., D); accumulates d weight and d bias."""
        xhat, rstd = self._cached(self._cache)
        g = np.asarray(grad_output)
        self.weight.accumulate((g * xhat).reshape(-1, self.d_model).sum(axis=0))
        self.bias.accumulate(g.reshape(-1, self.d_model).sum(axis=0))
        gx = g * self.weight.data                                     # d xhat
        dx = rstd * (gx - gx.mean(axis=-1, keepdims=True) - xhat * (gx * xhat).mean(axis=-1, keepdims=True))
        return _like_input(dx, g)

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
        x = check_float_array("x", x)
        check_feature_dim("x", x.shape, self.d_model)
        xs = _stats_input(x)                                          # float16 -> float64
        rrms = 1.0 / np.sqrt((xs * xs).mean(axis=-1, keepdims=True) + self.eps)
        xhat = xs * rrms
        self._cache = (xhat, rrms)
        return _like_input(xhat * self.weight.data, x)

    def backward(self, grad_output: np.ndarray) -> np.ndarray:
        xhat, rrms = self._cached(self._cache)
        g = np.asarray(grad_output)
        self.weight.accumulate((g * xhat).reshape(-1, self.d_model).sum(axis=0))
        gx = g * self.weight.data
        return _like_input(rrms * (gx - xhat * (gx * xhat).mean(axis=-1, keepdims=True)), g)

    def extra_repr(self) -> str:
        return f"{self.d_model}, eps={self.eps}"


def build_norm(kind: str | None, d_model: int, eps: float, dtype: Any) -> Module | None:
    """None, "layernorm" or "rmsnorm" -> the module (or None)."""
    from tokenpos.tables.validation import check_choice

    if kind is None:
        return None
    check_choice("norm", kind, NORMS)
    return LayerNorm(d_model, eps=eps, dtype=dtype) if kind == "layernorm" else RMSNorm(d_model, eps=eps, dtype=dtype)
