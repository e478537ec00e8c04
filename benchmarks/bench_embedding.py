"""Benchmark: forward, dropout (see tokenpos.analysis.bench).

Usage: python benchmarks/bench_embedding.py [--quick] [--compile] [--json PATH]
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main("forward,dropout".split(",")))
