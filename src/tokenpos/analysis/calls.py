"""``trace_call``: which of tokenpos's functions, and how many of its source lines, one call runs.

A call's host cost grows with the Python it runs: every function entered and every line executed
costs interpreter time whatever the data's size (the style guide's "a call that passes through 20+
functions to look up a few rows"). :func:`trace_call` counts them for one call, so a test or the
``calls`` case of ``tokenpos bench`` (:mod:`.bench_calls`) can state them as numbers:

    trace = trace_call(lambda: layer(ids))     # ids (B, L) -> (B, L, D), any call at all
    trace.functions   # ("torch/transformer.py:TransformerEmbedding.forward", ...), sorted
    trace.lines       # distinct (file, line) pairs of tokenpos code that ran

What counts: Python frames whose code lives under the package directory (by default the tokenpos
package, less ``tokenpos/analysis/`` and ``tokenpos/cli/``: the benchmark's own closures and the tools
around the library are not the library), entered on the calling thread (``sys.settrace`` is per
thread). torch, numpy, transformers and compiled code (numba kernels, torch's C++ ops) run no such
frames and never count; a tokenpos function that torch's dispatcher calls back (a custom op's Python
implementation) counts, as it runs on the calling thread. Generator expressions and, before Python
3.12, list / set / dict comprehensions run in frames of their own and count as functions when entered
(``"...:forward.<locals>.<genexpr>"``); from 3.12 on comprehensions are inlined (PEP 709) and only
their lines count. A generator resumed several times counts once.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import CodeType, FrameType
from typing import Any

#: Subfolders of the tokenpos package left out by default: the tools around the library, not the library.
TOOLS = ("analysis", "cli")


@dataclass(frozen=True)
class CallTrace:
    """What one call ran of the package's Python (:func:`trace_call`).

    functions: ``"relative/path.py:qualname"`` of every function entered, sorted (relative to the package
        directory, ``/``-separated; qualname as ``co_qualname``, e.g. ``"TokenEmbedding.forward"``,
        ``"f.<locals>.<genexpr>"``; ``co_name`` before Python 3.11).
    files: the distinct relative paths of those functions, sorted.
    lines: distinct (file, line) pairs executed (``line`` events: a docstring or a ``def`` line never counts).
    span: distinct (file, line) pairs of the entered functions' source, each function from its first line
        (``co_firstlineno``: the first decorator's, or the ``def``) to the last line of its code; a function
        nested in another entered one (a closure, a generator expression) adds no line twice.
    """

    functions: tuple[str, ...]
    files: tuple[str, ...]
    lines: int
    span: int


def package_dir() -> Path:
    """The tokenpos package directory (``.../tokenpos``)."""
    return Path(__file__).resolve().parents[1]


def _last_line(code: CodeType) -> int:
    """The last source line of ``code`` (end lines of its instructions where Python records them, 3.11+)."""
    positions = getattr(code, "co_positions", None)
    if positions is not None:
        ends = [end if end is not None else line for line, end, _, _ in positions()]
    else:                                                            # Python 3.10
        ends = [line for _, _, line in code.co_lines()]
    return max((e for e in ends if e is not None), default=code.co_firstlineno)


def trace_call(fn: Callable[[], Any], *, package: str | Path | None = None) -> CallTrace:
    """Call ``fn()`` once untraced (the warm-up: imports, caches, first-call paths), then once traced,
    and return what the traced call ran of the package's code (:class:`CallTrace`).

    ``package``: the directory whose code counts (None: the tokenpos package less :data:`TOOLS`; a
    directory given counts whole). ``fn``'s own frame counts only when its code lives there.
    Tracing replaces any tracer installed with ``sys.settrace`` (a debugger's, coverage's) for the
    traced call only; it is restored afterwards, also when ``fn`` raises (the exception propagates).
    """
    root = Path(package).resolve() if package is not None else package_dir()
    excluded = () if package is not None else tuple(str(root / t) + os.sep for t in TOOLS)
    prefix = str(root) + os.sep
    relative: dict[str, str | None] = {}                             # co_filename -> path in root, or None

    def rel(filename: str) -> str | None:
        if filename not in relative:
            path = os.path.realpath(os.path.abspath(filename))
            inside = path.startswith(prefix) and not path.startswith(excluded)
            relative[filename] = path[len(prefix):].replace(os.sep, "/") if inside else None
        return relative[filename]

    entered: dict[CodeType, str] = {}
    executed: set[tuple[str, int]] = set()

    def local(frame: FrameType, event: str, arg: Any) -> Any:
        if event == "line":
            executed.add((frame.f_code.co_filename, frame.f_lineno))
        return local

    def on_call(frame: FrameType, event: str, arg: Any) -> Any:
        code = frame.f_code
        path = rel(code.co_filename)
        if path is None:
            return None                                              # no line events for this frame
        entered.setdefault(code, path)
        return local

    fn()
    previous = sys.gettrace()
    sys.settrace(on_call)
    try:
        fn()
    finally:
        sys.settrace(previous)
    functions = sorted({f"{path}:{getattr(code, 'co_qualname', code.co_name)}" for code, path in entered.items()})
    spans = {(code.co_filename, line) for code in entered
             for line in range(code.co_firstlineno, _last_line(code) + 1)}
    return CallTrace(tuple(functions), tuple(sorted(set(entered.values()))), len(executed), len(spans))
