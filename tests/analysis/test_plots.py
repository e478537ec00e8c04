"""The figures: valid, non-trivial PNGs with titles, labelled axes and colour bars on heatmaps."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("matplotlib")

from tokenpos.analysis import plots, plots_relative, plots_rope  # noqa: E402
from tokenpos.tables.errors import ConfigError  # noqa: E402

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
HEATMAPS = {"sinusoidal", "alibi", "t5", "memory"}


def assert_real_png(path: Path) -> None:
    """A PNG that decodes and shows a picture (many colours, not one flat fill)."""
    from matplotlib.image import imread

    assert path.read_bytes()[:8] == PNG_MAGIC
    img = imread(path)                                               # (H, W, 3 or 4) floats
    assert img.shape[0] > 200 and img.shape[1] > 300
    colours = np.unique((img[..., :3] * 255).astype(np.uint8).reshape(-1, 3), axis=0)
    assert len(colours) > 50
    assert img[..., :3].std() > 0.05


@pytest.mark.slow  # renders every plot
@pytest.mark.parametrize("kind", sorted(plots.PLOTS))
def test_every_kind_writes_a_real_png(kind: str, tmp_path: Path) -> None:
    out = plots.plot(kind, tmp_path / f"{kind}.png", dpi=60)
    assert out == tmp_path / f"{kind}.png"
    assert_real_png(out)
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"{kind}.png"]       # no temporary file left


@pytest.mark.parametrize("kind", sorted(plots.PLOTS))
def test_titles_labels_colourbars(kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    figs: list[Any] = []

    def capture(fig: Any, path: Any, dpi: int = 110) -> Path:
        figs.append(fig)
        return Path(path)

    for module in (plots, plots_relative, plots_rope):               # each binds figures.save by name
        monkeypatch.setattr(module, "save", capture)
    plots.plot(kind, tmp_path / "x.png")
    (fig,) = figs
    from matplotlib.collections import QuadMesh
    from matplotlib.image import AxesImage

    mappables = [m for a in fig.axes for m in (*a.images, *a.collections)]
    cbar_axes = {m.colorbar.ax for m in mappables if getattr(m, "colorbar", None) is not None}
    data_axes = [a for a in fig.axes
                 if a.get_visible() and a not in cbar_axes and (a.lines or a.images or a.collections)]
    assert data_axes
    assert fig.get_suptitle() or all(a.get_title() for a in data_axes)
    for ax in data_axes:
        assert ax.get_xlabel() and ax.get_ylabel(), ax
    heatmaps = [m for a in data_axes for m in (*a.images, *a.collections) if isinstance(m, (AxesImage, QuadMesh))]
    if kind in HEATMAPS:
        assert heatmaps and all(m.colorbar is not None for m in heatmaps)
        assert all(m.colorbar.ax.get_ylabel() or kind == "alibi" for m in heatmaps)


def test_bad_kind_and_suffix(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="plot kind"):
        plots.plot("spiral", tmp_path / "x.png")
    with pytest.raises(ConfigError, match="output file type"):
        plots.plot("sinusoidal", tmp_path / "x.jpg")


def test_similarity_curves() -> None:
    k, curves = plots.similarity_curves(max_distance=64, d_model=64, head_dim=32)
    assert k.shape == (65,)
    for label, y in curves.items():
        assert y.shape == (65,) and y[0] == pytest.approx(1.0), label
    learned = next(y for label, y in curves.items() if label.startswith("learned"))
    assert np.abs(learned[1:]).max() < 0.1            # random init: no distance structure
    sin = next(y for label, y in curves.items() if label.startswith("sinusoidal"))
    assert sin[1] > 0.9 and sin[1] > sin[32]          # nearby positions are more alike


def test_rope_wavelengths_relations() -> None:
    waves = plots_relative.rope_wavelengths(head_dim=64, original_max=2048, factor=4.0)
    (default, att0), (linear, _) = list(waves.values())[:2]
    assert att0 == 1.0
    np.testing.assert_allclose(linear, 4.0 * default)          # linear = default / factor in frequency
    assert default[0] == pytest.approx(2 * np.pi)              # first pair: inv_freq 1
    for wave, _ in waves.values():
        assert np.all(wave >= default * (1 - 1e-12))           # no scaling shortens a wavelength


def test_a_missing_output_folder_is_an_error_not_created(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="output directory .*sub' of .* does not exist"):
        plots.plot("sinusoidal", tmp_path / "sub" / "x.png", dpi=30)
    assert list(tmp_path.iterdir()) == []


def test_a_failed_drawing_leaves_the_previous_figure_intact(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "x.png"
    target.write_bytes(b"previous figure")

    def broken_savefig(self: Any, fname: Any, **kw: Any) -> None:
        fname.write(b"half a png")
        raise KeyboardInterrupt                       # Ctrl-C in the middle of rendering

    from matplotlib.figure import Figure

    monkeypatch.setattr(Figure, "savefig", broken_savefig)
    with pytest.raises(KeyboardInterrupt):
        plots.plot("sinusoidal", target, dpi=30)
    assert target.read_bytes() == b"previous figure"
    assert [p.name for p in tmp_path.iterdir()] == ["x.png"]


@pytest.mark.parametrize("kind, opts, match", [
    ("sinusoidal", {"dpi": 100_000}, "dpi must be <= 600"),
    ("sinusoidal", {"num_positions": 10**9}, "num_positions must be <= 65536"),
    ("sinusoidal", {"num_positions": 65_536, "d_model": 16_384}, "num_positions \\* d_model must be <="),
    ("similarity", {"d_model": 10**7}, "d_model must be <= 16384"),
    ("rope", {"head_dim": 10**8}, "head_dim must be <= 16384"),
    ("rope", {"factor": 1e300}, "factor must be <= 1000000.0"),
    ("alibi", {"num_heads": 10**5}, "num_heads must be <= 64"),
    ("alibi", {"seq_len": 10**6}, "seq_len must be <= 512"),
    ("alibi", {"num_heads": 64, "dpi": 600}, "pixels; expected at most 50,000,000"),
    ("t5", {"seq_len": 10**6}, "seq_len must be <= 2048"),
])
def test_absurd_sizes_are_config_errors_not_memory_errors(kind: str, opts: dict[str, Any], match: str,
                                                          tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=match):
        plots.plot(kind, tmp_path / "x.png", **opts)
    assert list(tmp_path.iterdir()) == []
