"""GPU: the Triton kernels' tile sizes and warp counts, timed side by side (CUDA only).

``python benchmarks/exp_gpu_tiles.py [--quick]``. gpu_bench.py's workloads (RoPE q (4, 32, 4096, 128)
and k (4, 8, 4096, 128) bf16, half layout; the embedding forward and backward with V=50257,
D=4096, ids (4, 2048), learned positions, bf16, scale sqrt(D)), each kernel run through its public
wrapper with the module's tile constants and the launch's ``num_warps`` set per row. Prints, per
kernel, every setting's median ms (``triton.testing.do_bench``) and x the copy of the output's
bytes (and, for the embedding forward, x ``torch.index_select``), best first, with the current
setting marked. Nothing is changed in the package: the constants are restored at the end.
"""

from __future__ import annotations

import itertools
import math
import sys
from collections.abc import Callable

import torch
import triton
from triton.testing import do_bench

import tokenpos.kernels.triton.embedding as E
import tokenpos.kernels.triton.rope as R
from tokenpos.kernels.triton._cast import LAUNCH_OPTIONS


def _ms(fn: Callable[[], object]) -> float:
    return float(do_bench(fn, warmup=25, rep=100, return_mode="median"))


def _sweep(name: str, settings: list[dict], run: Callable[[dict], Callable[[], object]], refs: dict[str, float],
           current: dict) -> None:
    rows = []
    for s in settings:
        try:
            rows.append((_ms(run(s)), s))
        except Exception as e:                                   # a tile too large for the registers / shared memory
            print(f"{name} {s}: failed ({type(e).__name__})")
    rows.sort(key=lambda r: r[0])
    print(f"\n{name}: " + ", ".join(f"{k} {v:.4f} ms" for k, v in refs.items()))
    for ms, s in rows:
        ratios = "  ".join(f"x {k} {v / ms:.2f}" for k, v in refs.items())
        print(f"  {ms:8.4f} ms  {ratios}  {s}{'  <- current' if s == current else ''}")


def main(quick: bool) -> None:
    dev = torch.device("cuda")
    print(torch.cuda.get_device_name(dev), "torch", torch.__version__, "triton", triton.__version__)
    g = torch.Generator(device="cpu").manual_seed(0)
    saved = (E.BLOCK_N, E._block_d, R.BLOCK_L, dict(LAUNCH_OPTIONS))
    block_d = E._block_d
    try:
        # -- embedding forward / backward --------------------------------------------------------
        V, D, B, L = 50257, 4096, 4, 2048 // (4 if quick else 1)
        w = (0.02 * torch.randn(V, D, generator=g)).to(dev, torch.bfloat16)
        table = (0.02 * torch.randn(L, D, generator=g)).to(dev, torch.bfloat16)
        ids = torch.randint(0, V, (B, L), generator=g).to(dev)
        pos, seed, scale = torch.arange(L, device=dev), torch.tensor(1234, device=dev), math.sqrt(D)
        grad = torch.randn(B, L, D, generator=g).to(dev, torch.bfloat16)
        out = torch.empty(B * L, D, device=dev, dtype=torch.bfloat16)
        src = torch.empty_like(out)
        refs = {"copy": _ms(lambda: out.copy_(src)),
                "index_select": _ms(lambda: torch.index_select(w, 0, ids.view(-1), out=out))}

        def fwd(p: float) -> Callable[[dict], Callable[[], object]]:
            def make(s: dict) -> Callable[[], object]:
                E.BLOCK_N, LAUNCH_OPTIONS["num_warps"] = s["BLOCK_N"], s["num_warps"]
                E._block_d = lambda D, cap, c=s["BLOCK_D cap"]: block_d(D, c)
                E.embedding_forward(w, ids, table, pos, scale, p, seed)                 # compile before timing
                return lambda: E.embedding_forward(w, ids, table, pos, scale, p, seed)
            return make

        fwd_settings = [{"BLOCK_N": n, "BLOCK_D cap": c, "num_warps": nw}
                        for n, c, nw in itertools.product((1, 4, 16, 64), (256, 1024, 4096), (4, 8, 16))
                        if n * c <= 32768]
        current_fwd = {"BLOCK_N": saved[0], "BLOCK_D cap": 256, "num_warps": 4}
        for p in (0.0, 0.1):
            _sweep(f"embedding forward, p={p}", fwd_settings, fwd(p), refs, current_fwd)

        def bwd(s: dict) -> Callable[[], object]:
            LAUNCH_OPTIONS["num_warps"] = s["num_warps"]
            E._block_d = lambda D, cap, c=s["BLOCK_D cap"]: block_d(D, c)
            E.embedding_backward(grad, ids, pos, V, L, scale, 0.1, seed, -1)
            return lambda: E.embedding_backward(grad, ids, pos, V, L, scale, 0.1, seed, -1)

        dense = torch.empty(V + L, D, device=dev, dtype=torch.bfloat16)
        dsrc = torch.empty_like(dense)
        _sweep("embedding backward, p=0.1", [{"BLOCK_D cap": c, "num_warps": nw}
                                              for c, nw in itertools.product((512, 2048, 4096), (4, 8, 16))],
               bwd, {"copy of the dense gradients": _ms(lambda: dense.copy_(dsrc))},
               {"BLOCK_D cap": E.SEGMENT_BLOCK_D, "num_warps": E.SEGMENT_WARPS})
        E.BLOCK_N, E._block_d = saved[0], saved[1]
        LAUNCH_OPTIONS.clear()
        LAUNCH_OPTIONS.update(saved[3])

        # -- RoPE on q and k ---------------------------------------------------------------------
        Lr = 4096 // (4 if quick else 1)
        q = torch.randn(4, 32, Lr, 128, generator=g).to(dev, torch.bfloat16)
        k = torch.randn(4, 8, Lr, 128, generator=g).to(dev, torch.bfloat16)
        ang = torch.arange(Lr, dtype=torch.float64)[:, None] * 10000.0 ** (-torch.arange(0, 128, 2) / 128)
        cos, sin = ang.cos().float().to(dev), ang.sin().float().to(dev)
        oq, ok = torch.empty_like(q), torch.empty_like(k)
        sq, sk = torch.empty_like(q), torch.empty_like(k)

        def rope(s: dict) -> Callable[[], object]:
            R.BLOCK_L, LAUNCH_OPTIONS["num_warps"] = s["BLOCK_L"], s["num_warps"]
            R.rope_qk(q, k, cos, sin, False)
            return lambda: R.rope_qk(q, k, cos, sin, False)

        _sweep("rope_qk (out of place)", [{"BLOCK_L": b, "num_warps": nw}
                                          for b, nw in itertools.product((4, 16, 32, 64, 128), (2, 4, 8))],
               rope, {"copy": _ms(lambda: (oq.copy_(sq), ok.copy_(sk)))}, {"BLOCK_L": saved[2], "num_warps": 4})
    finally:
        E.BLOCK_N, E._block_d, R.BLOCK_L = saved[0], saved[1], saved[2]
        LAUNCH_OPTIONS.clear()
        LAUNCH_OPTIONS.update(saved[3])


if __name__ == "__main__":
    if not torch.cuda.is_available():
        print("exp_gpu_tiles: no CUDA device; nothing measured", file=sys.stderr)
        sys.exit(2)
    main("--quick" in sys.argv)
