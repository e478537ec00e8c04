"""The tied output projection as a forward/backward pair: logits against the embedding table.

Shapes: h (..., D), weight (V, D), logits (..., V).

    logits = h @ weight.T                 (flax's ``Embed.attend``; a tied ``nn.Linear`` without bias)

The backward is dense, like a tied ``nn.Linear``: every row, the padding row included, receives
gradient. ``h`` is kept as a private copy (the one rule for inputs kept for backward).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tokenpos.numpy.functional._dispatch import kept


@dataclass(frozen=True)
class AttendCache:
    """h (..., D), a private copy, and the weight (V, D) the logits were computed with."""

    h: np.ndarray
    weight: np.ndarray


def attend_forward(h: np.ndarray, weight: np.ndarray) -> tuple[np.ndarray, AttendCache]:
    """h (..., D), weight (V, D) -> (logits (..., V), cache)."""
    return h @ weight.T, AttendCache(kept(h), weight)


def attend_backward(dlogits: np.ndarray, cache: AttendCache) -> tuple[np.ndarray, np.ndarray]:
    """dlogits (..., V) -> (dh (..., D), dweight (V, D))."""
    v, d = cache.weight.shape
    dweight = dlogits.reshape(-1, v).T @ cache.h.reshape(-1, d)               # (V, D)
    return dlogits @ cache.weight, dweight
