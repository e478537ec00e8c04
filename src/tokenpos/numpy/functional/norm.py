"""LayerNorm and RMSNorm as forward/backward pairs over the last axis.

Shapes: x (..., D) -> (..., D); weight, bias (D,). Statistics and the normalised values are computed
in float64 (float16's x * x overflows from |x| = 256 on; float32's x - mean loses digits when the
mean is large against the spread), and the result is cast back to the input dtype once.

    layernorm: xhat = (x - mean) / sqrt(var + eps),  y = xhat * weight + bias   (biased variance)
    rmsnorm:   xhat = x / sqrt(mean(x**2) + eps),    y = xhat * weight
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class NormCache:
    """xhat (..., D) and the reciprocal std / rms (..., 1) of the forward, and its weight (D,)."""

    xhat: np.ndarray
    rstd: np.ndarray
    weight: np.ndarray


def _stats_input(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float64, copy=False)


def _like(y: np.ndarray, x: np.ndarray) -> np.ndarray:
    return y.astype(x.dtype, copy=False)


def layernorm_forward(x: np.ndarray, weight: np.ndarray, bias: np.ndarray, eps: float
                      ) -> tuple[np.ndarray, NormCache]:
    """x (..., D) -> (y (..., D), cache)."""
    xs = _stats_input(x)
    xc = xs - xs.mean(axis=-1, keepdims=True)
    rstd = 1.0 / np.sqrt((xc * xc).mean(axis=-1, keepdims=True) + eps)       # (..., 1)
    xhat = xc * rstd                                                         # (..., D)
    return _like(xhat * weight + bias, x), NormCache(xhat, rstd, weight.copy())


def layernorm_backward(dout: np.ndarray, cache: NormCache) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """dout (..., D) -> (dx (..., D), dweight (D,), dbias (D,))."""
    d = cache.xhat.shape[-1]
    dweight = (dout * cache.xhat).reshape(-1, d).sum(axis=0)
    dbias = dout.reshape(-1, d).sum(axis=0)
    gx = dout * cache.weight                                                 # d xhat
    dx = cache.rstd * (gx - gx.mean(axis=-1, keepdims=True)
                       - cache.xhat * (gx * cache.xhat).mean(axis=-1, keepdims=True))
    return _like(dx, dout), dweight, dbias


def rmsnorm_forward(x: np.ndarray, weight: np.ndarray, eps: float) -> tuple[np.ndarray, NormCache]:
    """x (..., D) -> (y (..., D), cache)."""
    xs = _stats_input(x)
    rrms = 1.0 / np.sqrt((xs * xs).mean(axis=-1, keepdims=True) + eps)       # (..., 1)
    xhat = xs * rrms
    return _like(xhat * weight, x), NormCache(xhat, rrms, weight.copy())


def rmsnorm_backward(dout: np.ndarray, cache: NormCache) -> tuple[np.ndarray, np.ndarray]:
    """dout (..., D) -> (dx (..., D), dweight (D,))."""
    d = cache.xhat.shape[-1]
    dweight = (dout * cache.xhat).reshape(-1, d).sum(axis=0)
    gx = dout * cache.weight
    dx = cache.rstd * (gx - cache.xhat * (gx * cache.xhat).mean(axis=-1, keepdims=True))
    return _like(dx, dout), dweight
