"""The vocab-parallel hashed n-gram lookup's work per rank on the CPU
(``tokenpos.torch.distributed.VocabParallelHashedNgramEmbedding``): its forward at W = 1 (a one-process gloo group)
against the one-process ``HashedNgramEmbedding`` of the same table, and the shard lookup one rank of W = 2 and 4
runs (``ops.ngram.ngram_lookup`` with ``row_start``: the fused kernel reading only the rank's rows, zeros for the
others; the all-reduce not included).

Usage:
    python benchmarks/ngram_shard_bench.py [--V 65536] [--B 4] [--L 1024] [--reps 100] [--threads 1]

One process; each call right after a torch matmul (caches holding another op's data), the calls interleaved in a
shuffled order, timed by the calling thread's CPU time (``time.thread_time``: on a shared machine, what the other
processes take is not counted) at ``--threads 1``, by the wall clock above. Prints median and best ms per row.
Shapes: the reference's settings (max_ngram_size 3, 8 heads per n, 512 per n: K = 16, Dh = 64), ``V`` rows per n.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for key, default in (("V", 1 << 16), ("B", 4), ("L", 1024), ("reps", 100), ("threads", 1)):
        ap.add_argument(f"--{key}", type=int, default=default)
    args = ap.parse_args()

    import numba
    import torch
    import torch.distributed as dist

    import tokenpos.torch as tpt
    from tokenpos.analysis.bench_timing import machine
    from tokenpos.torch.distributed import VocabParallelHashedNgramEmbedding
    from tokenpos.torch.ops.ngram import ngram_lookup

    numba.set_num_threads(args.threads)
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        dist.init_process_group("gloo", init_method=f"file://{os.path.join(tmp, 'rdzv')}", rank=0, world_size=1)
        try:
            rng = np.random.default_rng(0)
            old_vocab = 129280
            lookup = np.unique(rng.integers(0, old_vocab * 3 // 4, old_vocab), return_inverse=True)[1]
            settings = dict(engram_vocab_size=[args.V] * 2, max_ngram_size=3, n_embed_per_ngram=512,
                            n_head_per_ngram=8, layer_id=1, layer_ids=[1, 15], pad_id=2, seed=0, compress=lookup)
            one = tpt.HashedNgramEmbedding(**settings, dtype=torch.float32, init_seed=0).eval()
            par = VocabParallelHashedNgramEmbedding(**settings, dtype=torch.float32, init_seed=0).eval()
            batches = [torch.from_numpy(rng.integers(0, old_vocab, (args.B, args.L))) for _ in range(4)]
            a, b, o = torch.randn(256, 1024), torch.randn(1024, 1024), torch.empty(256, 1024)
            fns = {"one-process HashedNgramEmbedding": lambda i: one(batches[i % 4]),
                   "VocabParallel... at W = 1": lambda i: par(batches[i % 4])}
            R = par.num_rows
            for W in (2, 4):
                rows = -(-R // W)
                for r in (0, W - 1):
                    shard = par.weight.detach()[r * rows: (r + 1) * rows].clone()
                    fns[f"shard lookup, rank {r} of W = {W}"] = (
                        lambda i, s=shard, start=r * rows: ngram_lookup(
                            s, batches[i % 4], None, None, par.compress, par.multipliers, par.primes, par.offsets,
                            par.spec.pad, start))
            clock = time.thread_time if args.threads == 1 else time.perf_counter
            with torch.no_grad():
                assert torch.equal(par(batches[0]), one(batches[0]))
                for fn in fns.values():
                    fn(0)
                    fn(1)
                times: dict[str, list[float]] = {k: [] for k in fns}
                order = np.random.default_rng(1)
                for rep in range(args.reps):
                    for name in order.permutation(list(fns)):
                        torch.mm(a, b, out=o)
                        t0 = clock()
                        fns[str(name)](rep)
                        times[str(name)].append(clock() - t0)
        finally:
            dist.destroy_process_group()
    print(machine())
    print(f"V={args.V} per n-gram (R = {R} rows, {R * par.head_dim * 4 / 2**20:.0f} MiB), B={args.B}, L={args.L}, "
          f"{args.reps} reps, {args.threads} thread(s), {'thread CPU' if args.threads == 1 else 'wall'} time")
    for name, ts in times.items():
        print(f"  {name:36s} median {np.median(ts) * 1e3:7.3f} ms  best {min(ts) * 1e3:7.3f} ms")


if __name__ == "__main__":
    main()
