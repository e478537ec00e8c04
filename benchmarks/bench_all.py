"""Benchmark: forward, dropout, rope, train_lazy, train_exact, jit (see tokenpos.analysis.bench).

Usage: python benchmarks/bench_all.py [--quick] [--compile] [--json PATH]
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main("forward,dropout,rope,train_lazy,train_exact,jit".split(",")))
