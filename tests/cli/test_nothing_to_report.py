"""Every command handles "nothing to report" without a traceback.

Guard (issue 28, item 9): ``tokenpos extrapolate`` ended in an IndexError when every run diverged.
Each command's empty case, through the console script: extrapolate with every run diverged (table,
``--json`` and ``--plot`` still written); report given that document and one with no results at all;
bench with no rows; memory with no presets; plot has no empty case (every kind draws a formula) and
is covered by its size checks instead (tests/cli/test_size_bounds.py).
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import pytest

import tokenpos.analysis.extrapolate.train as train
from tokenpos.cli import main

FAST = ["--quick", "--no-progress", "--schemes", "alibi,rope", "--steps", "1", "--eval-tokens", "64"]


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    with warnings.catch_warnings():
        warnings.simplefilter("error")                      # library code warns about nothing either
        code = main(list(argv))
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return code, out, err


def _diverge(monkeypatch: pytest.MonkeyPatch) -> None:
    def diverged(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("loss is nan at step 1")
    monkeypatch.setattr(train, "train_model", diverged)


@pytest.fixture(scope="module")
def diverged_doc(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The JSON of a run whose every scheme diverged."""
    path = tmp_path_factory.mktemp("diverged") / "extrapolation.json"
    with pytest.MonkeyPatch.context() as mp:
        _diverge(mp)
        assert main(["extrapolate", *FAST, "--json", str(path)]) == 0
    return path


def test_extrapolate_with_every_run_diverged(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    _diverge(monkeypatch)
    code, out, _ = _run(capsys, "extrapolate", *FAST, "--json", str(tmp_path / "x.json"),
                        "--plot", str(tmp_path / "x.png"))
    assert code == 0
    assert "training diverged: loss is nan" in out
    assert "nothing to compare" in out
    doc = json.loads((tmp_path / "x.json").read_text())
    assert doc["runs"] == [] and all(r["ppl"] is None for r in doc["results"])
    assert (tmp_path / "x.png").stat().st_size > 0


@pytest.mark.slow  # a whole report
@pytest.mark.parametrize("empty_results", [False, True], ids=["diverged", "no-results"])
def test_report_with_nothing_to_report(diverged_doc: Path, empty_results: bool, tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    doc = json.loads(diverged_doc.read_text())
    if empty_results:
        doc["results"] = []
    source = tmp_path / "extrapolation_in.json"
    source.write_text(json.dumps(doc))
    code, out, _ = _run(capsys, "report", "--quick", "--no-bench", "--no-progress", "--extrapolation", str(source),
                        "--out", str(tmp_path / "report"))
    assert code == 0
    assert (tmp_path / "report" / "index.html").exists()


def test_bench_with_no_rows(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                            capsys: pytest.CaptureFixture[str]) -> None:
    import tokenpos.analysis.bench as bench
    from tokenpos.analysis.bench_timing import BenchReport

    monkeypatch.setattr(bench, "run_bench", lambda **kwargs: BenchReport("cpu", "tokenpos bench", {}, []))
    code, out, _ = _run(capsys, "bench", "--no-progress", "--json", str(tmp_path / "b.json"))
    assert code == 0
    assert json.loads((tmp_path / "b.json").read_text())["rows"] == []


def test_memory_with_no_presets(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import tokenpos.analysis.memory as memory

    monkeypatch.setattr(memory, "PRESETS", {})
    for argv in (["memory"], ["memory", "--tp", "2"], ["memory", "--json"]):
        code, _, _ = _run(capsys, *argv)
        assert code == 0, argv
