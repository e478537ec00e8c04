"""EngramMemory: the Engram module (arXiv 2601.07372) around a hashed n-gram table: context-aware gate, value
projection and a short depthwise convolution; the reference's ``Engram.forward`` (deepseek-ai/Engram
``engram_demo_v1.py``) given the same weights and hidden states.

Shapes: B batch, L length, G = hc_mult hyper-connection streams, D hidden size, E = (max_ngram_size - 1) *
n_embed_per_ngram.

    e      = HashedNgramEmbedding(ids)                                        (B, L, E)
    gate_g = sigmoid(ssqrt(<RMSNorm(k_g(e)), RMSNorm(h[:, :, g])> / sqrt(D)))  (B, L, G, 1),  ssqrt(x) = sign(x)
                                                                               * sqrt(max(|x|, 1e-6))
    v      = gate * value_proj(e)[:, :, None]                                 (B, L, G, D)
    out    = v + SiLU(causal depthwise conv(RMSNorm_g(v), kernel_size, dilation max_ngram_size))

Submodules are named as the reference's (``short_conv.conv``, ``short_conv.norms``, ``value_proj``, ``key_projs``,
``norm1``, ``norm2``), the table as ``multi_head_embedding.weight`` (the reference's
``multi_head_embedding.embedding.weight``: :meth:`EngramMemory.load_reference_state_dict` renames it).
Batches of whole sequences only: the convolution has no packed or cached (decoding) form here.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from torch import nn

from tokenpos.tables.checks.validation import check_int, check_positive_int
from tokenpos.tables.errors import ConfigError
from tokenpos.torch._checks import check_float_tensor
from tokenpos.torch._module import TokenposModule
from tokenpos.torch.ngram import HashedNgramEmbedding


class ShortConv(nn.Module):
    """RMSNorm per stream, then a causal depthwise Conv1d over the G * D channels and SiLU: (B, L, G, D) ->
    (B, L, G, D)."""

    def __init__(self, hidden_size: int, kernel_size: int, dilation: int, hc_mult: int, norm_eps: float = 1e-5,
                 device: Any = None, dtype: Any = None) -> None:
        super().__init__()
        channels = hidden_size * hc_mult
        self.hc_mult = hc_mult
        self.conv = nn.Conv1d(channels, channels, kernel_size, groups=channels, bias=False,
                              padding=(kernel_size - 1) * dilation, dilation=dilation, device=device, dtype=dtype)
        self.norms = nn.ModuleList([nn.RMSNorm(hidden_size, eps=norm_eps, device=device, dtype=dtype)
                                    for _ in range(hc_mult)])
        self.act_fn = nn.SiLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, G, C = x.shape
        x_norm = torch.cat([self.norms[i](x[:, :, i, :]) for i in range(G)], dim=-1)   # (B, T, G * C)
        y = self.conv(x_norm.transpose(1, 2))[..., :T]                                  # (B, G * C, T): causal
        return self.act_fn(y).transpose(1, 2).view(B, T, G, C).contiguous()


class EngramMemory(TokenposModule):
    """The Engram module of one layer.

    Args:
        hidden_size: D. hc_mult: G, the hyper-connection streams (1 or more; the reference uses 4).
        kernel_size: the short convolution's width (dilation max_ngram_size).
        engram_vocab_size, max_ngram_size, n_embed_per_ngram, n_head_per_ngram, layer_id, layer_ids, pad_id,
            seed, compress: the hashed table's settings (:class:`HashedNgramEmbedding`).
        device, dtype: factory kwargs. init_seed: the initial weights: the table's as the NumPy layer draws them,
            the linear, norm and conv layers' as torch's own do from ``torch.manual_seed(init_seed)`` (torch's
            global generator left as it was); None: torch's generator.

    Shape:
        forward: hidden_states (B, L, G, D), ids (B, L) -> (B, L, G, D).
    """

    def __init__(self, hidden_size: int, *, hc_mult: int = 4, kernel_size: int = 4, engram_vocab_size: Any,
                 max_ngram_size: int, n_embed_per_ngram: int, n_head_per_ngram: int, layer_id: int, layer_ids: Any,
                 pad_id: int, seed: int, compress: Any, device: Any = None, dtype: Any = None,
                 init_seed: int | None = None) -> None:
        super().__init__()
        self.hidden_size = check_positive_int("hidden_size", hidden_size)
        self.hc_mult = check_positive_int("hc_mult", hc_mult)
        kernel_size = check_int("kernel_size", kernel_size, minimum=1)
        self.multi_head_embedding = HashedNgramEmbedding(
            engram_vocab_size=engram_vocab_size, max_ngram_size=max_ngram_size, n_embed_per_ngram=n_embed_per_ngram,
            n_head_per_ngram=n_head_per_ngram, layer_id=layer_id, layer_ids=layer_ids, pad_id=pad_id, seed=seed,
            compress=compress, device=device, dtype=dtype, init_seed=init_seed)
        E, D, G = self.multi_head_embedding.out_dim, self.hidden_size, self.hc_mult
        kw: dict[str, Any] = dict(device=device, dtype=self.multi_head_embedding.weight.dtype)
        with torch.random.fork_rng(devices=[], enabled=init_seed is not None):
            if init_seed is not None:
                torch.manual_seed(init_seed)
            self.short_conv = ShortConv(D, kernel_size, max_ngram_size, G, **kw)
            self.value_proj = nn.Linear(E, D, **kw)
            self.key_projs = nn.ModuleList([nn.Linear(E, D, **kw) for _ in range(G)])
            self.norm1 = nn.ModuleList([nn.RMSNorm(D, **kw) for _ in range(G)])
            self.norm2 = nn.ModuleList([nn.RMSNorm(D, **kw) for _ in range(G)])

    def forward(self, hidden_states: torch.Tensor, ids: Any) -> torch.Tensor:
        """hidden_states (B, L, G, D), ids (B, L) -> (B, L, G, D); bad ids raise TokenIdError naming the value."""
        h = check_float_tensor("hidden_states", hidden_states)
        if h.dim() != 4 or h.shape[2:] != (self.hc_mult, self.hidden_size):
            raise ConfigError(f"hidden_states must be (B, L, {self.hc_mult}, {self.hidden_size}), got "
                              f"{tuple(h.shape)}")
        e = self.multi_head_embedding(ids)                                    # (B, L, E)
        if e.shape[:2] != h.shape[:2]:
            raise ConfigError(f"ids must be (B, L) = {tuple(h.shape[:2])} (hidden_states' first two dims), got "
                              f"{tuple(e.shape[:2])}")
        gates = []
        for g in range(self.hc_mult):
            key = self.norm1[g](self.key_projs[g](e))                          # (B, L, D)
            query = self.norm2[g](h[:, :, g, :])                               # (B, L, D)
            gate = (key * query).sum(dim=-1) / math.sqrt(self.hidden_size)     # (B, L)
            gate = gate.abs().clamp_min(1e-6).sqrt() * gate.sign()
            gates.append(gate.sigmoid().unsqueeze(-1))                         # (B, L, 1)
        value = torch.stack(gates, dim=2) * self.value_proj(e).unsqueeze(2)   # (B, L, G, D)
        return value + self.short_conv(value)

    def load_reference_state_dict(self, state: Mapping[str, Any], strict: bool = True) -> Any:
        """Load the reference ``Engram``'s state_dict: its ``multi_head_embedding.embedding.weight`` is this
        module's ``multi_head_embedding.weight``; its ``multi_head_embedding.offsets`` buffer (this module
        computes the same offsets) is checked, then dropped."""
        state = dict(state)
        offsets = state.pop("multi_head_embedding.offsets", None)
        if offsets is not None and not np.array_equal(np.asarray(offsets.cpu() if hasattr(offsets, "cpu")
                                                                 else offsets),
                                                      self.multi_head_embedding.spec.offsets):
            raise ConfigError("the reference's multi_head_embedding.offsets differ from this module's: the hash "
                              "settings (engram_vocab_size, heads, layer_ids) do not match")
        if "multi_head_embedding.embedding.weight" in state:
            state["multi_head_embedding.weight"] = state.pop("multi_head_embedding.embedding.weight")
        return self.load_state_dict(state, strict=strict)
