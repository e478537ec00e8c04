"""The positional schemes of the NumPy backend: the string shortcuts and the NoPE object.

Every scheme class has two class attributes (docs/DESIGN.md): ``kind``, its category ("additive"
is added to the embeddings, "rotary" rotates q and k, "bias" is added to attention logits, "none"),
and ``name``, its registry string. ``TransformerEmbedding(positional=...)`` takes a scheme object
(settings travel with it) or one of the shortcuts of ``tokenpos.tables.registry``, built with their
defaults by :func:`build_shortcut`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tokenpos.numpy.module import Module
from tokenpos.tables.registry import ShortcutContext, build_scheme


class NoPositionalEncoding(Module):
    """NoPE: no positional information at all (causal attention alone carries order)."""

    kind = "none"
    name = "none"

    def __init__(self, *, seed: int | None = None, rng: np.random.Generator | None = None,
                 dtype: Any = np.float32) -> None:
        """``dtype``: the keyword every NumPy layer takes (NoPE holds no array)."""
        super().__init__()

    def reset_parameters(self, *, seed: int | None = None, rng: np.random.Generator | None = None) -> None:
        """Nothing to draw."""

    def forward(self, seq_len_or_positions: Any) -> None:  # pragma: no cover - never added
        return None

    def extra_repr(self) -> str:
        return "NoPE"


def build_shortcut(name: str, *, d_model: int, max_seq_len: int, num_heads: int | None,
                   position_padding_idx: int | None, init: str, std: float, dtype: Any,
                   rng: np.random.Generator) -> Module:
    """The scheme a string shortcut of ``tables.checks.embedding.POSITIONAL_SHORTCUTS`` stands for,
    with its defaults (``tables.registry``; arguments already checked, H set for the headed shortcuts).

    Pass a scheme object to TransformerEmbedding for any other setting (rope scaling, layouts,
    T5 buckets, ...).
    """
    context = ShortcutContext(d_model=d_model, max_seq_len=max_seq_len, num_heads=num_heads, init=init, std=std,
                              position_padding_idx=position_padding_idx)
    return build_scheme(name, "numpy", context, dtype=dtype, rng=rng)
