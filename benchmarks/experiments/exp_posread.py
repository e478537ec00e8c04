"""What the fused forward pays for its positional rows, against the torch gather limit, in one run.

Usage: python benchmarks/experiments/exp_posread.py [--mode fp32|dropout|bf16] [--reps N] [--quick]

The compiled forward (``tokenpos.kernels.embedding.forward_rows``: the kernel entry on checked
arrays, nothing validated) on the bench's shapes (V=50257, D=768, B=16, L=512, ids cycled over 4 batches), three ways:

- as the layers call it (positions 0..L-1 in every sequence);
- every row at position 0: its positional row stays in L1, so the positional reads from L2/L3
  (25 MB per fp32 call) go and the arithmetic stays;
- without a positional table (a gather times the scale).

Interleaved with ``torch.index_select(out=)`` (the bench's gather limit) and a plain parallel numba
gather, interleaved back to back (``time_interleaved`` without a model op: the lab condition
before issue 29). The tables are the public torch layer's (``TransformerEmbedding``
allocates them 64-byte aligned, with transparent huge pages), shared by every row. Prints best /
median ms and x ``index_select`` (its time / the row's: > 1 is faster), then each row's quartiles
(the kernel's times are bimodal on a shared guest).

Public APIs only: :mod:`tokenpos.torch`, ``tokenpos.kernels.embedding.forward_rows`` and
:mod:`tokenpos.analysis.bench_timing` (and the bench's own plain gather, ``bench_cases.gather_rows``).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from itertools import count

import numpy as np
import torch
from _cli import FULL, QUICK, parse, parser  # the shared command line (this folder is on sys.path when run)

import tokenpos.torch as tpt
from tokenpos.analysis.bench_cases import gather_rows
from tokenpos.analysis.bench_timing import machine, time_interleaved
from tokenpos.kernels.embedding import forward_rows


def main(argv: list[str] | None = None) -> int:
    ap = parser(__doc__, 30, "interleaved reps")
    ap.add_argument("--mode", choices=("fp32", "dropout", "bf16"), default="fp32",
                    help="fp32 forward, fp32 with dropout 0.1, or bf16 tables (default fp32)")
    args, reps = parse(ap, argv)
    V, D, L, B = QUICK if args.quick else FULL
    bf16 = args.mode == "bf16"
    dtype = torch.bfloat16 if bf16 else torch.float32
    print(machine())

    emb = tpt.TransformerEmbedding(V, D, L, positional="learned", scale=True, seed=0, dtype=dtype)
    W, P = emb.token.weight.detach(), emb.position.weight.detach()
    out_t = torch.empty(B * L, D, dtype=dtype)                    # 64-byte aligned, as torch allocates

    def arr(t: torch.Tensor) -> np.ndarray:
        return t.view(torch.uint16).numpy() if bf16 else t.numpy()  # bf16: the bits, as the kernel takes them

    w, pt, out = arr(W), arr(P), arr(out_t)
    rng = np.random.default_rng(0)
    ids = [rng.integers(0, V, B * L) for _ in range(4)]
    tids = [torch.from_numpy(i) for i in ids]
    p, scale, turn = (0.1 if args.mode == "dropout" else 0.0), emb.token.multiplier, count()

    def nxt() -> int:
        return next(turn) % len(ids)

    def kernel(table: np.ndarray | None, pid: np.ndarray | None) -> Callable[[], np.ndarray]:
        return lambda: forward_rows(w, ids[nxt()], table, pid, scale, p, 5, out)

    impls = {"torch.index_select(out=)": lambda: torch.index_select(W, 0, tids[nxt()], out=out_t),
             "plain parallel numba gather": lambda: gather_rows(w, ids[nxt()], out),
             "kernel": kernel(pt, np.arange(L)),
             "kernel, every row at position 0": kernel(pt, np.zeros(L, np.int64)),
             "kernel, no positions": kernel(None, None)}
    with torch.no_grad():
        times = time_interleaved(impls, reps)
    ref = times["torch.index_select(out=)"]
    rb, rm = min(ref), float(np.median(ref))
    for name, ts in times.items():
        b, m = min(ts), float(np.median(ts))
        print(f"{args.mode:8s} {name:32s} best {b * 1e3:6.2f} ms  median {m * 1e3:6.2f} ms  "
              f"x index_select {rb / b:.2f} / {rm / m:.2f}")
    for name, ts in times.items():
        q25, q50, q75 = np.percentile(np.array(ts) * 1e3, [25, 50, 75])
        print(f"{args.mode:8s} {name:32s} quartiles {q25:6.2f} {q50:6.2f} {q75:6.2f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
