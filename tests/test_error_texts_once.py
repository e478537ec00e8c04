"""An error text is written once, in ``tokenpos.tables.checks``, never once per backend (issue 48, item 11: the
resize checks were written twice, in numpy/token.py and torch/token.py, and could drift apart).

The guard reads every ``raise`` of both backends' sources (``ast``) and collects the literal text of its message
(f-strings with their fields as ``{}``; ``NotImplementedError`` of abstract methods aside); a text raised by both
backends is a check written twice. Known
duplicates still to move are listed with where they are, so a new one fails and an old one moved fails too (the
list must shrink with it).
"""

from __future__ import annotations

import ast
from pathlib import Path

import tokenpos

SRC = Path(tokenpos.__file__).parent

#: text -> the files raising it in both backends (to move into tables/checks, as token.py's were)
KNOWN: dict[str, str] = {}


def _text(node: ast.AST) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _text(node.left), _text(node.right)
        return None if left is None or right is None else left + right
    return None


def raised_texts(backend: str) -> dict[str, set[str]]:
    """Message text -> the files of ``backend`` raising it (``raise SomeError(<text>, ...)``)."""
    out: dict[str, set[str]] = {}
    for path in sorted((SRC / backend).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call) and node.exc.args
                    and getattr(node.exc.func, "id", None) != "NotImplementedError"):    # abstract methods
                text = _text(node.exc.args[0])
                if text is not None and len(text) >= 20:
                    out.setdefault(text, set()).add(path.relative_to(SRC / backend).as_posix())
    return out


def test_no_error_text_is_raised_by_both_backends() -> None:
    numpy, torch = raised_texts("numpy"), raised_texts("torch")
    twice = {t: sorted(numpy[t] | torch[t]) for t in set(numpy) & set(torch)}
    new = {t: f for t, f in twice.items() if t not in KNOWN}
    assert not new, f"error texts written in both backends (move each into tokenpos.tables.checks): {new}"
    moved = set(KNOWN) - set(twice)
    assert not moved, f"no longer duplicated, drop them from KNOWN: {sorted(moved)}"


def test_the_guard_sees_the_resize_checks_in_tables_checks() -> None:
    """The resize messages live in tables/checks/token_table.py, raised by neither backend's own code."""
    texts = set(raised_texts("numpy")) | set(raised_texts("torch"))
    assert not any("would shrink vocab_size" in t or "would fall outside the new vocab" in t for t in texts)
    source = (SRC / "tables" / "checks" / "token_table.py").read_text()
    assert "would shrink vocab_size" in source and "would fall outside the new vocab" in source
