"""The tied output projection and its cross-entropy as one forward/backward pair, chunked over tokens.

Shapes: h (..., D) flattened to (N, D), weight (V, D), targets (...) flattened to (N,), c = chunk_size tokens.

    loss = F.cross_entropy(cap(h @ weight.T), targets, ignore_index=..., label_smoothing=..., reduction=...)

without ever holding the (N, V) logits: one (c, V) block of logits at a time, written into one reused
buffer and reduced to each token's log-sum-exp (N,) by plain NumPy ops (a numba block kernel measured no
faster and was deleted, issue 33). Each block's gradient (``tables.formulas.tied_loss``) adds
``block_grad @ weight`` to dh and ``block_grad.T @ h_block`` to dweight, block after block in token
order (a fixed order: the same inputs give bit-identical results).

- ``with_grad=True`` (reductions "mean" and "sum"; ``TokenEmbedding.loss`` in training mode): the forward
  computes the gradients of the loss from the same blocks (three matmuls per block in all) and the first
  backward takes them out of the cache, scales them by ``dloss`` in place and returns those arrays (no
  second (V, D) table: the cache no longer holds them, so an output never aliases the cache).
- otherwise, and for every later backward of the same cache, the backward recomputes each block from the
  kept lse (reduction "none", whose gradient needs each token's ``dloss``, a forward that did not ask for
  gradients, or gradients already handed over).

Arithmetic runs in float32 (float16 inputs) or the input dtype; the loss is returned in that compute dtype,
the gradients in the inputs' dtype. "mean" averages over the non-ignored tokens; with every target
ignored the loss is 0 and the gradients are 0 (``F.cross_entropy`` gives NaN). The pair takes checked
inputs (the public ``tokenpos.numpy.tied_cross_entropy`` and ``TokenEmbedding.loss`` check them once).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tokenpos.numpy.functional._dispatch import compute_dtype, kept
from tokenpos.tables.checks.tied_loss import check_options, check_same_dtype, check_shapes, check_targets
from tokenpos.tables.checks.validation import check_float_array, check_grad
from tokenpos.tables.formulas.tied_loss import (
    default_chunk_size,
    reduce_weights,
    smoothed_loss,
    soft_cap,
    soft_cap_grad,
)

#: Rows of dweight updated per matmul (its temporary stays (_ROWS, D), never a second (V, D)).
_ROWS = 4096


@dataclass(frozen=True)
class TiedLossCache:
    """h (N, D) (a private copy), weight (V, D), targets (N,) int64 (a copy), lse (N,), the settings, and the
    gradients of the loss ``[(dh (..., D), dweight (V, D))]`` in the compute dtype when the forward computed
    them (``with_grad``), until the first backward takes them (``list.pop``: one taker even across threads);
    empty otherwise."""

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
    grads: list[tuple[np.ndarray, np.ndarray]] = field(default_factory=list)


class _Blocks:
    """The reused (c, V) buffers of one call (and the dweight temporary), so no block allocates fresh memory."""

    def __init__(self, n: int, weight: np.ndarray, dt: np.dtype, c: int, softcap: float | None) -> None:
        V, D = weight.shape
        self.w = weight.astype(dt, copy=False)
        self.z = np.empty((min(c, n), V), dt)
        self.th = np.empty_like(self.z) if softcap is not None else None
        self.tmp = np.empty((min(_ROWS, V), D), dt)
        self.softcap = softcap

    def logits(self, hc: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """hc (c, D) -> (capped logits (c, V), tanh (c, V) or None), views of the buffers."""
        z = np.matmul(hc, self.w.T, out=self.z[:hc.shape[0]])
        if self.th is None or self.softcap is None:
            return z, None
        return soft_cap(z, self.softcap, self.th[:hc.shape[0]])

    def grad(self, g: np.ndarray, th: np.ndarray | None, safe: np.ndarray, coef: np.ndarray, eps: float,
             hc: np.ndarray, dh: np.ndarray, dweight: np.ndarray) -> None:
        """softmax block g (c, V) -> its gradient in place; writes its dh rows (c, D) = g @ w and adds
        g.T @ hc to dweight (V, D) (blocks in token order: a fixed order)."""
        V = g.shape[1]
        g[np.arange(g.shape[0]), safe] -= 1.0 - eps
        if eps > 0.0:
            g -= eps / V
        g *= coef[:, None]
        if th is not None:
            soft_cap_grad(g, th)
        dh[...] = (self.w.T @ g.T).T         # = g @ w; OpenBLAS runs this layout ~3x faster for short blocks
        for v in range(0, V, _ROWS):                                           # dweight += g.T @ hc, by row
            part = self.tmp[:min(_ROWS, V - v)]                                # block
            np.matmul(g[:, v:v + _ROWS].T, hc, out=part)
            dweight[v:v + _ROWS] += part


def check_tied_loss_args(h: Any, weight: Any, targets: Any, *, ignore_index: Any, label_smoothing: Any,
                         reduction: Any, softcap: Any, chunk_size: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray,
                                                                                 dict[str, Any]]:
    """(h, weight, targets int64, the options checked), the one check of the NumPy tied loss's inputs.

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


def tied_cross_entropy_forward(h: Any, weight: Any, targets: Any, *, ignore_index: int = -100,
                               label_smoothing: float = 0.0, reduction: str = "mean", softcap: float | None = None,
                               chunk_size: int | None = None, with_grad: bool = False
                               ) -> tuple[np.ndarray, TiedLossCache]:
    """h (..., D), weight (V, D), targets (...) int -> (loss () or (...) for "none", cache), every input checked
    first (:func:`check_tied_loss_args`: a target outside [0, V) that is not ``ignore_index`` is a TokenIdError,
    never a wrapped-around row).

    ``with_grad``: also compute the gradients now, from the same blocks (ignored for reduction "none").
    """
    h, weight, t, opts = check_tied_loss_args(h, weight, targets, ignore_index=ignore_index,
                                              label_smoothing=label_smoothing, reduction=reduction, softcap=softcap,
                                              chunk_size=chunk_size)
    return _forward(h, weight, t, **opts, with_grad=bool(with_grad))


def _forward(h: np.ndarray, weight: np.ndarray, targets: np.ndarray, *, ignore_index: int, label_smoothing: float,
             reduction: str, softcap: float | None, chunk_size: int | None, with_grad: bool
             ) -> tuple[np.ndarray, TiedLossCache]:
    """:func:`tied_cross_entropy_forward` on checked inputs."""
    V, D = weight.shape
    dt = compute_dtype(h.dtype)
    h2 = kept(h).reshape(-1, D)                                               # (N, D)
    t = np.array(targets, dtype=np.int64).reshape(-1)                         # (N,) a copy
    N = t.shape[0]
    c = default_chunk_size(V) if chunk_size is None else int(chunk_size)
    eps = float(label_smoothing)
    valid = t != ignore_index
    safe = np.where(valid, t, 0)
    lse = np.empty(N, dt)
    per = np.zeros(N, dt)
    grads = with_grad and reduction != "none"
    coef = reduce_weights(valid, reduction, np.asarray(1.0)).astype(dt) if grads else None
    dh = np.empty((N, D), dt) if grads else None
    dweight = np.zeros((V, D), dt) if grads else None
    blocks = _Blocks(N, weight, dt, c, softcap)
    for i in range(0, N, c):
        hc = h2[i:i + c].astype(dt, copy=False)
        z, th = blocks.logits(hc)
        j = i + z.shape[0]
        z_t = z[np.arange(j - i), safe[i:j]]
        z_sum = z.sum(axis=1) if eps > 0.0 else None
        m = z.max(axis=1)
        e = np.exp(np.subtract(z, m[:, None], out=z), out=z)
        s = e.sum(axis=1)
        lse[i:j] = m + np.log(s)
        per[i:j] = smoothed_loss(lse[i:j], z_t, z_sum, eps, V)
        if coef is not None and dh is not None and dweight is not None:
            e /= s[:, None]                                                    # softmax
            blocks.grad(e, th, safe[i:j], coef[i:j], eps, hc, dh[i:j], dweight)
    per = np.where(valid, per, 0.0).astype(dt, copy=False)
    if reduction == "none":
        loss = per.reshape(np.shape(targets))
    elif reduction == "sum":
        loss = np.asarray(per.sum(), dt)
    else:
        loss = np.asarray(per.sum() / max(int(valid.sum()), 1), dt)
    kept_grads = [] if dh is None or dweight is None else [(dh.reshape(h.shape), dweight)]
    cache = TiedLossCache(h2, weight, t, lse, tuple(h.shape), int(ignore_index), eps, reduction, softcap, c,
                          kept_grads)
    return loss, cache


def loss_grad(name: str, dloss: Any, cache: TiedLossCache) -> np.ndarray:
    """The gradient of a tied loss checked (``check_grad``): () or, for reduction "none", the loss's (...);
    an integer one (an exact scale) as float64."""
    g = np.asarray(dloss)
    return check_grad(name, g.astype(np.float64) if g.dtype.kind in "iu" else g,
                      cache.shape[:-1] if cache.reduction == "none" else ())


def tied_cross_entropy_backward(dloss: np.ndarray | float, cache: TiedLossCache) -> tuple[np.ndarray, np.ndarray]:
    """dloss (() or (...) for "none") -> (dh (..., D) in h's dtype, dweight (V, D) in weight's dtype).

    The returned arrays are fresh: the forward's gradients (taken out of the cache, scaled in place) or
    the ones recomputed here; never memory the cache still holds.
    """
    h2, weight, t, c = cache.h, cache.weight, cache.targets, cache.chunk_size
    V, D = weight.shape
    dt = compute_dtype(h2.dtype)
    dloss = loss_grad("dloss", dloss, cache)                                   # checked before taking anything
    scale = dloss.astype(dt, copy=False)
    try:
        dh_kept, dweight_kept = cache.grads.pop()                              # computed by the forward, once
    except IndexError:
        pass                                                                   # none, or handed over: recompute
    else:
        dh_kept *= scale
        dweight_kept *= scale
        return dh_kept.astype(h2.dtype, copy=False), dweight_kept.astype(weight.dtype, copy=False)
    valid = t != cache.ignore_index
    safe = np.where(valid, t, 0)
    coef = reduce_weights(valid, cache.reduction, np.asarray(dloss).reshape(-1)
                          if cache.reduction == "none" else np.asarray(dloss)).astype(dt)   # (N,)
    dh = np.empty((t.shape[0], D), dt)
    dweight = np.zeros((V, D), dt)
    blocks = _Blocks(t.shape[0], weight, dt, c, cache.softcap)
    for i in range(0, t.shape[0], c):
        hc = h2[i:i + c].astype(dt, copy=False)
        z, th = blocks.logits(hc)
        j = i + z.shape[0]
        g = np.exp(np.subtract(z, cache.lse[i:j, None], out=z), out=z)         # softmax, in place
        blocks.grad(g, th, safe[i:j], coef[i:j], cache.label_smoothing, hc, dh[i:j], dweight)
    return dh.reshape(cache.shape).astype(h2.dtype, copy=False), dweight.astype(weight.dtype, copy=False)
