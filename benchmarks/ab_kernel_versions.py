"""A/B: the forward core of another git revision beside the current one, in ONE process.

Usage: ``python benchmarks/ab_kernel_versions.py REV MODE [reps]``, MODE ``fp32``, ``dropout`` or
``bf16``.

REV's ``kernels/_forward.py`` and its helpers (``_lines``, ``_rng``, ``_prefetch``, ``_stream``)
are taken with ``git show`` into a temporary directory and imported under other names. Both cores
run on the bench's shapes and tables (:mod:`_forward_case`), interleaved
in ``tokenpos bench``'s conditions (``time_interleaved``) with the plain parallel numba gather, and
each also on the 64-row table that stays in cache (the compute floor: its arithmetic and writes
without the random reads). Prints best / median ms and x gather. Before 2026-11-23 the masks of
the two revisions differ (one dropout hash per element, then one per two); the work is the same
kind, so their times compare.
"""

from __future__ import annotations

import importlib
import subprocess
import sys
import tempfile
from pathlib import Path

from _forward_case import ForwardCase, print_vs_gather

from tokenpos.analysis.bench_timing import time_interleaved
from tokenpos.kernels._forward import forward_core

MODULES = ("_forward", "_lines", "_rng", "_prefetch", "_stream")


def load_old(rev: str):
    """REV's ``forward_core``, its helper modules renamed ``old_*``."""
    root = Path(subprocess.run(["git", "rev-parse", "--show-toplevel"], capture_output=True, text=True,
                               check=True).stdout.strip())
    tmp = Path(tempfile.mkdtemp(prefix="tokenpos_ab_"))
    for name in MODULES:
        src = subprocess.run(["git", "show", f"{rev}:src/tokenpos/kernels/{name}.py"], cwd=root,
                             capture_output=True, text=True, check=True).stdout
        for other in MODULES:
            src = src.replace(f"from tokenpos.kernels.{other} import", f"from old{other} import")
        (tmp / f"old{name}.py").write_text(src)
    sys.path.insert(0, str(tmp))
    core = importlib.import_module("old_forward").forward_core
    names = core.py_func.__code__.co_varnames

    def shim(*args):   # the current arguments (..., rows, ahead, far, out) in REV's order
        head, ahead, out = args[:-3], args[-3], args[-1]
        if "by_position" in names:             # before 2026-11-25: tiles, run by position as they shipped
            return core(*head, True, ahead, out)
        if "far" not in names:                 # the plain loop before the L2 prefetch
            return core(*head, ahead, out)
        return core(*args)
    return shim


def main(rev: str, mode: str, reps: int) -> None:
    old = load_old(rev)
    case = ForwardCase(mode)
    impls = {"plain parallel numba gather": case.gather}
    for tag, core in ((f"{rev}", old), ("current", forward_core)):
        impls[f"{tag}"] = case.core(case.w, fn=core)
        impls[f"{tag}, compute floor"] = case.core(case.small, fn=core)
    print_vs_gather(mode, time_interleaved(impls, reps))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 30)
