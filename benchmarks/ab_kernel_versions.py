"""A/B: the embedding forward kernel of another git revision beside the current one, in ONE process.

Usage: python benchmarks/ab_kernel_versions.py REV [reps] [--cpu]

REV's ``kernels/_forward.py`` and ``kernels/embedding.py`` are taken with ``git show`` into a
temporary directory and imported under other names (their helpers, ``_prefetch``/``_rng``/
``_stream``, come from the current tree: this compares the forward cores and their wrappers).
Both run interleaved, each timed after a 20 ms settle and one untimed call; ``--cpu`` times
process CPU seconds (run it with NUMBA_NUM_THREADS=1). Prints new / old speed, best / median.
"""

from __future__ import annotations

import importlib
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from tokenpos.kernels.embedding import embedding_forward as new

V, D, B, L = 50257, 768, 16, 512


def load_old(rev: str):
    root = Path(subprocess.run(["git", "rev-parse", "--show-toplevel"], capture_output=True, text=True,
                               check=True).stdout.strip())
    tmp = Path(tempfile.mkdtemp(prefix="tokenpos_ab_"))
    for name in ("_forward", "embedding"):
        src = subprocess.run(["git", "show", f"{rev}:src/tokenpos/kernels/{name}.py"], cwd=root,
                             capture_output=True, text=True, check=True).stdout
        src = src.replace("from tokenpos.kernels._forward import", "from old_forward import")
        (tmp / f"old{name if name.startswith('_') else '_' + name}.py").write_text(src)
    sys.path.insert(0, str(tmp))
    return importlib.import_module("old_embedding").embedding_forward


def main(rev: str, reps: int, cpu: bool) -> None:
    old = load_old(rev)
    rng = np.random.default_rng(0)
    W = rng.standard_normal((V, D), dtype=np.float32)
    P = rng.standard_normal((L, D), dtype=np.float32)
    Wb = torch.from_numpy(W).bfloat16().view(torch.int16).numpy().view(np.uint16)
    Pb = torch.from_numpy(P).bfloat16().view(torch.int16).numpy().view(np.uint16)
    batches = [rng.integers(0, V, (B, L)) for _ in range(4)]
    pos = np.arange(L)
    of, ob = np.empty((B, L, D), np.float32), np.empty((B, L, D), np.uint16)
    clock = time.process_time if cpu else time.perf_counter
    impls = {}
    for tag, fn in (("old", old), ("new", new)):
        impls[f"{tag} fp32"] = lambda i, fn=fn: fn(W, batches[i % 4], scale=27.7, pos_table=P, pos_ids=pos, out=of)
        impls[f"{tag} dropout"] = lambda i, fn=fn: fn(W, batches[i % 4], scale=27.7, pos_table=P, pos_ids=pos,
                                                      out=of, dropout_p=0.1, seed=i + 1)
        impls[f"{tag} bf16"] = lambda i, fn=fn: fn(Wb, batches[i % 4], scale=27.7, pos_table=Pb, pos_ids=pos,
                                                   out=ob, bf16=True)
    for f in impls.values():
        f(0)
    times: dict[str, list[float]] = {k: [] for k in impls}
    order = np.random.default_rng(1)
    for r in range(reps):
        for name in order.permutation(list(impls)):
            f = impls[str(name)]
            time.sleep(0.02)
            f(r)
            t0 = clock()
            f(r + 1)
            times[str(name)].append(clock() - t0)
    for case in ("fp32", "dropout", "bf16"):
        a, b = times[f"old {case}"], times[f"new {case}"]
        print(f"{case:8s} old {min(a) * 1e3:6.2f} / {np.median(a) * 1e3:6.2f} ms   new {min(b) * 1e3:6.2f} / "
              f"{np.median(b) * 1e3:6.2f} ms   new/old speed {min(a) / min(b):.3f} / {np.median(a) / np.median(b):.3f}")


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a != "--cpu"]
    main(args[0], int(args[1]) if len(args) > 1 else 30, "--cpu" in sys.argv)
