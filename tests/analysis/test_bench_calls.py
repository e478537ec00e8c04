"""The calls case of ``tokenpos bench`` (host time of a call) and ``trace_call``, on tiny shapes and counts.

Timings themselves are never asserted: only the structure of the rows, the alternation of the blocks,
the ratios' arithmetic, and ``trace_call``'s exact counts on a known function.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import textwrap
from pathlib import Path

import pytest

from tokenpos.analysis.calls import CallTrace, trace_call

KNOWN = textwrap.dedent('''\
    def helper(x):
        return x + 1


    def known(n):
        """Sum of helper(i) for i < n, plus one."""
        total = 0
        for i in range(n):
            total += helper(i)
        return sum(v for v in (total, 1))
    ''')


def _load(tmp_path: Path, name: str, source: str) -> object:
    path = tmp_path / f"{name}.py"
    path.write_text(source, encoding="utf-8")
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_trace_call_counts_a_known_function_exactly(tmp_path: Path) -> None:
    """known(3): itself, helper (entered three times, counted once) and its generator expression; the lines
    that ran (4 in known: not the docstring nor the def; 1 in helper; the genexpr's line is known's return
    line, counted once); the source of known (lines 5-10) and helper (1-2), the genexpr inside known adding none."""
    mod = _load(tmp_path, "known_mod", KNOWN)
    calls: list[int] = []

    def fn() -> int:
        calls.append(1)
        return mod.known(3)  # type: ignore[attr-defined]

    trace = trace_call(fn, package=tmp_path)
    genexpr = "known.<locals>.<genexpr>" if sys.version_info >= (3, 11) else "<genexpr>"
    assert trace == CallTrace(functions=tuple(sorted(("known_mod.py:helper", "known_mod.py:known",
                                                      f"known_mod.py:{genexpr}"))),
                              files=("known_mod.py",), lines=5, span=8)
    assert len(calls) == 2                                            # the warm-up, then the traced call
    assert "test_bench_calls.py" not in str(trace)                    # fn's frame lives outside the package


def test_trace_call_restores_the_tracer_and_lets_exceptions_through(tmp_path: Path) -> None:
    mod = _load(tmp_path, "raising_mod", "def boom(state):\n    state.append(1)\n    if len(state) > 1:\n"
                                         "        raise KeyError('second call')\n")
    before = sys.gettrace()
    state: list[int] = []
    with pytest.raises(KeyError, match="second call"):
        trace_call(lambda: mod.boom(state), package=tmp_path)  # type: ignore[attr-defined]
    assert sys.gettrace() is before


def test_trace_call_counts_the_library_not_the_tools() -> None:
    """By default only tokenpos's library code counts: a call into the analysis package traces nothing, a layer
    call traces its own functions (relative paths, sorted; files from the same functions)."""
    torch = pytest.importorskip("torch")
    from tokenpos.analysis.bench_timing import paired_ratio
    from tokenpos.torch import TokenEmbedding

    assert trace_call(lambda: paired_ratio([1.0, 2.0], [2.0, 2.0])) == CallTrace((), (), 0, 0)
    layer = TokenEmbedding(10, 4, seed=0).eval()
    ids = torch.tensor([[1, 2]])
    with torch.no_grad():
        trace = trace_call(lambda: layer(ids))
    assert trace.functions and list(trace.functions) == sorted(trace.functions)
    assert all(":" in f and f.split(":")[0].endswith(".py") for f in trace.functions)
    assert not any(f.startswith(("analysis/", "cli/", "/")) for f in trace.functions)
    assert trace.files == tuple(sorted({f.split(":")[0] for f in trace.functions}))
    assert 0 < trace.lines <= trace.span


# -- the timing machinery -------------------------------------------------------------------------------


pytest.importorskip("torch")

from tokenpos.analysis import bench, bench_calls  # noqa: E402
from tokenpos.analysis.bench_calls import CallPair  # noqa: E402

TINY = dict(V=64, D=16, P=32, B=2, start_pos=7, H=4, Hk=2, Dh=16, rope_len=64, train_L=4, loss_N=8, loss_V=64,
            loss_D=16, lm_hidden=32, lm_intermediate=64, lm_layers=1, lm_heads=4, lm_kv_heads=2, lm_vocab=64, prompt=4)
CFG = dict(calls_rounds=3, calls_block_ms=0.05)
HF = importlib.util.find_spec("transformers") is not None
NEEDS_HF = {"rope_pair", "rope_tables_pair", "decode_pair"}


def test_blocks_alternate_and_reset_after_each() -> None:
    """Each round: one block of each side, tokenpos first in even rounds; reset after every block."""
    log: list[str] = []
    pair = CallPair("t", "r", lambda: log.append("t"), lambda: log.append("r"), reset=lambda: log.append("|"))
    tp, ref = bench_calls.time_pair(pair, rounds=3, calls=2)
    assert "".join(log) == "tt|rr|" "rr|tt|" "tt|rr|"
    assert len(tp) == len(ref) == 3 and all(t >= 0 for t in tp + ref)


def test_host_row_ratios_are_tokenpos_over_reference() -> None:
    """The issue's numbers go the other way from the house ratios: tokenpos / reference in ``host``."""
    pair = CallPair("layer call", "torch call", lambda: None, lambda: None)
    trace = CallTrace(("torch/x.py:f",), ("torch/x.py",), 3, 5)
    row = bench_calls.host_row(pair, [1e-6, 2e-6, 3e-6], [2e-6, 2e-6, 2e-6], 7, trace)
    h = row.host
    assert h is not None and row.case == "calls" and row.impl == "layer call" and h.reference == "torch call"
    assert h.ratio == pytest.approx(1.0) and h.ratio_low <= h.ratio <= h.ratio_high   # median of 0.5, 1, 1.5
    assert h.ratio_best == pytest.approx(0.5) and h.rounds == 3 and h.calls == 7 and h.trace == trace
    assert (h.seconds, h.reference_seconds, h.best_seconds) == pytest.approx((2e-6, 2e-6, 1e-6))
    assert row.seconds == pytest.approx(1e-6) and row.median_seconds == pytest.approx(2e-6)
    assert row.ratio_vs_reference == pytest.approx(2.0)                 # house convention: reference / tokenpos
    assert "1 tokenpos functions, 3 lines" in row.note


@pytest.mark.slow  # times every call
def test_calls_case_rows_on_tiny_shapes() -> None:
    """One row per pair, each timed (rounds, calls, positive times, a trace of tokenpos code) or, for the HF
    rows without transformers, a note; the thread counts are restored."""
    import numba
    import torch

    threads = (torch.get_num_threads(), numba.get_num_threads())
    rows = bench_calls.calls_case(CFG, TINY)
    assert (torch.get_num_threads(), numba.get_num_threads()) == threads
    assert len(rows) == len(bench_calls.PAIRS) and all(r.case == "calls" for r in rows)
    for make, r in zip(bench_calls.PAIRS, rows, strict=True):
        if r.host is None:
            assert not HF and make.__name__ in NEEDS_HF and r.note.startswith("skipped"), r.note
            continue
        h = r.host
        assert h.rounds == 3 and 1 <= h.calls <= bench_calls.MAX_CALLS
        assert h.seconds > 0 and h.reference_seconds > 0 and h.ratio_low <= h.ratio <= h.ratio_high
        assert h.trace is not None and h.trace.functions and h.trace.lines > 0, r.impl
    assert rows[2].host is None or rows[2].host.reference != rows[3].host.reference   # two RoPE references


@pytest.mark.parametrize("make", bench_calls.PAIRS, ids=lambda f: f.__name__)
def test_both_sides_compute_the_same_thing(make) -> None:
    """Each pair's two calls return the same shapes; the same values where they read the same inputs
    (RoPE, the tied loss, the patched decode step); the decode step's reset restores its cache."""
    import torch

    if make.__name__ in NEEDS_HF and not HF:
        pytest.skip("needs transformers")
    pair = make(TINY)
    with torch.set_grad_enabled(pair.grad):
        a, b = pair.tokenpos(), pair.ref()
        if make.__name__ == "decode_pair":
            pair.reset()
            again = pair.tokenpos()
            pair.reset()
            assert torch.equal(again.logits, a.logits)               # the same cache length as the first step
            a, b = a.logits, b.logits
        if isinstance(a, tuple):
            assert all(torch.allclose(x, y, atol=1e-5) for x, y in zip(a, b, strict=True))
        else:
            assert a.shape == b.shape
            if make.__name__ in ("tied_loss_pair", "decode_pair"):
                assert torch.allclose(a, b, atol=1e-4)


def test_run_bench_runs_the_calls_case(monkeypatch) -> None:
    seen: list[dict] = []
    monkeypatch.setattr(bench, "calls_case", lambda cfg: seen.append(cfg) or [])
    report = bench.run_bench(quick=True, cases=["calls"])
    assert seen and seen[0]["calls_rounds"] == bench.QUICK["calls_rounds"] and report.rows == []
    assert "calls" in bench.CASES and "calls_timing" in report.config


# -- the CLI and the report ------------------------------------------------------------------------------


def _rows() -> list:
    from tokenpos.analysis.bench_timing import COPY, GATHER, bench_rows, note_rows

    trace = CallTrace(("torch/x.py:f", "torch/x.py:g"), ("torch/x.py",), 9, 20)
    def nothing() -> None:
        return None

    cheap = bench_calls.host_row(CallPair("cheap call", "torch cheap", nothing, nothing), [1e-6, 1e-6],
                                 [2e-6, 2e-6], 5, trace)
    dear = bench_calls.host_row(CallPair("dear call", "torch dear", nothing, nothing), [3e-6, 3e-6], [2e-6, 2e-6],
                                5, trace)
    return (bench_rows("forward", {COPY: [1.0, 1.2], GATHER: [0.8, 1.0]}, 1e6, limit=(GATHER,)) + [cheap, dear]
            + note_rows("calls", {"patched Llama decode step": "skipped: ImportError: no transformers"}))


def test_cli_prints_the_calls_table_and_writes_the_host_numbers(tmp_path, monkeypatch, capsys) -> None:
    from tokenpos.analysis.bench_timing import BenchReport
    from tokenpos.cli import bench as cli_bench

    monkeypatch.setattr(bench, "run_bench", lambda **kw: BenchReport("m", "tokenpos bench", {}, _rows()))
    monkeypatch.setenv("COLUMNS", "250")
    out = tmp_path / "r.json"
    args = argparse.Namespace(json=str(out), quick=False, compile=None, cases=None, no_progress=True)
    assert cli_bench.run(args) == 0
    text = capsys.readouterr().out
    assert "x limit" in text and "calls: host time per call" in text and "x ref [95%]" in text
    assert "0.50 [0.50, 0.50]" in text and "1.50 [1.50, 1.50]" in text
    assert "2 x 5" in text and "skipped: ImportError" in text
    saved = json.loads(out.read_text())
    cheap = [r for r in saved["rows"] if r["impl"] == "cheap call"][0]
    assert cheap["host"]["ratio"] == pytest.approx(0.5) and cheap["host"]["trace"]["lines"] == 9
    assert cheap["host"]["trace"]["functions"] == ["torch/x.py:f", "torch/x.py:g"]


def test_the_report_charts_the_calls_rows(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from tokenpos.analysis.bench_chart import calls_points
    from tokenpos.analysis.bench_timing import BenchReport
    from tokenpos.analysis.report import bench_html

    rows = _rows()
    pts = calls_points(rows)
    assert [p[0].split("\n")[0] for p in pts] == ["cheap call", "dear call"]    # the note row has no point
    assert [p[1] for p in pts] == pytest.approx([0.5, 1.5]) and [p[4] for p in pts] == pytest.approx([0.5, 1.5])
    images: list[Path] = []
    page = bench_html(BenchReport("m", "tokenpos bench", {}, rows), "full", tmp_path, 60, images)
    assert tmp_path / "bench_calls.png" in images and (tmp_path / "bench_calls.png").stat().st_size > 0
    calls = page.split("Host time of a call</h3>")[1]
    assert calls.index("data:image/png;base64,") < calls.index("<table")     # the chart, then the table
    for shown in ("cheap call", "torch dear", "0.50 [0.50, 0.50]", "skipped: ImportError"):
        assert shown in calls
    assert "Host time of a call" not in bench_html(BenchReport("m", "c", {}, rows[:2]), "full", tmp_path, 60)
