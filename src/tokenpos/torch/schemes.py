"""The positional schemes of the torch backend: the string shortcuts and the NoPE object.

Every scheme class has two class attributes (docs/DESIGN.md): ``kind``, its category ("additive" is
added to the embeddings, "rotary" rotates q and k, "bias" is added to attention logits, "none"), and
``name``, its registry string. ``TransformerEmbedding(positional=...)`` takes a torch scheme object
(settings travel with it; the checks and messages are ``tables.embedding_args``'s, shared with
NumPy) or one of the shortcuts below, built here with their defaults. Mirrors ``numpy/schemes.py``.

    TransformerEmbedding(V, D, positional=T5RelativePositionBias(12, num_buckets=64, bidirectional=False))
    TransformerEmbedding(V, D, positional="rope", num_heads=12)            # shortcut, default settings
"""

from __future__ import annotations

from typing import Any

import numpy as np
from torch import nn

from tokenpos.tables.embedding_args import positional_choice_message
from tokenpos.tables.errors import ConfigError
from tokenpos.torch._module import TokenposModule
from tokenpos.torch.alibi import ALiBi
from tokenpos.torch.fire import FIRE
from tokenpos.torch.kerple import KERPLE
from tokenpos.torch.learned import LearnedPositionalEmbedding
from tokenpos.torch.rotary import RotaryEmbedding
from tokenpos.torch.sinusoidal import SinusoidalPositionalEncoding
from tokenpos.torch.t5_bias import T5RelativePositionBias


class NoPositionalEncoding(TokenposModule):
    """NoPE: no positional information at all (causal attention alone carries order)."""

    kind = "none"
    name = "none"

    def __init__(self, *, seed: int | None = None, rng: np.random.Generator | None = None) -> None:
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
    """The scheme a string shortcut of ``tables.embedding_args.POSITIONAL_SHORTCUTS`` stands for,
    with its defaults (arguments already checked; H is set for the headed shortcuts).
    """
    if name == "learned":          # position_padding_idx: RoBERTa's padding position, or None
        return LearnedPositionalEmbedding(max_seq_len, d_model, init=init, std=std, padding_idx=position_padding_idx,
                                          device=device, dtype=dtype, rng=rng)
    if name == "sinusoidal":
        return SinusoidalPositionalEncoding(max_seq_len, d_model, device=device, dtype=dtype)
    if name == "rope":
        return RotaryEmbedding(d_model // int(num_heads), max_seq_len=max_seq_len,   # type: ignore[arg-type]
                               device=device)
    if name == "alibi":
        return ALiBi(int(num_heads), device=device, dtype=dtype)                   # type: ignore[arg-type]
    if name == "t5":
        return T5RelativePositionBias(int(num_heads), init=init, std=std, device=device,  # type: ignore[arg-type]
                                      dtype=dtype, rng=rng)
    if name == "fire":
        return FIRE(int(num_heads), init_L=float(max_seq_len), device=device, dtype=dtype,  # type: ignore[arg-type]
                    rng=rng)
    if name == "kerple":
        return KERPLE(int(num_heads), device=device, dtype=dtype, rng=rng)           # type: ignore[arg-type]
    if name == "none":
        return NoPositionalEncoding()
    raise ConfigError(positional_choice_message(name, "torch"))
