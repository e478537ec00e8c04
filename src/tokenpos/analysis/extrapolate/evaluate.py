"""Evaluation at a given length: per-window perplexity and the tail NLL.

For eval length T = k * L the eval split is cut into non-overlapping windows of T tokens (the same
predicted tokens at every k, see ``data.eval_token_count``). Each window starts from an empty
context, so its early tokens are hard for every scheme; the **tail NLL** averages only the last
``L / 2`` positions of each window, where the model has at least T - L/2 tokens of context.

Shapes: W windows, T eval length, V vocab.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from tokenpos.analysis.extrapolate.data import eval_windows
from tokenpos.analysis.extrapolate.model import swapped_position
from tokenpos.tables.errors import PositionError

NA_NOTE = "n/a (cannot represent positions >= L)"


@dataclass(frozen=True)
class LengthScore:
    """One scheme at one eval length. ``ppl``/``tail_nll`` are None when the model cannot run there."""

    eval_len: int
    ppl: float | None
    tail_nll: float | None
    note: str | None = None


def window_nll(model: nn.Module, inputs: np.ndarray, targets: np.ndarray, *,
               batch_tokens: int = 8192) -> np.ndarray:
    """Next-token NLL (nats) at every position of every window.

    Args:
        model: ids (B, T) -> logits (B, T, V).
        inputs, targets: (W, T) int64.
        batch_tokens: windows are run ``max(1, batch_tokens // T)`` at a time.

    Returns:
        (W, T) float64.
    """
    W, T = inputs.shape
    per_batch = max(1, batch_tokens // T)
    out = np.empty((W, T), dtype=np.float64)
    model.eval()
    with torch.inference_mode():
        for s in range(0, W, per_batch):
            x = torch.from_numpy(inputs[s:s + per_batch])                    # (b, T)
            y = torch.from_numpy(targets[s:s + per_batch])                   # (b, T)
            logits = model(x).float()                                        # (b, T, V)
            nll = F.cross_entropy(logits.transpose(1, 2), y, reduction="none")   # (b, T)
            out[s:s + per_batch] = nll.double().numpy()
    return out


def score_length(model: nn.Module, eval_ids: np.ndarray, eval_len: int, total_tokens: int, tail_len: int, *,
                 scheme: nn.Module | None = None, batch_tokens: int = 8192) -> LengthScore:
    """Perplexity and tail NLL of ``model`` on windows of ``eval_len`` over the first ``total_tokens``.

    ``scheme`` (optional) replaces the model's positional scheme for this evaluation only (RoPE with
    inference-time scaling). A model that cannot represent these positions (a learned table shorter
    than ``eval_len``) raises ``PositionError`` inside; that becomes a score with ``NA_NOTE``.
    """
    inputs, targets = eval_windows(eval_ids, eval_len, total_tokens)        # (W, T) each
    try:
        with swapped_position(model, scheme):
            nll = window_nll(model, inputs, targets, batch_tokens=batch_tokens)   # (W, T)
    except PositionError:
        return LengthScore(eval_len, None, None, NA_NOTE)
    tail = nll[:, -min(tail_len, eval_len):]                                 # (W, tail)
    return LengthScore(eval_len, math.exp(float(nll.mean())), float(tail.mean()))


def score_sliding(model: nn.Module, eval_ids: np.ndarray, eval_len: int, stride: int, total_tokens: int, *,
                  start: int, scheme: nn.Module | None = None, batch_tokens: int = 8192) -> LengthScore:
    """The sliding-window protocol: windows of ``eval_len`` moved by ``stride``, each scoring its last
    ``stride`` tokens (``data.sliding_windows``); ``total_tokens`` scored tokens, the same at every length.

    ``ppl`` = exp(mean NLL of the scored tokens); ``tail_nll`` = that mean NLL (every scored token
    already has at least ``eval_len - stride`` tokens of context, so all of them are "tail").
    """
    from tokenpos.analysis.extrapolate.data import sliding_windows

    inputs, targets = sliding_windows(eval_ids, eval_len, stride, total_tokens, start)   # (W, T) each
    try:
        with swapped_position(model, scheme):
            nll = window_nll(model, inputs, targets, batch_tokens=batch_tokens)[:, -stride:]   # (W, S)
    except PositionError:
        return LengthScore(eval_len, None, None, NA_NOTE)
    mean = float(nll.mean())
    return LengthScore(eval_len, math.exp(mean), mean)
