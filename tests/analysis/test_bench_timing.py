"""The bench's interleaved timing: which calls it makes, in which order (never how long they take)."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from tokenpos.analysis.bench_timing import (
    BUSY_CPUS,
    Competition,
    CpuCounters,
    busy_note,
    competition,
    cpu_counters,
    model_op,
    paired_ratio,
    time_interleaved,
    timing_lines,
)


def _recorder(log: list[str], name: str):
    return lambda: log.append(name)


def test_each_timed_call_follows_the_model_op() -> None:
    """Model conditions: every call of every impl (warm-up and timed) runs right after the torch op,
    with nothing in between (no settle, no untimed calls of its own), and the same impl is never
    timed twice in a row across rounds."""
    log: list[str] = []
    impls = {n: _recorder(log, n) for n in "abc"}
    reps = 6
    times = time_interleaved(impls, reps, before=_recorder(log, "|"))
    assert {k: len(v) for k, v in times.items()} == {n: reps for n in "abc"}
    assert all(t >= 0 for v in times.values() for t in v)
    assert log[:6] == ["|", "a", "|", "b", "|", "c"]        # one warm-up call each, after the op too
    calls = log[6:]
    assert calls[0::2] == ["|"] * 3 * reps                  # the op before each timed call ...
    timed = calls[1::2]                                      # ... and right after it, one impl call
    assert len(timed) == 3 * reps and "|" not in timed
    assert all(x != y for x, y in zip(timed[:-1], timed[1:], strict=True))  # never twice in a row


def test_without_an_op_the_calls_run_back_to_back() -> None:
    log: list[str] = []
    times = time_interleaved({n: _recorder(log, n) for n in "ab"}, 4)
    assert len(log) == 2 + 2 * 4 and {k: len(v) for k, v in times.items()} == {"a": 4, "b": 4}


def test_model_op_is_a_parallel_torch_matmul_of_the_model_dim() -> None:
    """About 2**30 flops, (m, dim) @ (dim, dim), at least 16 rows; it runs and returns its output."""
    import torch

    out = model_op(64)()
    assert isinstance(out, torch.Tensor) and out.shape == (2**30 // (2 * 64 * 64), 64)
    assert model_op(8192)().shape == (16, 8192)


def test_timing_lines_give_best_median_and_the_ratio_to_the_reference() -> None:
    times = {"ref": [0.004, 0.002, 0.003], "a much longer name": [0.001, 0.001, 0.002]}
    plain = timing_lines(times)
    assert plain == ["ref                 best    2.00 ms  median    3.00 ms",
                     "a much longer name  best    1.00 ms  median    1.00 ms"]
    ratio = timing_lines(times, ref="ref")
    assert ratio[0].endswith("x ref 1.00 / 1.00") and ratio[1].endswith("x ref 2.00 / 3.00")


def test_paired_ratio_is_the_median_of_round_by_round_ratios_with_a_seeded_interval() -> None:
    """Rounds where both rows drift together give the same ratio every round: a tight interval at it,
    where the rows' own medians (taken apart) would not show it; the interval holds the median and
    repeats with the seed."""
    drift = [1.0, 3.0, 2.0, 5.0, 4.0, 2.5, 1.5]
    ref, impl = [2.0 * d for d in drift], list(drift)
    assert paired_ratio(ref, impl) == (2.0, 2.0, 2.0)
    noisy = [x * (1.0 + 0.01 * ((i * 7) % 5 - 2)) for i, x in enumerate(impl)]
    med, lo, hi = paired_ratio(ref, noisy)
    assert lo <= med <= hi and 1.9 < lo and hi < 2.1
    assert paired_ratio(ref, noisy) == (med, lo, hi) and paired_ratio(ref, noisy, seed=1)[0] == med
    for a, b in (([], []), ([1.0, 2.0], [1.0])):
        with pytest.raises(ValueError, match="equally long non-empty"):
            paired_ratio(a, b)


# -- competition: the busy note measures other processes' CPU time, never the spread of the reps ------------


@pytest.mark.parametrize(("busy", "own", "wall", "cpus", "others", "noted"), [
    ((100.0, 140.0), (10.0, 50.0), (0.0, 20.0), 16, 0.0, False),     # all the busy time was the bench's own
    ((100.0, 141.0), (10.0, 50.0), (0.0, 20.0), 16, 1.0, False),     # daemons: 0.05 CPUs
    ((100.0, 145.0), (10.0, 50.0), (0.0, 20.0), 16, 5.0, False),     # 0.25 CPUs exactly: not above the line
    ((100.0, 146.0), (10.0, 50.0), (0.0, 20.0), 16, 6.0, True),      # 0.3 CPUs: a competitor
    ((100.0, 200.0), (10.0, 50.0), (0.0, 20.0), 2, 60.0, True),      # 3 CPUs' worth of others
    ((100.0, 139.99), (10.0, 50.0), (0.0, 20.0), 16, 0.0, False),    # ticks rounding below own: 0, not negative
])
def test_the_note_is_decided_by_other_processes_cpu_time(busy, own, wall, cpus, others, noted) -> None:  # noqa: ANN001
    start, end = (CpuCounters(b, o, w, cpus) for b, o, w in zip(busy, own, wall, strict=True))
    measured = competition(start, end)
    assert measured == Competition(pytest.approx(others), 20.0, cpus)
    note = busy_note(measured)
    assert (note is not None) == noted == (others / 20.0 > BUSY_CPUS)
    if noted:
        assert note.startswith(f"other processes kept {others / 20.0:.2f} of the {cpus} CPUs busy on average")
        assert f"({others:.1f} CPU s in 20.0 s)" in note


def test_no_counters_give_no_note_rather_than_a_wrong_one() -> None:
    """Not Linux (no /proc): nothing measured, no note; a report without a measurement either."""
    reading = CpuCounters(1.0, 0.0, 0.0, 4)
    assert competition(None, reading) is None and competition(reading, None) is None
    assert busy_note(None) is None
    assert busy_note(Competition(5.0, 0.0, 4)) is None                   # no time elapsed: no average to report


def test_the_counters_read_this_process_and_its_cpus() -> None:
    if not sys.platform.startswith("linux"):
        assert cpu_counters() is None
        return
    a = cpu_counters()
    t0 = time.process_time()
    while time.process_time() - t0 < 0.2:                                # this process's own CPU time grows
        pass
    b = cpu_counters()
    assert a is not None and b is not None and a.cpus == b.cpus >= 1
    assert b.own - a.own >= 0.1 and b.busy - a.busy >= b.own - a.own - 0.05 and b.wall > a.wall


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc: Linux only")
def test_a_spinning_process_during_a_timed_run_fires_the_note() -> None:
    """Another process spinning on a CPU while the bench times its calls is measured as competition (it is
    not this process's child until waited for, after the last reading) and the note fires with the number."""
    spinner = subprocess.Popen([sys.executable, "-c", "print('ready', flush=True)\nwhile True: pass"],
                               stdout=subprocess.PIPE, text=True)
    try:
        assert spinner.stdout is not None and spinner.stdout.readline().strip() == "ready"
        start = cpu_counters()
        time_interleaved({"a": lambda: time.sleep(0.05), "b": lambda: time.sleep(0.05)}, 5)   # ~0.5 s, idle
        end = cpu_counters()
    finally:
        spinner.kill()
        spinner.wait()
    measured = competition(start, end)
    assert measured is not None and measured.other_cpus > BUSY_CPUS
    note = busy_note(measured)
    assert note is not None and note.startswith(f"other processes kept {measured.other_cpus:.2f} of the")
