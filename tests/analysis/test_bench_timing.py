"""The bench's interleaved timing: which calls it makes, in which order (never how long they take)."""

from __future__ import annotations

import pytest

from tokenpos.analysis.bench_timing import WARM_CALLS, time_interleaved


def _recorder(log: list[str], name: str):
    return lambda: log.append(name)


@pytest.mark.parametrize("warm", [0, 1, WARM_CALLS])
def test_each_timed_call_follows_a_settle_and_its_own_warm_calls(warm: int, monkeypatch) -> None:
    """Every timed call is preceded by a sleep and then ``warm`` untimed calls of the same impl, and
    the same impl is never timed twice in a row across rounds."""
    log: list[str] = []
    sleeps: list[float] = []
    monkeypatch.setattr("tokenpos.analysis.bench_timing.time.sleep", lambda s: (sleeps.append(s), log.append("|")))
    impls = {n: _recorder(log, n) for n in "abc"}
    reps = 6
    times = time_interleaved(impls, reps, settle=0.01, warm=warm)
    assert {k: len(v) for k, v in times.items()} == {n: reps for n in "abc"}
    assert all(t >= 0 for v in times.values() for t in v)
    assert log[:3] == ["a", "b", "c"]                     # one warm-up call each before the rounds
    groups = "".join(log[3:]).split("|")[1:]               # what ran after each sleep
    assert len(groups) == len(sleeps) == 3 * reps and set(sleeps) == {0.01}
    timed = []
    for g in groups:
        assert len(g) == warm + 1 and len(set(g)) == 1     # warm untimed calls, then the timed one
        timed.append(g[0])
    assert all(x != y for x, y in zip(timed[:-1], timed[1:], strict=True))  # never twice in a row


def test_no_settle_means_no_untimed_calls() -> None:
    log: list[str] = []
    times = time_interleaved({n: _recorder(log, n) for n in "ab"}, 4, settle=0.0)
    assert len(log) == 2 + 2 * 4 and {k: len(v) for k, v in times.items()} == {"a": 4, "b": 4}
