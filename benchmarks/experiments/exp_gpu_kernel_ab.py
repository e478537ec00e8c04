"""The Triton kernels of an earlier commit against the working tree's, on one GPU, in one run.

What it answers: whether a kernel change is faster on the GPU, and whether it changed any bit. Each
case is captured CALLS times in one CUDA graph per side (the GPU's time alone, a replay's fixed costs
spread over the calls) and the sides are replayed in alternating order, round by round; the ratio
before / after is taken per round (> 1: the working tree is faster), with its median and range.
Before timing, every case compares the two sides' outputs bit for bit.

    git archive REV src/tokenpos/kernels/triton | tar -x -C BEFORE      # on a machine with git
    python benchmarks/experiments/exp_gpu_kernel_ab.py --before BEFORE [--rounds 20] [--cases a,b]

BEFORE is a folder holding ``src/tokenpos/kernels/triton`` of the earlier commit (carry it to the GPU
machine with the working tree). Its modules are loaded as the package ``kernels_before``, their
imports of ``tokenpos.kernels.triton.*`` pointed at that package; what they import from the rest of
tokenpos (errors, formulas) is the working tree's. CUDA only.

Cases (the shapes of ``benchmarks/gpu_bench.py``; bf16): the embedding forward with and without
dropout (V=50257, D=4096, ids (4, 2048), learned positions), its backward with dropout, RoPE on q
(4, 32, 4096, 128) and k (4, 8, 4096, 128), and RoPE on the (T, H, 1, Dh) token-major view of a
packed row (T = 16384) with positions (T, 1), as the layers call it.
"""

from __future__ import annotations

import argparse
import importlib
import math
import statistics
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # benchmarks/: the bench's graph capture
from gpu_bench import CALLS, embedding_inputs, graphed, replay_ms  # noqa: E402

import tokenpos.kernels.triton as after  # noqa: E402


def load_before(folder: Path) -> object:
    """``kernels_before``: the earlier commit's ``tokenpos.kernels.triton``, imports rewritten (module doc)."""
    src = folder / "src" / "tokenpos" / "kernels" / "triton"
    if not (src / "__init__.py").is_file():
        raise SystemExit(f"exp_gpu_kernel_ab: {src} has no __init__.py; make it with "
                         "`git archive REV src/tokenpos/kernels/triton | tar -x -C FOLDER`")
    root = Path(tempfile.mkdtemp(prefix="kernels_before_"))
    (root / "kernels_before").mkdir()
    for f in src.glob("*.py"):
        text = f.read_text().replace("tokenpos.kernels.triton.", "kernels_before.")
        (root / "kernels_before" / f.name).write_text(text)
    sys.path.insert(0, str(root))
    return importlib.import_module("kernels_before")


def cases(dev: torch.device) -> dict[str, Callable[[object], Callable[[], object]]]:
    V, D, B, L = 50257, 4096, 4, 2048
    dt = torch.bfloat16
    w, tab, ids, pos, seed, grad = embedding_inputs(V, D, B, L, dev, dt)           # gpu_bench's, seeded
    scale = math.sqrt(D)
    g = torch.Generator().manual_seed(1)
    q = torch.randn(4, 32, 4096, 128, generator=g).to(dev, dt)
    k = torch.randn(4, 8, 4096, 128, generator=g).to(dev, dt)
    ang = torch.arange(4 * 4096).double()[:, None] * (10000.0 ** (-torch.arange(64).double() / 64))[None]
    cos, sin = ang.cos().float().to(dev), ang.sin().float().to(dev)                    # (P, 64) float32
    T = 4 * 4096
    qt, kt = q.permute(0, 2, 1, 3).reshape(T, 32, 1, 128), k.permute(0, 2, 1, 3).reshape(T, 8, 1, 128)
    doc = torch.cat([torch.arange(n) for n in (3072, 5120, 1365, T - 3072 - 5120 - 1365)]).to(dev)[:, None]
    return {
        "embedding fwd p=0.1": lambda m: lambda: m.embedding_forward(w, ids, tab, pos, scale, 0.1, seed),
        "embedding fwd p=0": lambda m: lambda: m.embedding_forward(w, ids, tab, pos, scale, 0.0, seed),
        "embedding bwd p=0.1": lambda m: lambda: m.embedding_backward(grad, ids, pos, V, L, scale, 0.1, seed, -1),
        "rope_qk fwd": lambda m: lambda: m.rope_qk(q, k, cos[:4096], sin[:4096], False),
        "rope_qk packed rows": lambda m: lambda: m.rope_qk(qt, kt, cos, sin, False, positions=doc),
    }


def _same(a: object, b: object) -> bool:
    if isinstance(a, (tuple, list)):
        return all(_same(x, y) for x, y in zip(a, b, strict=True))
    if a is None or b is None:
        return a is b
    return bool(torch.equal(a.view(torch.int16) if a.dtype == torch.bfloat16 else a,        # NaNs compare by bits
                            b.view(torch.int16) if b.dtype == torch.bfloat16 else b))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", type=Path, required=True, help="folder holding the earlier src/tokenpos/kernels/triton")
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--cases", default=None, help="comma-separated case names (default: all)")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("exp_gpu_kernel_ab: needs CUDA", file=sys.stderr)
        return 2
    before = load_before(args.before)
    dev = torch.device("cuda")
    all_cases = cases(dev)
    names = list(all_cases) if args.cases is None else args.cases.split(",")
    print(f"{torch.cuda.get_device_name()}; before: {args.before}; {args.rounds} rounds of {CALLS} calls per graph")
    for name in names:
        make = all_cases[name]
        print(f"{name}: the same bits: {_same(make(before)(), make(after)())}", flush=True)
        replays = {"before": graphed(make(before)), "after": graphed(make(after))}
        t: dict[str, list[float]] = {"before": [], "after": []}
        for r in range(args.rounds):
            for side in (("before", "after") if r % 2 else ("after", "before")):
                t[side].append(replay_ms(replays[side]))
        ratio = sorted(b / a for b, a in zip(t["before"], t["after"], strict=True))
        print(f"{name}: before {1e3 * statistics.median(t['before']):.1f} us, after "
              f"{1e3 * statistics.median(t['after']):.1f} us; before / after per round: median "
              f"{statistics.median(ratio):.3f} (range {ratio[0]:.3f}-{ratio[-1]:.3f})", flush=True)
        del replays
    return 0


if __name__ == "__main__":
    sys.exit(main())
