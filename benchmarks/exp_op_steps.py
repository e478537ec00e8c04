"""Where the torch embedding op's time goes outside the kernel, step by step, in the bench's conditions.

``python benchmarks/exp_op_steps.py [fp32|bf16] [reps]``. Replays ``ops.embedding._forward_numba``
one step at a time (the path choice, the NumPy views of the table, ids and positions, the output
from the cache, the shape check, the kernel, the output's release) with a clock between steps.
Each rep sleeps 25 ms, makes one untimed call and then the timed one, as ``tokenpos bench`` does,
so the timed call follows the op's own 25 MB of output writes. Prints the median and first
quartile of each step in us.

What it showed (BENCHMARKS.md, 2026-11-23 08:40): no step is slow in itself; each is slow when it
is the first to touch its part of the interpreter, NumPy or torch after the kernel has evicted
them from L1/L2. The first crossing into torch (the table's NumPy view) costs 55-85 us, the output
from the cache and its release 150-190 us together, against 2-8 us for the same steps called
back to back.
"""

from __future__ import annotations

import sys
import time
from collections import defaultdict

import numpy as np
import torch

from tokenpos.kernels.embedding import run_forward
from tokenpos.torch.ops._dispatch import cpu_empty, cpu_path, np_view
from tokenpos.torch.ops.embedding import _in_shape

V, D, B, L = 50257, 768, 16, 512
STEPS = ("path choice", "view of the table", "view of the ids", "views of the positions", "output (cache)",
         "shape check", "reshapes", "kernel", "release of the output")


def main(mode: str, reps: int) -> None:
    dtype = torch.bfloat16 if mode == "bf16" else torch.float32
    W = torch.nn.Parameter(torch.randn(V, D).to(dtype))
    P = torch.nn.Parameter(torch.randn(L, D).to(dtype))
    batches = [torch.randint(0, V, (B, L)) for _ in range(2)]
    pos = torch.arange(L)
    clock = time.perf_counter_ns

    def op(ids: torch.Tensor, marks: list[int]) -> None:
        marks.append(clock())
        cpu_path(W, P)
        marks.append(clock())
        w = np_view(W)
        marks.append(clock())
        i = np_view(ids)
        marks.append(clock())
        t, q = np_view(P), np_view(pos)
        marks.append(clock())
        out, out_np = cpu_empty((*i.shape, w.shape[1]), W.dtype)
        marks.append(clock())
        _in_shape(w, i, t, q)
        marks.append(clock())
        flat_i, flat_q, o = i.reshape(-1), q.reshape(-1), out_np.reshape(-1, w.shape[1])
        marks.append(clock())
        run_forward(w, flat_i, t, flat_q, 27.7, 0.0, 0, o)
        marks.append(clock())
        del out, out_np, o
        marks.append(clock())

    acc: dict[str, list[float]] = defaultdict(list)
    with torch.no_grad():
        for rep in range(reps + 3):
            time.sleep(0.025)
            op(batches[0], [])
            marks: list[int] = []
            op(batches[1], marks)
            if rep >= 3:
                for name, a, b in zip(STEPS, marks, marks[1:], strict=False):
                    acc[name].append((b - a) / 1e3)
    for name in STEPS:
        v = np.array(acc[name])
        print(f"{mode} {name:24s} median {np.median(v):8.1f} us   first quartile {np.percentile(v, 25):8.1f} us")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "fp32", int(sys.argv[2]) if len(sys.argv) > 2 else 100)
