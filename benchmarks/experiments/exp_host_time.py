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
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

import tokenpos
import tokenpos.kernels.embedding as kernel_module  # the module whose core is stubbed
import tokenpos.numpy as tpn
import tokenpos.torch as tpt
import tokenpos.torch._checks as checks_module  # the module whose range check one case stubs


def _stub_core(*args: object) -> int:
    return 0                                             # "no bad rows", nothing written


def _no_bad_values(*args: object) -> None:
    return None                                          # "every value inside its range", nothing read


def _cases(quick: bool) -> dict[str, object]:
    V, D, P = 50257, 768, 1024
    ids_np = np.random.default_rng(0).integers(0, V, (4, 128))
    ids_t = torch.from_numpy(ids_np)
    t_eval = tpt.TransformerEmbedding(V, D, P, seed=0).eval()
    t_train = tpt.TransformerEmbedding(V, D, P, dropout=0.1, seed=0).train()
    n_eval = tpn.TransformerEmbedding(V, D, P, seed=0).eval()
    rope = tpt.RotaryEmbedding(64, max_seq_len=P)
    q, k = torch.randn(4, 12, 128, 64), torch.randn(4, 12, 128, 64)

    def torch_eval() -> None:
        with torch.no_grad():
            t_eval(ids_t)

    def torch_eval_unchecked() -> None:
        real = checks_module._outside
        checks_module._outside = _no_bad_values
        try:
            with torch.no_grad():
                t_eval(ids_t)
        finally:
            checks_module._outside = real

    def torch_train() -> None:
        t_train(ids_t)

    def numpy_eval() -> None:
        n_eval(ids_np)

    def torch_rope() -> None:
        with torch.no_grad():
            rope.apply(q, k)

    return {"torch TransformerEmbedding eval": torch_eval,
            "torch TransformerEmbedding eval, range check stubbed": torch_eval_unchecked,
            "torch TransformerEmbedding train p=0.1": torch_train,
            "numpy TransformerEmbedding eval": numpy_eval, "torch RotaryEmbedding.apply (rope kernel not stubbed)":
            torch_rope}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="few calls, for a smoke run")
    args = parser.parse_args()
    calls, rounds = (50, 3) if args.quick else (400, 15)
    real = (kernel_module.forward_core, kernel_module.forward_core_serial)
    kernel_module.forward_core = kernel_module.forward_core_serial = _stub_core
    try:
        cases = _cases(args.quick)
        for fn in cases.values():                        # warm: numba, caches, allocator
            for _ in range(20):
                fn()  # type: ignore[operator]
        times: dict[str, list[float]] = {name: [] for name in cases}
        order = list(cases)
        rng = np.random.default_rng(0)
        for _ in range(rounds):
            rng.shuffle(order)
            for name in order:
                fn = cases[name]
                t0 = time.perf_counter()
                for _ in range(calls):
                    fn()  # type: ignore[operator]
                times[name].append((time.perf_counter() - t0) / calls * 1e6)
    finally:
        kernel_module.forward_core, kernel_module.forward_core_serial = real
    print(f"tokenpos {tokenpos.__file__}")
    for name, ts in times.items():
        print(f"{name:58s} median {statistics.median(ts):7.1f} us  best {min(ts):7.1f} us")


if __name__ == "__main__":
    main()
