"""The bench's interleaved timing: which calls it makes, in which order (never how long they take)."""

from __future__ import annotations

from tokenpos.analysis.bench_timing import model_op, time_interleaved, timing_lines


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
