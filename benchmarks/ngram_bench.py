"""The hashed n-gram lookup (Engram) on the CPU: the fused lookup against the reference's two steps and the
random-gather limit, in model conditions (``tokenpos.analysis.bench_ngram``).

Usage:
    python benchmarks/ngram_bench.py [--V 131072] [--B 4] [--L 1024] [--reps 30]

Prints the machine, the table's size and the 1-minute load average before and after (on a shared machine the load
says what the numbers are worth), then one line per row: best and median ms, and the ratios limit / row and
reference / row (best, median; > 1: faster than that row). Acceptance (issue 51): the fused rows at >= 0.8x the
limit, >= 3x the reference (at B = 16, L = 2048; at the default B = 4, L = 1024 the reference itself costs only about
twice the limit).
"""

from __future__ import annotations

import argparse
import os

from tokenpos.analysis.bench_ngram import DEFAULT, ngram_case, table_bytes
from tokenpos.analysis.bench_timing import machine


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for key in ("V", "B", "L", "reps"):
        ap.add_argument(f"--{key}", type=int, default=DEFAULT[key])
    args = ap.parse_args()
    cfg = {"V": args.V, "B": args.B, "L": args.L}
    load0 = os.getloadavg()[0]
    rows = ngram_case(cfg, args.reps)
    print(machine())
    print(f"V={args.V} per n-gram, B={args.B}, L={args.L}, {args.reps} reps; table {table_bytes(cfg) / 2**20:.0f} MiB; "
          f"1-minute load average {load0:.2f} before, {os.getloadavg()[0]:.2f} after (other processes' CPUs)")
    for r in rows:
        if r.median_seconds is None:
            print(f"  note: {r.impl}: {r.note}")
            continue
        lim = r.median_ratios.get("limit")
        ref = r.median_ratios.get("eager")
        print(f"  {r.impl:<66} best {r.seconds * 1e3:8.2f} ms  median {r.median_seconds * 1e3:8.2f} ms  "
              f"x limit {r.ratio_vs_limit or 0:5.2f}/{lim or 0:5.2f}  x reference {r.ratio_vs_reference or 0:6.2f}/"
              f"{ref or 0:6.2f}")


if __name__ == "__main__":
    main()
