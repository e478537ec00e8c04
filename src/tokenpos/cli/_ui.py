"""Console and progress-bar helpers shared by the sub-commands (the CLI is the only place that prints)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ProgressFn = Callable[[str, int, int], None]

#: Each optional package a command may import -> the extra of pyproject.toml's [project.optional-dependencies]
#: that installs it (tests/cli/test_lazy_imports.py checks the two agree, and that none is a required package).
EXTRAS: dict[str, str] = {"torch": "torch", "transformers": "hf", "matplotlib": "plot", "triton": "gpu"}


def missing_extra(exc: ImportError) -> str | None:
    """The one message for a missing optional package: ``needs matplotlib, which is not installed; install it
    with: pip install 'tokenpos[plot]'``; None when ``exc`` is not a missing package of :data:`EXTRAS` (a
    package that is installed but fails to import keeps its own message)."""
    if not isinstance(exc, ModuleNotFoundError) or not exc.name:
        return None
    package = exc.name.partition(".")[0]
    extra = EXTRAS.get(package)
    if extra is None:
        return None
    return f"needs {package}, which is not installed; install it with: pip install 'tokenpos[{extra}]'"


@contextmanager
def output_file(path: str | os.PathLike[str], *, overwrite: bool = True,
                suffixes: tuple[str, ...] | None = None) -> Iterator[Path]:
    """An output file's path, checked before the work (:func:`tokenpos._files.check_output_path`), its missing
    parent folders created first as ``report --out`` creates its folder; if the work (the ``with`` body) fails,
    the folders created here are removed again, so a failed run leaves nothing behind. Write the file itself
    atomically (``tokenpos._files``).

    Raises:
        ValueError / OSError: from :func:`tokenpos._files.check_output_path`, or a folder that cannot be made.
    """
    from tokenpos._files import check_output_path

    target = Path(path)
    created: list[Path] = []
    try:
        check_output_path(path, overwrite=overwrite, suffixes=suffixes)       # name, suffix, existing file
    except FileNotFoundError:                                                   # only the parent is missing
        missing = [p for p in target.parent.parents if not p.exists()][::-1] + [target.parent]
        try:
            for folder in missing:
                folder.mkdir()
                created.append(folder)
            check_output_path(target, overwrite=overwrite, suffixes=suffixes)
        except BaseException:
            _remove_empty(created)
            raise
    try:
        yield target
    except BaseException:
        _remove_empty(created)
        raise


def _remove_empty(folders: list[Path]) -> None:
    """Remove ``folders`` (deepest first) that are still empty."""
    for folder in reversed(folders):
        try:
            folder.rmdir()
        except OSError:
            return


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


# The upper bound of every size option of every command, by command and option dest: beyond it the work would
# not fit in memory (or in any reasonable time). Checked by ``check_size`` before a command runs, so an
# absurd value is a ConfigError in a millisecond, never an allocation first. Plot sizes are also bounded per
# figure kind in ``analysis.figures.LIMITS`` (e.g. alibi's seq_len); these are the largest any kind accepts.
SIZE_LIMITS: dict[str, dict[str, int]] = {
    "memory": {"vocab_size": 1 << 40, "d_model": 1 << 30, "max_seq_len": 1 << 40, "num_heads": 1 << 20,   # arithmetic
               "total_params": 10 ** 18, "tp": 1 << 20, "pad_to_multiple_of": 1 << 30, "batch": 1 << 30,  # only
               "seq_len": 1 << 40},
    "plot": {"dpi": 600, "d_model": 16_384, "num_positions": 65_536, "head_dim": 16_384, "num_heads": 64,
             "seq_len": 65_536},
    "extrapolate": {"sliding_stride": 8_192, "sliding_tokens": 10_000_000, "task_steps": 1_000_000,
                    "train_len": 8_192, "steps": 1_000_000, "batch_size": 4_096, "d_model": 4_096, "num_layers": 64,
                    "num_heads": 64, "eval_tokens": 100_000_000, "threads": 1_024, "multiples": 64},
}


def check_size(command: str, dest: str, value: int) -> int:
    """The one bound of the CLI's size options: ``value`` in [1, SIZE_LIMITS[command][dest]].

    Raises:
        ConfigError: naming the option (``--seq-len``), the value and the bound.
    """
    from tokenpos.tables.checks.validation import check_int

    return check_int("--" + dest.replace("_", "-"), value, minimum=1, maximum=SIZE_LIMITS[command][dest])


def check_sizes(command: str, args: Any) -> None:
    """Every size option of ``command`` that was given, through :func:`check_size` (before the command runs)."""
    for dest in SIZE_LIMITS.get(command, {}):
        value = getattr(args, dest, None)
        if isinstance(value, int):
            check_size(command, dest, value)


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
