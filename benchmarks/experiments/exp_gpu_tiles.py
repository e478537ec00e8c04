"""Tile sizes of the Triton embedding forward and RoPE kernels on a GPU, timed as CUDA-graph replays.

What it answers: which (BLOCK_N, BLOCK_D, num_warps) of ``_embedding_forward_kernel`` and which
(BLOCK_L, num_warps) of ``_rope_kernel`` move the most bytes per second on this GPU, at the sizes
of ``benchmarks/gpu_bench.py`` (embedding V=50257, D=4096, ids (4, 2048), learned positions, bf16;
RoPE q (4, 32, 4096, 128), k (4, 8, 4096, 128) bf16). Each configuration's launches are captured in
one CUDA graph (10 launches) and replayed, so the time is the GPU's alone; the module constants are
patched per configuration, then restored. A copy of the same bytes is the ceiling.

    python benchmarks/experiments/exp_gpu_tiles.py            # CUDA only

Prints one line per configuration, best first, for each kernel and dropout setting.
"""

from __future__ import annotations

import itertools
import math
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

import torch

import tokenpos.kernels.triton.embedding as E
import tokenpos.kernels.triton.rope as R
from tokenpos.kernels.triton._cast import LAUNCH_OPTIONS

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # benchmarks/: the bench's graph capture
from gpu_bench import CALLS, graphed, replay_ms  # noqa: E402


def graph_ms(fn: Callable[[], object], rounds: int = 15) -> float:
    """Median ms of one ``fn`` call, from replays of a graph of CALLS calls (``gpu_bench.graphed``)."""
    replay = graphed(fn, CALLS)
    return statistics.median(replay_ms(replay) for _ in range(rounds))


def embedding_sweep() -> None:
    V, D, B, L = 50257, 4096, 4, 2048
    g = torch.Generator(device="cpu").manual_seed(0)
    w = (0.02 * torch.randn(V, D, generator=g)).to("cuda", torch.bfloat16)
    table = (0.02 * torch.randn(L, D, generator=g)).to("cuda", torch.bfloat16)
    ids = torch.randint(0, V, (B, L), generator=g).cuda()
    pos = torch.arange(L, device="cuda")
    seed = torch.tensor(1234, device="cuda")
    moved = 2 * B * L * D * 2
    src = torch.empty(moved // 2, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    copy = graph_ms(lambda: dst.copy_(src))
    want = {p: E.embedding_forward(w, ids, table, pos, math.sqrt(D), p, seed) for p in (0.0, 0.1)}
    saved = (E.BLOCK_N, E._block_d, E.LAUNCH_OPTIONS)
    for p in (0.0, 0.1):
        rows = []
        for bn, bd, warps in itertools.product((16, 32, 64), (256, 512, 1024), (4, 8)):
            if bn * bd > 32768:
                continue
            E.BLOCK_N, E._block_d = bn, (lambda D, cap, bd=bd: min(bd, 1 << (D - 1).bit_length()))
            E.LAUNCH_OPTIONS = {**LAUNCH_OPTIONS, "num_warps": warps}
            try:
                out = E.embedding_forward(w, ids, table, pos, math.sqrt(D), p, seed)
                assert torch.equal(out, want[p]), "a configuration changed the result"
                ms = graph_ms(lambda: E.embedding_forward(w, ids, table, pos, math.sqrt(D), p, seed))  # noqa: B023
                rows.append((ms, bn, bd, warps))
            finally:
                E.BLOCK_N, E._block_d, E.LAUNCH_OPTIONS = saved
        rows.sort()
        print(f"embedding forward p={p}: copy {copy:.4f} ms; current (BLOCK_N {saved[0]}, BLOCK_D 256, 4 warps)")
        for ms, bn, bd, warps in rows[:8]:
            print(f"  BLOCK_N {bn:3d} BLOCK_D {bd:5d} warps {warps}: {ms:.4f} ms  {copy / ms:.2f}x copy")
        cur = [r for r in rows if r[1:] == (saved[0], 256, 4)]
        if cur:
            print(f"  current: {cur[0][0]:.4f} ms  {copy / cur[0][0]:.2f}x copy")


def rope_sweep() -> None:
    from tokenpos.kernels.triton import rope_qk
    B, H, Hk, L, Dh = 4, 32, 8, 4096, 128
    g = torch.Generator(device="cpu").manual_seed(0)
    q = torch.randn(B, H, L, Dh, generator=g).to("cuda", torch.bfloat16)
    k = torch.randn(B, Hk, L, Dh, generator=g).to("cuda", torch.bfloat16)
    inv_freq = 10000.0 ** (-torch.arange(0, Dh, 2, dtype=torch.float64) / Dh)         # (Dh/2,)
    ang = torch.outer(torch.arange(L, dtype=torch.float64), inv_freq)                  # (L, Dh/2)
    cos, sin = ang.cos().float().cuda(), ang.sin().float().cuda()
    moved = 2 * (q.numel() + k.numel()) * 2
    src = torch.empty(moved // 2, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    copy = graph_ms(lambda: dst.copy_(src))
    want = rope_qk(q, k, cos, sin, False)
    saved = (R.BLOCK_L, R.LAUNCH_OPTIONS)
    rows = []
    for bl, warps in itertools.product((8, 16, 32, 64), (2, 4, 8)):
        R.BLOCK_L, R.LAUNCH_OPTIONS = bl, {**LAUNCH_OPTIONS, "num_warps": warps}
        try:
            got = rope_qk(q, k, cos, sin, False)
            assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True)), "a configuration changed the result"
            rows.append((graph_ms(lambda: rope_qk(q, k, cos, sin, False)), bl, warps))
        finally:
            R.BLOCK_L, R.LAUNCH_OPTIONS = saved
    rows.sort()
    print(f"rope_qk: copy {copy:.4f} ms; current (BLOCK_L {saved[0]}, 4 warps)")
    for ms, bl, warps in rows[:8]:
        print(f"  BLOCK_L {bl:3d} warps {warps}: {ms:.4f} ms  {copy / ms:.2f}x copy")
    cur = [r for r in rows if r[1:] == (saved[0], 4)]
    if cur:
        print(f"  current: {cur[0][0]:.4f} ms  {copy / cur[0][0]:.2f}x copy")


def main() -> int:
    if not torch.cuda.is_available():
        print("exp_gpu_tiles: needs CUDA", file=sys.stderr)
        return 2
    print(torch.cuda.get_device_name(), torch.__version__, flush=True)
    rope_sweep()
    embedding_sweep()
    return 0


if __name__ == "__main__":
    sys.exit(main())
