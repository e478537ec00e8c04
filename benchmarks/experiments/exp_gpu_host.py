"""Host time per call on a GPU machine: what each piece of a layer call costs the CPU that launches it.

What it answers: at a decode step's size (the GPU's work is a few KB, so the host is the bottleneck),
how many microseconds of host time each call takes: one trivial torch op (the cost of one launch
through torch), the boundary's device-side id check, the Triton kernel API, the layers in eval and
training, eager torch and Liger's RoPE. Each case runs N calls back to back, then one
synchronize; time / N is the host's time per call when it exceeds the GPU's (rows interleaved,
median and best over rounds). Then torch.profiler's table of host time by op for the
``TransformerEmbedding`` eval call.

    python benchmarks/experiments/exp_gpu_host.py [--profile PATH]      # CUDA only
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from collections.abc import Callable

import torch


def cases() -> dict[str, Callable[[], object]]:
    import tokenpos.torch as tpt
    from tokenpos.kernels.triton import embedding_forward, rope_qk
    from tokenpos.torch._checks import _assert_on_device

    V, D, P = 50257, 4096, 4096
    g = torch.Generator(device="cpu").manual_seed(0)
    ids = torch.randint(0, V, (4, 1), generator=g).cuda()
    pos = torch.full((1,), P - 1, device="cuda")
    t_eval = tpt.TransformerEmbedding(V, D, P, seed=0, device="cuda", dtype=torch.bfloat16).eval()
    t_train = tpt.TransformerEmbedding(V, D, P, dropout=0.1, seed=0, device="cuda", dtype=torch.bfloat16).train()
    token = tpt.TokenEmbedding(V, D, seed=0, device="cuda", dtype=torch.bfloat16)
    w, table = t_eval.token.weight.detach(), t_eval.position.weight.detach()
    seed = torch.zeros((), dtype=torch.int64, device="cuda")
    rope = tpt.RotaryEmbedding(128, max_seq_len=P).cuda()
    q = torch.randn(4, 32, 1, 128, generator=g).to("cuda", torch.bfloat16)
    k = torch.randn(4, 8, 1, 128, generator=g).to("cuda", torch.bfloat16)
    cos = torch.randn(1, 64, generator=g).cuda()
    sin = torch.randn(1, 64, generator=g).cuda()
    cos_hf = torch.randn(1, 1, 128, generator=g).to("cuda", torch.bfloat16)
    sin_hf = torch.randn(1, 1, 128, generator=g).to("cuda", torch.bfloat16)
    scale = math.sqrt(D)

    def no_grad(fn: Callable[[], object]) -> Callable[[], object]:
        def run() -> object:
            with torch.no_grad():
                return fn()
        return run

    out = {
        "one torch op (ones_like)": lambda: torch.ones_like(ids),
        "id check (device-side assert)": lambda: _assert_on_device(ids, V, "token ids"),
        "Triton embedding_forward (kernel API)": lambda: embedding_forward(w, ids, table, pos, scale, 0.0, seed),
        "eager F.embedding * scale + table[pos]": no_grad(lambda: torch.nn.functional.embedding(ids, w) * scale
                                                          + table[pos]),
        "TokenEmbedding eval": no_grad(lambda: token(ids)),
        "TransformerEmbedding eval": no_grad(lambda: t_eval(ids, start_pos=P - 1)),
        "TransformerEmbedding train p=0.1 (forward)": lambda: t_train(ids, start_pos=P - 1),
        "Triton rope_qk (kernel API)": lambda: rope_qk(q, k, cos, sin, False),
        "RotaryEmbedding.apply decode": no_grad(lambda: rope.apply(q, k, start_pos=P - 1)),
    }
    try:
        from liger_kernel.transformers.rope import liger_rotary_pos_emb
        out["liger_rotary_pos_emb decode"] = no_grad(lambda: liger_rotary_pos_emb(q, k, cos_hf, sin_hf))
    except ImportError:
        pass
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default=None, help="write torch.profiler's table here")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("exp_gpu_host: needs CUDA", file=sys.stderr)
        return 2
    cs = cases()
    for fn in cs.values():
        for _ in range(20):
            fn()
    torch.cuda.synchronize()
    calls, rounds = 200, 9
    times: dict[str, list[float]] = {name: [] for name in cs}
    for r in range(rounds):
        for name in (list(cs) if r % 2 == 0 else list(reversed(cs))):
            fn = cs[name]
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            torch.cuda.synchronize()
            times[name].append((time.perf_counter() - t0) / calls * 1e6)
    print(f"{torch.cuda.get_device_name()}; torch {torch.__version__}; {calls} calls x {rounds} rounds")
    for name, ts in times.items():
        print(f"{name:48s} median {statistics.median(ts):7.1f} us  best {min(ts):7.1f} us")
    if args.profile:
        from torch.profiler import ProfilerActivity, profile
        with open(args.profile, "w") as f:
            for name in ("TransformerEmbedding eval", "TransformerEmbedding train p=0.1 (forward)"):
                fn = cs[name]
                with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                    for _ in range(100):
                        fn()
                    torch.cuda.synchronize()
                f.write(f"== {name}, 100 calls\n")
                f.write(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
