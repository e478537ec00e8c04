"""The positional schemes of the extrapolation study, built as objects (no TransformerEmbedding flags).

``build_positions(name, ...) -> (position, layer_positions)``: the scheme object the input embedding
uses, and per-layer attention schemes for model variants (None: every layer uses ``position``).

- ``sinusoidal``, ``learned``: additive tables (learned: ``max_seq_len = L`` rows, cannot go past L);
- ``rope``: ``RotaryEmbedding(D / H, base)``;
- ``alibi``, ``t5`` (causal buckets, ``max_distance = L``, at most L buckets), ``fire``
  (``init_L = L``), ``kerple``: attention biases;
- ``nope``: no positional information;
- ``irope``: the iRoPE model variant (Llama 4): RoPE in three layers of four, NoPE in every fourth
  (layers 4, 8, ...). The embedding carries no positions. With fewer than 4 layers the last layer
  is NoPE (2 layers: RoPE, NoPE, a 1:1 ratio instead of 3:1; see docs/EXTRAPOLATION.md). Llama 4 also
  makes the RoPE layers chunked-local; we do not (all layers attend globally): this isolates the
  "interleave NoPE layers" part.

Trainable schemes draw their initial values from the generator passed in, after the token table.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

# annotations only: the functions that build models import torch, so listing the schemes (the CLI's parser) needs none
if TYPE_CHECKING:
    from torch import nn

SCHEMES = ("sinusoidal", "learned", "rope", "alibi", "t5", "nope", "fire", "kerple", "irope")
DEFAULT_SCHEMES = ("sinusoidal", "learned", "rope", "alibi", "t5", "nope")
ROTARY_SCHEMES = ("rope", "irope")


def irope_layers(num_layers: int) -> list[bool]:
    """For each layer: True where it uses RoPE, False where NoPE: every 4th layer (1-based), and the
    last layer when there are fewer than 4 (so a 2-layer model is RoPE then NoPE)."""
    if num_layers < 4:
        return [i < num_layers - 1 for i in range(num_layers)]
    return [(i + 1) % 4 != 0 for i in range(num_layers)]


def build_positions(name: str, *, train_len: int, d_model: int, num_heads: int, num_layers: int, base: float,
                    t5_num_buckets: int, rng: np.random.Generator) -> tuple[nn.Module, list[nn.Module] | None]:
    """The scheme object(s) for study scheme ``name`` (see the module docstring)."""
    import tokenpos.torch as tpt
    from tokenpos.torch.fire import FIRE
    from tokenpos.torch.kerple import KERPLE

    L, std = train_len, d_model ** -0.5
    if name == "sinusoidal":
        return tpt.SinusoidalPositionalEncoding(L, d_model, base=base), None
    if name == "learned":
        return tpt.LearnedPositionalEmbedding(L, d_model, std=std, rng=rng), None
    if name == "rope":
        return tpt.RotaryEmbedding(d_model // num_heads, base=base, max_seq_len=L), None
    if name == "alibi":
        return tpt.ALiBi(num_heads), None
    if name == "t5":
        return tpt.T5RelativePositionBias(num_heads, bidirectional=False, num_buckets=min(t5_num_buckets, L),
                                          max_distance=L, std=std, rng=rng), None
    if name == "nope":
        return tpt.NoPositionalEncoding(), None
    if name == "fire":
        return FIRE(num_heads, init_L=float(L), rng=rng), None
    if name == "kerple":
        return KERPLE(num_heads, rng=rng), None
    if name == "irope":
        rope = tpt.RotaryEmbedding(d_model // num_heads, base=base, max_seq_len=L)
        layers: list[nn.Module] = [rope if use else tpt.NoPositionalEncoding() for use in irope_layers(num_layers)]
        return rope, layers
    raise ValueError(f"unknown scheme {name!r}; expected one of {list(SCHEMES)}")


def build_model(name: str, vocab_size: int, *, train_len: int, d_model: int, num_heads: int, num_layers: int,
                base: float = 10000.0, t5_num_buckets: int = 32, seed: int = 0) -> Any:
    """A TinyLM for scheme ``name``: token table first, then the scheme, from ``default_rng(seed)``."""
    from tokenpos.analysis.extrapolate.model import TinyLM
    from tokenpos.torch import TokenEmbedding

    rng = np.random.default_rng(seed)
    token = TokenEmbedding(vocab_size, d_model, scale=True, std=d_model ** -0.5, rng=rng)
    position, layers = build_positions(name, train_len=train_len, d_model=d_model, num_heads=num_heads,
                                       num_layers=num_layers, base=base, t5_num_buckets=t5_num_buckets, rng=rng)
    return TinyLM(vocab_size, position=position, layer_positions=layers, d_model=d_model, num_layers=num_layers,
                  num_heads=num_heads, token=token, seed=seed)
