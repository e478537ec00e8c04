"""The tied output projection and its cross-entropy as one forward/backward pair, chunked over tokens.

Shapes: h (..., D) flattened to (N, D), weight (V, D), targets (...) flattened to (N,), c = chunk_size tokens.

    loss = F.cross_entropy(cap(h @ weight.T), targets, ignore_index=..., label_smoothing=..., reduction=...)

without ever holding the (N, V) logits: the forward computes one (c, V) block of logits at a time and
keeps only each token's log-sum-exp (N,); the backward recomputes each block, turns it into its
gradient (``tables.formulas.tied_loss``) and adds ``block_grad @ weight`` to dh and
``block_grad.T @ h_block`` to dweight, chunk after chunk in token order (a fixed order: the same
inputs give bit-identical results). Arithmetic runs in float32 (float16 inputs) or the input dtype;
the loss is returned in that compute dtype, the gradients in the inputs' dtype.

"mean" averages over the non-ignored tokens; with every target ignored the loss is 0 and the
gradients are 0 (``F.cross_entropy`` gives NaN). The pair takes checked inputs (the public
``tokenpos.numpy.tied_cross_entropy`` and ``TokenEmbedding.loss`` check them once).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tokenpos.numpy.functional._dispatch import compute_dtype, kept
from tokenpos.tables.formulas.tied_loss import (
    default_chunk_size,
    reduce_weights,
    smoothed_loss,
    soft_cap,
    soft_cap_grad,
)


@dataclass(frozen=True)
class TiedLossCache:
    """h (N, D) (a private copy), weight (V, D), targets (N,) int64 (a copy), lse (N,), the settings."""

    h: np.ndarray
    weight: np.ndarray
    targets: np.ndarray
    lse: np.ndarray
    shape: tuple[int, ...]
    ignore_index: int
    label_smoothing: float
    reduction: str
    softcap: float | None
    chunk_size: int


#: Rows of dweight updated per matmul (its temporary stays (_ROWS, D), never a second (V, D)).
_ROWS = 4096


def _chunks(n: int, c: int) -> range:
    return range(0, n, c)


def _logits(h: np.ndarray, weight: np.ndarray, dt: np.dtype, softcap: float | None
            ) -> tuple[np.ndarray, np.ndarray | None]:
    """One block: h (c, D) -> (capped logits (c, V), tanh (c, V) or None) in the compute dtype."""
    z = h.astype(dt, copy=False) @ weight.astype(dt, copy=False).T
    return soft_cap(z, softcap)


def tied_cross_entropy_forward(h: np.ndarray, weight: np.ndarray, targets: np.ndarray, *, ignore_index: int = -100,
                               label_smoothing: float = 0.0, reduction: str = "mean", softcap: float | None = None,
                               chunk_size: int | None = None) -> tuple[np.ndarray, TiedLossCache]:
    """h (..., D), weight (V, D), targets (...) int -> (loss () or (...) for "none", cache)."""
    V, D = weight.shape
    dt = compute_dtype(h.dtype)
    h2 = kept(h).reshape(-1, D)                                               # (N, D)
    t = np.array(targets, dtype=np.int64).reshape(-1)                         # (N,) a copy
    N = t.shape[0]
    c = default_chunk_size(V) if chunk_size is None else int(chunk_size)
    valid = t != ignore_index
    safe = np.where(valid, t, 0)
    lse = np.empty(N, dt)
    per = np.zeros(N, dt)
    for i in _chunks(N, c):
        z, _ = _logits(h2[i:i + c], weight, dt, softcap)                      # (c, V)
        m = z.max(axis=1)
        lse[i:i + c] = m + np.log(np.exp(z - m[:, None]).sum(axis=1))
        rows = np.arange(z.shape[0])
        z_sum = z.sum(axis=1) if label_smoothing > 0.0 else None
        per[i:i + c] = smoothed_loss(lse[i:i + c], z[rows, safe[i:i + c]], z_sum, label_smoothing, V)
    per = np.where(valid, per, 0.0).astype(dt, copy=False)
    if reduction == "none":
        loss = per.reshape(np.shape(targets))
    elif reduction == "sum":
        loss = np.asarray(per.sum(), dt)
    else:
        loss = np.asarray(per.sum() / max(int(valid.sum()), 1), dt)
    cache = TiedLossCache(h2, weight, t, lse, tuple(h.shape), int(ignore_index), float(label_smoothing), reduction,
                          softcap, c)
    return loss, cache


def tied_cross_entropy_backward(dloss: np.ndarray | float, cache: TiedLossCache) -> tuple[np.ndarray, np.ndarray]:
    """dloss (() or (...) for "none") -> (dh (..., D) in h's dtype, dweight (V, D) in weight's dtype)."""
    h2, weight, t, c = cache.h, cache.weight, cache.targets, cache.chunk_size
    V, D = weight.shape
    dt = compute_dtype(h2.dtype)
    eps = cache.label_smoothing
    valid = t != cache.ignore_index
    safe = np.where(valid, t, 0)
    g_tok = reduce_weights(valid, cache.reduction, np.asarray(dloss).reshape(-1)
                           if cache.reduction == "none" else np.asarray(dloss)).astype(dt)   # (N,)
    dh = np.zeros((t.shape[0], D), dt)
    dweight = np.zeros((V, D), dt)
    w = weight.astype(dt, copy=False)
    tmp = np.empty((min(_ROWS, V), D), dt)
    for i in _chunks(t.shape[0], c):
        hc = h2[i:i + c].astype(dt, copy=False)
        z, th = _logits(hc, weight, dt, cache.softcap)                         # (c, V)
        g = np.exp(np.subtract(z, cache.lse[i:i + c, None], out=z), out=z)    # softmax, in place
        g[np.arange(g.shape[0]), safe[i:i + c]] -= 1.0 - eps
        if eps > 0.0:
            g -= eps / V
        g *= g_tok[i:i + c, None]
        soft_cap_grad(g, th)
        dh[i:i + c] = g @ w
        for v in range(0, V, _ROWS):                                           # dweight += g.T @ hc, by row
            part = tmp[:min(_ROWS, V - v)]                                     # block, in a fixed order
            np.matmul(g[:, v:v + _ROWS].T, hc, out=part)
            dweight[v:v + _ROWS] += part
    return dh.reshape(cache.shape).astype(h2.dtype, copy=False), dweight.astype(weight.dtype, copy=False)
