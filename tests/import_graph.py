"""The static import graph of a package, read with ``ast`` (nothing is imported): shared by the import tests.

An edge A -> B is any import of module B of the package by module A of it:

- ``import tokenpos.x.y`` and ``from tokenpos.x.y import name`` -> ``tokenpos.x.y`` (a package means its
  ``__init__.py``); ``from tokenpos.x import y`` -> ``tokenpos.x.y`` when ``y`` is a submodule, else
  ``tokenpos.x``; relative imports (``from . import y``, ``from ..x import name``) resolved the same way;
  ``importlib.import_module("tokenpos.x")`` with a literal name counts too.
- imports anywhere count: module level, inside functions and methods, in ``try`` / ``if`` blocks. An
  import deferred into a function still runs: it only moves the import to the first call.
- imports under ``if TYPE_CHECKING:`` do not count (never executed); its ``else:`` branch does.
- the implicit import of the parent packages (``tokenpos.x`` before ``tokenpos.x.y``) is not an edge:
  every package that imports its own submodules would otherwise be a circle. A module importing
  itself is not one either.

Used by ``tests/test_import_cycles.py`` (no circles) and ``tests/test_import_direction.py`` (the layers).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"


@dataclass(frozen=True)
class Edge:
    """One import of ``target`` by ``source``, where it is written."""

    source: str
    target: str
    path: Path
    line: int
    statement: str


def module_names(src: Path, package: str) -> dict[str, Path]:
    """``{dotted module name: file}`` for every ``.py`` file of ``package`` (a folder under ``src``)."""
    out = {}
    for path in sorted((src / package).rglob("*.py")):
        parts = list(path.relative_to(src).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _is_type_checking(test: ast.expr) -> bool:
    """``TYPE_CHECKING`` or ``<module>.TYPE_CHECKING`` (``typing.TYPE_CHECKING``)."""
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _import_nodes(tree: ast.AST) -> list[ast.Import | ast.ImportFrom | ast.Call]:
    """Every import statement and ``import_module("...")`` call, at any depth, except under TYPE_CHECKING."""
    found: list[ast.Import | ast.ImportFrom | ast.Call] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for stmt in node.orelse:                  # only the else branch ever runs
                visit(stmt)
            return
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        elif (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str)
              and ((isinstance(node.func, ast.Attribute) and node.func.attr == "import_module")
                   or (isinstance(node.func, ast.Name) and node.func.id == "import_module"))):
            found.append(node)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The module ``name`` names: itself, else its longest known prefix (``pkg.attr`` -> ``pkg``); None outside."""
    parts = name.split(".")
    while parts:
        candidate = ".".join(parts)
        if candidate in modules:
            return candidate
        parts.pop()
    return None


def _base_of(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    """The absolute module a ``from X import ...`` reads from, relative levels resolved."""
    if not node.level:
        return node.module or ""
    package = module.split(".") if is_package else module.split(".")[:-1]
    anchor = package[: len(package) - (node.level - 1)]
    return ".".join(anchor + ([node.module] if node.module else []))


def import_edges(src: Path, package: str) -> list[Edge]:
    """Every import of a module of ``package`` by a module of ``package`` (module docstring for the rules)."""
    modules = module_names(src, package)
    edges = []
    for module, path in modules.items():
        is_package = path.name == "__init__.py"
        for node in _import_nodes(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            targets: list[str | None]
            if isinstance(node, ast.Import):
                targets = [_resolve(alias.name, modules) for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _base_of(node, module, is_package)
                # ``from pkg import sub``: the submodule sub when there is one, else the name lives in pkg
                targets = [_resolve(base if alias.name == "*" else f"{base}.{alias.name}".lstrip("."), modules)
                           for alias in node.names]
            else:
                name = node.args[0]
                assert isinstance(name, ast.Constant) and isinstance(name.value, str)  # literal names only
                targets = [_resolve(name.value, modules)]
            for target in dict.fromkeys(targets):
                if target is not None and target != module:
                    edges.append(Edge(module, target, path, node.lineno, ast.unparse(node)))
    return edges


def write_package(root: Path, files: dict[str, str]) -> Path:
    """Write ``{relative path: text}`` under ``root`` (a made-up package for the checkers' own tests)."""
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return root
