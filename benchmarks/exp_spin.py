"""Experiment: torch's idle OpenMP threads spin, and a numba kernel timed inside that window slows.

Usage: python benchmarks/exp_spin.py [reps]          (compare with OMP_WAIT_POLICY=PASSIVE)

1. CPU seconds the process uses during a sleep that follows one parallel op (torch ``index_select``,
   then the tokenpos numba kernel): what the idle threads burn.
2. The tokenpos embedding kernel timed right after ``index_select``, and right after itself.
"""

from __future__ import annotations

import sys
import time

import numpy as np
import torch

from tokenpos.kernels.embedding import embedding_forward

V, D, L, B = 50257, 768, 512, 16


def main(reps: int) -> None:
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
    for name, ts in (("after index_select", after_torch), ("after itself", after_kernel)):
        print(f"kernel {name:20s} best {min(ts) * 1e3:6.2f} ms   median {np.median(ts) * 1e3:6.2f} ms")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 60)
