"""A tiny causal transformer language model built only from tokenpos pieces.

    x = TokenEmbedding(ids) (+ P)                      token (* sqrt(D)) + additive positions, if any
    x = x + Attn(LN(x));  x = x + MLP(LN(x))          pre-LN blocks, ``num_layers`` times
    logits = TokenEmbedding.attend(LN(x))             tied output projection

Attention calls ``tokenpos.torch.scaled_dot_product_attention(..., positional=<the layer's scheme>)``:
rotary schemes rotate q and k there, bias schemes add their bias, additive and "none" schemes are
ignored. Nothing in this file looks at which scheme it runs; evaluating RoPE with inference-time
scaling swaps ``embed.position`` for another rotary object (see :func:`swapped_position`).

Shapes: B batch, L length, D d_model, H heads, Dh = D / H head dim, V vocab.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention whose positional behaviour comes from a scheme object.

    Shape:
        forward(x (B, L, D), positional) -> (B, L, D)
    """

    def __init__(self, d_model: int, num_heads: int) -> None:
        super().__init__()
        self.num_heads, self.head_dim = num_heads, d_model // num_heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out = nn.Linear(d_model, d_model)

    def forward(self, x: torch.Tensor, positional: Any) -> torch.Tensor:
        from tokenpos.torch import scaled_dot_product_attention

        B, L, D = x.shape
        qkv = self.qkv(x).view(B, L, 3, self.num_heads, self.head_dim)   # (B, L, 3, H, Dh)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)                   # 3 x (B, H, L, Dh)
        y = scaled_dot_product_attention(q, k, v, positional=positional, causal=True)  # (B, H, L, Dh)
        return self.out(y.transpose(1, 2).reshape(B, L, D))              # (B, L, D)


class Block(nn.Module):
    """Pre-LN transformer block. Shape: forward(x (B, L, D), positional) -> (B, L, D)."""

    def __init__(self, d_model: int, num_heads: int, mlp_ratio: int = 4) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.attn = CausalSelfAttention(d_model, num_heads)
        self.fc = nn.Linear(d_model, mlp_ratio * d_model)
        self.proj = nn.Linear(mlp_ratio * d_model, d_model)

    def forward(self, x: torch.Tensor, positional: Any) -> torch.Tensor:
        x = x + self.attn(self.ln1(x), positional)                      # (B, L, D)
        return x + self.proj(F.gelu(self.fc(self.ln2(x))))               # (B, L, D)


class InputEmbedding(nn.Module):
    """Token table (``TokenEmbedding``, scaled by sqrt(D)) plus the positional scheme's vectors when
    the scheme is additive. ``position`` is the scheme object every layer uses unless the model
    gives a layer its own (iRoPE). Shape: forward(ids (B, L)) -> (B, L, D)."""

    token: Any       # a token table with forward(ids) and attend(h) (tokenpos.torch.TokenEmbedding)
    position: Any    # a tokenpos.torch positional scheme

    def __init__(self, token: nn.Module, position: nn.Module) -> None:
        super().__init__()
        self.token, self.position = token, position

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.token(ids)                                              # (B, L, D), scaled
        if getattr(self.position, "kind", None) == "additive":
            x = x + self.position(ids.shape[-1])                         # (L, D) broadcast
        return x


class TinyLM(nn.Module):
    """Causal LM: token table + scheme object in, pre-LN blocks, tied output.

    Args:
        vocab_size: V.
        position: the positional scheme object (any ``kind``); built by the caller, so this file
            never looks at which scheme it runs.
        layer_positions: optional, one scheme object per layer for attention (None: ``position``
            everywhere). iRoPE passes RoPE for three layers in four and NoPE for the fourth.
        d_model, num_layers, num_heads: D, number of blocks, H.
        token: the token table (default: ``TokenEmbedding`` drawn from ``default_rng(seed)``).
        seed: initialises the linear layers (and the default token table) from explicit generators.

    The token table uses fairseq's convention (Press et al.'s code base): init N(0, D**-0.5) and a
    sqrt(D) scale, so token vectors start with unit RMS, comparable to a sinusoidal row
    (``schemes.build_model`` draws it first, then the scheme, from one generator).

    Shape:
        forward(ids (B, L)) -> logits (B, L, V)
    """

    def __init__(self, vocab_size: int, *, position: nn.Module, d_model: int = 128, num_layers: int = 2,
                 num_heads: int = 4, layer_positions: list[nn.Module] | None = None,
                 token: nn.Module | None = None, seed: int = 0) -> None:
        import numpy as np

        from tokenpos.torch import TokenEmbedding

        super().__init__()
        if token is None:
            token = TokenEmbedding(vocab_size, d_model, scale=True, std=d_model ** -0.5,
                                   rng=np.random.default_rng(seed))
        self.embed = InputEmbedding(token, position)
        if layer_positions is not None and len(layer_positions) != num_layers:
            raise ValueError(f"layer_positions needs {num_layers} schemes, got {len(layer_positions)}")
        self.layer_positions = nn.ModuleList(layer_positions) if layer_positions is not None else None
        self.blocks = nn.ModuleList(Block(d_model, num_heads) for _ in range(num_layers))
        self.norm = nn.LayerNorm(d_model)
        self._init_linears(seed, num_layers)

    def _init_linears(self, seed: int, num_layers: int) -> None:
        """GPT-2 init from a seeded generator: N(0, 0.02), residual projections / sqrt(2 * layers)."""
        gen = torch.Generator().manual_seed(int(seed) + 1)
        for name, module in self.blocks.named_modules():
            if isinstance(module, nn.Linear):
                std = 0.02 / math.sqrt(2 * num_layers) if name.endswith(("out", "proj")) else 0.02
                with torch.no_grad():
                    module.weight.copy_(torch.randn(module.weight.shape, generator=gen) * std)
                    module.bias.zero_()

    def attention_schemes(self) -> list[Any]:
        """The scheme object each layer's attention uses."""
        if self.layer_positions is None:
            return [self.embed.position] * len(self.blocks)
        return list(self.layer_positions)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)                                              # (B, L, D)
        for block, scheme in zip(self.blocks, self.attention_schemes(), strict=True):
            x = block(x, scheme)                                         # (B, L, D)
        return self.embed.token.attend(self.norm(x))                     # (B, L, V)


@contextmanager
def swapped_position(model: Any, scheme: nn.Module | None) -> Iterator[Any]:
    """Temporarily replace ``model.embed.position`` (a TinyLM) by ``scheme`` (None: leave it), and every
    per-layer scheme of the same kind (iRoPE's RoPE layers). Restored on exit."""
    if scheme is None:
        yield model
        return
    original = model.embed.position
    layers = model.layer_positions
    saved = list(layers) if layers is not None else None
    model.embed.position = scheme
    if layers is not None:          # iRoPE: swap the layers that use the same kind (RoPE), keep NoPE
        for i, s in enumerate(saved or []):
            if getattr(s, "kind", None) == getattr(original, "kind", None):
                layers[i] = scheme
    try:
        yield model
    finally:
        model.embed.position = original
        if layers is not None and saved is not None:
            for i, s in enumerate(saved):
                layers[i] = s
