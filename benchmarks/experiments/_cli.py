"""The command line every experiment shares: ``--reps`` and ``--quick``, and the bench's shapes.

``FULL`` is ``tokenpos bench``'s forward workload (V, D, L, B); ``QUICK`` tiny shapes for a smoke
run whose numbers mean nothing. Each script adds its own options before :func:`parse`.
"""

from __future__ import annotations

import argparse

FULL = (50257, 768, 512, 16)      # V, D, L, B: the bench's forward
QUICK = (4096, 256, 64, 4)


def parser(doc: str | None, reps: int, what: str = "interleaved reps") -> argparse.ArgumentParser:
    """An argument parser with the script's docstring, ``--reps`` (default ``reps``) and ``--quick``."""
    ap = argparse.ArgumentParser(description=(doc or "").splitlines()[0])
    ap.add_argument("--reps", type=int, default=reps, help=f"{what} (default {reps})")
    ap.add_argument("--quick", action="store_true",
                    help="tiny shapes, 3 reps: checks that it runs (numbers mean nothing)")
    return ap


def parse(ap: argparse.ArgumentParser, argv: list[str] | None) -> tuple[argparse.Namespace, int]:
    """(the parsed arguments, the reps to run: 3 with ``--quick``)."""
    args = ap.parse_args(argv)
    return args, 3 if args.quick else args.reps
