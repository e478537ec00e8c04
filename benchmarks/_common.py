"""Shared runner for the benchmark scripts: run some cases of ``tokenpos bench`` and print the table."""

from __future__ import annotations

import sys
from collections.abc import Sequence


def main(cases: Sequence[str], argv: Sequence[str] | None = None) -> int:
    """``python benchmarks/bench_x.py [--quick] [--compile] [--json PATH]``: the CLI with fixed cases."""
    from tokenpos.cli import main as cli_main

    args = list(sys.argv[1:] if argv is None else argv)
    return cli_main(["bench", "--cases", ",".join(cases), *args])
