"""A missing output folder is created, as ``report --out`` creates its folder (issue 49): ``plot --out`` (tests in
test_cli.py) and ``bench --json``; a run that fails leaves no folder behind, and a bad path still fails before any
work. Files are written atomically (tokenpos._files)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from tokenpos.analysis import bench
from tokenpos.cli import bench as cli_bench
from tokenpos.cli._ui import output_file


def _args(path: Path) -> argparse.Namespace:
    return argparse.Namespace(json=str(path), quick=True, compile=None, cases=None, no_progress=True)


def _report() -> bench.BenchReport:
    from tokenpos.analysis.bench_timing import BenchReport

    return BenchReport("a machine", "tokenpos bench --quick", {}, [])


def test_bench_json_creates_its_folders(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bench, "run_bench", lambda **kw: _report())
    target = tmp_path / "runs" / "today" / "bench.json"
    assert cli_bench.run(_args(target)) == 0
    assert json.loads(target.read_text(encoding="utf-8"))["command"] == "tokenpos bench --quick"


def test_a_failed_bench_leaves_no_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(**kw: object) -> None:
        raise RuntimeError("the benchmark broke")

    monkeypatch.setattr(bench, "run_bench", fail)
    with pytest.raises(RuntimeError, match="broke"):
        cli_bench.run(_args(tmp_path / "runs" / "today" / "bench.json"))
    assert list(tmp_path.iterdir()) == []


def test_output_file_keeps_folders_that_were_there(tmp_path: Path) -> None:
    (tmp_path / "kept").mkdir()
    with pytest.raises(ValueError), output_file(tmp_path / "kept" / "new" / "x.png"):
        raise ValueError("the work failed")
    assert [p.name for p in tmp_path.iterdir()] == ["kept"] and list((tmp_path / "kept").iterdir()) == []
    with output_file(tmp_path / "kept" / "new" / "x.png") as path:
        path.write_bytes(b"made")
    assert (tmp_path / "kept" / "new" / "x.png").read_bytes() == b"made"


def test_output_file_checks_before_making_anything(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="must end in one of"), output_file(tmp_path / "a" / "x.txt",
                                                                            suffixes=(".png",)):
        pass
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    with pytest.raises(NotADirectoryError), output_file(blocker / "b" / "x.png"):
        pass
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]
