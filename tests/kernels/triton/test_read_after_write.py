"""No Triton kernel reads memory it wrote earlier in the same program without a barrier in between.

A program's lanes run in several warps, and global memory written by one lane is not ordered before
another lane's later load of it unless a ``tl.debug_barrier()`` (``bar.sync``) separates them. The
interpreter runs one lane at a time and never shows the race: the soft-capped tied-loss kernel wrote
the capped row and read the target's logit back, and on an H100 z_t was sometimes the uncapped value
(2026-11-28). This test reads the kernels' source: statements are taken in program order (a loop
body once, in order), and a ``tl.load`` through a pointer name that a ``tl.store`` used since the last
barrier fails it. A load before the store in one loop body (read a tile, write it back) is the
same lane's element and passes. Aliasing between two different pointer arguments (an in-place call)
is outside what a name-based check can see.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil

import pytest

pytest.importorskip("triton")          # the optional gpu extra

import tokenpos.kernels.triton as kt  # noqa: E402


def _base(expr: ast.expr) -> str | None:
    """The pointer name a load / store address starts from: ``row`` in ``row + cols``."""
    while isinstance(expr, ast.BinOp):
        expr = expr.left
    return expr.id if isinstance(expr, ast.Name) else None


def _call(node: ast.AST, name: str) -> bool:
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == name
            and isinstance(node.func.value, ast.Name) and node.func.value.id == "tl")


def _events(body: list[ast.stmt]) -> list[tuple[str, str | None, int]]:
    """(kind, pointer name, line) of every load, store and barrier, in program order."""
    out: list[tuple[str, str | None, int]] = []
    for stmt in body:
        if isinstance(stmt, (ast.For, ast.While)):
            out += _events(stmt.body)
        elif isinstance(stmt, ast.If):
            out += _events(stmt.body) + _events(stmt.orelse)
        else:
            for node in ast.walk(stmt):
                for kind in ("load", "store", "debug_barrier"):
                    if _call(node, kind):
                        out.append((kind, _base(node.args[0]) if node.args else None, node.lineno))
    return out


def _violations(fn: ast.FunctionDef) -> list[str]:
    pending: dict[str, int] = {}                     # pointer name -> line of a store since the last barrier
    found = []
    for kind, base, line in _events(fn.body):
        if kind == "debug_barrier":
            pending.clear()
        elif kind == "store" and base is not None:
            pending.setdefault(base, line)
        elif kind == "load" and base in pending:
            found.append(f"{fn.name}: line {line} loads through {base!r}, stored at line {pending[base]} "
                         "with no tl.debug_barrier() in between")
    return found


def _kernels() -> list[tuple[str, ast.FunctionDef]]:
    found = []
    for info in pkgutil.iter_modules(kt.__path__):
        module = importlib.import_module(f"{kt.__name__}.{info.name}")
        tree = ast.parse(inspect.getsource(module))
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and any(
                    isinstance(d, ast.Attribute) and d.attr == "jit" for d in node.decorator_list):
                found.append((info.name, node))
    return found


def test_the_check_finds_the_tied_loss_race_it_was_written_for() -> None:
    """The kernel as it was before the fix (its first lines): a capped row stored, z_t loaded back."""
    before = ast.parse('''
@triton.jit
def k(z_ptr, t_ptr, Vl, softcap, CAP: tl.constexpr, BLOCK: tl.constexpr):
    row = z_ptr + tl.program_id(0) * Vl
    tn = tl.load(t_ptr + tl.program_id(0))
    if CAP:
        for v0 in range(0, Vl, BLOCK):
            cols = v0 + tl.arange(0, BLOCK)
            x = tl.load(row + cols, mask=cols < Vl, other=0.0)
            tl.store(row + cols, softcap * x, mask=cols < Vl)
    zt = tl.load(row + tn)
''').body[0]
    assert isinstance(before, ast.FunctionDef)
    assert [v.split(":")[0] for v in _violations(before)] == ["k"]


def test_no_kernel_reads_what_it_wrote_without_a_barrier() -> None:
    kernels = _kernels()
    assert {m for m, _ in kernels} >= {"embedding", "rope", "cross_entropy", "tied_loss"}
    problems = [f"{module}.{v}" for module, fn in kernels for v in _violations(fn)]
    assert not problems, "\n".join(problems)
