"""Experiment: RoPE on torch's pool two ways, in model conditions (each timed call right after a torch matmul).

Usage: python benchmarks/experiments/exp_cpp_pool.py [--reps N] [--quick]

Issue 29's second option: a small C++ function built with ``torch.utils.cpp_extension.load_inline``
that runs ``at::parallel_for`` over row chunks and calls a numba ``@cfunc`` RoPE core per chunk,
against tokenpos's own launch (numba's omp layer bound to torch's libgomp, chosen since issue 29
when torch is imported first) and ``copy_`` of the same bytes (the limit). Needs a C++ compiler
(the first run compiles for a minute or two). Prints best / median ms and x copy.

Public APIs only, besides the experiment's own C++ and cfunc: :func:`tokenpos.kernels.rope_apply`.
"""

from __future__ import annotations

import sys
import time

import numpy as np
import torch
from _cli import parse, parser
from llvmlite import ir
from numba import carray, cfunc, types
from numba.extending import intrinsic

from tokenpos.analysis.bench_timing import machine, model_op
from tokenpos.kernels import rope_apply

CPP = r"""
#include <torch/extension.h>
#include <ATen/Parallel.h>
typedef void (*chunk_fn)(int64_t, int64_t, const int64_t*);
void run_chunks(int64_t fn, int64_t args, int64_t n, int64_t grain) {
  auto f = reinterpret_cast<chunk_fn>(fn);
  auto a = reinterpret_cast<const int64_t*>(args);
  at::parallel_for(0, n, grain, [&](int64_t b, int64_t e) { f(b, e, a); });
}
"""


@intrinsic
def _fptr(typingctx, addr):  # pragma: no cover - compiled
    sig = types.CPointer(types.float32)(types.int64)

    def codegen(context, builder, signature, args):
        return builder.inttoptr(args[0], ir.PointerType(ir.FloatType()))
    return sig, codegen


@cfunc(types.void(types.int64, types.int64, types.CPointer(types.int64)), cache=True)
def rope_chunk(b, e, a):  # pragma: no cover - compiled
    """Rows [b, e) of q and k (N, Dh) rotated ("half" layout) by tables (L, R2); a = addresses and sizes."""
    n, L, Dh, R2 = a[6], a[7], a[8], a[9]
    q, k = carray(_fptr(a[0]), (n, Dh)), carray(_fptr(a[1]), (n, Dh))
    oq, ok = carray(_fptr(a[2]), (n, Dh)), carray(_fptr(a[3]), (n, Dh))
    cos, sin = carray(_fptr(a[4]), (L, R2)), carray(_fptr(a[5]), (L, R2))
    for r in range(b, e):
        l = r % L
        for i in range(R2):
            c = cos[l, i]
            s = sin[l, i]
            x1 = q[r, i]
            x2 = q[r, i + R2]
            oq[r, i] = x1 * c - x2 * s
            oq[r, i + R2] = x2 * c + x1 * s
            y1 = k[r, i]
            y2 = k[r, i + R2]
            ok[r, i] = y1 * c - y2 * s
            ok[r, i + R2] = y2 * c + y1 * s


def main(argv: list[str] | None = None) -> int:
    ap = parser(__doc__, 20)
    args, reps = parse(ap, argv)
    B, H, L, Dh = (1, 2, 64, 32) if args.quick else (2, 32, 2048, 128)
    from torch.utils.cpp_extension import load_inline
    t0 = time.perf_counter()
    ext = load_inline("tokenpos_exp_pool", CPP, functions=["run_chunks"], extra_cflags=["-O2"])
    print(machine())
    print(f"C++ extension ready in {time.perf_counter() - t0:.0f} s")
    rng = np.random.default_rng(0)
    q, k = (rng.standard_normal((B, H, L, Dh), dtype=np.float32) for _ in range(2))
    oq, ok = np.empty_like(q), np.empty_like(k)
    ang = np.arange(L)[:, None] * 10000.0 ** (-np.arange(0, Dh, 2) / Dh)
    c, s = np.ascontiguousarray(np.cos(ang), np.float32), np.ascontiguousarray(np.sin(ang), np.float32)
    n = B * H * L
    addr = np.array([x.__array_interface__["data"][0] for x in (q, k, oq, ok, c, s)] + [n, L, Dh, Dh // 2], np.int64)
    grain = max(1, (1 << 18) // (Dh * 4))
    src, dst = torch.randn(2 * q.size), torch.empty(2 * q.size)
    impls = {"copy_": lambda: dst.copy_(src),
             "tokenpos rope_apply (numba omp on torch's pool)": lambda: rope_apply(q, k, c, s, out_q=oq, out_k=ok),
             "at::parallel_for + numba cfunc": lambda: ext.run_chunks(rope_chunk.address, addr.ctypes.data, n, grain)}
    ext.run_chunks(rope_chunk.address, addr.ctypes.data, n, grain)
    want = rope_apply(q, k, c, s)
    assert np.allclose(oq, want[0], atol=1e-5) and np.allclose(ok, want[1], atol=1e-5)
    from tokenpos.analysis.bench_timing import time_interleaved, timing_lines
    print("\n".join(timing_lines(time_interleaved(impls, reps, model_op(H * Dh)), ref="copy_")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
