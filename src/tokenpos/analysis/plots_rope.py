"""Pictures of the multimodal RoPE family: M-RoPE (which axis each frequency reads, and the (3, L) ids of a
text + image sequence) and 2-D patch positions (axial 2-D RoPE similarity and the 2-D sin-cos table).

The ``figure_*`` functions return a matplotlib Figure (no pyplot, nothing written); the ``plot_*``
functions save one to a path, for ``tokenpos plot`` and the report. All data come from ``tokenpos.tables``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from tokenpos.analysis.figures import check_head_dim, new_figure, save
from tokenpos.tables.checks.validation import check_positive_int
from tokenpos.tables.formulas.mrope import mrope_axis_map, mrope_position_ids
from tokenpos.tables.formulas.rope2d import patch_positions_2d, rope2d_inv_freq, sincos_2d_table

AXES = ("T", "H", "W")


def mrope_example(head_dim: int = 128) -> dict[str, Any]:
    """The data of :func:`figure_mrope`: axis maps of both layouts and a text + image + text sequence's ids."""
    f = check_head_dim(head_dim) // 2
    t = f // 4
    h = (f - t) // 2
    section = [f - 2 * h, h, h]
    inter = [f - 2 * min(h, f // 3), min(h, f // 3), min(h, f // 3)]
    types = np.array([[0] * 4 + [1] * 12 + [0] * 6])     # text, a (t, h, w) = (2, 4, 6) grid (merge 2: 2 x 2 x 3), text
    ids, _ = mrope_position_ids(types, np.array([[2, 4, 6]]), spatial_merge_size=2)
    return {"sections": mrope_axis_map(section, f), "interleaved": mrope_axis_map(inter, f, layout="interleaved"),
            "section": section, "interleaved_section": inter, "types": types[0], "ids": ids[:, 0]}


def figure_mrope(head_dim: int = 128) -> Any:
    """Left: the axis each frequency reads (Qwen2-VL sections, Qwen3-VL interleaved). Right: (3, L) ids."""
    data = mrope_example(head_dim)
    fig = new_figure(11.0, 4.5)
    left, right = fig.subplots(1, 2, width_ratios=[1.2, 1.0])
    maps = np.stack([data["sections"], data["interleaved"]])
    left.imshow(maps, aspect="auto", cmap="viridis", vmin=0, vmax=2, interpolation="nearest")
    left.set_yticks([0, 1], [f"sections {data['section']}", f"interleaved {data['interleaved_section']}"])
    left.set_xlabel("frequency index j (0 = fastest)")
    left.set_ylabel("layout")
    left.set_title("M-RoPE: axis read by each frequency (T / H / W)")
    for value, name in enumerate(AXES):
        left.plot([], [], "s", color=left.images[0].cmap(value / 2), label=name)
    left.legend(loc="upper right", fontsize=8)
    ids = data["ids"]
    for a, name in enumerate(AXES):
        right.step(np.arange(ids.shape[1]), ids[a] + 0.08 * (a - 1), where="mid", label=name)
    img = np.flatnonzero(data["types"] == 1)
    right.axvspan(img[0] - 0.5, img[-1] + 0.5, color="0.9", label="image tokens")
    right.set_xlabel("token index")
    right.set_ylabel("position id")
    right.set_title("(3, L) ids: text, a 2 x 2 x 3 vision grid, text")
    right.legend(fontsize=8)
    return fig


def rope2d_similarity(grid: int = 16, head_dim: int = 64, *, base: float = 100.0) -> np.ndarray:
    """``cos``-similarity of the 2-D RoPE rotation at each patch of a grid x grid image with the centre patch:
    the mean over pairs of ``cos(angle(p) - angle(c))`` -> (grid, grid)."""
    inv, axis = rope2d_inv_freq(head_dim, base=base)
    pos = patch_positions_2d([(grid, grid)]).astype(np.float64)               # (N, 2)
    centre = np.array([grid // 2, grid // 2], dtype=np.float64)
    ang = (pos[:, axis] - centre[axis]) * inv                                  # (N, F)
    return np.cos(ang).mean(axis=1).reshape(grid, grid)


def figure_positions_2d(grid: int = 16, head_dim: int = 64, d_model: int = 64) -> Any:
    """Left: 2-D RoPE similarity with the centre patch. Right: the 2-D sin-cos table (patch x dimension)."""
    grid = check_positive_int("grid", grid)
    fig = new_figure(11.0, 4.5)
    left, right = fig.subplots(1, 2)
    im = left.imshow(rope2d_similarity(grid, head_dim), cmap="magma")
    left.set_title(f"axial 2-D RoPE: similarity with the centre patch (Dh={head_dim})")
    left.set_xlabel("column")
    left.set_ylabel("row")
    fig.colorbar(im, ax=left, shrink=0.8).set_label("mean cos of the angle difference")
    table = sincos_2d_table(grid, grid, d_model)
    im2 = right.imshow(table, aspect="auto", cmap="RdBu", vmin=-1, vmax=1, interpolation="nearest")
    right.set_title(f"2-D sin-cos table ({grid} x {grid} patches, D={d_model})")
    right.set_xlabel("dimension: sin(row) | cos(row) | sin(col) | cos(col)")
    right.set_ylabel("patch (row-major)")
    fig.colorbar(im2, ax=right, shrink=0.8).set_label("value")
    return fig


def plot_mrope(path: str | Path, *, head_dim: int = 128, dpi: int = 110) -> Path:
    """Save :func:`figure_mrope` to ``path``."""
    return save(figure_mrope(head_dim), path, dpi)


def plot_positions_2d(path: str | Path, *, head_dim: int = 64, d_model: int = 64, num_positions: int = 16,
                      dpi: int = 110) -> Path:
    """Save :func:`figure_positions_2d` (a ``num_positions`` x ``num_positions`` grid) to ``path``."""
    return save(figure_positions_2d(num_positions, head_dim, d_model), path, dpi)


