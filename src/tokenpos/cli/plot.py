"""``tokenpos plot KIND --out FILE.png``: one figure of a positional scheme or of embedding memory."""

from __future__ import annotations

import argparse
import inspect
from typing import Any

from tokenpos.cli._ui import console, output_file, positive_int

HELP = "draw one figure (sinusoidal, similarity, rope, alibi, t5, fire, kerple, memory, mrope, positions2d) to a PNG"

# option dest -> keyword of the plot functions
OPTIONS = {"d_model": "d_model", "num_positions": "num_positions", "head_dim": "head_dim",
           "num_heads": "num_heads", "seq_len": "seq_len", "base": "base", "factor": "factor"}


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive finite number, got {text}")
    return value


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    from tokenpos.analysis.extrapolate.plot_bias import DESCRIPTIONS as BIAS
    from tokenpos.analysis.plots import DESCRIPTIONS as BASE

    DESCRIPTIONS = {**BASE, **BIAS}
    kinds = "; ".join(f"{k}: {v}" for k, v in DESCRIPTIONS.items())
    p = subparsers.add_parser("plot", help=HELP, description=f"{HELP}. Kinds: {kinds}.",
                              epilog="Example: tokenpos plot sinusoidal --out sinusoidal.png")
    p.add_argument("kind", choices=list(DESCRIPTIONS), metavar="KIND", help="one of " + ", ".join(DESCRIPTIONS))
    p.add_argument("--out", metavar="FILE", help="output file, .png (or .svg / .pdf); default KIND.png. Missing "
                                                 "folders are created; an existing file is kept unless --force")
    p.add_argument("--force", action="store_true", help="replace FILE if it exists")
    p.add_argument("--dpi", type=positive_int, default=110, help="resolution (default 110, at most 600)")
    g = p.add_argument_group("figure options (each applies to the kinds that use it)")
    g.add_argument("--d-model", type=positive_int, help="sinusoidal, similarity: embedding width (128)")
    g.add_argument("--num-positions", type=positive_int, help="sinusoidal: rows of the heatmap (256)")
    g.add_argument("--head-dim", type=positive_int,
                   help="similarity (64), rope (128), mrope (128), positions2d (64): rotary head dim, even")
    g.add_argument("--num-heads", type=positive_int, help="alibi (8), fire, kerple (4): number of heads")
    g.add_argument("--seq-len", type=positive_int,
                   help="alibi (24), t5 (256), fire (512), kerple (256): query/key length")
    g.add_argument("--base", type=_positive_float, help="sinusoidal, rope: wavelength base (10000)")
    g.add_argument("--factor", type=_positive_float, help="rope: context extension factor of the scalings (4)")
    return p


def run(args: argparse.Namespace) -> int:
    """Draw the figure (matplotlib is imported by the drawing: without it, main names the extra to install)."""
    from tokenpos.analysis.extrapolate import plot_bias
    from tokenpos.analysis.plots import FORMATS, PLOTS

    fn = PLOTS.get(args.kind) or getattr(plot_bias, f"plot_{args.kind}")
    accepted = set(inspect.signature(fn).parameters)
    opts: dict[str, Any] = {"dpi": args.dpi}
    for dest, kw in OPTIONS.items():
        value = getattr(args, dest)
        if value is None:
            continue
        if kw not in accepted:
            raise ValueError(f"--{dest.replace('_', '-')} does not apply to plot {args.kind!r}")
        opts[kw] = value
    with output_file(f"{args.kind}.png" if args.out is None else args.out, overwrite=args.force,
                     suffixes=tuple(f".{f}" for f in FORMATS)) as out:      # checked before any drawing
        path = fn(out, **opts)
    console().print(f"wrote {path}", markup=False)
    return 0
