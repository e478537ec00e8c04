"""benchmarks/experiments use public APIs, or name each private one they use in their README with why (issue 48,
item 11: six scripts imported private names although docs/CONTRIBUTING.md says public APIs only).

The guard reads every script (its code and the code it runs in a child, which is text): a dotted ``tokenpos``
name with a private part (``tokenpos.torch._checks``, ``from tokenpos.kernels import _threading``) must appear in
the README's "Private names" table, in its script's row.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import tokenpos

EXPERIMENTS = Path(tokenpos.__file__).parents[2] / "benchmarks" / "experiments"
DOTTED = re.compile(r"\btokenpos(?:\.\w+)+")
FROM_IMPORT = re.compile(r"^\s*from\s+(tokenpos(?:\.\w+)*)\s+import\s+\(?([^)\n]+)", re.M)


def private_names(source: str) -> set[str]:
    """The ``tokenpos`` names with a part starting with "_" (dunders aside) that ``source`` refers to."""
    found = set()
    for m in FROM_IMPORT.finditer(source):
        for name in (n.split(" as ")[0].strip() for n in m.group(2).split(",")):
            found.add(f"{m.group(1)}.{name}")
    found |= set(DOTTED.findall(source))
    private = set()
    for name in found:
        parts = name.split(".")
        cut = next((i for i, p in enumerate(parts) if p.startswith("_") and not p.startswith("__")), None)
        if cut is not None:
            private.add(".".join(parts[:cut + 1]))
    return private


def _rows() -> dict[str, str]:
    text = (EXPERIMENTS / "README.md").read_text()
    section = text.split("## Private names", 1)[1] if "## Private names" in text else ""
    return {m.group(1): m.group(0) for m in re.finditer(r"^\| `(exp_\w+\.py)` \|.*$", section, re.M)}


SCRIPTS = sorted(p.name for p in EXPERIMENTS.glob("exp_*.py")) if EXPERIMENTS.is_dir() else []


def test_the_detector_sees_each_form() -> None:
    assert private_names("from tokenpos.kernels import _threading") == {"tokenpos.kernels._threading"}
    assert private_names("import tokenpos.torch._checks as c") == {"tokenpos.torch._checks"}
    assert private_names("from tokenpos.torch._init import empty_table") == {"tokenpos.torch._init"}
    assert private_names("from tokenpos.torch import RotaryEmbedding") == set()


@pytest.mark.skipif(not SCRIPTS, reason="benchmarks/ is not shipped with an installed package")
@pytest.mark.parametrize("script", SCRIPTS)
def test_every_private_name_is_listed_with_its_reason(script: str) -> None:
    names = private_names((EXPERIMENTS / script).read_text())
    if not names:
        return
    row = _rows().get(script)
    assert row is not None, f"{script} uses {sorted(names)}: list them in README.md's 'Private names' with why"
    missing = sorted(n for n in names if n not in row)
    assert not missing, f"{script}: {missing} are not in its README row"
