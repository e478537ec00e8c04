"""``tokenpos report``: the whole analysis as one self-contained HTML page (the README's main command)."""

from __future__ import annotations

import argparse
import time
from typing import Any

from tokenpos.cli._ui import console, progress_bars

HELP = "write the analysis report: memory, benchmark, plots, positional trade-offs (HTML)"


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "report", help=HELP,
        description=HELP + ". Writes DIR/index.html (figures embedded) and the figures as PNGs beside it. "
                           "Measured on 2 cores: the default run about 45 s idle, 4 min while other processes "
                           "kept the cores busy (the benchmark then marks its rows as measured under load); "
                           "--quick about 4 min under the same load.",
        epilog="Examples: tokenpos report; tokenpos report --out out/report --quick; "
               "tokenpos extrapolate --json report/extrapolation.json && tokenpos report",
    )
    p.add_argument("--out", default="report", metavar="DIR", help="output folder (default: ./report)")
    speed = p.add_mutually_exclusive_group()
    speed.add_argument("--quick", action="store_true", help="fastest: low-resolution figures, quick benchmark")
    speed.add_argument("--full", action="store_true",
                       help="the full (non-quick) benchmark and sharper figures; takes longer")
    p.add_argument("--no-bench", action="store_true", help="skip the benchmark")
    p.add_argument("--extrapolation", metavar="PATH",
                   help="results of `tokenpos extrapolate --json PATH` to include "
                        "(default: DIR/extrapolation.json if it exists)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    return p


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from tokenpos.analysis.report import build_report

    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {args.out!r} exists and is not a folder")
    mode = "quick" if args.quick else "full" if args.full else "default"
    start = time.perf_counter()
    notes: list[str] = []
    with progress_bars(enabled=not args.no_progress) as progress:
        path = build_report(out, mode=mode, bench=not args.no_bench, extrapolation=args.extrapolation,
                            progress=progress, on_note=notes.append)
    con = console()
    for note in notes:
        console(stderr=True).print(f"note: {note}", markup=False)
    images = sorted(p.name for p in out.glob("*.png"))
    con.print(f"wrote {path} ({path.stat().st_size / 1e6:.1f} MB; figures, also embedded: {', '.join(images)}) "
              f"in {time.perf_counter() - start:.1f} s", markup=False)
    if mode == "full" and not (out / "extrapolation.json").exists() and args.extrapolation is None:
        con.print(f"tip: `tokenpos extrapolate --json {out / 'extrapolation.json'}` (under 10 minutes on 2 cores), "
                  "then "
                  "run the report again to include the length-extrapolation table.", markup=False)
    return 0
