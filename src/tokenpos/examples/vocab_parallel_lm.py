"""Train a tiny causal LM whose tied token table is split over ranks, and prove it matches one process.

    torchrun --nproc-per-node 2 -m tokenpos.examples.vocab_parallel_lm --steps 30 --check

Every rank runs the same script (SPMD) on the same batches. The token table is a
``VocabParallelEmbedding`` (each rank holds V / W rows, tied to the output layer through ``attend``)
and the loss is ``vocab_parallel_cross_entropy``: the (B, L, V) logits are never gathered. The rest of
the model (RoPE attention blocks, RMSNorm) is replicated: it sees the same inputs and the same
all-reduced gradients on every rank, so it stays identical without any further communication.

With ``--check`` every rank also trains the one-process twin (``TokenEmbedding`` + ``F.cross_entropy``,
same seed, same batches) and the script exits with status 1 unless the losses agree at every step.
gloo on CPU (the default), NCCL with ``--device cuda``. Without torchrun it runs as a world of one.

Shapes: B batch, L length, D d_model, H heads, Dh head dim, V vocab, Vl = padded V / W.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from tokenpos.torch import RMSNorm, RotaryEmbedding, TokenEmbedding, scaled_dot_product_attention
from tokenpos.torch.distributed import VocabParallelEmbedding, vocab_parallel_cross_entropy

LOSS_RTOL = 1e-4      # parallel vs one-process loss per step: float32 sums in another order, amplified by training


class Block(nn.Module):
    """Pre-norm block with RoPE attention: x (B, L, D) -> (B, L, D)."""

    def __init__(self, d_model: int, num_heads: int, gen: torch.Generator) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.rope = RotaryEmbedding(d_model // num_heads, max_seq_len=256)
        self.norm1, self.norm2 = RMSNorm(d_model), RMSNorm(d_model)
        self.qkv, self.out = nn.Linear(d_model, 3 * d_model), nn.Linear(d_model, d_model)
        self.fc, self.proj = nn.Linear(d_model, 4 * d_model), nn.Linear(4 * d_model, d_model)
        for lin in (self.qkv, self.out, self.fc, self.proj):                  # seeded, no global RNG
            with torch.no_grad():
                lin.weight.copy_(torch.randn(lin.weight.shape, generator=gen) * 0.02)
                lin.bias.zero_()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, L, D = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(B, L, 3, self.num_heads, -1).permute(2, 0, 3, 1, 4)  # (B, H, L, Dh)
        y = scaled_dot_product_attention(q, k, v, positional=self.rope, causal=True)            # (B, H, L, Dh)
        x = x + self.out(y.transpose(1, 2).reshape(B, L, D))
        return x + self.proj(F.gelu(self.fc(self.norm2(x))))


class TinyLM(nn.Module):
    """token table -> blocks -> RMSNorm -> tied logits. ``token`` is either kind of table (both have attend)."""

    def __init__(self, token: nn.Module, d_model: int, num_heads: int, num_layers: int, seed: int) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(seed + 1)
        self.token: Any = token
        self.blocks = nn.ModuleList(Block(d_model, num_heads, gen) for _ in range(num_layers))
        self.norm = RMSNorm(d_model)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.token(ids)                                                    # (B, L, D)
        for block in self.blocks:
            x = block(x)
        return self.token.attend(self.norm(x))                                 # (B, L, Vl) or (B, L, V)


def batches(vocab_size: int, batch: int, length: int, seed: int, device: Any) -> Any:
    """Endless (ids, targets) of shape (B, L): each row follows x -> (5 x + 3) mod V from a random start."""
    gen = torch.Generator().manual_seed(seed)
    while True:
        start = torch.randint(0, vocab_size, (batch, 1), generator=gen)
        seq = [start]
        for _ in range(length):
            seq.append((5 * seq[-1] + 3) % vocab_size)
        rows = torch.cat(seq, dim=1).to(device)                                # (B, L + 1)
        yield rows[:, :-1], rows[:, 1:]


def _init_group(device: str) -> None:
    if "RANK" not in os.environ:                                               # plain `python -m`: a world of one
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ.get("MASTER_PORT", "29512"),
                          RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
    dist.init_process_group("nccl" if device == "cuda" else "gloo")


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tokenpos.examples.vocab_parallel_lm", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--vocab-size", type=int, default=1003, help="V (odd on purpose: the last shard is padded)")
    p.add_argument("--d-model", type=int, default=32)
    p.add_argument("--num-heads", type=int, default=4)
    p.add_argument("--num-layers", type=int, default=2)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=16)
    p.add_argument("--lr", type=float, default=1e-2)
    p.add_argument("--pad-to-multiple-of", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--check", action="store_true", help="also train the one-process model; exit 1 on a mismatch")
    args = p.parse_args(argv)
    if args.steps < 1:
        p.error(f"--steps must be >= 1, got {args.steps}")
    torch.set_num_threads(1)
    _init_group(args.device)
    try:
        return _train(args)
    finally:
        dist.destroy_process_group()


def _train(args: argparse.Namespace) -> int:
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}" if args.device == "cuda" else "cpu")
    V, D = args.vocab_size, args.d_model
    emb = VocabParallelEmbedding(V, D, pad_to_multiple_of=args.pad_to_multiple_of, seed=args.seed, device=device)
    model = TinyLM(emb, D, args.num_heads, args.num_layers, args.seed).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    ref = opt_ref = None
    if args.check:
        ref = TinyLM(TokenEmbedding(V, D, seed=args.seed, device=device), D, args.num_heads, args.num_layers,
                     args.seed).to(device)
        opt_ref = torch.optim.AdamW(ref.parameters(), lr=args.lr)
    if rank == 0:
        print(f"world {world}: vocab {V} padded to {emb.padded_vocab_size}, {emb.num_local_rows} rows per rank, "
              f"d_model {D}, {args.num_layers} layers", flush=True)
    worst = 0.0
    data = batches(V, args.batch, args.seq_len, args.seed + 2, device)
    for step in range(1, args.steps + 1):
        ids, targets = next(data)
        loss = vocab_parallel_cross_entropy(model(ids), targets, vocab_size=V)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        line = f"step {step:3d}  loss {loss.item():.6f}"
        if ref is not None and opt_ref is not None:
            ref_loss = F.cross_entropy(ref(ids).reshape(-1, V), targets.reshape(-1))
            opt_ref.zero_grad(set_to_none=True)
            ref_loss.backward()
            opt_ref.step()
            diff = abs(loss.item() - ref_loss.item()) / max(1.0, abs(ref_loss.item()))
            worst = max(worst, diff)
            line += f"  one process {ref_loss.item():.6f}  rel diff {diff:.1e}"
        if rank == 0:
            print(line, flush=True)
    if ref is None:
        return 0
    ok = worst <= LOSS_RTOL
    if rank == 0:
        verdict = "check passed" if ok else "CHECK FAILED"
        print(f"{verdict}: {args.steps} steps on {world} ranks, max relative loss difference {worst:.1e} "
              f"(tolerance {LOSS_RTOL:.0e})", file=sys.stdout if ok else sys.stderr, flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
