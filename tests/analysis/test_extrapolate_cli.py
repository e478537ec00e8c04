"""The ``tokenpos extrapolate`` sub-command end to end, on a tiny configuration."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")
pytest.importorskip("matplotlib")

ARGS = ["--train-len", "8", "--multiples", "1,2", "--d-model", "16", "--num-layers", "1", "--num-heads", "2",
        "--steps", "3", "--batch-size", "2", "--eval-tokens", "64", "--threads", "1", "--no-progress"]


def _main(argv):
    from tokenpos.cli import main

    return main(argv)


def test_cli_writes_json_plot_and_table(tmp_path, capsys):
    out, fig = tmp_path / "out.json", tmp_path / "fig.png"
    assert _main(["extrapolate", "--seed", "3", *ARGS, "--schemes", "learned,rope", "--rope-scalings", "yarn",
                  "--json", str(out), "--plot", str(fig)]) == 0
    text = capsys.readouterr().out
    assert "rope+yarn" in text and "n/a (cannot represent positions >= L)" in text
    doc = json.loads(out.read_text())
    assert doc["train_len"] == 8 and doc["config"]["seed"] == 3
    assert [r["scheme"] for r in doc["results"]] == ["learned"] * 2 + ["rope"] * 2 + ["rope+yarn"] * 2
    assert fig.stat().st_size > 1000


def test_cli_bad_scheme_is_one_line_error(capsys):
    assert _main(["extrapolate", *ARGS, "--schemes", "xpos"]) == 2
    err = capsys.readouterr().err
    assert "unknown schemes ['xpos']" in err and "Traceback" not in err


@pytest.mark.slow  # trains language models
def test_cli_seeds_both_protocols_and_tasks(tmp_path, capsys):
    out, fig = tmp_path / "out.json", tmp_path / "fig.png"
    assert _main(["extrapolate", "--seeds", "0,1", "--eval", "both", "--tasks", "reverse", "--task-steps", "1",
                  *ARGS, "--schemes", "alibi,kerple", "--rope-scalings", "none", "--sliding-tokens", "8",
                  "--json", str(out), "--plot", str(fig)]) == 0
    text = capsys.readouterr().out
    assert "Sliding window (stride 2)" in text and "Synthetic task reverse" in text and "t-interval" in text
    doc = json.loads(out.read_text())
    assert doc["complete"] is True and {r["protocol"] for r in doc["results"]} == {"nonoverlap", "sliding"}
    assert all(r["seeds"] == [0, 1] and "ratio_ci" in r and "ppl_ci" in r for r in doc["results"])
    assert {t["task"] for t in doc["task_results"]} == {"reverse"} and fig.stat().st_size > 1000


def test_cli_checks_output_paths_before_the_run(tmp_path, capsys):
    missing = tmp_path / "no" / "such" / "dir" / "out.json"
    assert _main(["extrapolate", *ARGS, "--json", str(missing)]) != 0
    assert "Traceback" not in capsys.readouterr().err and not missing.exists()
    assert _main(["extrapolate", *ARGS, "--plot", str(tmp_path / "fig.gif")]) != 0


@pytest.mark.parametrize("kind", ["fire", "kerple"])
def test_plot_fire_and_kerple(kind, tmp_path, capsys):
    out = tmp_path / f"{kind}.png"
    assert _main(["plot", kind, "--out", str(out), "--num-heads", "2", "--seq-len", "64"]) == 0
    assert out.stat().st_size > 1000 and "wrote" in capsys.readouterr().out
    assert _main(["plot", kind, "--base", "500"]) == 2                       # an option that does not apply
