"""Timing machinery of the benchmark: rows, reports, interleaved timing and the copy reference.

Shared by every case in :mod:`tokenpos.analysis.bench`; returns data, never prints.
"""

from __future__ import annotations

import os
import platform
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tokenpos.analysis.calls import CallTrace

COPY, EAGER, COMPILE = "torch copy_ (copy bandwidth)", "torch eager", "torch.compile"
GATHER = "gather limit: torch.index_select(out=)"
GATHER_NUMBA = "gather limit: plain parallel numba gather"
KERNEL = "tokenpos kernel (out=)"          # the raw kernel a case's public layers call
PUBLIC = "(public layer)"                  # in the name of every public-layer row


@dataclass
class BenchRow:
    case: str
    impl: str
    seconds: float
    gbps: float
    ratio_vs_copy: float | None
    ratio_vs_reference: float | None
    note: str = ""
    median_seconds: float | None = None     # the median rep (seconds is the best rep)
    ratio_vs_limit: float | None = None     # the case's limit (gather or copy) time / this time, best
    ratio_vs_compile: float | None = None   # torch.compile time / this time, best
    median_ratios: dict = field(default_factory=dict)   # "copy" / "eager" / "limit" / "compile" / "kernel"
    ratio_vs_kernel: float | None = None   # public-layer rows: the raw kernel's time / this time, best
    host: HostTime | None = None           # ``calls`` rows: host time against the row's reference (.bench_calls)
    unstable: tuple[str, ...] = ()         # ratio keys not claimed: best and median ratio disagree by more than
                                           # RATIO_AGREEMENT (:func:`unstable_keys`)
    other_cpus: float | None = None        # CPUs other processes kept busy while this row's case ran (None:
                                           # not measured); above BUSY_CPUS the row was measured under competition

    @property
    def competed(self) -> bool:
        """Measured while other processes kept more than :data:`BUSY_CPUS` CPUs busy on average."""
        return self.other_cpus is not None and self.other_cpus > BUSY_CPUS


@dataclass
class HostTime:
    """A ``calls`` row's numbers (:mod:`.bench_calls`): CPU time of the calling thread per call
    (``time.thread_time``) of one tokenpos call and of its reference, timed in the same rounds.

    seconds, reference_seconds: median over the rounds of each block's seconds per call.
    best_seconds, reference_best_seconds: the lowest block of each.
    ratio: tokenpos / reference (< 1: tokenpos costs less), the median of the per-round ratios
    (:func:`paired_ratio`); ratio_low, ratio_high: its 95 % bootstrap interval. ratio_best: best tokenpos /
    best reference. rounds: timed rounds; calls: calls per block (one block of each per round).
    trace: what ONE tokenpos call ran of tokenpos's code (:func:`tokenpos.analysis.calls.trace_call`).
    """

    reference: str
    seconds: float
    reference_seconds: float
    best_seconds: float
    reference_best_seconds: float
    ratio: float
    ratio_low: float
    ratio_high: float
    ratio_best: float
    rounds: int
    calls: int
    trace: CallTrace | None = None


@dataclass
class BenchReport:
    machine: str
    command: str
    config: dict
    rows: list[BenchRow] = field(default_factory=list)
    competition: Competition | None = None   # other processes' CPU time during the run (None: not measured)


def machine() -> str:
    model = platform.processor() or platform.machine()
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=5).stdout
        info = dict(line.split(":", 1) for line in out.splitlines() if ":" in line)
        model = info.get("Model name", model).strip()
    except (OSError, subprocess.SubprocessError):
        pass
    import numba
    import torch
    return (f"{model}, {os.cpu_count()} CPUs; numba {numba.__version__} ({numba.get_num_threads()} threads), "
            f"torch {torch.__version__} ({torch.get_num_threads()} threads), numpy {np.__version__}, "
            f"Python {platform.python_version()}")


MODEL_FLOP = 1 << 30   # the torch op before each timed call: a matmul of about this many flops


def model_op(dim: int) -> Callable[[], Any]:
    """A torch parallel op of a model's size: ``(m, dim) @ (dim, dim)`` into a preallocated output,
    ``m`` chosen for about :data:`MODEL_FLOP` flops (at least 16 rows): a layer's projection of
    model dim ``dim`` (D for the embedding, H * Dh for RoPE's q/k projection).

    After it returns, torch's OpenMP threads spin for about 10 ms (default wait policy,
    ``benchmarks/experiments/exp_spin.py``), as they do between the layers of a model."""
    import torch
    m = max(16, MODEL_FLOP // (2 * dim * dim))
    a, b, out = torch.randn(m, dim), torch.randn(dim, dim), torch.empty(m, dim)
    return lambda: torch.mm(a, b, out=out)


def time_interleaved(impls: dict[str, Callable[[], Any]], reps: int,
                     before: Callable[[], Any] | None = None) -> dict[str, list[float]]:
    """Warm each impl once, then ``reps`` interleaved rounds in a shuffled order; seconds per call.

    The order changes every round (fixed seed) so that no impl always runs right after the same
    neighbour, and no impl runs twice in a row.

    Model conditions (the bench's): ``before`` (:func:`model_op`) runs, untimed, right before each
    timed call of every impl, references included. A model calls its layers right after torch's
    parallel ops, with torch's OpenMP threads still spinning on the cores and the caches holding
    that op's data; every impl is timed in that state, with the default OpenMP wait policy (the
    bench until issue 29 slept 25 ms and made three untimed calls first: a lab condition no model
    runs in). ``before=None``: the impls back to back (the experiments' plain interleaving).
    """
    for fn in impls.values():
        if before is not None:
            before()
        fn()
    times: dict[str, list[float]] = {k: [] for k in impls}
    names = list(impls)
    order_rng = np.random.default_rng(12345)
    last = None
    for _ in range(reps):
        order = [str(n) for n in order_rng.permutation(names)]
        if len(order) > 1 and order[0] == last:             # never the same impl twice in a row
            order[0], order[-1] = order[-1], order[0]
        last = order[-1]
        for name in order:
            fn = impls[name]
            if before is not None:
                before()
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return times


def timing_lines(times: dict[str, list[float]], ref: str | None = None) -> list[str]:
    """One line per impl of :func:`time_interleaved`'s ``times``: best and median ms, and with ``ref`` (one of
    the names) the ratio ref / impl of each (> 1: faster than ref), best / median. The experiments' report."""
    width = max((len(n) for n in times), default=0)
    lines = []
    for name, ts in times.items():
        line = f"{name:{width}s}  best {min(ts) * 1e3:7.2f} ms  median {np.median(ts) * 1e3:7.2f} ms"
        if ref is not None:
            r = times[ref]
            line += f"  x {ref} {min(r) / min(ts):.2f} / {np.median(r) / np.median(ts):.2f}"
        lines.append(line)
    return lines


def paired_ratio(ref: list[float], impl: list[float], seed: int = 0,
                 resamples: int = 2000) -> tuple[float, float, float]:
    """Round by round ``ref[i] / impl[i]`` (> 1: impl faster) of two rows timed in the same rounds
    (:func:`time_interleaved`, or any loop that runs both once per round): (the median of those
    ratios, and the 2.5 % and 97.5 % points of that median over ``resamples`` seeded bootstrap
    resamples of the rounds). Drift between rounds hits both sides of a round alike, so this
    resolves differences a ratio of the two rows' medians, taken over separate rounds, does not."""
    if len(ref) != len(impl) or not len(ref):
        raise ValueError(f"paired_ratio needs two equally long non-empty lists of times, got lengths "
                         f"{len(ref)} and {len(impl)}")
    r = np.asarray(ref, dtype=np.float64) / np.asarray(impl, dtype=np.float64)
    boots = np.median(np.random.default_rng(seed).choice(r, size=(resamples, r.size)), axis=1)
    return float(np.median(r)), float(np.quantile(boots, 0.025)), float(np.quantile(boots, 0.975))


# A ratio whose best (best / best) and median (median / median) differ by more than this factor is unstable,
# and not claimed. In model conditions a row's median rep is routinely 1.5-3x its best (torch's spinning
# threads, benchmarks/HISTORY.md), so the spread of one row says nothing; but the two ratios of a pair timed
# in the same rounds agree on a machine at rest (within 1.4x over the runs in HISTORY.md). Under load one side
# can catch a lucky rep the other never gets: ``tokenpos bench --quick`` once showed a best of 2.07 ms against
# a 31.99 ms median as "12.22x limit", with a median ratio near 0.9.
RATIO_AGREEMENT = 2.0


def disagreement(best: float | None, median: float | None) -> float | None:
    """max / min of a ratio's best and median (1.0: they agree); None without both (positive, finite)."""
    if best is None or median is None or not (0 < best < np.inf and 0 < median < np.inf):
        return None
    return float(max(best, median) / min(best, median))


def unstable_of(row: Any) -> tuple[str, ...]:
    """The ratio keys ``row`` does not claim (``()`` for a row read from an older JSON without the field)."""
    keys = getattr(row, "unstable", None)
    return () if keys is None else tuple(keys)


def unstable_keys(best: dict[str, float | None], median: dict[str, float | None]) -> tuple[str, ...]:
    """The ratio keys (of ``median``) whose best and median ratios disagree by more than :data:`RATIO_AGREEMENT`."""
    return tuple(k for k, m in median.items() if (d := disagreement(best.get(k), m)) is not None
                 and d > RATIO_AGREEMENT)


def bench_rows(case: str, times: dict[str, list[float]], nbytes: float, *, bandwidth: bool = True,
               notes: dict[str, str] | None = None, limit: tuple[str, ...] = (COPY,),
               eager: str = EAGER, compiled: str = COMPILE) -> list[BenchRow]:
    """One row per impl: best and median seconds, and ratios (reference time / impl time).

    ``limit`` names the case's physical limit rows (the faster of them, by best and by median, is
    the limit); ratios > 1 mean faster than the reference. Public-layer rows also get "kernel": the
    raw kernel they call (:data:`KERNEL`), timed in the same run (1.0 = no cost over the kernel).
    """
    def ref(stat: Callable[[list[float]], float], names: tuple[str, ...]) -> float | None:
        vals = [stat(times[n]) for n in names if n in times]
        return min(vals) if vals else None

    def ratio(r: float | None, t: float) -> float | None:
        return None if r is None else r / t

    med = lambda t: float(np.median(t))  # noqa: E731
    rows = []
    for name, ts in times.items():
        b, m = float(min(ts)), med(ts)
        kernel = (KERNEL,) if PUBLIC in name else ()
        refs = {"copy": (COPY,) if bandwidth else (), "eager": (eager,), "limit": limit if bandwidth else (),
                "compile": (compiled,), "kernel": kernel}
        bests = {k: ratio(ref(min, names), b) for k, names in refs.items()}
        meds = {k: ratio(ref(med, names), m) for k, names in refs.items()}
        meds = {k: v for k, v in meds.items() if v is not None}
        note = f"median {m * 1e3:.2f} ms" + "".join(f", x {k} {v:.2f}" for k, v in meds.items()) + f" ({len(ts)} reps)"
        if notes and name in notes:
            note = notes[name] + "; " + note
        rows.append(BenchRow(case, name, b, nbytes / b / 1e9 if bandwidth else float("nan"),
                             ratio(ref(min, (COPY,)), b) if bandwidth else None, ratio(ref(min, (eager,)), b),
                             note, m, ratio(ref(min, limit), b) if bandwidth else None,
                             ratio(ref(min, (compiled,)), b), meds, ratio(ref(min, kernel), b),
                             unstable=unstable_keys(bests, meds)))
    return rows


# -- competition: CPU time other processes took while the bench ran -----------------------------------


@dataclass(frozen=True)
class CpuCounters:
    """Cumulative CPU seconds at one moment (Linux ``/proc``): ``busy``, the time every process and the
    kernel took on the CPUs this process may run on (user, nice, system, irq, softirq and steal: another
    guest's turn on a virtual CPU); ``own``, this process's (every thread, and its waited-for children);
    ``wall``, a monotonic clock; ``cpus``, how many CPUs were counted."""

    busy: float
    own: float
    wall: float
    cpus: int


@dataclass(frozen=True)
class Competition:
    """What other processes took while the bench ran: ``other_cpu_seconds`` of CPU time on the bench's
    ``cpus`` over ``wall_seconds``."""

    other_cpu_seconds: float
    wall_seconds: float
    cpus: int

    @property
    def other_cpus(self) -> float:
        """The CPUs other processes kept busy on average (0: none; 1.0: one whole CPU throughout)."""
        return self.other_cpu_seconds / self.wall_seconds if self.wall_seconds > 0 else 0.0


# A run is reported as competed for when other processes kept more than this many CPUs busy on average:
# every timed call is a parallel op over all the bench's CPUs, so one CPU taken part of the time already
# holds the others up at each barrier. A quiet machine's daemons stay far below it (a few hundredths).
BUSY_CPUS = 0.25


def cpu_counters() -> CpuCounters | None:
    """The counters now, from ``/proc/stat`` (the per-CPU lines of this process's CPU affinity) and
    ``/proc/self/stat``; None where they cannot be read (not Linux): no measurement, rather than a wrong one."""
    try:
        allowed = os.sched_getaffinity(0)
        hz = os.sysconf("SC_CLK_TCK")
        with open("/proc/stat") as f:
            lines = [line.split() for line in f if line.startswith("cpu") and line[3].isdigit()]
        with open("/proc/self/stat") as f:
            own_fields = f.read().rsplit(")", 1)[1].split()     # after "pid (comm)": state is field 3
        # cpuN user nice system idle iowait irq softirq steal ...: all but idle and iowait are busy
        busy = sum(sum(int(v) for i, v in enumerate(f[1:9]) if i not in (3, 4))
                   for f in lines if int(f[0][3:]) in allowed)
        own = sum(int(v) for v in own_fields[11:15])           # utime, stime, cutime, cstime (fields 14-17)
    except (AttributeError, OSError, ValueError, IndexError):
        return None
    return None if not lines else CpuCounters(busy / hz, own / hz, time.monotonic(), len(allowed))


def competition(start: CpuCounters | None, end: CpuCounters | None) -> Competition | None:
    """Other processes' CPU time between two readings: the busy time of the bench's CPUs minus its own
    (never below 0: the counters tick in clock ticks, 1/100 s on Linux); None when either reading is missing."""
    if start is None or end is None:
        return None
    others = (end.busy - start.busy) - (end.own - start.own)
    return Competition(max(others, 0.0), end.wall - start.wall, end.cpus)


def busy_note(measured: Competition | None) -> str | None:
    """The warning to print with a run whose other processes kept more than :data:`BUSY_CPUS` CPUs busy
    on average (:func:`competition`); None otherwise, and when nothing was measured (not Linux, an
    older report)."""
    if measured is None or not measured.other_cpus > BUSY_CPUS:
        return None
    return (f"other processes kept {measured.other_cpus:.2f} of the {measured.cpus} CPUs busy on average during "
            f"this run ({measured.other_cpu_seconds:.1f} CPU s in {measured.wall_seconds:.1f} s), competing with "
            "the timed calls, so one run's ratios can move by 0.1 or more; compare several runs")


def note_rows(case: str, notes: dict[str, str]) -> list[BenchRow]:
    """Rows for impls that could not run (the note says why)."""
    return [BenchRow(case, k, float("nan"), float("nan"), None, None, v) for k, v in notes.items()]


def guard(fn: Callable[[], Any]) -> Callable[[], Any] | str:
    """Run once; a public layer that fails (not wired, API drift) becomes a note, not a crash."""
    try:
        fn()
        return fn
    except Exception as exc:  # noqa: BLE001 - reported in the row note
        return f"skipped: {type(exc).__name__}: {exc}"[:160]


def add_impl(impls: dict, notes: dict, name: str, make: Callable[[], Callable[[], Any]]) -> None:
    try:
        fn = guard(make())
    except Exception as exc:  # noqa: BLE001
        fn = f"skipped: {type(exc).__name__}: {exc}"[:160]
    if isinstance(fn, str):
        notes[name] = fn
    else:
        impls[name] = fn


NBATCH = 4   # id batches cycled through, so no impl finds the previous call's rows still in cache


def cycle(items: list) -> Any:
    import itertools
    return itertools.cycle(items)


def public(backend: str, module: str, name: str) -> Any:
    """``tokenpos.<backend>.<name>``, or from its module when the package does not export it."""
    import importlib
    pkg = importlib.import_module(f"tokenpos.{backend}")
    if hasattr(pkg, name):
        return getattr(pkg, name)
    return getattr(importlib.import_module(f"tokenpos.{backend}.{module}"), name)


def copy_ref(nbytes_half: int) -> Callable[[], Any]:
    import torch
    src = torch.randn(nbytes_half // 4)
    dst = torch.empty_like(src)
    return lambda: dst.copy_(src)


# ----------------------------------------------------------------------------------------------
# cases
# ----------------------------------------------------------------------------------------------
