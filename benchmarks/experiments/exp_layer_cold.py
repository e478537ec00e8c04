"""Where a public layer's time over its raw kernel goes when every call follows a torch matmul.

Usage: python benchmarks/experiments/exp_layer_cold.py [--dtype bf16|fp32] [--reps N] [--quick]

Rows, interleaved in ``tokenpos bench``'s model conditions (each timed call right after a matmul of
the model dim), on the bench's forward workload and the same tables:

- the plain numba gather into a buffer of its own, and into a buffer that two other rows write too
  (the bench's limit rows shared one until 2026-11-27: a shared 12.6 MB bf16 buffer stays in L3);
- the raw kernel (``tokenpos.kernels.embedding_forward``) into its own buffer, and into a fresh
  output block (``out=None``: ``tokenpos._outputs``, what the layers use);
- the torch op's implementation called directly (``forward_impl``: output block, array views,
  kernel entry; no checks);
- the public torch layer, and the same with its check of the ids' values stubbed;
- the check's ``torch.aminmax`` of the ids alone.

Prints best / median ms per row and its ratio to the gather into its own buffer. Calls internals
(``forward_impl``, ``torch._checks._outside``): run it against the commit it came with.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from itertools import cycle
from typing import Any

import numpy as np
import torch
from _cli import FULL, QUICK, parse, parser  # the shared command line (this folder is on sys.path when run)

import tokenpos.kernels as K
import tokenpos.torch as tpt
import tokenpos.torch._checks as checks
from tokenpos.analysis.bench_cases import numba_gather
from tokenpos.analysis.bench_timing import machine, model_op, time_interleaved, timing_lines
from tokenpos.torch.ops._dispatch import np_view
from tokenpos.torch.ops.embedding import forward_impl


def main(argv: list[str] | None = None) -> int:
    ap = parser(__doc__, 30, "interleaved reps")
    ap.add_argument("--dtype", choices=("bf16", "fp32"), default="bf16")
    args, reps = parse(ap, argv)
    V, D, L, B = QUICK if args.quick else FULL
    bf16 = args.dtype == "bf16"
    dtype = torch.bfloat16 if bf16 else torch.float32
    print(machine())
    rng = np.random.default_rng(0)
    layer = tpt.TransformerEmbedding(V, D, L, positional="learned", scale=True, dtype=dtype, seed=0).eval()
    W, P = layer.token.weight.detach(), layer.position.weight.detach()
    w, pt = np_view(W), np_view(P)
    batches = [rng.integers(0, V, (B, L)) for _ in range(4)]
    tbatches = [torch.from_numpy(b) for b in batches]
    shared, own_g, own_k = (np_view(torch.empty(B, L, D, dtype=dtype)) for _ in range(3))
    pos, tpos = np.arange(L), torch.arange(L)
    scale, seed = float(np.sqrt(D)), torch.zeros((), dtype=torch.int64)
    ids_k, ids_n, ids_s, ids_f, ids_l, ids_u, ids_a = (cycle(tbatches) for _ in range(7))
    real_outside = checks._outside

    def kernel(out: np.ndarray | None, ids: Any) -> Callable[[], Any]:
        return lambda: K.embedding_forward(w, next(ids).numpy(), scale=scale, pos_table=pt, pos_ids=pos,
                                           out=out, bf16=bf16)

    def unchecked() -> Any:
        checks._outside = lambda *a: None                  # "every value inside its range", nothing read
        try:
            return layer(next(ids_u))
        finally:
            checks._outside = real_outside

    impls: dict[str, Callable[[], Any]] = {
        "numba gather, own buffer": numba_gather(w, batches, own_g),
        "numba gather, shared buffer": numba_gather(w, batches, shared),
        "kernel, shared buffer": kernel(shared, ids_s),
        "kernel, own buffer": kernel(own_k, ids_k),
        "kernel, fresh output block": kernel(None, ids_n),
        "op implementation (forward_impl)": lambda: forward_impl(W, next(ids_f), P, tpos, scale, 0.0, seed, -1),
        "public layer": lambda: layer(next(ids_l)),
        "public layer, ids check stubbed": unchecked,
        "torch.aminmax of the ids": lambda: torch.aminmax(next(ids_a)),
    }
    with torch.no_grad():
        times = time_interleaved(impls, reps, model_op(D))
    print(f"{args.dtype}: V={V} D={D} B={B} L={L}, {reps} reps, each call right after a torch matmul")
    for line in timing_lines(times, "numba gather, own buffer"):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
