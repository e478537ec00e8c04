"""The end-to-end case of ``tokenpos bench``: one transformer block, forward + backward.

The block is what the input layers sit in: embedding (token table * sqrt(D) + learned positions,
dropout 0.1), layer norm, the q/k/v projection, RoPE on q and k, causal attention
(``scaled_dot_product_attention``), the output projection, layer norm and a 4x GELU MLP, then a
scalar loss and its backward (no optimiser). Four implementations of the same block, timed
interleaved in model conditions (:func:`.bench_timing.time_interleaved`):

- ``torch eager``: ``nn.Embedding`` + positions + ``F.dropout``, HF-style ``rotate_half`` RoPE;
- ``torch.compile``: ``torch.compile`` of that block;
- ``tokenpos layers, eager``: the same block with ``tokenpos.torch.TransformerEmbedding`` and
  ``tokenpos.torch.RotaryEmbedding`` in place of the embedding and the RoPE;
- ``tokenpos layers, torch.compile``: ``torch.compile`` of the tokenpos block.

Ratios are reference time / row time (> 1: faster than torch eager, or than ``torch.compile``).
Shapes: ids (B, L), x (B, L, D), q / k / v (B, H, L, Dh) with D = H * Dh.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from tokenpos.analysis.bench_timing import (
    COMPILE,
    EAGER,
    NBATCH,
    BenchRow,
    add_impl,
    bench_rows,
    cycle,
    model_op,
    note_rows,
    public,
    time_interleaved,
)

TOKENPOS = "tokenpos layers, eager"
TOKENPOS_COMPILE = "tokenpos layers, torch.compile"


def _block(V: int, D: int, H: int, L: int, tokenpos: bool) -> Any:
    """The block as an ``nn.Module``: ids (B, L) -> scalar loss (the same seed: the same weights)."""
    import torch
    import torch.nn.functional as F

    torch.manual_seed(0)
    Dh = D // H

    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            if tokenpos:
                self.emb = public("torch", "transformer", "TransformerEmbedding")(
                    V, D, L, positional="learned", scale=True, dropout=0.1, seed=0)
                self.rope = public("torch", "rotary", "RotaryEmbedding")(Dh, max_seq_len=L)
            else:
                self.tok, self.pos = torch.nn.Embedding(V, D), torch.nn.Embedding(L, D)
                inv = 10000.0 ** (-torch.arange(0, Dh, 2, dtype=torch.float64) / Dh)
                ang = torch.arange(L, dtype=torch.float64)[:, None] * inv                  # (L, Dh/2)
                self.register_buffer("cos", torch.cat([ang.cos(), ang.cos()], -1).float())  # (L, Dh)
                self.register_buffer("sin", torch.cat([ang.sin(), ang.sin()], -1).float())
            self.ln1, self.ln2 = torch.nn.LayerNorm(D), torch.nn.LayerNorm(D)
            self.qkv, self.proj = torch.nn.Linear(D, 3 * D, bias=False), torch.nn.Linear(D, D, bias=False)
            self.up, self.down = torch.nn.Linear(D, 4 * D), torch.nn.Linear(4 * D, D)

        def embed(self, ids: torch.Tensor) -> torch.Tensor:
            if tokenpos:
                return self.emb(ids)
            x = self.tok(ids) * math.sqrt(D) + self.pos.weight[: ids.shape[1]]
            return F.dropout(x, 0.1, training=self.training)

        def rotate(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            if tokenpos:
                return self.rope.apply(q, k)
            cos, sin = self.get_buffer("cos")[: q.shape[2]], self.get_buffer("sin")[: q.shape[2]]

            def half(x: torch.Tensor) -> torch.Tensor:
                return torch.cat((-x[..., Dh // 2:], x[..., : Dh // 2]), dim=-1)
            return q * cos + half(q) * sin, k * cos + half(k) * sin

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            B, Lx = ids.shape
            x = self.embed(ids)
            q, k, v = self.qkv(self.ln1(x)).view(B, Lx, 3, H, Dh).permute(2, 0, 3, 1, 4)
            q, k = self.rotate(q, k)
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(a.transpose(1, 2).reshape(B, Lx, D))
            x = x + self.down(F.gelu(self.up(self.ln2(x))))
            return x.square().mean()

    return Block().train()


def block_case(cfg: dict, reps: int, compile_: bool) -> list[BenchRow]:
    """The block's forward + backward (``cfg``: V, D, bB, bL, bH) in the four implementations."""
    V, D, B, L, H = cfg["V"], cfg["D"], cfg["bB"], cfg["bL"], cfg["bH"]
    import torch

    rng = np.random.default_rng(0)
    batches = cycle([torch.from_numpy(rng.integers(0, V, (B, L))) for _ in range(NBATCH)])

    def step(fn: Callable[[torch.Tensor], torch.Tensor], model: torch.nn.Module) -> Callable[[], Any]:
        def run() -> None:
            fn(next(batches)).backward()
            model.zero_grad(set_to_none=True)
        return run

    impls: dict[str, Callable[[], Any]] = {}
    notes: dict[str, str] = {}
    for name, tp, comp in ((EAGER, False, False), (COMPILE, False, True), (TOKENPOS, True, False),
                           (TOKENPOS_COMPILE, True, True)):
        if comp and not compile_:
            continue

        def make(tp: bool = tp, comp: bool = comp) -> Callable[[], Any]:
            model = _block(V, D, H, L, tp)
            return step(torch.compile(model) if comp else model, model)
        add_impl(impls, notes, name, make)
    times = time_interleaved(impls, reps, model_op(D))
    return bench_rows("block", times, 0, bandwidth=False, notes=notes) + note_rows("block", notes)
