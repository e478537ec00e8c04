"""The ``tokenpos`` console script: ``main(argv) -> exit code``.

Each sub-command lives in its own module (named as the command) exposing ``HELP`` (its one-line summary),
``add_parser(subparsers)`` and ``run(args) -> int``. Imports are what a command needs, when it needs them: a
sub-command module imports nothing heavy at module level, ``main`` builds the options of the one command it
runs (the others are listed by name and ``HELP`` only), and torch, numba and matplotlib are imported by the
``run`` that uses them. So ``tokenpos --help``, a bad argument and ``tokenpos memory`` import none of them
(tests/cli/test_lazy_imports.py), and the console script works without the optional packages. A command that
needs a missing optional package says which extra installs it (:func:`tokenpos.cli._ui.missing_extra`).

Errors: a bad argument (argparse), a ``ValueError`` from the library (``ConfigError`` and friends),
an ``OSError`` on output files or a ``MemoryError`` becomes one line ``tokenpos <cmd>: error: ...`` on
stderr and exit code 2, never a traceback. Ctrl-C exits 130.

Outputs: every file a sub-command writes goes through :mod:`tokenpos._files` (path checked before
the work, written atomically after it), so a failed or interrupted run never destroys a previous file.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Collection, Sequence
from types import ModuleType
from typing import Any

# Order shown in ``tokenpos --help``. Optional ones are written by other issues and may be absent.
COMMANDS = ("report", "memory", "plot", "bench", "extrapolate")
OPTIONAL_COMMANDS = frozenset({"bench", "extrapolate"})
EXIT_USAGE = 2
EXIT_BROKEN_PIPE = 128 + 13        # the status of a Unix tool killed by SIGPIPE (``tokenpos memory | head``)


class UsageError(Exception):
    """A bad command line; ``prog`` names the (sub-)command."""

    def __init__(self, prog: str, message: str) -> None:
        super().__init__(message)
        self.prog = prog


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser that raises UsageError instead of printing the usage block and exiting."""

    def error(self, message: str) -> Any:  # type: ignore[override]
        raise UsageError(self.prog, message)


class _Unavailable:
    """Stand-in for a sub-command module that exists but fails to import (shown, and explained on use)."""

    def __init__(self, name: str, exc: BaseException) -> None:
        self.name, self.reason = name, f"{type(exc).__name__}: {exc}"

    def add_parser(self, subparsers: Any) -> None:
        p = subparsers.add_parser(self.name, help=f"(unavailable: {self.reason})",
                                  description=f"tokenpos {self.name} is unavailable: {self.reason}")
        p.set_defaults(_run=self.run)
        p.add_argument("rest", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)

    def run(self, args: argparse.Namespace) -> int:
        raise RuntimeError(f"this command is unavailable: {self.reason}")


def _load(name: str) -> ModuleType | _Unavailable | None:
    module = f"tokenpos.cli.{name}"
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if name in OPTIONAL_COMMANDS and exc.name == module:
            return None  # not written yet: simply not registered
        if name not in OPTIONAL_COMMANDS:
            raise
        return _Unavailable(name, exc)
    except Exception as exc:  # a colleague's module is broken: keep the rest of the CLI usable
        if name not in OPTIONAL_COMMANDS:
            raise
        return _Unavailable(name, exc)


def build_parser(full: Collection[str] | None = None) -> argparse.ArgumentParser:
    """The top-level parser with every available sub-command registered.

    Args:
        full: the commands whose options are built (each ``add_parser`` may import what its options list);
            the others are registered by name and ``HELP`` only. None: every command (tests, documentation).
    """
    from tokenpos import __version__

    parser = _Parser(
        prog="tokenpos",
        description="tokenpos: token ids to position-aware vectors. Analysis tools for the input block "
                    "of a transformer. Start with `tokenpos report`.",
        epilog="Run `tokenpos <command> --help` for the options of each command.",
    )
    parser.add_argument("--version", action="version", version=f"tokenpos {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="<command>", parser_class=_Parser)
    for name in COMMANDS:
        mod = _load(name)
        if mod is None:
            continue
        if full is not None and name not in full and not isinstance(mod, _Unavailable):
            sub.add_parser(name, help=mod.HELP)              # listed in --help; never parsed (not the command)
            continue
        before = set(sub.choices)
        mod.add_parser(sub)
        for new in set(sub.choices) - before:  # default the runner unless the module set its own
            if sub.choices[new].get_default("_run") is None:
                sub.choices[new].set_defaults(_run=mod.run)
    return parser


def _command_of(argv: Sequence[str]) -> str | None:
    """The sub-command ``argv`` names: its first argument that is not an option (the top-level parser has no
    option that takes a value), or None."""
    return next((a for a in argv if not a.startswith("-")), None)


def _fail(prog: str, message: str, code: int = EXIT_USAGE) -> int:
    first = " ".join(str(message).split())  # one line, whatever the exception text held
    print(f"{prog}: error: {first}", file=sys.stderr)
    return code


def _stdout_to_devnull() -> None:
    """Point stdout at /dev/null so the interpreter's final flush cannot complain about the pipe again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        pass          # stdout without a file descriptor (an in-process capture): nothing to redirect


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI with ``argv`` (default ``sys.argv[1:]``); returns the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    command = _command_of(argv)
    parser = build_parser(full=() if command is None else (command,))
    try:
        args = parser.parse_args(argv)
    except UsageError as exc:
        return _fail(exc.prog, f"{exc} (see `{exc.prog} --help`)")
    except SystemExit as exc:  # --help / --version
        return int(exc.code or 0) if not isinstance(exc.code, str) else 1
    args.argv = argv                               # the exact command, for documents that record it
    if args.command is None:
        parser.print_help()
        return EXIT_USAGE
    prog = f"tokenpos {args.command}"
    try:
        from tokenpos.cli._ui import check_sizes

        check_sizes(args.command, args)            # every size option bounded before any work (ConfigError)
        return int(args._run(args) or 0)
    except UsageError as exc:
        return _fail(exc.prog, str(exc))
    except BrokenPipeError:            # the reader closed the pipe early: end quietly, as Unix tools do
        _stdout_to_devnull()
        return EXIT_BROKEN_PIPE
    except OSError as exc:
        where = f"{exc.filename}: " if getattr(exc, "filename", None) else ""
        return _fail(prog, f"{where}{exc.strerror or exc}")
    except ImportError as exc:
        from tokenpos.cli._ui import missing_extra

        return _fail(prog, missing_extra(exc) or str(exc))
    except (ValueError, RuntimeError) as exc:
        return _fail(prog, str(exc))
    except MemoryError as exc:   # a last line of defence: sizes are bounded where they are read
        return _fail(prog, f"out of memory{': ' + str(exc) if str(exc) else ''}; try smaller sizes")
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
