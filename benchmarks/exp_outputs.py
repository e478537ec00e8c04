"""Where a public layer's output memory comes from: the output cache against ``np.empty`` (malloc).

``python benchmarks/exp_outputs.py MODE [reps]``, MODE ``fp32`` or ``bf16``. The bench's shapes
(V=50257, D=768, B=16, L=512): the torch ``index_select`` gather (the limit), torch eager's
``F.embedding(ids, W) * s + P[pos]`` (which allocates and frees blocks of the output's size, as any
model's torch ops do between layers), the kernel into a preallocated output, and the public torch
layer twice: its output from the cache (``OUTPUTS.min_bytes`` 1 MiB, the default) and from
``np.empty`` (``min_bytes`` raised past the output). Interleaved in ``tokenpos bench``'s
conditions; prints best / median ms and x gather, then the minor page faults per call of each
route (``getrusage``), counted over the timed reps.
"""

from __future__ import annotations

import resource
import sys
from collections.abc import Callable
from itertools import count
from typing import Any

import numpy as np
import torch
from _forward_case import B, D, L, V, print_vs_gather

import tokenpos.kernels as K
import tokenpos.torch as tpt
from tokenpos._config import OUTPUTS
from tokenpos.analysis.bench_timing import time_interleaved
from tokenpos.torch._init import empty_table
from tokenpos.torch.ops._dispatch import np_view


def main(mode: str, reps: int) -> None:
    bf16 = mode == "bf16"
    dt = torch.bfloat16 if bf16 else torch.float32
    W, P = empty_table(V, D, dtype=dt).normal_(), empty_table(L, D, dtype=dt).normal_()
    layer = tpt.TransformerEmbedding(V, D, L, scale=True, seed=0, dtype=dt).eval()
    layer.token.weight.data, layer.position.weight.data = W, P                # share, do not copy
    ids = [torch.randint(0, V, (B, L)) for _ in range(4)]
    out = torch.empty(B, L, D, dtype=dt)
    w, pt, o, tp, it = np_view(W), np_view(P), np_view(out), torch.arange(L), count()
    faults: dict[str, list[int]] = {}

    def counted(name: str, fn: Callable[[], Any], min_bytes: int | None = None) -> Callable[[], Any]:
        def run() -> Any:
            old = OUTPUTS.min_bytes
            if min_bytes is not None:
                OUTPUTS.min_bytes = min_bytes
            before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            try:
                return fn()
            finally:
                faults.setdefault(name, []).append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
                OUTPUTS.min_bytes = old
        return run

    def nxt() -> torch.Tensor:
        return ids[next(it) % 4]

    routes: dict[str, tuple[Callable[[], Any], int | None]] = {
        "torch index_select (out=)": (lambda: torch.index_select(W, 0, nxt().reshape(-1), out=out.view(-1, D)), None),
        "torch eager formula": (lambda: torch.nn.functional.embedding(nxt(), W) * 27.7 + P[tp], None),
        "kernel (out=)": (lambda: K.embedding_forward(w, nxt().numpy(), scale=27.7, pos_table=pt, pos_ids=np.arange(L),
                                                       out=o, bf16=bf16), None),
        "public layer, output cache": (lambda: layer(nxt()), 1 << 20),
        "public layer, np.empty": (lambda: layer(nxt()), 1 << 62),
    }
    impls = {name: counted(name, fn, mb) for name, (fn, mb) in routes.items()}
    with torch.no_grad():
        print_vs_gather(mode, time_interleaved(impls, reps))
    for name, f in faults.items():
        print(f"{name:34s} minor page faults per call: median {np.median(f[-reps:]):.0f}, max {max(f[-reps:])}")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 20)
