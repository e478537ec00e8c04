"""The tied loss without logits against the materialised logits + cross-entropy, on the CPU, in one run.

Usage:
    python benchmarks/tied_loss_bench.py [--tokens N] [--vocab V] [--dim D] [--rounds R] [--backend torch|numpy|both]

GPT-2's output layer by default: V = 50,257, D = 768, N = 8,192 tokens, float32, forward + backward
(loss "mean", d loss = 1), gradients for h and the tied table:

- torch: "fused" ``tokenpos.torch.tied_cross_entropy(h, W, t)`` vs "eager" ``F.cross_entropy(h @ W.T, t)``
  (eager autograd);
- numpy: "fused" ``functional.tied_cross_entropy_forward / _backward`` vs "eager", the same formula on the
  whole (N, V) logits;
- cuda (issue 33's GPU row, on a machine with an NVIDIA GPU): torch's "fused" and "eager" as above on the
  GPU, and "liger", Liger-Kernel's ``LigerFusedLinearCrossEntropyLoss`` (when liger-kernel is installed).

The fused loss runs plain torch / NumPy ops on each block on the CPU (a numba block kernel measured no
faster and was deleted, issue 33: ``benchmarks/HISTORY.md``).

Time: interleaved rounds (fused, eager, fused, eager, ...), best and median of each, the ratio eager / fused
(> 1: the fused loss is faster). Peak extra memory (above the inputs, outputs included: dh and dW count for
both): numpy with ``tracemalloc`` (NumPy reports its buffers to it) in this process; torch as the peak RSS
of a fresh child process per path (Linux: VmHWM, reset through /proc/self/clear_refs just before the step)
minus its RSS then, since torch's CPU allocator keeps no peak statistics; cuda with the caching allocator's
peak (``torch.cuda.max_memory_allocated``) above what the inputs hold, timed with a synchronize around each step.
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import time
import tracemalloc
from collections.abc import Callable
from typing import Any

import numpy as np


def _inputs(n: int, v: int, d: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    h = (rng.standard_normal((n, d)) * 0.5).astype(np.float32)
    w = (rng.standard_normal((v, d)) * 0.02).astype(np.float32)
    return h, w, rng.integers(0, v, n)


# -- torch ---------------------------------------------------------------------------------------


def _torch_step(path: str, h: Any, w: Any, t: Any, loss_fn: Callable[..., Any] | None = None) -> Callable[[], Any]:
    """One forward + backward of ``path`` on fresh leaves of h and w: "eager", "fused", or ``loss_fn(h, w, t)``."""
    import torch.nn.functional as F

    import tokenpos.torch as tpt

    if loss_fn is None:
        loss_fn = (lambda a, b, t: F.cross_entropy(a @ b.T, t)) if path == "eager" else tpt.tied_cross_entropy

    def run() -> Any:
        a, b = h.detach().requires_grad_(), w.detach().requires_grad_()
        loss = loss_fn(a, b, t)
        loss.backward()
        return loss.item(), a.grad, b.grad

    return run


def _status_kib(key: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(key + ":"))


def _torch_memory_child(path: str, n: int, v: int, d: int, out: Any) -> None:
    import torch

    small = (torch.from_numpy(x) for x in _inputs(16, v, d))
    _torch_step(path, *small)()                                                # load the kernels: not counted
    h, w, t = (torch.from_numpy(x) for x in _inputs(n, v, d))
    run = _torch_step(path, h, w, t)
    with open("/proc/self/clear_refs", "w") as f:                             # reset the peak RSS (VmHWM)
        f.write("5")
    before = _status_kib("VmRSS")
    result = run()
    out.put((max(_status_kib("VmHWM") - before, 0) * 1024, float(result[0])))


def torch_memory(path: str, n: int, v: int, d: int) -> tuple[int, float]:
    ctx = multiprocessing.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=_torch_memory_child, args=(path, n, v, d, q))
    p.start()
    got = q.get()
    p.join()
    return got


# -- numpy ---------------------------------------------------------------------------------------


def _numpy_step(path: str, h: np.ndarray, w: np.ndarray, t: np.ndarray) -> Callable[[], Any]:
    from tokenpos.numpy import functional as F

    def fused() -> Any:
        loss, cache = F.tied_cross_entropy_forward(h, w, t, with_grad=True)
        return (loss, *F.tied_cross_entropy_backward(1.0, cache))

    def eager() -> Any:
        z = h @ w.T                                                           # (N, V) logits
        m = z.max(axis=1, keepdims=True)
        p = np.exp(z - m)
        s = p.sum(axis=1, keepdims=True)
        loss = float(np.mean(np.log(s[:, 0]) + m[:, 0] - z[np.arange(len(t)), t]))
        del z
        p /= s
        p[np.arange(len(t)), t] -= 1.0
        p /= len(t)
        return loss, p @ w, p.T @ h

    return eager if path == "eager" else fused


def numpy_memory(path: str, h: np.ndarray, w: np.ndarray, t: np.ndarray) -> tuple[int, float]:
    run = _numpy_step(path, h, w, t)
    run()                                                                      # warm: as in the timed rounds
    tracemalloc.start()
    tracemalloc.reset_peak()
    result = run()
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return peak, float(result[0])


# -- cuda (issue 33's GPU row) ----------------------------------------------------------------------


def _cuda_steps(h: Any, w: Any, t: Any) -> dict[str, Callable[[], Any]]:
    """The GPU paths on the same (N, D) h, (V, D) table and (N,) targets: tokenpos's fused loss, the eager
    ``F.cross_entropy(h @ W.T)``, and Liger-Kernel's fused linear cross-entropy when it imports."""
    steps = {"fused": _torch_step("fused", h, w, t), "eager": _torch_step("eager", h, w, t)}
    try:
        from liger_kernel.transformers.fused_linear_cross_entropy import LigerFusedLinearCrossEntropyLoss
    except ImportError:
        print("liger-kernel not installed: no Liger row (pip download liger-kernel --no-deps -d .whl)")
        return steps
    liger = LigerFusedLinearCrossEntropyLoss()
    steps["liger"] = _torch_step("liger", h, w, t, lambda a, b, t: liger(b, a, t))   # (lin_weight, input, target)
    return steps


def cuda_memory(step: Callable[[], Any]) -> tuple[int, float]:
    """(peak bytes the caching allocator held above what was allocated before the step, the loss)."""
    import torch

    step()                                                                     # warm: kernels, autotuning
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    result = step()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - before, float(result[0])


def _synced(step: Callable[[], Any]) -> Callable[[], Any]:
    import torch

    def run() -> Any:
        torch.cuda.synchronize()
        out = step()
        torch.cuda.synchronize()
        return out
    return run


# -- driver --------------------------------------------------------------------------------------

PATHS = ("fused", "eager")


def _time(steps: dict[str, Callable[[], Any]], rounds: int) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {k: [] for k in steps}
    for _ in range(rounds):
        for name, step in steps.items():
            t0 = time.perf_counter()
            step()
            times[name].append(time.perf_counter() - t0)
    return times


def _report(backend: str, mem: dict[str, tuple[int, float]], times: dict[str, list[float]]) -> None:
    print(f"\n{backend}: peak extra memory (forward + backward, outputs included)")
    for name, (peak, loss) in mem.items():
        print(f"  {name:6s} {peak / 2**20:9.1f} MiB   loss {loss:.6f}")
    for ref in (r for r in mem if r != "fused"):
        print(f"  fused / {ref} memory: {mem['fused'][0] / mem[ref][0]:.3f}")
    print(f"{backend}: forward + backward time, {len(times['fused'])} interleaved rounds")
    for name, ts in times.items():
        print(f"  {name:6s} best {min(ts):7.3f} s   median {statistics.median(ts):7.3f} s")
    for ref in (r for r in times if r != "fused"):
        print(f"  {ref} / fused (best): {min(times[ref]) / min(times['fused']):.2f}   "
              f"(median): {statistics.median(times[ref]) / statistics.median(times['fused']):.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--vocab", type=int, default=50257)
    ap.add_argument("--dim", type=int, default=768)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--backend", choices=("torch", "numpy", "both", "cuda"), default="both",
                    help="both: torch and numpy on the CPU; cuda: torch on the GPU beside Liger-Kernel")
    a = ap.parse_args()
    n, v, d = a.tokens, a.vocab, a.dim
    print(f"N={n} tokens, V={v}, D={d}, float32; the logits alone: {n * v * 4 / 2**30:.2f} GiB")
    if a.backend in ("torch", "both"):
        import torch

        print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
        mem = {p: torch_memory(p, n, v, d) for p in PATHS}
        h, w, t = (torch.from_numpy(x) for x in _inputs(n, v, d))
        _report("torch", mem, _time({p: _torch_step(p, h, w, t) for p in PATHS}, a.rounds))
    if a.backend == "cuda":
        import torch

        print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}")
        h, w, t = (torch.from_numpy(x).cuda() for x in _inputs(n, v, d))
        steps = _cuda_steps(h, w, t)
        mem = {p: cuda_memory(step) for p, step in steps.items()}
        _report("cuda", mem, _time({p: _synced(step) for p, step in steps.items()}, a.rounds))
    if a.backend in ("numpy", "both"):
        h, w, t = _inputs(n, v, d)
        mem = {p: numpy_memory(p, h, w, t) for p in PATHS}
        _report("numpy", mem, _time({p: _numpy_step(p, h, w, t) for p in PATHS}, a.rounds))


if __name__ == "__main__":
    main()
