"""The static checks run with the tests: ruff (lint, import order) and mypy (types) over the code.

Both tools are test extras pinned to a minor version, so a new release cannot fail CI by itself;
where they are not installed (not CI: it installs the extras) the checks are skipped.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("command", [["ruff", "check", "src", "tests", "benchmarks"],
                                     pytest.param(["mypy", "src"], marks=pytest.mark.slow)],   # mypy: 10-45 s
                         ids=["ruff", "mypy"])
def test_the_code_passes(command: list[str]) -> None:
    pytest.importorskip(command[0], reason=f"{command[0]} is a test extra: pip install -e '.[test]'")
    done = subprocess.run([sys.executable, "-m", *command], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, f"{' '.join(command)} failed:\n{done.stdout}\n{done.stderr}"
