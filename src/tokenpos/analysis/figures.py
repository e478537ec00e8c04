"""The canvas and the output file every figure shares: ``new_figure`` (Agg, no pyplot), the size bounds
(``LIMITS``, ``check_size``, ``MAX_DPI``, ``MAX_PIXELS``) and ``save`` (checked path, atomic write).

A leaf below every plot module (plots.py, plots_relative.py, plots_rope.py, extrapolate/plot*.py): it
imports none of them. matplotlib is imported inside ``new_figure`` only.

Outputs: the folder must exist (it is never created here); the file is rendered in memory and written
atomically (``tokenpos._files``: a temporary file renamed over the target), so an interrupted run
never leaves a truncated figure. Sizes are bounded: an absurd request is a ConfigError, never a MemoryError.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from tokenpos._files import atomic_write_bytes
from tokenpos.tables.checks.validation import check_choice, check_int
from tokenpos.tables.errors import ConfigError

FORMATS = ("png", "svg", "pdf")
MAX_DPI = 600
MAX_PIXELS = 50_000_000                      # width x height of the rendered figure (about 200 MB as RGBA)
# the largest size option each figure accepts (beyond these the arrays or the figure would not fit in memory)
LIMITS = {"num_positions": 65_536, "d_model": 16_384, "head_dim": 16_384, "num_heads": 64, "alibi_seq_len": 512,
          "t5_seq_len": 2_048, "fire_seq_len": 65_536,
          "kerple_seq_len": 65_536, "max_distance": 65_536, "num_buckets": 4_096, "original_max": 1 << 24,
          "table_cells": 1 << 23}


def check_size(name: str, value: int, limit: str | None = None) -> int:
    """A size option: an integer in [1, LIMITS[limit or name]] (ConfigError otherwise)."""
    return check_int(name, value, minimum=1, maximum=LIMITS[limit or name])


def check_head_dim(value: int, minimum: int = 2) -> int:
    """A rotary head dim option: a size (:func:`check_size`), even (features rotate in pairs, as every rotary
    layer requires) and at least ``minimum`` (ConfigError otherwise)."""
    value = check_size("head_dim", value)
    if value % 2 or value < minimum:
        raise ConfigError(f"head_dim must be an even number >= {minimum} (features rotate in pairs), got {value}")
    return value


def new_figure(width: float = 8.0, height: float = 5.0) -> Any:
    """A Figure on its own Agg canvas (no pyplot, no global backend switch)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def output_path(path: str | Path) -> Path:
    """The output path, its suffix checked (png, svg or pdf) and its folder required to exist.

    Raises:
        ConfigError: another suffix.
        FileNotFoundError: the folder does not exist (it is not created).
    """
    p = Path(path)
    check_choice("output file type", p.suffix.lower().lstrip(".") or "(none)", FORMATS)
    parent = p.parent if str(p.parent) else Path(".")
    if not parent.is_dir():
        raise FileNotFoundError(f"output directory {str(parent)!r} of {str(p)!r} does not exist")
    return p


def save(fig: Any, path: str | Path, dpi: int = 110) -> Path:
    """Write ``fig`` to ``path`` (format from the suffix) atomically and return the path.

    Raises:
        ConfigError: dpi outside [1, MAX_DPI], or a rendered size above MAX_PIXELS.
    """
    p = output_path(path)
    dpi = check_int("dpi", dpi, minimum=1, maximum=MAX_DPI)
    width, height = fig.get_size_inches()
    pixels = int(width * dpi) * int(height * dpi)
    if pixels > MAX_PIXELS:
        raise ConfigError(f"figure of {width:g} x {height:g} inches at dpi {dpi} is {pixels:,} pixels; expected "
                          f"at most {MAX_PIXELS:,} (lower --dpi or the sizes)")
    buf = io.BytesIO()
    fig.savefig(buf, dpi=dpi, format=p.suffix.lower().lstrip("."))
    return atomic_write_bytes(p, buf.getvalue())
