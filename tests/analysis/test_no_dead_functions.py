"""No dead function in ``tokenpos.analysis`` (issue 48, item 11: ``plots_rope.rope_wavelength_axes`` was called by
nothing). The guard: every top-level function of every analysis module is named somewhere else, in the package,
the tests, the benchmarks or the docs (a word match outside its own ``def``)."""

from __future__ import annotations

import ast
import re
from collections import Counter
from pathlib import Path

import tokenpos

ROOT = Path(tokenpos.__file__).parents[2]
ANALYSIS = Path(tokenpos.__file__).parent / "analysis"


def _corpus() -> str:
    files = [*(ROOT / "src").rglob("*.py"), *(ROOT / "tests").rglob("*.py"), *(ROOT / "benchmarks").rglob("*.py"),
             *(ROOT / "docs").rglob("*.md"), *ROOT.glob("*.md")]
    return "\n".join(p.read_text(errors="replace") for p in files if p.resolve() != Path(__file__).resolve())


def test_every_analysis_function_is_used_somewhere() -> None:
    words = Counter(re.findall(r"\w+", _corpus()))
    dead = []
    for path in sorted(ANALYSIS.rglob("*.py")):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                uses = words[node.name] - 1                                          # minus its def
                if uses < 1:
                    dead.append(f"{path.relative_to(ANALYSIS)}::{node.name}")
    assert not dead, f"functions nothing calls (delete them, or call them): {dead}"
