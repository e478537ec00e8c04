"""Evaluation at a given length: the NLL of targets that are the same at every length.

Both protocols score the same target tokens at every eval length T = k * L; a longer window only adds
context to the left of the same targets (so R(k) is not confounded by the text getting easier or harder):

- ``nonoverlap``: the eval split is cut into blocks of the longest length; at every length one window
  is right-aligned on each block's end (``data.tail_windows``) and only its **tail**, the last ``L / 2``
  positions, is scored. ``ppl = exp(tail NLL)``. The whole window's NLL by position (in bins) is the
  per-position curve.
- ``sliding``: the ALiBi paper's sliding window (``data.sliding_windows``).

Shapes: W windows, T eval length, V vocab.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

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
    curve: list[float] | None = None      # mean NLL per bin of positions (nonoverlap only)


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


def position_curve(nll: np.ndarray, bin_width: int) -> list[float]:
    """Mean NLL over windows in bins of ``bin_width`` positions: (W, T) -> ceil(T / bin_width) floats."""
    T = nll.shape[1]
    return [float(nll[:, s:s + bin_width].mean()) for s in range(0, T, bin_width)]


def score_length(model: nn.Module, eval_ids: np.ndarray, eval_len: int, total_tokens: int, tail_len: int, *,
                 longest: int, bin_width: int, scheme: nn.Module | None = None,
                 batch_tokens: int = 8192) -> LengthScore:
    """Tail NLL of ``model`` at ``eval_len``: windows right-aligned on blocks of ``longest`` ids over the first
    ``total_tokens`` (``data.tail_windows``), the last ``tail_len`` positions scored (the same targets at every
    length); ``ppl = exp(tail NLL)``; ``curve``: the whole window's NLL in bins of ``bin_width`` positions.

    ``scheme`` (optional) replaces the model's positional scheme for this evaluation only (RoPE with
    inference-time scaling). A model that cannot represent these positions (a learned table shorter
    than ``eval_len``) raises ``PositionError`` inside; that becomes a score with ``NA_NOTE``.
    """
    from tokenpos.analysis.extrapolate.data import tail_windows

    inputs, targets = tail_windows(eval_ids, eval_len, longest, total_tokens)   # (W, T) each
    try:
        with swapped_position(model, scheme):
            nll = window_nll(model, inputs, targets, batch_tokens=batch_tokens)   # (W, T)
    except PositionError:
        return LengthScore(eval_len, None, None, NA_NOTE)
    tail = float(nll[:, -min(tail_len, eval_len):].mean())                  # (W, tail) -> mean
    return LengthScore(eval_len, math.exp(tail), tail, curve=position_curve(nll, bin_width))


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
