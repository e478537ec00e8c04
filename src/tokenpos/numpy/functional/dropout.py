"""Counter-hash dropout as a forward/backward pair: ``out = x * m``.

``m = 1/(1-p)`` where ``tables.formulas.dropout.dropout_keep_mask(seed, shape, p)`` keeps, else 0.0; a
multiply (not ``where``), so NaN and Inf propagate like ``torch.nn.Dropout``. Float16 inputs are
computed in float32 and rounded once. The mask is recomputed from the seed in backward.

Shapes: x (...) any shape; the mask uses the C-order flat index of each element as its counter.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tokenpos.numpy.functional._dispatch import compute_dtype
from tokenpos.tables.formulas.dropout import dropout_multiplier


@dataclass(frozen=True)
class DropoutCache:
    """What :func:`dropout_backward` needs: p, seed and the counter offset (the mask is recomputed)."""

    p: float
    seed: int
    offset: int = 0


def dropout_forward(x: np.ndarray, *, p: float, seed: int, offset: int = 0) -> tuple[np.ndarray, DropoutCache]:
    """x (...) -> (x * m (...) in x's dtype, cache). p = 0 returns x itself."""
    cache = DropoutCache(p, seed, offset)
    if p == 0.0:
        return x, cache
    ct = compute_dtype(x.dtype)
    with np.errstate(invalid="ignore"):                 # inf * 0 = nan is the intended result
        out = x.astype(ct) * dropout_multiplier(seed, x.shape, p, offset, ct)
    return out.astype(x.dtype, copy=False), cache


def dropout_backward(dout: np.ndarray, cache: DropoutCache) -> np.ndarray:
    """dout (...) -> dx = dout * m (...), the same mask and multiplier as the forward."""
    if cache.p == 0.0:
        return dout
    ct = compute_dtype(dout.dtype)
    with np.errstate(invalid="ignore"):
        dx = dout.astype(ct) * dropout_multiplier(cache.seed, dout.shape, cache.p, cache.offset, ct)
    return dx.astype(dout.dtype, copy=False)
