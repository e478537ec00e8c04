"""analysis.plots_rope: figures of M-RoPE and 2-D positions (data from tables), and ``tokenpos plot`` kinds."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("matplotlib")

from tokenpos.analysis import plots_rope  # noqa: E402
from tokenpos.analysis.plots import PLOTS, plot  # noqa: E402


def test_mrope_data_and_figure() -> None:
    data = plots_rope.mrope_example(128)
    assert np.bincount(data["sections"]).tolist() == data["section"]
    assert np.bincount(data["interleaved"]).tolist() == data["interleaved_section"]
    assert data["ids"].shape == (3, 22) and data["ids"][:, -1].tolist() == [12, 12, 12]
    fig = plots_rope.figure_mrope(64)
    assert len(fig.axes) == 2


def test_positions_2d_similarity_peaks_at_the_centre() -> None:
    sim = plots_rope.rope2d_similarity(9, 16)
    assert sim[4, 4] == pytest.approx(1.0) and sim.max() == pytest.approx(1.0)
    assert sim[0, 0] < sim[4, 3]


@pytest.mark.parametrize("kind", ["mrope", "positions2d"])
def test_plot_kinds_write_files(tmp_path: Path, kind: str) -> None:
    assert kind in PLOTS
    out = plot(kind, tmp_path / f"{kind}.png", dpi=40)
    assert out.exists() and out.stat().st_size > 1000
