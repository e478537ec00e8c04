"""The report's data ships in the package: an installed copy (the files a wheel holds: the modules and the
package-data patterns of pyproject.toml), imported from another folder, finds the checked-in study."""

from __future__ import annotations

import fnmatch
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

try:
    import tomllib
except ImportError:                      # Python 3.10
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "src" / "tokenpos"


def _wheel_like_copy(dest: Path) -> Path:
    """Copy what setuptools puts in the wheel: every .py file of the package and the files matching the
    ``[tool.setuptools.package-data]`` patterns (nothing else: no docs/, no tests/)."""
    patterns = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"][
        "package-data"]["tokenpos"]
    for src in PACKAGE.rglob("*"):
        if not src.is_file() or "__pycache__" in src.parts:
            continue
        rel = src.relative_to(PACKAGE).as_posix()
        if src.suffix == ".py" or any(fnmatch.fnmatch(rel, p) for p in patterns):
            target = dest / "tokenpos" / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, target)
    return dest


def test_an_installed_copy_run_outside_the_checkout_finds_the_study(tmp_path: Path) -> None:
    site = _wheel_like_copy(tmp_path / "site")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    code = ("import json, sys; from tokenpos.analysis.report import CHECKED_IN_STUDY, read_extrapolation; "
            "doc = read_extrapolation(CHECKED_IN_STUDY); "
            "print(json.dumps([str(CHECKED_IN_STUDY), len(doc['results'])]))")
    env = {**os.environ, "PYTHONPATH": str(site)}
    out = subprocess.run([sys.executable, "-c", code], cwd=elsewhere, env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    path, results = json.loads(out.stdout.strip().splitlines()[-1])
    assert Path(path).is_relative_to(site) and results > 0      # the copy's own file, not the checkout's


def test_docs_link_is_the_packaged_study() -> None:
    """docs/extrapolation_full.json (the path the docs and the study's command name) is the packaged file:
    a rerun that replaced the link with a new file must be copied into the package as well."""
    from tokenpos.analysis.report import CHECKED_IN_STUDY

    docs = ROOT / "docs" / "extrapolation_full.json"
    assert CHECKED_IN_STUDY.is_file() and CHECKED_IN_STUDY.is_relative_to(PACKAGE)
    assert docs.read_bytes() == CHECKED_IN_STUDY.read_bytes()
