"""``tied_cross_entropy``: the checked public entry of the NumPy tied loss (h (..., D), weight (V, D), targets (...)).

The computation is the pair ``functional.tied_cross_entropy_forward / _backward`` (chunked over tokens, never
the (N, V) logits); this module checks the inputs once and calls it. ``TokenEmbedding.loss`` uses the same check.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tokenpos.numpy import functional as F
from tokenpos.tables.checks.tied_loss import check_options, check_same_dtype, check_shapes, check_targets
from tokenpos.tables.checks.validation import check_float_array


def check_tied_loss_args(h: Any, weight: Any, targets: Any, *, ignore_index: Any, label_smoothing: Any,
                         reduction: Any, softcap: Any, chunk_size: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray,
                                                                                 dict[str, Any]]:
    """(h, weight, targets int64, the pair's keyword arguments), every one checked.

    Raises:
        DtypeError: h or weight not float, or of two dtypes.
        ConfigError: shapes that do not fit, a bad option.
        TokenIdError: a target outside [0, V) that is not ``ignore_index``, or non-integer targets.
    """
    h = check_float_array("h", h)
    weight = check_float_array("weight", weight)
    check_same_dtype(h.dtype, weight.dtype)
    t = np.asarray(targets)
    check_shapes(h.shape, weight.shape, t.shape)
    ignore_index, eps, reduction, cap, chunk = check_options(ignore_index, label_smoothing, reduction, softcap,
                                                             chunk_size)
    t = check_targets(t, weight.shape[0], ignore_index)
    return h, weight, t, {"ignore_index": ignore_index, "label_smoothing": eps, "reduction": reduction,
                          "softcap": cap, "chunk_size": chunk}


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
        DtypeError / ConfigError: see ``check_tied_loss_args``.
    """
    h, weight, t, opts = check_tied_loss_args(h, weight, targets, ignore_index=ignore_index,
                                              label_smoothing=label_smoothing, reduction=reduction, softcap=softcap,
                                              chunk_size=chunk_size)
    return F.tied_cross_entropy_forward(h, weight, t, **opts)[0]
