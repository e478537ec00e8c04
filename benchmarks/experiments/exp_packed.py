"""Packed documents against the same tokens padded, call by call: is packing slower per token? (issue 30)

Usage: python benchmarks/experiments/exp_packed.py [--reps N] [--per-call] [--quick]

``tokenpos bench`` has a packed row beside each padded one, but a run's best or median of 20 reps
moves by about 6 % between runs on a shared machine, more than any difference packing could make.
This script times only the pairs, many interleaved rounds in the bench's model conditions (each
timed call right after a torch matmul of the model dim), and reports each pair's **paired** ratio:
padded / packed within each round (> 1: packed faster), its median over the rounds and a 95 %
bootstrap interval of that median (seeded). Drift between rounds hits both sides of a round alike.

Pairs (the bench's workloads and shapes): TransformerEmbedding forward (fp32, learned positions,
V=50257, D=768, B=16, L=512) in torch and NumPy; RotaryEmbedding on q and k (2, 32, 2048, 128) in
torch and NumPy, padded as (B, H, L, Dh), packed as (T, H, Dh) rows with ``qk_layout="thd"``.
Packed: the same B * L tokens as 2B documents of lengths L/2 (``cu_seqlens``), so every packed call
also computes the positions from ``cu_seqlens`` (one compiled pass over T). Both sides of a pair read
the same input memory (the embedding's packed ids are the padded ids flattened; RoPE's packed rows are
the padded q and k viewed as (T, H, Dh)): with separate buffers, where the pages landed moved a pair's
ratio by about 5 % from run to run.

``--per-call``: the same pairs on tiny shapes (the ``--quick`` ones), still each right after the full
workload's matmul, so that a call's time is its per-call work (checks, views, positions, the op's
entry) with the caches as cold as a model leaves them: the part of a packed call that does not shrink
with the tokens, and what a few microseconds hot become inside a model.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from itertools import cycle
from typing import Any

import numpy as np
import torch
from _cli import FULL, QUICK, parse, parser  # the shared command line (this folder is on sys.path when run)

import tokenpos.numpy as tpn
import tokenpos.torch as tpt
from tokenpos.analysis.bench_cases import packed_cu_seqlens
from tokenpos.analysis.bench_timing import machine, model_op, paired_ratio, time_interleaved, timing_lines

ROPE_FULL = (2, 32, 2048, 128)    # B, H, L, Dh: the bench's RoPE (134 MB of q and k)
ROPE_QUICK = (1, 4, 64, 32)


def embedding_pairs(V: int, D: int, L: int, B: int) -> dict[str, Callable[[], Any]]:
    rng = np.random.default_rng(0)
    batches = [rng.integers(0, V, (B, L)) for _ in range(4)]
    cu = packed_cu_seqlens(B, L)
    impls: dict[str, Callable[[], Any]] = {}
    for name, mod, as_ids, cu_arg in (("torch", tpt, torch.from_numpy, torch.from_numpy(cu)),
                                      ("numpy", tpn, np.asarray, cu)):
        layer = mod.TransformerEmbedding(V, D, L, positional="learned", scale=True, seed=0).eval()
        padded, flat = cycle([as_ids(b) for b in batches]), cycle([as_ids(b.reshape(-1)) for b in batches])
        impls[f"embedding {name}, padded"] = lambda layer=layer, it=padded: layer(next(it))
        impls[f"embedding {name}, packed"] = lambda layer=layer, it=flat, c=cu_arg: layer(next(it), cu_seqlens=c)
    return impls


def rope_pairs(B: int, H: int, L: int, Dh: int) -> dict[str, Callable[[], Any]]:
    gen = torch.Generator().manual_seed(0)
    q, k = torch.randn(B, H, L, Dh, generator=gen), torch.randn(B, H, L, Dh, generator=gen)
    # the packed rows are the same memory seen as (T, H, Dh): both sides read the same pages (placement
    # alone moved separate buffers' ratio by 5 % between runs); for timing, which values sit where is moot
    qt, kt = (x.view(B * L, H, Dh) for x in (q, k))
    cu = packed_cu_seqlens(B, L)
    impls: dict[str, Callable[[], Any]] = {}
    for name, mod, conv, cu_arg in (("torch", tpt, lambda t: t, torch.from_numpy(cu)),
                                    ("numpy", tpn, lambda t: t.numpy(), cu)):
        rope = mod.RotaryEmbedding(Dh, max_seq_len=L)
        thd = mod.RotaryEmbedding(Dh, max_seq_len=L, qk_layout="thd")
        a, b, ap, bp = conv(q), conv(k), conv(qt), conv(kt)
        impls[f"rope {name}, padded"] = lambda r=rope, a=a, b=b: r.apply(a, b)
        impls[f"rope {name}, packed"] = lambda r=thd, a=ap, b=bp, c=cu_arg: r.apply(a, b, cu_seqlens=c)
    return impls


def main(argv: list[str] | None = None) -> int:
    ap = parser(__doc__, 60, "interleaved rounds")
    ap.add_argument("--per-call", action="store_true",
                    help="tiny shapes after the full workload's matmul: the per-call work with cold caches")
    args, reps = parse(ap, argv)
    tiny = args.quick or args.per_call
    V, D, L, B = QUICK if tiny else FULL
    rope_shape = ROPE_QUICK if tiny else ROPE_FULL
    dims = (QUICK[1], ROPE_QUICK[1] * ROPE_QUICK[3]) if args.quick else (FULL[1], ROPE_FULL[1] * ROPE_FULL[3])
    print(machine())
    with torch.no_grad():
        for title, impls, dim in (("embedding forward", embedding_pairs(V, D, L, B), dims[0]),
                                  ("RoPE on q and k", rope_pairs(*rope_shape), dims[1])):
            times = time_interleaved(impls, reps, model_op(dim))
            print(f"{title}: {reps} rounds, each call right after a torch matmul")
            for line in timing_lines(times):
                print("  " + line)
            for name in impls:
                if name.endswith(", packed"):
                    pad = name.replace(", packed", ", padded")
                    med, lo, hi = paired_ratio(times[pad], times[name])
                    print(f"  {name.removesuffix(', packed')}: padded / packed per round, median {med:.3f} "
                          f"[95 % interval {lo:.3f}, {hi:.3f}]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
