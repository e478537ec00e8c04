"""``tokenpos bench``: the fused kernels against the copy bandwidth and torch, measured in one run."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
from typing import Any

HELP = ("benchmark the fused kernels: GB/s and ratios vs the measured limit (gather or copy), torch.compile "
        "and torch eager, side by side")


def _cases(text: str) -> list[str]:
    from tokenpos.analysis.bench_names import CASES  # the names alone: an argument error imports no numba

    names = [c.strip() for c in text.split(",") if c.strip()]
    bad = [c for c in names if c not in CASES]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"expected a comma-separated subset of {','.join(CASES)}, got {text!r}")
    return names


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "bench", help=HELP, description=HELP + ".",
        epilog="GB/s = 2 x output bytes / time. Each row is the best of interleaved, shuffled reps, each "
               "timed in model conditions: right after a torch matmul of the model's size, with torch's "
               "threads still spinning (default OpenMP wait policy), references timed the same way; ratios "
               "are reference time / row time, 'best/median' (> 1: faster than the reference). The limit "
               "is the random-row gather (embedding cases) or the copy bandwidth (rope). "
               "The calls case instead times each call's host work as the calling thread's CPU time, tokenpos "
               "and the torch way alternating, and its ratio is tokenpos time / reference time (< 1: tokenpos "
               "costs less). A ratio shows as 'unstable' (not claimed) where its best and its median differ by more "
               "than 2x; rows measured while other processes kept the CPUs busy are marked "
               "'under load'. Cases: forward, dropout, bf16, rope, block, compiled, train_lazy, train_exact, ngram "
               "(the hashed n-gram lookup vs the Engram reference's two steps and the gather limit), jit, "
               "calls. "
               "Example: tokenpos bench --quick --cases forward,rope",
    )
    p.add_argument("--quick", action="store_true",
                   help="the same shapes, fewer reps, no torch.compile rows (209 s measured on 2 busy cores)")
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                   help="time torch.compile rows (default: yes, except with --quick)")
    p.add_argument("--cases", type=_cases, default=None, metavar="A,B",
                   help="comma-separated cases to run (default: all; --quick and --no-compile leave 'compiled' "
                        "out)")
    p.add_argument("--json", metavar="PATH", default=None, help="also write the report as JSON to PATH")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def _fmt(x: float | None, spec: str) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def _pair(best: float | None, median: float | None, unstable: bool = False) -> str:
    """'best/median' of a ratio, '-' when there is none, 'unstable' when it is not claimed (its best and median
    disagree by more than RATIO_AGREEMENT)."""
    if best is None:
        return "-"
    return "unstable" if unstable else f"{_fmt(best, '.2f')}/{_fmt(median, '.2f')}"


def _best(r: Any, key: str) -> float | None:
    """Row ``r``'s best ratio against reference ``key``."""
    attr = {"limit": "ratio_vs_limit", "eager": "ratio_vs_reference", "compile": "ratio_vs_compile",
            "kernel": "ratio_vs_kernel", "copy": "ratio_vs_copy"}[key]
    return getattr(r, attr, None)


def _row_note(r: Any) -> str:
    """The row's note (medians have their own columns), then its unstable ratios and its competition."""
    note = "" if r.note.startswith("median ") else r.note.split("; median ")[0]
    extra = []
    if r.unstable:
        extra.append("unstable: " + ", ".join(f"x {k} {_pair(_best(r, k), r.median_ratios.get(k))}"
                                              for k in r.unstable))
    if r.competed:
        extra.append(f"under load: others kept {r.other_cpus:.2f} CPUs busy")
    return "; ".join([note] * bool(note) + extra)


def _table(report: Any, rows: list[Any]) -> Any:
    """Every case but calls: best and median ms, GB/s, and the ratios reference / row as best/median."""
    from rich.table import Table

    table = Table(title=f"tokenpos bench ({report.command})", caption=report.machine)
    for col, justify in (("case", "left"), ("impl", "left"), ("best ms", "right"), ("median ms", "right"),
                         ("GB/s", "right"), ("x limit", "right"), ("x compile", "right"), ("x eager", "right"),
                         ("x kernel", "right"), ("note", "left")):
        table.add_column(col, justify=justify)  # type: ignore[arg-type]
    last = None
    for r in rows:
        if last is not None and r.case != last:
            table.add_section()
        last = r.case
        m, u = r.median_ratios, r.unstable
        table.add_row(r.case, r.impl, _fmt(r.seconds * 1e3, ".2f"),
                      _fmt(None if r.median_seconds is None else r.median_seconds * 1e3, ".2f"), _fmt(r.gbps, ".1f"),
                      _pair(r.ratio_vs_limit, m.get("limit"), "limit" in u),
                      _pair(r.ratio_vs_compile, m.get("compile"), "compile" in u),
                      _pair(r.ratio_vs_reference, m.get("eager"), "eager" in u),
                      _pair(r.ratio_vs_kernel, m.get("kernel"), "kernel" in u), _row_note(r))
    return table


def _calls_table(report: Any, rows: list[Any]) -> Any:
    """The calls case: each side's median microseconds per call (calling thread's CPU time), the ratio
    tokenpos / reference (median of the rounds' ratios [95 % interval], and best / best), what one call runs of
    tokenpos's code; a row that could not run shows its note."""
    from rich.table import Table

    table = Table(title=f"tokenpos bench ({report.command}), calls: host time per call, CPU time of the calling "
                        "thread (median); x ref = tokenpos / reference (< 1: tokenpos costs less)",
                  caption=report.machine)
    for col, justify in (("tokenpos call", "left"), ("reference", "left"), ("tokenpos us", "right"),
                         ("ref us", "right"), ("x ref [95%]", "right"), ("x ref best", "right"),
                         ("functions", "right"), ("lines", "right"), ("rounds x calls", "right")):
        table.add_column(col, justify=justify)  # type: ignore[arg-type]
    for r in rows:
        h = r.host
        if h is None:
            table.add_row(r.impl, r.note, *["-"] * 7)
            continue
        t = h.trace
        table.add_row(r.impl, h.reference, _fmt(h.seconds * 1e6, ".1f"), _fmt(h.reference_seconds * 1e6, ".1f"),
                      f"{h.ratio:.2f} [{h.ratio_low:.2f}, {h.ratio_high:.2f}]", _fmt(h.ratio_best, ".2f"),
                      "-" if t is None else str(len(t.functions)), "-" if t is None else str(t.lines),
                      f"{h.rounds} x {h.calls}")
    return table


def run(args: argparse.Namespace) -> int:
    """Run the benchmark; ``--json PATH`` is checked first (fail now, not after minutes of timing), its missing
    folders made, and removed again if the run fails."""
    from tokenpos.cli._ui import output_file

    if not args.json:
        return _run(args)
    with output_file(args.json):
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    from tokenpos._files import atomic_write_text
    from tokenpos.analysis.bench import run_bench
    from tokenpos.analysis.bench_calls import CASE
    from tokenpos.analysis.bench_timing import RATIO_AGREEMENT, busy_note
    from tokenpos.cli._ui import console, progress_bars

    with progress_bars(not args.no_progress) as progress:
        def step(label: str, done: int, total: int) -> None:
            progress("bench cases", done, total)

        report = run_bench(quick=args.quick, compile=args.compile, cases=args.cases, progress=step)
    con = console()
    shown = [r for r in report.rows if r.case != CASE]
    if shown or not report.rows:
        con.print(_table(report, shown))
    calls = [r for r in report.rows if r.case == CASE]
    if calls:
        con.print(_calls_table(report, calls))
    if any(r.unstable for r in shown):
        con.print(f"[yellow]unstable: a ratio is not claimed where its best (best / best) and its median (median / "
                  f"median) differ by more than {RATIO_AGREEMENT:g}x: one side caught reps the other did not (other "
                  "load, or too few reps); the note gives both. Rerun on a quiet machine, or without --quick."
                  "[/yellow]")
    if shown and all(r.ratio_vs_compile is None for r in shown):
        con.print("x compile: '-' throughout: torch.compile was not timed in this run (--quick skips it); "
                  "--compile times it.", markup=False)
    busy = busy_note(report.competition)
    if busy:
        con.print(f"[yellow]{busy}.[/yellow]")
    if args.json:
        atomic_write_text(args.json, json.dumps(dataclasses.asdict(report), indent=2, default=str))
        con.print(f"wrote {args.json}")
    return 0
