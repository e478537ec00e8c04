"""tokenpos.torch.hf.patch(model) against the same HF Llama-style model unpatched, in one run, on the CPU.

Usage:
    python benchmarks/hf_patch_bench.py [--rounds N] [--threads T] [--quick]

One random ``LlamaForCausalLM`` (hidden 512, 8 heads, 4 layers, vocab 32000, float32, eval, no grad),
patched and unpatched in turn inside each round (interleaved, so drift hits both alike):

- prefill: ``model(ids)`` with ids (4, 512);
- decode: 64 one-token steps with a KV cache after a 64-token prompt (4 rows), as ``generate`` runs them.

For each: best and median over rounds, the ratio unpatched / patched (> 1: patched is faster), the
same ratio round by round (both models run in every round: its median and a 95 % bootstrap interval,
``analysis.bench_timing.paired_ratio``), and the
share of the wall time spent in RoPE (the ``apply_rotary_pos_emb`` the attention calls, HF's or
tokenpos's, timed by a wrapper in the globals it is read from: :func:`rope_scopes`) and in the input
embedding (a forward pre/post hook pair), measured in separate timing rounds so the wrappers do not
touch the main numbers. Logits of the two agree (checked once).

    python benchmarks/hf_patch_bench.py --train [--steps N]

One training step (forward + backward, labels given) of a ``LlamaForCausalLM`` (hidden 256, 1 layer, 4
heads, tied head, float32) on 2 x 2,048 tokens at vocab 32,000 and 128,256, unpatched against
``patch(model, loss=True)``: each case in its own process (:func:`train_case`), which reports its peak
RSS (``ru_maxrss``), the RSS before the first step, the step's peak above it, and the best of ``--steps``
timed steps after a warm-up one; the loss of the two agree (printed). Liger-Kernel's
``apply_liger_kernel_to_llama(fused_linear_cross_entropy=True)`` joins when it is installed.
"""

from __future__ import annotations

import argparse
import inspect
import json
import resource
import statistics
import subprocess
import sys
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch


def _model(quick: bool) -> Any:
    import transformers

    cfg = transformers.LlamaConfig(vocab_size=32000, hidden_size=512, intermediate_size=1376,
                                   num_hidden_layers=2 if quick else 4, num_attention_heads=8, num_key_value_heads=8,
                                   max_position_embeddings=2048, attn_implementation="sdpa")
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return transformers.LlamaForCausalLM(cfg).eval()


def _prefill(model: Any, ids: torch.Tensor) -> Callable[[], Any]:
    return lambda: model(ids).logits


def _decode(model: Any, prompt: torch.Tensor, steps: int) -> Callable[[], Any]:
    import inspect

    # transformers 5.24 renamed the KV cache argument and output to ``cache`` (``past_key_values`` before)
    name = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"

    def run() -> Any:
        out = model(prompt, use_cache=True)
        cache, tok = out[name], out.logits[:, -1:].argmax(-1)
        for _ in range(steps):
            out = model(tok, use_cache=True, **{name: cache})
            cache, tok = out[name], out.logits[:, -1:].argmax(-1)
        return tok
    return run


ROPE = "apply_rotary_pos_emb"


def rope_scopes(model: Any) -> list[dict[str, Any]]:
    """The globals in which ``model``'s attention modules look up ``apply_rotary_pos_emb``, one per
    distinct dict: the modeling module's own (HF), or the patched forwards' copy (``patch`` gives
    each patched model's attention a forward of its own, the module itself unchanged)."""
    scopes: dict[int, dict[str, Any]] = {}
    for m in model.modules():
        if type(m).__name__.endswith("Attention"):
            scope = inspect.unwrap(m.forward.__func__).__globals__
            scopes[id(scope)] = scope
    return list(scopes.values())


class _Shares:
    """Seconds spent in the RoPE function and the input embedding while installed."""

    def __init__(self, model: Any) -> None:
        self.model, self.rope, self.emb = model, 0.0, 0.0

    def __enter__(self) -> _Shares:
        self.saved = [(scope, scope[ROPE]) for scope in rope_scopes(self.model)]
        for scope, inner in self.saved:
            scope[ROPE] = self._timed(inner)
        emb = self.model.get_input_embeddings()
        self.hooks = (emb.register_forward_pre_hook(lambda m, a: setattr(self, "_t", time.perf_counter())),
                      emb.register_forward_hook(lambda m, a, o: setattr(self, "emb", self.emb + time.perf_counter()
                                                                        - self._t)))
        return self

    def _timed(self, inner: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*a: Any, **k: Any) -> Any:
            t = time.perf_counter()
            out = inner(*a, **k)
            self.rope += time.perf_counter() - t
            return out
        return timed

    def __exit__(self, *exc: Any) -> None:
        for scope, inner in self.saved:
            scope[ROPE] = inner
        for h in self.hooks:
            h.remove()


TRAIN_VOCABS = (32000, 128256)
TRAIN_VARIANTS = ("hf", "tokenpos", "liger")


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def train_case(vocab: int, variant: str, steps: int) -> dict[str, Any]:
    """One process's case: build, (patch), one warm-up step and ``steps`` timed forward + backward steps."""
    import transformers

    cfg = transformers.LlamaConfig(vocab_size=vocab, hidden_size=256, intermediate_size=688, num_hidden_layers=1,
                                   num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=2048,
                                   tie_word_embeddings=True, attn_implementation="sdpa")
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if variant == "liger":
            from liger_kernel.transformers import apply_liger_kernel_to_llama

            apply_liger_kernel_to_llama(fused_linear_cross_entropy=True)
        model = transformers.LlamaForCausalLM(cfg).train()
    if variant == "tokenpos":
        from tokenpos.torch.hf import patch

        patch(model, loss=True)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, vocab, (2, 2048), generator=g)
    before = _rss_bytes()
    times, loss = [], 0.0
    for i in range(steps + 1):
        model.zero_grad(set_to_none=True)
        t = time.perf_counter()
        out = model(input_ids=ids, labels=ids)
        out.loss.backward()
        if i:
            times.append(time.perf_counter() - t)
        loss = float(out.loss.detach())
        del out
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024      # kB on Linux
    return {"vocab": vocab, "variant": variant, "peak": peak, "before": before, "step_peak": peak - before,
            "best_s": min(times), "loss": loss}


def train_main(steps: int) -> None:
    """Each (vocab, variant) of :func:`train_case` in a fresh process; prints the table."""
    try:
        import liger_kernel  # noqa: F401
        variants = TRAIN_VARIANTS
    except ImportError:
        variants = TRAIN_VARIANTS[:2]
        print("liger-kernel is not installed: its fused linear cross-entropy is not measured")
    rows = []
    for vocab in TRAIN_VOCABS:
        for variant in variants:
            out = subprocess.run([sys.executable, __file__, "--train-case", str(vocab), variant, "--steps", str(steps)],
                                 check=True, capture_output=True, text=True).stdout
            rows.append(json.loads(out.strip().splitlines()[-1]))
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, 2 x 2048 tokens, hidden 256, 1 layer, "
          f"best of {steps} steps")
    print(f"{'vocab':>7} {'model':<9} {'peak RSS MB':>11} {'step peak MB':>12} {'mem vs hf':>9} {'step s':>7} "
          f"{'hf/ours':>7} {'loss':>10}")
    for r in rows:
        ref = next(x for x in rows if x["vocab"] == r["vocab"] and x["variant"] == "hf")
        print(f"{r['vocab']:>7} {r['variant']:<9} {r['peak'] / 2**20:11.0f} {r['step_peak'] / 2**20:12.0f} "
              f"{r['peak'] / ref['peak']:9.3f} {r['best_s']:7.2f} {ref['best_s'] / r['best_s']:7.2f} {r['loss']:10.6f}")


def main() -> None:
    if "--train-case" in sys.argv or "--train" in sys.argv:
        ap = argparse.ArgumentParser()
        ap.add_argument("--train", action="store_true")
        ap.add_argument("--train-case", nargs=2, metavar=("VOCAB", "VARIANT"))
        ap.add_argument("--steps", type=int, default=3)
        a = ap.parse_args()
        if a.train_case:
            print(json.dumps(train_case(int(a.train_case[0]), a.train_case[1], a.steps)))
        else:
            train_main(a.steps)
        return
    from tokenpos.analysis.bench_timing import paired_ratio
    from tokenpos.torch.hf import patch, unpatch

    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--quick", action="store_true", help="2 layers, L=128, 16 decode steps")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    model = _model(args.quick)
    g = torch.Generator().manual_seed(1)
    L, steps = (128, 16) if args.quick else (512, 64)
    ids = torch.randint(0, 32000, (4, L), generator=g)
    prompt = ids[:, :64]
    work = {f"prefill B=4 L={L}": lambda: _prefill(model, ids),
            f"decode {steps} steps B=4": lambda: _decode(model, prompt, steps)}
    with torch.no_grad():
        want = model(ids[:, :64]).logits
        patch(model)
        diff = float((model(ids[:, :64]).logits - want).abs().max())
        unpatch(model)
        for fn in work.values():                                     # warm up both (numba JIT, allocator)
            fn()()
            patch(model)
            fn()()
            unpatch(model)
        times: dict[tuple[str, str], list[float]] = {}
        shares: dict[tuple[str, str], tuple[float, float, float]] = {}
        for r in range(args.rounds + 1):
            # the order alternates by round, so neither model always runs first (after the other's work)
            for variant in (("hf", "tokenpos") if r % 2 == 0 else ("tokenpos", "hf")):
                if variant == "tokenpos":
                    patch(model)
                for name, fn in work.items():
                    run = fn()
                    if r == args.rounds:                                 # the last round: timed shares
                        with _Shares(model) as s:
                            t = time.perf_counter()
                            run()
                            total = time.perf_counter() - t
                        shares[(name, variant)] = (total, s.rope, s.emb)
                    else:
                        t = time.perf_counter()
                        run()
                        times.setdefault((name, variant), []).append(time.perf_counter() - t)
                if variant == "tokenpos":
                    unpatch(model)
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, rounds {args.rounds}, "
          f"max |logits diff| {diff:.2e}")
    print(f"{'workload':<22} {'model':<9} {'best ms':>9} {'median ms':>10} {'hf/ours':>8} {'rope %':>7} {'emb %':>6}")
    for name in work:
        ref = statistics.median(times[(name, "hf")])
        for variant in ("hf", "tokenpos"):
            ts = times[(name, variant)]
            total, rope, emb = shares[(name, variant)]
            print(f"{name:<22} {variant:<9} {1e3 * min(ts):9.1f} {1e3 * statistics.median(ts):10.1f} "
                  f"{ref / statistics.median(ts):8.2f} {100 * rope / total:7.1f} {100 * emb / total:6.1f}")
    for name in work:
        med, lo, hi = paired_ratio(times[(name, "hf")], times[(name, "tokenpos")])
        print(f"{name}: hf / tokenpos round by round, median {med:.3f} [95 % interval {lo:.3f}, {hi:.3f}]")


if __name__ == "__main__":
    main()
