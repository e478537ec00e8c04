"""Character-level corpus for the length-extrapolation experiment.

The default corpus exists offline on any machine with Python: the text of ``pydoc_data.topics``
(the help topics of the standard library, about 465k characters). The first 90% of the characters
train, the last 10% evaluate. The vocabulary is the sorted set of characters of the whole text.

Shapes: N number of characters; B batch, L window length.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tokenpos.tables.errors import ConfigError

DEFAULT_CORPUS_NAME = "pydoc_data.topics"


def default_corpus_text() -> str:
    """The standard library's pydoc topics, joined in sorted key order (deterministic)."""
    from pydoc_data import topics

    return "\n\n".join(topics.topics[key] for key in sorted(topics.topics))


@dataclass(frozen=True)
class CharCorpus:
    """A text split into train / eval id arrays over a character vocabulary.

    Attributes:
        name: where the text came from (a path or ``pydoc_data.topics``).
        chars: the vocabulary, ``chars[i]`` is the character of id i; V = len(chars).
        train: (N_train,) int64 ids, the first ``train_fraction`` of the text.
        eval: (N_eval,) int64 ids, the rest.
    """

    name: str
    chars: str
    train: np.ndarray
    eval: np.ndarray

    @property
    def vocab_size(self) -> int:
        return len(self.chars)


def load_corpus(path: str | Path | None = None, *, train_fraction: float = 0.9) -> CharCorpus:
    """Read ``path`` (UTF-8) or the default corpus and split it at ``train_fraction``.

    Raises:
        ConfigError: a bad fraction or a text too short to split.
        OSError: the file cannot be read.
    """
    if not 0.0 < train_fraction < 1.0:
        raise ConfigError(f"train_fraction must be in (0, 1), got {train_fraction!r}")
    if path is None:
        text, name = default_corpus_text(), DEFAULT_CORPUS_NAME
    else:
        text, name = Path(path).read_text(encoding="utf-8"), str(path)
    if len(text) < 20:
        raise ConfigError(f"corpus {name} has {len(text)} characters; expected at least 20")
    chars = "".join(sorted(set(text)))
    lookup = {c: i for i, c in enumerate(chars)}
    ids = np.fromiter((lookup[c] for c in text), dtype=np.int64, count=len(text))   # (N,)
    cut = int(len(ids) * train_fraction)
    return CharCorpus(name=name, chars=chars, train=ids[:cut], eval=ids[cut:])


def eval_token_count(num_eval_ids: int, longest_window: int, cap: int | None = None) -> int:
    """Tokens evaluated at every length: the largest multiple of ``longest_window`` that fits.

    Every window length used is a divisor of ``longest_window``, so every length sees exactly the same
    predicted tokens. ``cap`` bounds the count (time is then bounded and equal across lengths); it is
    raised to one longest window if smaller.

    Raises:
        ConfigError: the eval split is shorter than one longest window.
    """
    usable = num_eval_ids - 1
    if cap is not None:
        usable = min(usable, max(int(cap), longest_window))
    total = (usable // longest_window) * longest_window
    if total <= 0:
        raise ConfigError(f"the eval split has {num_eval_ids} characters; a window of {longest_window} needs "
                          f"at least {longest_window + 1}")
    return total


def aligned_windows(ids: np.ndarray, window: int, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Windows of ``window`` ids ending at each of ``ends`` (exclusive): inputs ``ids[e - window : e]``,
    targets shifted by one (the last target of a window is ``ids[e]``).

    Returns:
        inputs, targets: (len(ends), window) int64 each.
    """
    offsets = ends[:, None] - window + np.arange(window)[None, :]          # (W, window)
    return ids[offsets], ids[offsets + 1]


def tail_windows(ids: np.ndarray, window: int, longest: int, total: int) -> tuple[np.ndarray, np.ndarray]:
    """The non-overlapping protocol, scoring the same targets at every length: one window per block of
    ``longest`` ids, right-aligned on the block's end, so the window of every length ends at the same
    place and its last positions (the tail) predict the same targets; a longer window only adds context
    to their left. At ``window == longest`` these are the plain non-overlapping windows. ``total`` must
    be a multiple of ``longest``, ``window <= longest`` and ``len(ids) >= total + 1``.

    Returns:
        inputs, targets: (total // longest, window) int64 each.
    """
    if window > longest or total % longest or len(ids) < total + 1:
        raise ConfigError(f"cannot cut {total} tokens into blocks of {longest} for windows of {window} from "
                          f"{len(ids)} ids")
    ends = longest * (1 + np.arange(total // longest))                     # (W,)
    return aligned_windows(ids, window, ends)


def sliding_windows(ids: np.ndarray, window: int, stride: int, total: int, start: int) -> tuple[np.ndarray, np.ndarray]:
    """Sliding windows (the ALiBi paper's second protocol): each window scores only its last ``stride`` tokens.

    Window m ends at ``e = start + m * stride`` (exclusive): inputs ``ids[e - window : e]``, targets
    shifted by one. The scored targets ``ids[start - stride + 1 : start - stride + 1 + total]`` are the
    same for every window length; each has at least ``window - stride`` tokens of context.
    ``start >= window`` and ``len(ids) >= start + total - stride + 1`` are required, and ``total`` must
    be a multiple of ``stride``.

    Returns:
        inputs, targets: (total // stride, window) int64 each.
    """
    if stride < 1 or total % stride or start < window or len(ids) < start - stride + total + 1:
        raise ConfigError(f"cannot score {total} tokens with windows of {window}, stride {stride}, from position "
                          f"{start} of {len(ids)} ids")
    return aligned_windows(ids, window, start + stride * np.arange(total // stride))


def sliding_targets(stride: int, total: int, start: int) -> np.ndarray:
    """Indices into the ids of the targets ``sliding_windows`` scores (the same at every length): (total,)."""
    return np.arange(start - stride + 1, start - stride + 1 + total)


def tail_targets(longest: int, total: int, tail: int) -> np.ndarray:
    """Indices into the ids of the targets ``tail_windows`` scores in its last ``tail`` positions: (W * tail,)."""
    ends = longest * (1 + np.arange(total // longest))                     # (W,)
    return (ends[:, None] - tail + 1 + np.arange(tail)[None, :]).reshape(-1)
