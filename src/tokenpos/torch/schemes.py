"""The positional schemes of the torch backend: the string shortcuts and the NoPE object.

Every scheme class has two class attributes (docs/DESIGN.md): ``kind``, its category ("additive" is
added to the embeddings, "rotary" rotates q and k, "bias" is added to attention logits, "none"), and
``name``, its registry string. ``TransformerEmbedding(positional=...)`` takes a torch scheme object
(settings travel with it; the checks and messages are ``tables.checks.embedding``'s, shared with
NumPy) or one of the shortcuts of ``tokenpos.tables.registry``, built with their defaults by
:func:`build_shortcut`. Mirrors ``numpy/schemes.py``.

    TransformerEmbedding(V, D, positional=T5RelativePositionBias(12, num_buckets=64, bidirectional=False))
    TransformerEmbedding(V, D, positional="rope", num_heads=12)            # shortcut, default settings
"""

from __future__ import annotations

from typing import Any

import numpy as np
from torch import nn

from tokenpos.tables.registry import ShortcutContext, build_scheme
from tokenpos.torch._module import TokenposModule


class NoPositionalEncoding(TokenposModule):
    """NoPE: no positional information at all (causal attention alone carries order)."""

    kind = "none"
    name = "none"

    def __init__(self, *, seed: int | None = None, rng: np.random.Generator | None = None, device: Any = None,
                 dtype: Any = None) -> None:
        """``device`` and ``dtype``: the factory keywords every torch layer takes (NoPE holds no tensor)."""
        super().__init__()

    def reset_parameters(self, *, seed: int | None = None, rng: np.random.Generator | None = None) -> None:
        """Nothing to draw."""

    def forward(self, seq_len_or_positions: Any) -> None:
        return None

    def extra_repr(self) -> str:
        return "NoPE"


def build_shortcut(name: str, *, d_model: int, max_seq_len: int, num_heads: int | None,
                   position_padding_idx: int | None, init: str, std: float, rng: np.random.Generator,
                   device: Any = None, dtype: Any = None) -> nn.Module:
    """The scheme a string shortcut of ``tables.checks.embedding.POSITIONAL_SHORTCUTS`` stands for,
    with its defaults (``tables.registry``; arguments already checked, H set for the headed shortcuts).
    """
    context = ShortcutContext(d_model=d_model, max_seq_len=max_seq_len, num_heads=num_heads, init=init, std=std,
                              position_padding_idx=position_padding_idx)
    return build_scheme(name, "torch", context, device=device, dtype=dtype, rng=rng)
