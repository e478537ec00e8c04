"""Each public layer vs the raw kernel it calls, on the SAME tables and inputs, timed as the bench
times (``analysis.bench_timing.time_interleaved``, here back to back: no model op between calls).

Usage: python benchmarks/experiments/exp_public_vs_kernel.py [--reps N] [--quick]

Issue 10's measure: best / median ms and kernel / public ratios (> 0.95: within 5 % of the raw
kernel) for the forward (eval), forward + dropout (train, no grad), bf16 forward and RoPE on q
and k. The kernel rows call ``embedding_forward`` / ``rope_apply`` with ``out=`` into preallocated
arrays; the layers allocate their outputs as a user's call does. Every result is kept alive until
that impl's next call, as a model keeps its activations. The same ratio is the "x kernel" column
of ``tokenpos bench``; this script shows it alone, without the other cases' rows in between.

Public APIs only: :mod:`tokenpos.numpy`, :mod:`tokenpos.torch`, ``tokenpos.kernels.embedding_forward``,
``tokenpos.kernels.rope_apply`` and :mod:`tokenpos.analysis.bench_timing`.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from itertools import count
from typing import Any

import numpy as np
import torch
from _cli import parse, parser  # the shared command line (this folder is on sys.path when run)

import tokenpos.numpy as tpn
import tokenpos.torch as tpt
from tokenpos.analysis.bench_timing import machine, time_interleaved
from tokenpos.kernels import embedding_forward, rope_apply

FULL = (50257, 768, 512, 16, 12, 64)      # V, D, L, B, H, Dh: the bench's forward and RoPE
QUICK = (4096, 256, 64, 4, 4, 32)


def _impls(V: int, D: int, L: int, B: int, H: int, Dh: int) -> dict[str, dict[str, Callable[[], Any]]]:
    emb = tpt.TransformerEmbedding(V, D, L, positional="learned", scale=True, seed=0).eval()
    drop = tpt.TransformerEmbedding(V, D, L, positional="learned", scale=True, dropout=0.1, seed=0).train()
    e16 = tpt.TransformerEmbedding(V, D, L, positional="learned", scale=True, seed=0, dtype=torch.bfloat16).eval()
    nemb = tpn.TransformerEmbedding(V, D, L, positional="learned", scale=True, seed=0).eval()
    rope = tpt.RotaryEmbedding(Dh, max_seq_len=L).eval()
    nrope = tpn.RotaryEmbedding(Dh, max_seq_len=L)
    batches = [torch.randint(0, V, (B, L)) for _ in range(4)]
    nb = [b.numpy() for b in batches]
    W, P = emb.token.weight.detach().numpy(), emb.position.weight.detach().numpy()
    W16 = e16.token.weight.detach().view(torch.uint16).numpy()
    P16 = e16.position.weight.detach().view(torch.uint16).numpy()
    pos, s = np.arange(L), emb.token.multiplier
    q, k = torch.randn(B, H, L, Dh), torch.randn(B, H, L, Dh)
    c = rope.cos_cached[:L].float().numpy()
    sn = rope.sin_cached[:L].float().numpy()
    bufs = {n: np.empty((B, L, D), np.float32) for n in ("f", "d")}
    b16 = np.empty((B, L, D), np.uint16)
    oq, ok = np.empty_like(q.numpy()), np.empty_like(k.numpy())
    turn = count()

    def nxt() -> int:
        return next(turn) % len(batches)

    return {
        "forward": {
            "kernel(out=)": lambda: embedding_forward(W, nb[nxt()], scale=s, pos_table=P, pos_ids=pos,
                                                      out=bufs["f"]),
            "torch layer": lambda: emb(batches[nxt()]),
            "numpy layer": lambda: nemb(nb[nxt()]),
        },
        "dropout": {
            "kernel(out=)": lambda: embedding_forward(W, nb[nxt()], scale=s, pos_table=P, pos_ids=pos,
                                                      dropout_p=0.1, seed=12345, out=bufs["d"]),
            "torch layer": lambda: drop(batches[nxt()]),
        },
        "bf16": {
            "kernel(out=)": lambda: embedding_forward(W16, nb[nxt()], scale=s, pos_table=P16, pos_ids=pos,
                                                      out=b16, bf16=True),
            "torch layer": lambda: e16(batches[nxt()]),
        },
        "rope": {
            "kernel(out=)": lambda: rope_apply(q.numpy(), k.numpy(), c, sn, out_q=oq, out_k=ok),
            "torch layer": lambda: rope(q, k),
            "numpy layer": lambda: nrope(q.numpy(), k.numpy()),
        },
    }


def main(argv: list[str] | None = None) -> int:
    ap = parser(__doc__, 30, "interleaved reps per case")
    args, reps = parse(ap, argv)
    print(machine())
    alive: dict[str, object] = {}
    with torch.no_grad():
        for case, impls in _impls(*(QUICK if args.quick else FULL)).items():
            alive.clear()

            def keep(name: str, f: Callable[[], Any]) -> Callable[[], None]:
                def run() -> None:
                    alive[name] = f()
                return run

            times = time_interleaved({n: keep(n, f) for n, f in impls.items()}, reps)
            kb, km = min(times["kernel(out=)"]), float(np.median(times["kernel(out=)"]))
            for name, ts in times.items():
                b, m = min(ts), float(np.median(ts))
                print(f"{case:8s} {name:13s} best {b * 1e3:6.2f} ms  median {m * 1e3:6.2f} ms  "
                      f"x kernel {kb / b:4.2f} / {km / m:4.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
