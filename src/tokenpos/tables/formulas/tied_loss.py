"""The tied cross-entropy's formulas: soft-capping, label smoothing, the chunk size (float64-safe NumPy).

Shapes: N tokens, V vocab, c tokens in a chunk. Per token n with logits z (V,) (soft-capped first when
``softcap`` is given, Gemma 2: ``z = softcap * tanh(z / softcap)``), target t, eps = label_smoothing:

    lse_n  = log sum_v exp(z_v)
    loss_n = (1 - eps) * (lse_n - z_t) + eps * (lse_n - sum_v z_v / V)       (0 for an ignored target)
    d loss_n / d z_v = softmax(z)_v - (1 - eps) * [v == t] - eps / V            (0 for an ignored target)

which is ``F.cross_entropy(z, t, label_smoothing=eps)``. Both backends compute exactly these steps
(the torch backend in torch ops, checked against these functions by the parity tests).
"""

from __future__ import annotations

import numpy as np

from tokenpos.tables.checks.tied_loss import REDUCTIONS as REDUCTIONS  # re-exported: defined with its check

#: The logits a chunk may hold (bytes of one (c, V) float32 block): the default chunk size. 64 MiB (333 tokens
#: of GPT-2's vocabulary): each block's matmuls read the whole table, so fewer, larger blocks pay; at 32 MiB
#: the torch CPU loss was level with the materialised eager one, at 64 MiB 1.10x faster, still under 1/10 of its
#: memory (benchmarks/HISTORY.md, 2026-11-27).
DEFAULT_CHUNK_BYTES = 64 << 20


def default_chunk_size(vocab_size: int) -> int:
    """Tokens per chunk so one (c, V) float32 logits block stays within ``DEFAULT_CHUNK_BYTES``."""
    return max(1, DEFAULT_CHUNK_BYTES // (4 * max(1, int(vocab_size))))


def soft_cap(z: np.ndarray, softcap: float, tanh_out: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """z (...) -> (z overwritten with softcap * tanh(z / softcap), tanh(z / softcap) written into ``tanh_out``)."""
    th = np.tanh(np.divide(z, softcap, out=tanh_out), out=tanh_out)
    return np.multiply(th, softcap, out=z), th


def soft_cap_grad(g: np.ndarray, th: np.ndarray) -> np.ndarray:
    """The gradient through the cap, in place: g * (1 - tanh^2) (``th`` is overwritten with 1 - tanh^2)."""
    np.multiply(th, th, out=th)
    g *= np.subtract(1.0, th, out=th)
    return g


def smoothed_loss(lse: np.ndarray, z_target: np.ndarray, z_sum: np.ndarray | None, eps: float,
                  vocab_size: int) -> np.ndarray:
    """Per-token loss (N,) from lse (N,), the target's logit (N,) and the sum of the logits (N,) (eps > 0)."""
    loss = lse - z_target
    if eps > 0.0 and z_sum is not None:
        loss = (1.0 - eps) * loss + eps * (lse - z_sum / vocab_size)
    return loss


def reduce_weights(valid: np.ndarray, reduction: str, dloss: np.ndarray) -> np.ndarray:
    """Each token's gradient weight (N,): dloss (() or (N,)) times 1/count for "mean", 0 where ignored.

    ``count`` is the number of non-ignored tokens, at least 1: an all-ignored batch has loss 0 and gradient 0.
    """
    count = max(int(valid.sum()), 1)
    scale = np.broadcast_to(np.asarray(dloss, dtype=np.float64), valid.shape)
    if reduction == "mean":
        scale = scale / count
    return np.where(valid, scale, 0.0)
