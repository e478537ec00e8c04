"""``tied_cross_entropy``: the checked public entry of the NumPy tied loss (h (..., D), weight (V, D), targets (...)).

The computation is the pair ``functional.tied_cross_entropy_forward / _backward`` (chunked over tokens, never
the (N, V) logits), whose forward checks the inputs once (``functional.check_tied_loss_args``); so does
``TokenEmbedding.loss``, which calls it too.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tokenpos.numpy import functional as F


def tied_cross_entropy(h: Any, weight: Any, targets: Any, *, ignore_index: int = -100, label_smoothing: float = 0.0,
                       reduction: str = "mean", softcap: float | None = None,
                       chunk_size: int | None = None) -> np.ndarray:
    """``F.cross_entropy(cap(h @ weight.T), targets, ...)`` without the logits: h (..., D), weight (V, D),
    targets (...) -> loss () ("mean", "sum") or (...) ("none"), in float32 (float16 inputs) or the inputs' dtype.

    ``softcap``: logits become ``softcap * tanh(z / softcap)`` first (Gemma 2). ``chunk_size``: tokens per
    block of logits (default: a block of at most 64 MiB). "mean" averages over the non-ignored targets;
    all ignored gives 0. For gradients use ``functional.tied_cross_entropy_forward`` / ``_backward`` or
    ``TokenEmbedding.loss`` / ``loss_backward``.

    Raises:
        TokenIdError: a target outside [0, V) that is not ``ignore_index``.
        DtypeError / ConfigError: see ``functional.check_tied_loss_args``.
    """
    return F.tied_cross_entropy_forward(h, weight, targets, ignore_index=ignore_index, label_smoothing=label_smoothing,
                                        reduction=reduction, softcap=softcap, chunk_size=chunk_size)[0]
