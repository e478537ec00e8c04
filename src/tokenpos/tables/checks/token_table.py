"""The checks of a token table (``TokenEmbedding`` in both backends) written once: its resize, and the (V, D) shape
of a table it wraps.

Shapes: V the current vocab, V' the new one (rounded up to ``pad_to_multiple_of``), D d_model.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tokenpos.tables.checks.validation import check_choice, check_positive_int
from tokenpos.tables.errors import ConfigError


def check_resize(vocab_size: int, new_vocab_size: Any, *, pad_to_multiple_of: Any, init: Any, inits: Sequence[str],
                 allow_shrink: bool, padding_idx: int | None) -> int:
    """V': ``new_vocab_size`` (a positive int) rounded up to ``pad_to_multiple_of`` (None: as it is), with ``init``
    one of ``inits`` (the backend passes ``tables.formulas.init.RESIZE_INITS``: a check imports no formula), no
    shrink unless ``allow_shrink``, and ``padding_idx`` still inside [0, V'). Checked before any row changes.

    Raises:
        ConfigError: a bad size, multiple or init; a shrink without ``allow_shrink=True``; ``padding_idx`` >= V'.
    """
    new_v = check_positive_int("new_vocab_size", new_vocab_size)
    if pad_to_multiple_of is not None:
        m = check_positive_int("pad_to_multiple_of", pad_to_multiple_of)
        new_v = -(-new_v // m) * m
    check_choice("init", init, tuple(inits))
    if new_v < vocab_size and not allow_shrink:
        raise ConfigError(f"resize would shrink vocab_size from {vocab_size} to {new_v}; "
                          f"pass allow_shrink=True to drop rows")
    if padding_idx is not None and padding_idx >= new_v:
        raise ConfigError(f"padding_idx {padding_idx} would fall outside the new vocab [0, {new_v})")
    return new_v


def check_table_shape(shape: tuple[int, ...]) -> None:
    """A table to wrap (``TokenEmbedding.from_pretrained``) is 2-D (V, D).

    Raises:
        ConfigError: any other number of dimensions, quoting the shape.
    """
    if len(shape) != 2:
        raise ConfigError("weights must be a 2-D (vocab_size, d_model) array, got shape "
                          f"{tuple(int(s) for s in shape)}")
