"""Host (Python) time per call of the public layers, with the compiled kernel stubbed out.

What it answers: how much time a call spends in tokenpos's own Python (checks, plan, op entry,
output allocation) around the kernel. The numba core is replaced by a stub that writes nothing, so
what is left is the path a GPU user pays on the host per call too (issue 27: "the Python time per
call of the torch layer goes down"; issue 34's budget). Run the same script on two checkouts to
compare them (``PYTHONPATH=/path/to/other/src python benchmarks/experiments/exp_host_time.py``).

    python benchmarks/experiments/exp_host_time.py            # full (about 20 s)
    python benchmarks/experiments/exp_host_time.py --quick    # a smoke run

Prints one line per case: median and best microseconds per call over interleaved rounds. The
case "eval, range check stubbed" also stubs the boundary's one reduction over the ids
(``torch._checks._outside``): the difference to "eval" is what checking the ids' values costs.
The RoPE cases stub the numba RoPE core too; with liger-kernel installed, Liger's
``liger_rotary_pos_emb`` runs beside them with its Triton launch stubbed, at a decode step's size
(issue 34's budget: tokenpos's RotaryEmbedding call at most 1.5x Liger's host time).
"""

from __future__ import annotations

import argparse
import logging
import statistics
import time
from collections.abc import Callable

import numpy as np
import torch

import tokenpos
import tokenpos.kernels.embedding as kernel_module  # the module whose core is stubbed
import tokenpos.kernels.rope as rope_module  # the module whose RoPE core is stubbed
import tokenpos.numpy as tpn
import tokenpos.torch as tpt
import tokenpos.torch._checks as checks_module  # the module whose range check one case stubs


def _stub_core(*args: object) -> int:
    return 0                                             # "no bad rows", nothing written


def _no_bad_values(*args: object) -> None:
    return None                                          # "every value inside its range", nothing read


def _cases(quick: bool) -> dict[str, tuple[Callable[[], None], bool]]:
    """name -> (one call, whether autograd is on around it). The inference cases run with autograd off
    around the whole timed loop, as a model's forward runs under one ``torch.no_grad()``: until
    2026-11-27 each call entered its own ``no_grad`` context, 1.5 us of the harness's in every number."""
    V, D, P = 50257, 768, 1024
    ids_np = np.random.default_rng(0).integers(0, V, (4, 128))
    ids_t = torch.from_numpy(ids_np)
    t_eval = tpt.TransformerEmbedding(V, D, P, seed=0).eval()
    t_train = tpt.TransformerEmbedding(V, D, P, dropout=0.1, seed=0).train()
    n_eval = tpn.TransformerEmbedding(V, D, P, seed=0).eval()
    rope = tpt.RotaryEmbedding(64, max_seq_len=P)
    q, k = torch.randn(4, 12, 128, 64), torch.randn(4, 12, 128, 64)
    # a decode step of a Llama-style model (one token, GQA): the data is a few KB, the call is host time
    llama = tpt.RotaryEmbedding(128, max_seq_len=4096)
    qd, kd = torch.randn(1, 32, 1, 128), torch.randn(1, 8, 1, 128)
    cos_hf, sin_hf = torch.randn(1, 1, 128), torch.randn(1, 1, 128)     # HF's (B, L, Dh) cache rows

    def torch_eval() -> None:
        t_eval(ids_t)

    def torch_eval_unchecked() -> None:
        real = checks_module._outside
        checks_module._outside = _no_bad_values
        try:
            t_eval(ids_t)
        finally:
            checks_module._outside = real

    def torch_train() -> None:
        t_train(ids_t)

    def numpy_eval() -> None:
        n_eval(ids_np)

    def torch_rope() -> None:
        rope.apply(q, k)

    def torch_rope_decode() -> None:
        llama.apply(qd, kd, start_pos=100)

    cases = {"torch TransformerEmbedding eval": (torch_eval, False),
             "torch TransformerEmbedding eval, range check stubbed": (torch_eval_unchecked, False),
             "torch TransformerEmbedding train p=0.1": (torch_train, True),
             "numpy TransformerEmbedding eval": (numpy_eval, False),
             "torch RotaryEmbedding.apply B4 H12 L128 Dh64": (torch_rope, False),
             "torch RotaryEmbedding.apply, decode": (torch_rope_decode, False)}
    liger = _liger_stubbed()
    if liger is not None:
        def liger_decode() -> None:
            liger(qd, kd, cos_hf, sin_hf)
        cases["liger_rotary_pos_emb, decode"] = (liger_decode, False)
    return cases


def _liger_stubbed() -> object:
    """Liger-Kernel's ``liger_rotary_pos_emb`` with its Triton launch stubbed (``_triton_rope[grid](...)``
    does nothing): its host time on the same machine. None when liger-kernel is not installed."""
    try:
        import liger_kernel.ops.rope as liger_ops
        from liger_kernel.transformers.rope import liger_rotary_pos_emb
    except ImportError:
        return None

    class _NoLaunch:
        def __getitem__(self, grid: object) -> object:
            return lambda *args, **kwargs: None

    liger_ops._triton_rope = _NoLaunch()
    logging.getLogger("liger_kernel").setLevel(logging.ERROR)    # its GPU backends that cannot load here
    return liger_rotary_pos_emb


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="few calls, for a smoke run")
    args = parser.parse_args()
    calls, rounds = (50, 3) if args.quick else (400, 15)
    real = (kernel_module.forward_core, kernel_module.forward_core_serial, rope_module._rope_core)
    kernel_module.forward_core = kernel_module.forward_core_serial = rope_module._rope_core = _stub_core
    try:
        cases = _cases(args.quick)
        for fn, grad in cases.values():                  # warm: numba, caches, allocator
            with torch.set_grad_enabled(grad):
                for _ in range(20):
                    fn()
        times: dict[str, list[float]] = {name: [] for name in cases}
        order = list(cases)
        rng = np.random.default_rng(0)
        for _ in range(rounds):
            rng.shuffle(order)
            for name in order:
                fn, grad = cases[name]
                with torch.set_grad_enabled(grad):
                    t0 = time.perf_counter()
                    for _ in range(calls):
                        fn()
                    times[name].append((time.perf_counter() - t0) / calls * 1e6)
    finally:
        kernel_module.forward_core, kernel_module.forward_core_serial, rope_module._rope_core = real
    print(f"tokenpos {tokenpos.__file__}")
    for name, ts in times.items():
        print(f"{name:58s} median {statistics.median(ts):7.1f} us  best {min(ts):7.1f} us")
    ours, theirs = "torch RotaryEmbedding.apply, decode", "liger_rotary_pos_emb, decode"
    if theirs in times:
        print(f"RoPE decode, tokenpos / Liger (budget <= 1.5): median "
              f"{statistics.median(times[ours]) / statistics.median(times[theirs]):.2f}, "
              f"best {min(times[ours]) / min(times[theirs]):.2f}")


if __name__ == "__main__":
    main()
