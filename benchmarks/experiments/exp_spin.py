"""Experiment: torch's idle OpenMP threads spin, and a tokenpos kernel timed inside that window slows.

Usage: python benchmarks/experiments/exp_spin.py [--reps N] [--quick]
(compare with OMP_WAIT_POLICY=PASSIVE set before Python starts)

1. CPU seconds the process uses during a sleep that follows one parallel op (torch ``index_select``,
   then the tokenpos kernel): what the idle threads burn.
2. The tokenpos embedding kernel (``embedding_forward(..., out=)``) timed right after
   ``index_select``, and right after itself.

Public APIs only: :func:`tokenpos.kernels.embedding_forward`.
"""

from __future__ import annotations

import sys
import time

import numpy as np
import torch
from _cli import FULL, QUICK, parse, parser  # the shared command line (this folder is on sys.path when run)

from tokenpos.analysis.bench_timing import machine, timing_lines
from tokenpos.kernels import embedding_forward


def main(argv: list[str] | None = None) -> int:
    ap = parser(__doc__, 60, "timed pairs")
    args, reps = parse(ap, argv)
    V, D, L, B = QUICK if args.quick else FULL
    print(machine())
    W, P = torch.randn(V, D), torch.randn(L, D)
    ids = [torch.randint(0, V, (B, L)) for _ in range(4)]
    buf, gathered, pos = torch.empty(B, L, D), torch.empty(B * L, D), np.arange(L)

    def kernel(i: int) -> None:
        embedding_forward(W.numpy(), ids[i % 4].numpy(), scale=2.0, pos_table=P.numpy(), pos_ids=pos,
                          out=buf.numpy())

    def torch_op(i: int) -> None:
        torch.index_select(W, 0, ids[i % 4].view(-1), out=gathered)

    kernel(0)
    torch_op(0)
    for name, op in (("torch index_select", torch_op), ("tokenpos kernel", kernel)):
        for gap in (0.01, 0.1):
            op(1)
            c0 = time.process_time()
            time.sleep(gap)
            print(f"CPU used during a {gap * 1e3:.0f} ms sleep after {name}: {(time.process_time() - c0) * 1e3:.1f} ms")
    after_torch, after_kernel = [], []
    for i in range(reps):
        torch_op(i)
        t0 = time.perf_counter()
        kernel(i)
        after_torch.append(time.perf_counter() - t0)
        kernel(i + 1)
        t0 = time.perf_counter()
        kernel(i)
        after_kernel.append(time.perf_counter() - t0)
    print("\n".join(timing_lines({"kernel after index_select": after_torch, "kernel after itself": after_kernel})))
    return 0


if __name__ == "__main__":
    sys.exit(main())
