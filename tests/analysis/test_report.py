"""build_report: one self-contained HTML page that references every figure it wrote."""

from __future__ import annotations

import base64
import json
import re
import sys
import types
from dataclasses import dataclass
from pathlib import Path

import pytest

pytest.importorskip("matplotlib")

from tokenpos.analysis.report import HTML_NAME, build_report  # noqa: E402
from tokenpos.tables.errors import ConfigError  # noqa: E402

IMG = re.compile(r'<img src="data:image/png;base64,([A-Za-z0-9+/=]+)"[^>]*data-file="([^"]+)"')


def referenced_images(page: str) -> dict[str, bytes]:
    return {name: base64.b64decode(data) for data, name in IMG.findall(page)}


@dataclass
class FakeRow:
    case: str
    impl: str
    seconds: float
    gbps: float
    ratio_vs_copy: float
    ratio_vs_reference: float | None
    note: str = ""


def install_fake_bench(monkeypatch: pytest.MonkeyPatch, *, fail: bool = False) -> list[dict]:
    calls: list[dict] = []

    def run_bench(*, quick=False, compile=False, cases=None, progress=None):
        calls.append({"quick": quick})
        if fail:
            raise RuntimeError("no kernels here")
        progress and progress("lookup", 1, 1)
        rows = [FakeRow("lookup V=50257 D=768", "tokenpos torch (public layer)", 0.00123, 11.5, 0.8, 2.5, "fake"),
                FakeRow("lookup V=50257 D=768", "reference", 0.00307, 4.6, 0.3, None)]
        return types.SimpleNamespace(rows=rows, machine="test machine", command="pytest", config={})

    mod = types.ModuleType("tokenpos.analysis.bench")
    mod.run_bench = run_bench  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "tokenpos.analysis.bench", mod)
    return calls


TINY_PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==")


@pytest.fixture
def fast_plots(monkeypatch: pytest.MonkeyPatch) -> None:
    """Replace the figures by a 1x1 PNG where a test is about something else (they cost seconds each)."""
    def plot(kind: str, path: Path, **opts: object) -> Path:
        Path(path).write_bytes(TINY_PNG)
        return Path(path)

    monkeypatch.setattr("tokenpos.analysis.plots.plot", plot)


@pytest.mark.slow  # a whole report
def test_report_quick_without_bench(tmp_path: Path) -> None:
    steps: list[tuple[str, int, int]] = []
    path = build_report(tmp_path / "rep", mode="quick", bench=False, progress=lambda *a: steps.append(a))
    assert path == tmp_path / "rep" / HTML_NAME
    page = path.read_text(encoding="utf-8")
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    pngs = sorted(p.name for p in path.parent.glob("*.png"))
    assert {"sinusoidal.png", "similarity.png", "rope.png", "alibi.png", "t5.png", "memory.png"} <= set(pngs)
    embedded = referenced_images(page)
    assert sorted(embedded) == pngs                                  # every figure written is on the page
    for name, data in embedded.items():
        assert data == (path.parent / name).read_bytes()            # and it is the same image
        assert f'href="{name}"' in page
    assert "38,597,376" in page and "147.2" in page and "fp16/bf16 MiB" in page   # the memory table
    assert "Benchmark skipped" in page
    assert "PositionError" in page                                   # trade-offs computed from the layers
    assert "tokenpos extrapolate --json" in page                     # how to get one's own table
    last = {}
    for step, done, total in steps:
        last[step] = (done, total)
    assert {"memory tables", "plots", "trade-off analysis", "writing HTML"} <= set(last)
    assert all(done == total for done, total in last.values())


def test_report_with_fake_bench_and_extrapolation(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                  fast_plots: None) -> None:
    calls = install_fake_bench(monkeypatch)
    doc = {"train_len": 64, "results": [
        {"scheme": "sinusoidal", "eval_len": 64, "ppl": 3.5, "tail_nll": 1.25, "ratio": 1.0},
        {"scheme": "sinusoidal", "eval_len": 128, "ppl": 9.75, "tail_nll": 2.5, "ratio": 2.0},
        {"scheme": "learned", "eval_len": 64, "ppl": 3.4, "tail_nll": 1.2, "ratio": 1.0},
        {"scheme": "learned", "eval_len": 128, "ppl": None, "tail_nll": None, "ratio": None,
         "note": "positions >= 64 refused"}]}
    (tmp_path / "extrapolation.json").write_text(json.dumps(doc))
    notes: list[str] = []
    page = build_report(tmp_path, mode="quick", on_note=notes.append).read_text(encoding="utf-8")
    assert calls == [{"quick": True}]
    assert "lookup V=50257 D=768" in page and "test machine" in page
    assert "9.75" in page and "sinusoidal" in page                  # the extrapolation table
    assert sorted(referenced_images(page)) == sorted(p.name for p in tmp_path.glob("*.png"))
    assert not notes


@pytest.mark.slow  # the full bench
def test_full_mode_runs_the_full_bench(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fast_plots: None) -> None:
    calls = install_fake_bench(monkeypatch)
    build_report(tmp_path, mode="full")
    assert calls == [{"quick": False}]


def test_failing_bench_is_a_note_not_a_crash(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                            fast_plots: None) -> None:
    install_fake_bench(monkeypatch, fail=True)
    notes: list[str] = []
    page = build_report(tmp_path, mode="quick", on_note=notes.append).read_text(encoding="utf-8")
    assert "Benchmark failed: RuntimeError: no kernels here" in page
    assert notes == ["benchmark failed: RuntimeError: no kernels here"]


def test_bad_arguments(tmp_path: Path, fast_plots: None) -> None:
    with pytest.raises(ConfigError, match="mode"):
        build_report(tmp_path, mode="slow")
    with pytest.raises(ConfigError, match="does not exist"):
        build_report(tmp_path, extrapolation=tmp_path / "missing.json")
    (tmp_path / "file").write_text("x")
    with pytest.raises(OSError):
        build_report(tmp_path / "file" / "rep", bench=False)


# -- never destroy the previous report --------------------------------------------------------------


OLD_PAGE = "<html>the previous report</html>"


def _previous_report(tmp_path: Path) -> Path:
    out = tmp_path / "rep"
    out.mkdir()
    (out / HTML_NAME).write_text(OLD_PAGE, encoding="utf-8")
    return out


@pytest.mark.parametrize("interrupt", [KeyboardInterrupt, RuntimeError], ids=["ctrl-c", "crash"])
def test_an_interrupted_run_leaves_the_previous_index_html_intact(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                   fast_plots: None, interrupt: type) -> None:
    out = _previous_report(tmp_path)

    def tradeoffs_interrupted(ctx: object) -> str:
        assert (out / HTML_NAME).read_text(encoding="utf-8") == OLD_PAGE     # untouched while the run goes on
        raise interrupt("stopped in the middle of the run")

    monkeypatch.setattr("tokenpos.analysis.report._tradeoff_section", tradeoffs_interrupted)
    with pytest.raises(interrupt):
        build_report(out, mode="quick", bench=False)
    assert (out / HTML_NAME).read_text(encoding="utf-8") == OLD_PAGE
    assert not [p.name for p in out.iterdir() if p.name.startswith(".")]       # no temporary file left


def test_a_failure_while_writing_the_page_leaves_the_previous_index_html_intact(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fast_plots: None) -> None:
    out = _previous_report(tmp_path)

    def page_interrupted(*args: object) -> str:
        raise KeyboardInterrupt

    monkeypatch.setattr("tokenpos.analysis.report_html.page", page_interrupted)
    with pytest.raises(KeyboardInterrupt):
        build_report(out, mode="quick", bench=False)
    assert (out / HTML_NAME).read_text(encoding="utf-8") == OLD_PAGE


@pytest.mark.parametrize("content", ["{not json", '{"results": 3}', "[]"], ids=["syntax", "results", "list"])
def test_a_bad_extrapolation_file_fails_before_anything_is_written(tmp_path: Path, fast_plots: None,
                                                                   content: str) -> None:
    out = _previous_report(tmp_path)
    bad = tmp_path / "bad.json"
    bad.write_text(content, encoding="utf-8")
    before = sorted(p.name for p in out.iterdir())
    with pytest.raises(ConfigError, match="cannot read extrapolation results"):
        build_report(out, mode="quick", bench=False, extrapolation=bad)
    assert (out / HTML_NAME).read_text(encoding="utf-8") == OLD_PAGE
    assert sorted(p.name for p in out.iterdir()) == before                    # no figure written either
    fresh = tmp_path / "fresh"
    with pytest.raises(ConfigError):
        build_report(fresh, mode="quick", bench=False, extrapolation=bad)
    assert not fresh.exists()                                                 # not even the folder


def test_a_successful_run_replaces_the_previous_page(tmp_path: Path, fast_plots: None) -> None:
    out = _previous_report(tmp_path)
    build_report(out, mode="quick", bench=False)
    page = (out / HTML_NAME).read_text(encoding="utf-8")
    assert page != OLD_PAGE and page.startswith("<!DOCTYPE html>")
    assert not [p.name for p in out.iterdir() if p.name.startswith(".")]


@pytest.mark.slow  # a whole report
def test_report_without_a_run_of_ones_own_shows_the_checked_in_study_with_intervals(tmp_path: Path) -> None:
    from tokenpos.analysis.report import CHECKED_IN_STUDY

    assert CHECKED_IN_STUDY.is_file(), "the study ships in the package (src/tokenpos/analysis/data)"
    page = build_report(tmp_path / "rep", mode="quick", bench=False).read_text(encoding="utf-8")
    assert "extrapolation_full.json" in page and "95% Student-t interval over seeds" in page
    assert "checked-in study" in page and "sliding" in page              # both protocols' tables


@pytest.mark.parametrize("other_cpu_seconds, busy", [(None, False), (0.5, False), (30.0, True)])
def test_the_bench_section_says_when_other_processes_competed(other_cpu_seconds: float | None, busy: bool) -> None:
    from tokenpos.analysis.bench_timing import COPY, GATHER, BenchReport, Competition, bench_rows
    from tokenpos.analysis.report import bench_html

    rows = bench_rows("forward", {COPY: [1.0, 3.0, 3.0], GATHER: [1.0, 1.0, 1.0]}, 1e6, limit=(GATHER,))
    measured = None if other_cpu_seconds is None else Competition(other_cpu_seconds, 10.0, 16)
    page = bench_html(BenchReport("m", "tokenpos bench --quick", {}, rows, measured), "default")
    assert ("other processes kept 3.00 of the 16 CPUs busy" in page) == busy


def test_the_bench_section_charts_the_headline_ratios_and_leaves_the_experiment_rows_out(tmp_path: Path) -> None:
    """A chart (an embedded PNG) of the public layers' and the block's ratios, then their table; the
    references, raw kernels and experiment rows (compute floor, the numba gather) are not in it."""
    from tokenpos.analysis.bench_chart import ratio_points
    from tokenpos.analysis.bench_timing import COMPILE, EAGER, GATHER, GATHER_NUMBA, KERNEL, BenchReport, bench_rows
    from tokenpos.analysis.report import bench_html

    rows = bench_rows("forward", {GATHER: [1.0, 1.1], EAGER: [3.0, 3.3], COMPILE: [1.2, 1.3], KERNEL: [1.05, 1.1],
                                  GATHER_NUMBA: [1.2, 1.3],
                                  "compute floor: tokenpos kernel, 64-row table (in cache)": [0.5, 0.6],
                                  "tokenpos torch (public layer)": [1.1, 1.2]}, 1e6, limit=(GATHER,))
    rows += bench_rows("block", {EAGER: [2.0, 2.2], COMPILE: [1.5, 1.6], "tokenpos layers, eager": [1.8, 1.9]}, 0,
                       bandwidth=False)
    images: list[Path] = []
    page = bench_html(BenchReport("m", "tokenpos bench", {}, rows), "full", tmp_path, 60, images)
    assert images == [tmp_path / "bench.png"] and images[0].is_file()
    assert page.index("data:image/png;base64,") < page.index("<table")           # the chart, the table under it
    for shown in ("tokenpos torch (public layer)", "tokenpos layers, eager"):
        assert shown in page
    for left_out in ("numba gather", "compute floor", KERNEL, GATHER):
        assert left_out not in page.split("<table")[1]
    pts = {(label, key): (med, best) for label, key, med, best in ratio_points(rows)}   # (median, best)
    assert pts[("forward: tokenpos torch", "limit")] == pytest.approx((1.05 / 1.15, 1.0 / 1.1))  # 2-rep medians: means
    assert pts[("forward: tokenpos torch", "compile")] == pytest.approx((1.25 / 1.15, 1.2 / 1.1))
    assert pts[("block: tokenpos layers, eager", "eager")] == pytest.approx((2.1 / 1.85, 2.0 / 1.8))
    assert ("block: tokenpos layers, eager", "limit") not in pts
