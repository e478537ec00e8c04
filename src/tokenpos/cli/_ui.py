"""Console and progress-bar helpers shared by the sub-commands (the CLI is the only place that prints)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager

ProgressFn = Callable[[str, int, int], None]


def console(*, stderr: bool = False):  # -> rich.console.Console
    """A rich Console; 160 columns wide when the output is not a terminal (so tables are never squeezed)."""
    from rich.console import Console

    con = Console(stderr=stderr, highlight=False)
    if not con.is_terminal and "COLUMNS" not in os.environ:
        con = Console(stderr=stderr, highlight=False, width=160)
    return con


@contextmanager
def progress_bars(enabled: bool = True) -> Iterator[ProgressFn]:
    """Yield a ``progress(step, done, total)`` callback drawing one rich bar per step on stderr.

    ``"group: detail"`` steps share the bar of ``group`` and show the detail (the benchmark reports
    ``"benchmark: forward"``, ``"benchmark: rope"``, ... on one bar).
    """
    if not enabled:
        yield lambda step, done, total: None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

    columns = (TextColumn("{task.description:<34}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console(stderr=True)) as prog:
        tasks: dict[str, TaskID] = {}

        def update(step: str, done: int, total: int) -> None:
            key = step.split(":", 1)[0]
            if key not in tasks:
                tasks[key] = prog.add_task(step, total=max(int(total), 1))
            prog.update(tasks[key], description=step, completed=int(done), total=max(int(total), 1))

        yield update


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1 (the message becomes ``argument --x: ...``)."""
    import argparse

    try:
        value = int(text.replace("_", "").replace(",", ""))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {value}")
    return value
