"""The positional schemes of the NumPy backend: the string shortcuts and the NoPE object.

Every scheme class has two class attributes (docs/DESIGN.md): ``kind``, its category ("additive"
is added to the embeddings, "rotary" rotates q and k, "bias" is added to attention logits, "none"),
and ``name``, its registry string. ``TransformerEmbedding(positional=...)`` takes a scheme object
(settings travel with it) or one of the shortcuts below, built here with their defaults.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tokenpos.numpy.alibi import ALiBi
from tokenpos.numpy.fire import FIRE
from tokenpos.numpy.kerple import KERPLE
from tokenpos.numpy.learned import LearnedPositionalEmbedding
from tokenpos.numpy.module import Module
from tokenpos.numpy.rotary import RotaryEmbedding
from tokenpos.numpy.sinusoidal import SinusoidalPositionalEncoding
from tokenpos.numpy.t5_bias import T5RelativePositionBias
from tokenpos.tables.embedding_args import positional_choice_message
from tokenpos.tables.errors import ConfigError


class NoPositionalEncoding(Module):
    """NoPE: no positional information at all (causal attention alone carries order)."""

    kind = "none"
    name = "none"

    def __init__(self, *, seed: int | None = None, rng: np.random.Generator | None = None) -> None:
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
    """The scheme a string shortcut of ``tables.embedding_args.POSITIONAL_SHORTCUTS`` stands for,
    with its defaults (arguments already checked; H is set for the headed shortcuts).

    Pass a scheme object to TransformerEmbedding for any other setting (rope scaling, layouts,
    T5 buckets, ...).
    """
    if name == "learned":          # position_padding_idx: RoBERTa's padding position, or None
        return LearnedPositionalEmbedding(max_seq_len, d_model, init=init, std=std, padding_idx=position_padding_idx,
                                          dtype=dtype, rng=rng)
    if name == "sinusoidal":
        return SinusoidalPositionalEncoding(max_seq_len, d_model, dtype=dtype)
    if name == "rope":
        return RotaryEmbedding(d_model // int(num_heads), max_seq_len=max_seq_len)   # type: ignore[arg-type]
    if name == "alibi":
        return ALiBi(int(num_heads), dtype=dtype)                                  # type: ignore[arg-type]
    if name == "t5":
        return T5RelativePositionBias(int(num_heads), init=init, std=std, dtype=dtype, rng=rng)  # type: ignore[arg-type]
    if name == "fire":
        return FIRE(int(num_heads), init_L=float(max_seq_len), dtype=dtype, rng=rng)     # type: ignore[arg-type]
    if name == "kerple":
        return KERPLE(int(num_heads), dtype=dtype, rng=rng)                          # type: ignore[arg-type]
    if name == "none":
        return NoPositionalEncoding()
    raise ConfigError(positional_choice_message(name))
