"""The study's figures: one colour per scheme in every figure (keyed by name, not by a figure's own order), the
n-gram baselines drawn in the perplexity panel, and a scheme that fails the context gate labelled as in the
tables. Checked on the figures' artists, captured before they are written."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("matplotlib")

from matplotlib.colors import to_hex  # noqa: E402

from tokenpos.analysis.extrapolate.gate import FAIL_TEXT, context_gate  # noqa: E402
from tokenpos.analysis.extrapolate.plot import (  # noqa: E402
    plot_extrapolation,
    plot_tasks,
    scheme_color,
    scheme_names,
)
from tokenpos.analysis.extrapolate.schemes import SCHEMES  # noqa: E402


def _doc(schemes: list[str], task_schemes: list[str]) -> dict[str, Any]:
    """A sliding-protocol document: NLL at L 1.0 + 0.1 i (nope: above the 4-gram's 2.0), R 1.5 at 2L; a copy
    task over ``task_schemes`` (another order)."""
    results = []
    for i, s in enumerate(schemes):
        nll = 2.5 if s == "nope" else 1.0 + 0.1 * i
        results += [{"scheme": s, "eval_len": 8, "ppl": 2.7, "tail_nll": nll, "ratio": 1.0, "protocol": "sliding"},
                    {"scheme": s, "eval_len": 16, "ppl": 4.0, "tail_nll": 1.5 * nll, "ratio": 1.5,
                     "protocol": "sliding"}]
    ngram = [{"order": n, "k": 0.1, "protocol": "sliding", "nll": 4.0 - n / 2, "tokens": 16} for n in (2, 3, 4)]
    tasks = [{"scheme": s, "task": "copy", "length": t, "accuracy": 0.5, "examples": 8}
             for s in task_schemes for t in (10, 20)]
    doc = {"train_len": 8, "results": results, "ngram": ngram, "task_results": tasks,
           "config": {"task": {"train_len": 10}}}
    return {**doc, "gate": context_gate(doc)}


def _figure(monkeypatch: pytest.MonkeyPatch, draw: Any, doc: dict[str, Any], tmp_path: Path) -> Any:
    """The Figure ``draw`` builds (``figures.save`` captured)."""
    seen: list[Any] = []

    def save(fig: Any, path: Any, dpi: int = 110) -> Path:
        seen.append(fig)
        return Path(path)

    monkeypatch.setattr("tokenpos.analysis.figures.save", save)
    draw(doc, tmp_path / "x.png")
    return seen[0]


def _line_colours(ax: Any) -> dict[str, str]:
    """Each errorbar's label (the scheme, before any " (...)") -> its data line's colour."""
    return {str(c.get_label()).split(" (")[0]: to_hex(c.lines[0].get_color()) for c in ax.containers}


def test_one_colour_per_scheme_across_the_extrapolation_and_task_figures(monkeypatch: pytest.MonkeyPatch,
                                                                         tmp_path: Path) -> None:
    schemes = list(SCHEMES) + ["rope+linear", "rope+yarn"]
    doc = _doc(schemes, list(reversed(SCHEMES)))              # the task figure meets the schemes in another order
    ext = _figure(monkeypatch, plot_extrapolation, doc, tmp_path)
    tasks = _figure(monkeypatch, plot_tasks, doc, tmp_path)
    ratio = ext.axes[1]
    in_ext, in_tasks = _line_colours(ratio), _line_colours(tasks.axes[0])
    assert set(in_ext) == set(schemes) and set(in_tasks) == set(SCHEMES)     # fire and kerple in both
    for s in SCHEMES:
        assert in_ext[s] == in_tasks[s] == to_hex(scheme_color(s))
    colours = [to_hex(scheme_color(n)) for n in scheme_names()]
    assert len(set(colours)) == len(colours)                 # every scheme and scaling its own colour
    assert to_hex(scheme_color("old-name")) == to_hex(scheme_color("old-name"))   # unknown names: stable


def test_the_perplexity_panel_draws_the_baselines_and_gated_schemes_say_so(monkeypatch: pytest.MonkeyPatch,
                                                                           tmp_path: Path) -> None:
    doc = _doc(["rope", "nope"], ["rope"])
    fig = _figure(monkeypatch, plot_extrapolation, doc, tmp_path)
    ppl, ratio = fig.axes[0], fig.axes[1]
    grams = [line for line in ppl.get_lines() if "-gram" in str(line.get_label())]
    assert sorted(line.get_label() for line in grams) == ["2-gram (add-k 0.1)", "3-gram (add-k 0.1)",
                                                          "4-gram (add-k 0.1)"]
    import math

    assert grams[0].get_ydata()[0] == pytest.approx(math.exp(3.0))      # exp(NLL): the table's perplexity
    labels = [t.get_text() for t in ratio.get_legend().get_texts()]
    assert labels == ["rope", f"nope ({FAIL_TEXT})"]
