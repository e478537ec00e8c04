"""Where a patched HF model's decode step spends its RoPE and embedding time, call by call, inside the model.

Usage: python benchmarks/experiments/exp_hf_decode_calls.py [--steps N] [--quick]

``benchmarks/hf_patch_bench.py`` times whole decode loops; this script times each call of the two
patched pieces *inside* that loop (64 one-token steps after a 64-token prompt, B=4, the bench's
Llama: hidden 512, 8 heads, 4 layers), where every call runs right after torch's ops with cold
caches, and splits tokenpos's calls into their parts with timing wrappers:

- RoPE: HF's ``apply_rotary_pos_emb`` against tokenpos's replacement, and in the latter the table
  slicing (``_op_tables``), the op entry (``rotate_qk``), the compiled pass (``run_rope``), the output
  allocation (``cpu_empty``, two per call);
- the input embedding: ``nn.Embedding`` against ``SharedTokenEmbedding``, and in the latter the ids'
  dtype check (``index_tensor``), a small call's torch gather (``formula``), or the op's implementation
  (``forward_impl``), the output allocation and the kernel entry (``forward_rows``) of a larger one.

Prints the median and best microseconds per call (the second half of the calls: the prompt's are
left out). Wraps internals: run it against the commit it came with.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # benchmarks/: the bench's model and decode loop
import hf_patch_bench as bench  # noqa: E402

from tokenpos.torch.hf import patch, unpatch  # noqa: E402

PARTS = {   # module -> the functions of it timed inside tokenpos's calls (names as that module binds them)
    "tokenpos.torch.hf.rope_helpers": ("_op_tables", "rotate_qk"),
    "tokenpos.torch.ops.rope": ("run_rope", "cpu_empty"),
    "tokenpos.torch.token": ("index_tensor",),
    "tokenpos.torch.ops.entry": ("formula", "forward_impl"),
    "tokenpos.torch.ops.embedding": ("forward_rows", "cpu_empty"),
}


def _timed(fn: Callable[..., Any], log: list[int]) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter_ns()
        try:
            return fn(*args, **kwargs)
        finally:
            log.append(time.perf_counter_ns() - t0)
    return wrapper


def _run(model: Any, prompt: torch.Tensor, steps: int, variant: str, times: dict[str, list[int]],
         parts: bool = False) -> None:
    """One decode loop of ``variant`` ("hf" / "tokenpos"), the RoPE function and the embedding timed
    per call; with ``parts`` (tokenpos only) its internals too, and the calls under another name (the
    parts' wrappers cost time of their own)."""

    saved: list[tuple[Any, str, Any]] = []

    def wrap(owner: Any, name: str, key: str) -> None:
        saved.append((owner, name, getattr(owner, name)))
        setattr(owner, name, _timed(getattr(owner, name), times[key]))

    if variant == "tokenpos":
        patch(model)
    label = f"{variant}, parts timed" if parts else variant
    for scope in bench.rope_scopes(model):       # where the attention reads it: HF's module, or the patched copy
        saved.append((scope, bench.ROPE, scope[bench.ROPE]))
        scope[bench.ROPE] = _timed(scope[bench.ROPE], times[f"{label}: RoPE call"])
    emb = model.get_input_embeddings()
    wrap(emb, "forward", f"{label}: embedding call")
    if parts:
        for mod_name, names in PARTS.items():
            mod = importlib.import_module(mod_name)
            for name in names:
                wrap(mod, name, f"  {mod_name.rsplit('.', 1)[-1]}.{name}")
    try:
        bench._decode(model, prompt, steps)()
    finally:
        for owner, name, fn in reversed(saved):
            if owner is emb:
                del emb.forward                  # back to the class's method
            elif isinstance(owner, dict):
                owner[name] = fn
            else:
                setattr(owner, name, fn)
        if variant == "tokenpos":
            unpatch(model)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=64, help="decode steps (default 64)")
    ap.add_argument("--quick", action="store_true", help="2 layers, 8 steps: checks that it runs")
    args = ap.parse_args(argv)
    steps = 8 if args.quick else args.steps
    model = bench._model(args.quick)
    prompt = torch.randint(0, 32000, (4, 64), generator=torch.Generator().manual_seed(1))
    times: dict[str, list[int]] = defaultdict(list)
    with torch.no_grad():
        for variant in ("hf", "tokenpos"):                       # warm: numba, allocator
            _run(model, prompt, steps, variant, defaultdict(list))
        for variant in ("hf", "tokenpos", "tokenpos", "hf"):
            _run(model, prompt, steps, variant, times)
        _run(model, prompt, steps, "tokenpos", times, parts=True)   # the parts, in a loop of their own
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; decode {steps} steps, B=4, "
          f"{model.config.num_hidden_layers} layers; per call, microseconds")
    for key, ns in times.items():
        us = np.asarray(ns[len(ns) // 2:]) / 1e3
        if us.size:                                      # (a part this call did not reach: no row)
            print(f"{key:44s} calls {us.size:5d}  median {np.median(us):7.1f}  best {us.min():7.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
