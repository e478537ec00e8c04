"""Science v3 of the extrapolation study: n-gram baselines and the context gate, the same scored targets at
every length, per-position curves, pre-registered comparisons with Holm-adjusted p-values, the passkey probe,
tasks trained to a target accuracy, study files, resumable runs, the command in the document. Tiny sizes only."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from tokenpos.analysis.extrapolate import ExtrapolationConfig, TaskConfig, run_extrapolation  # noqa: E402
from tokenpos.analysis.extrapolate.comparisons import PREREGISTERED, SMALLEST  # noqa: E402
from tokenpos.analysis.extrapolate.data import load_corpus, sliding_targets, sliding_windows  # noqa: E402
from tokenpos.analysis.extrapolate.gate import FAIL_TEXT, context_gate  # noqa: E402
from tokenpos.analysis.extrapolate.ngram import K_GRID, NGramModel, fit_tuned  # noqa: E402
from tokenpos.analysis.extrapolate.render import comparison_table, curve_table, fmt_ratio, markdown_table  # noqa: E402
from tokenpos.analysis.extrapolate.results import with_analysis  # noqa: E402
from tokenpos.analysis.extrapolate.stats import holm, paired_t_pvalue  # noqa: E402
from tokenpos.analysis.extrapolate.study_file import load_study  # noqa: E402
from tokenpos.analysis.extrapolate.tasks import make_passkey, run_task, score_task  # noqa: E402
from tokenpos.tables.errors import ConfigError  # noqa: E402

TINY = dict(train_len=8, multiples=(1, 2), d_model=16, num_layers=2, num_heads=2, steps=3, batch_size=4, warmup=1,
            eval_tokens=64, sliding_tokens=16, threads=1)


# ---- n-gram baselines --------------------------------------------------------------------------------------

def test_ngram_probabilities_by_hand():
    ids = np.array([0, 1, 0, 1, 0, 2, 0, 1])               # bigrams: 0->1 x3, 1->0 x2, 0->2 x1, 2->0 x1
    m = NGramModel.fit(ids, 2, 3, k=0.5)
    nll = m.nll(np.array([0, 1, 0, 2, 1, 1]), np.array([1, 3, 4, 5]))
    expect = [(3 + 0.5) / (4 + 1.5), (1 + 0.5) / (4 + 1.5), (0 + 0.5) / (1 + 1.5), (0 + 0.5) / (2 + 1.5)]
    np.testing.assert_allclose(nll, -np.log(expect))
    for ctx in range(3):                                    # a distribution over the vocabulary for every context
        probs = [math.exp(-m.nll(np.array([ctx, t]), np.array([1]))[0]) for t in range(3)]
        assert sum(probs) == pytest.approx(1.0)
    uni = NGramModel.fit(ids, 1, 3, k=1.0)
    assert uni.nll(ids, np.array([0]))[0] == pytest.approx(-math.log((4 + 1) / (8 + 3)))


def test_ngram_orders_improve_and_k_is_tuned():
    corpus = load_corpus()
    pos = sliding_targets(16, 512, 512)
    nll = {n: float(fit_tuned(corpus.train, n, corpus.vocab_size).nll(corpus.eval, pos).mean()) for n in (2, 3, 4)}
    assert nll[2] > nll[3] > nll[4] > 1.0
    assert fit_tuned(corpus.train, 4, corpus.vocab_size).k in K_GRID


@pytest.mark.parametrize("args, match", [((np.arange(5), 0, 5, 1.0), "order"), ((np.arange(5), 2, 5, 0.0), "add-k"),
                                         ((np.arange(2), 3, 5, 1.0), "needs more"),
                                         ((np.arange(20), 4, 2 ** 20, 1.0), "int64")])
def test_ngram_errors(args, match):
    with pytest.raises(ConfigError, match=match):
        NGramModel.fit(*args)


def test_ngram_refuses_positions_without_context():
    m = NGramModel.fit(np.arange(10) % 3, 3, 3, k=1.0)
    with pytest.raises(ConfigError, match="positions must lie"):
        m.nll(np.arange(10) % 3, np.array([1]))


# ---- the gate, the tables, the same targets -------------------------------------------------------------

def _doc(nll_at_L, ratios, seeds=(0, 1, 2, 3, 4), baseline=2.0):
    """A document with schemes at L = 8 and 16 (sliding), per-seed R(2) from ``ratios[scheme][seed]``."""
    seed_results, results = [], []
    for scheme, rs in ratios.items():
        for s in seeds:
            for t, r in ((8, 1.0), (16, rs[s])):
                seed_results.append({"scheme": scheme, "eval_len": t, "protocol": "sliding", "seed": s,
                                     "ppl": 1.0, "tail_nll": nll_at_L[scheme] * r, "ratio": r})
        for t in (8, 16):
            mean = float(np.mean([rs[s] if t == 16 else 1.0 for s in seeds]))
            results.append({"scheme": scheme, "eval_len": t, "protocol": "sliding", "ppl": 1.0, "ratio": mean,
                            "tail_nll": nll_at_L[scheme] * mean})
    doc = {"train_len": 8, "results": results, "seed_results": seed_results, "config": {"seed": 0},
           "ngram": [{"order": n, "k": 0.1, "protocol": "sliding", "nll": baseline + 4 - n, "tokens": 16}
                     for n in (2, 3, 4)]}
    return with_analysis(doc)


def test_gate_hides_R_of_a_scheme_that_does_not_beat_the_4gram():
    doc = _doc({"alibi": 1.5, "rope": 2.5}, {"alibi": [1.0] * 5, "rope": [1.1] * 5})
    gate = context_gate(doc)
    assert gate["baseline_nll"] == 2.0 and gate["schemes"]["alibi"]["passes"]
    assert not gate["schemes"]["rope"]["passes"]
    md = markdown_table(doc, "sliding")
    rope = next(line for line in md.splitlines() if line.startswith("| rope "))
    alibi = next(line for line in md.splitlines() if line.startswith("| alibi "))
    assert FAIL_TEXT in rope and "1.1000" not in rope and "1.0000" in alibi
    assert "| 4-gram (add-k 0.1) |" in md and "2.0000" in md


def test_ratio_has_four_decimals():
    assert fmt_ratio(0.99986) == "0.9999" and fmt_ratio(1.00020) == "1.0002"


def test_both_protocols_score_the_same_targets_as_the_baselines():
    ids = np.arange(300)
    for window in (8, 16, 32):
        _, y = sliding_windows(ids, window, 4, 40, start=32)
        np.testing.assert_array_equal(ids[sliding_targets(4, 40, 32)], y[:, -4:].reshape(-1))


def test_curves_and_baselines_in_a_run(tmp_path):
    config = ExtrapolationConfig(seeds=(0, 1), schemes=("alibi", "learned"), protocols=("sliding", "nonoverlap"),
                                 rope_scalings=(), **TINY)
    doc = run_extrapolation(config).to_dict()
    assert {(g["order"], g["protocol"]) for g in doc["ngram"]} == {(n, p) for n in (2, 3, 4)
                                                                  for p in ("sliding", "nonoverlap")}
    curves = {(c["scheme"], c["eval_len"]): c for c in doc["curves"]}
    assert set(curves) == {("alibi", 8), ("alibi", 16), ("learned", 8)}         # learned cannot run at 16
    c = curves["alibi", 16]
    assert c["bin_width"] == 4 and len(c["nll"]) == 4 and len(c["seed_nll"]) == 2
    assert c["nll"][0] == pytest.approx(np.mean([s[0] for s in c["seed_nll"]]))
    tail = [r for r in doc["seed_results"] if r["scheme"] == "alibi" and r["eval_len"] == 16
            and r["protocol"] == "nonoverlap" and r["seed"] == 0][0]
    assert tail["tail_nll"] == pytest.approx(c["seed_nll"][0][-1])           # the tail is the last bin
    headers, rows = curve_table(doc)
    assert headers[1] == "pos 0-3" and len(rows) == 1
    pytest.importorskip("matplotlib")
    from tokenpos.analysis.extrapolate.plot import plot_curves

    assert plot_curves(doc, tmp_path / "c.png").stat().st_size > 1000
    with pytest.raises(ValueError, match="no curves"):
        plot_curves({"train_len": 8, "results": []}, tmp_path / "d.png")
    assert doc["gate"]["protocol"] == "sliding" and set(doc["gate"]["schemes"]) == {"alibi", "learned"}


# ---- statistics ------------------------------------------------------------------------------------------

def test_holm_by_hand():
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert holm([0.5, 0.9]) == pytest.approx([1.0, 1.0])
    assert holm([]) == []


def test_paired_pvalue_matches_scipy():
    from scipy.stats import ttest_1samp

    d = [0.01, 0.03, -0.005, 0.02, 0.012]
    assert paired_t_pvalue(d) == pytest.approx(ttest_1samp(d, 0.0).pvalue)
    assert paired_t_pvalue([0.1]) is None
    assert paired_t_pvalue([0.0, 0.0]) == 1.0 and paired_t_pvalue([0.2, 0.2]) == 0.0


def test_comparison_verdicts():
    rng = np.random.default_rng(0)
    noise = list(rng.normal(0, 0.001, 5))
    ratios = {"alibi": [1.00 + e for e in noise], "rope": [1.20 + 0.01 * i for i in range(5)],
              "sinusoidal": [1.0005 - e for e in noise], "nope": [1.5 + 0.01 * i for i in range(5)]}
    doc = _doc({s: 1.5 for s in ratios} | {"nope": 2.5}, ratios)
    by = {(e["a"], e["b"]): e for e in doc["comparisons"]["entries"]}
    assert len(by) == len(PREREGISTERED)
    assert by["alibi", "rope"]["verdict"] == "agree" and by["alibi", "rope"]["p_holm"] < 0.05
    assert by["rope", "sinusoidal"]["verdict"] == "disagree"
    assert by["alibi", "sinusoidal"]["verdict"] == "not resolved"
    assert by["alibi", "sinusoidal"]["reason"] in ("no difference detected", f"difference below {SMALLEST}")
    assert by["nope", "rope"]["reason"] == f"{FAIL_TEXT}: nope" and by["nope", "rope"]["p"] is None
    assert by["t5", "rope"]["reason"] == "not run"
    tested = [e for e in doc["comparisons"]["entries"] if e["p"] is not None]
    assert [e["p_holm"] for e in tested] == pytest.approx(holm([e["p"] for e in tested]))
    headers, rows = comparison_table(doc)
    assert "Holm p" in headers and len(rows) == len(PREREGISTERED)


# ---- tasks: passkey, training to a target ----------------------------------------------------------------

def test_passkey_examples():
    x, y = make_passkey(12, 50, 3, 10, np.random.default_rng(0))
    x, y = x.numpy(), y.numpy()
    assert x.shape == y.shape == (50, 12) and np.array_equal(x[:, 1:], y[:, :-1])
    for row_x, row_y in zip(x, y, strict=True):
        at = int(np.flatnonzero(row_x == 11)[0])             # KEY
        key = row_x[at + 1:at + 4]
        assert np.all(key < 10) and row_x[12 - 3] == 12        # QUERY right before the scored digits
        np.testing.assert_array_equal(row_y[-3:], key)
        np.testing.assert_array_equal(row_x[10:], key[:2])    # teacher forcing: the answer so far
        assert np.all(np.delete(row_x, [at, at + 1, at + 2, at + 3, 9, 10, 11]) == 13)   # the rest is filler
    assert len({int(np.flatnonzero(r == 11)[0]) for r in x}) > 3                 # random depth


def test_oracle_scores_full_marks_on_passkey():
    cfg = TaskConfig(tasks=("passkey",), eval_examples=20)

    class Oracle(torch.nn.Module):
        def forward(self, ids):                                # read the key after KEY, emit it after QUERY
            out = torch.zeros(*ids.shape, cfg.vocab_size)
            for b in range(ids.shape[0]):
                at = int((ids[b] == 11).nonzero()[0])
                q = int((ids[b] == 12).nonzero()[0])
                for i in range(cfg.passkey_digits):
                    out[b, q + i, ids[b, at + 1 + i]] = 1.0
            return out

    score = score_task(Oracle(), "passkey", 40, cfg)
    assert score.per_token == 1.0 and score.exact == 1.0


@pytest.mark.slow  # trains to a target
def test_task_training_stops_at_the_target_and_reports_untrained():
    small = dict(d_model=16, num_heads=2, eval_examples=10, eval_lens=(10, 20), check_every=2)
    done = run_task("alibi", "passkey", TaskConfig(steps=8, target_accuracy=0.01, **small), 0)
    assert done["trained"] and done["steps"] == 2 and "note" not in done
    assert set(done["per_token"]) == {10, 20} and all(0 <= v <= 1 for v in done["per_token"].values())
    short = run_task("alibi", "copy", TaskConfig(steps=2, **small), 0)
    assert not short["trained"] and short["steps"] == 2 and short["note"].startswith("not trained")


def test_task_status_counts_the_seeds_that_reached_the_target():
    from tokenpos.analysis.extrapolate.render import task_table
    from tokenpos.analysis.extrapolate.results import TaskRow, _aggregate_tasks

    rows = [TaskRow(s, "copy", n, 0.5, seed, 10, None, 0.9, trained=trained)
            for s, flags in (("a", (True, True)), ("b", (True, False)), ("c", (False, False)))
            for seed, trained in enumerate(flags) for n in (4, 8)]
    doc = {"task_results": _aggregate_tasks(rows)}
    assert [r[:2] for r in task_table(doc, "copy")[1]] == [["a", "trained"], ["b", "trained in 1 of 2 seeds"],
                                                           ["c", "not trained"]]
    assert {e["scheme"]: e["trained_seeds"] for e in doc["task_results"]} == {"a": [0, 1], "b": [0], "c": []}


# ---- study files, checkpoints, the command -----------------------------------------------------------------

def test_study_file(tmp_path):
    path = tmp_path / "s.toml"
    path.write_text('preset = "full"\nsteps = 7\nseeds = [0, 1, 2, 3, 4]\n[task]\ntasks = ["passkey"]\n')
    config = load_study(path)
    full = ExtrapolationConfig.full()
    assert config.steps == 7 and config.seeds == (0, 1, 2, 3, 4) and config.num_layers == full.num_layers == 4
    assert config.task.tasks == ("passkey",) and config.task.steps == full.task.steps
    path.write_text("task = false\n")
    assert load_study(path).task is None and load_study(path).protocols == ("sliding",)
    for text, match in (("stpes = 3\n", "unknown keys"), ('preset = "huge"\n', "preset"), ("steps = \n", "TOML"),
                        ("[task]\nsteeps = 1\n", "unknown keys"), ("steps = 0\n", "positive")):
        path.write_text(text)
        with pytest.raises(ConfigError, match=match):
            load_study(path)


def test_checked_in_study_files_load():
    from pathlib import Path

    docs = Path(__file__).resolve().parents[2] / "docs"
    full = load_study(docs / "study.toml")
    assert full == ExtrapolationConfig.full().validate()                     # the file says every setting
    assert len(full.seed_list) >= 5 and full.num_layers == 4
    budget = load_study(docs / "study_budget.toml")                          # the study at half its steps
    assert budget == replace(full, steps=full.steps // 2, seeds=(0,), protocols=("sliding",), rope_scalings=(),
                             task=None)


def test_resume_skips_finished_units_and_keeps_each_kind_by_its_settings(tmp_path, monkeypatch):
    import tokenpos.analysis.extrapolate.tasks as tasks
    import tokenpos.analysis.extrapolate.train as train

    task = TaskConfig(tasks=("passkey",), train_len=8, eval_lens=(8, 16), d_model=8, num_layers=1, num_heads=2,
                      steps=2, batch_size=4, warmup=1, eval_examples=4, check_every=1)
    config = ExtrapolationConfig(seeds=(0, 1), schemes=("alibi", "rope"), rope_scalings=("yarn",), task=task,
                                 task_seeds=(0,), checkpoint_dir=str(tmp_path / "ck"), **TINY)
    first = run_extrapolation(config).to_dict()
    (lm,), (tk,) = sorted((tmp_path / "ck").glob("lm-*")), sorted((tmp_path / "ck").glob("task-*"))
    files = sorted(p.name for p in lm.iterdir())
    assert "alibi-s1.safetensors" in files and "rope-s0.rows.json" in files and "settings.json" in files
    assert sorted(p.name for p in tk.iterdir()) == ["passkey-alibi-s0.rows.json", "passkey-rope-s0.rows.json",
                                                   "settings.json"]
    assert json.loads((tk / "settings.json").read_text())["task"]["steps"] == 2
    (lm / "rope-s1.rows.json").unlink()                                      # interrupted after training
    monkeypatch.setattr(train, "train_model", lambda *a, **k: pytest.fail("a finished unit was retrained"))
    monkeypatch.setattr(tasks, "train_task", lambda *a, **k: pytest.fail("a finished task was retrained"))
    again = run_extrapolation(config).to_dict()
    assert again["seed_results"] == first["seed_results"] and again["task_seed_results"] == first["task_seed_results"]
    assert [{**r, "eval_seconds": 0} for r in again["runs"]] == [{**r, "eval_seconds": 0} for r in first["runs"]]

    # other task settings: every language model is kept, the tasks train again into a folder of their own
    monkeypatch.undo()
    monkeypatch.setattr(train, "train_model", lambda *a, **k: pytest.fail("a language model was retrained"))
    more = replace(config, task=replace(task, steps=3))
    assert run_extrapolation(more).to_dict()["seed_results"] == first["seed_results"]
    assert len(list((tmp_path / "ck").glob("task-*"))) == 2 and len(list((tmp_path / "ck").glob("lm-*"))) == 1

    # other model settings: a new folder, never mixed with the old one
    with pytest.raises(pytest.fail.Exception, match="a language model was retrained"):
        run_extrapolation(replace(config, steps=4))
    assert len(list((tmp_path / "ck").glob("lm-*"))) == 2
    (lm / "settings.json").write_text(json.dumps({**json.loads((lm / "settings.json").read_text()), "steps": 9}))
    with pytest.raises(ConfigError, match="other settings"):
        run_extrapolation(config)


def test_cli_full_tasks_keeps_study_steps_and_records_command(tmp_path):
    from tokenpos.cli import build_parser, main
    from tokenpos.cli.extrapolate import build_config

    args = build_parser().parse_args(["extrapolate", "--full", "--tasks", "passkey"])
    assert build_config(args).task.steps == ExtrapolationConfig.full().task.steps == 20000
    argv = ["extrapolate", "--schemes", "alibi", "--steps", "2", "--train-len", "8", "--multiples", "1,2",
            "--d-model", "16", "--num-layers", "1", "--num-heads", "2", "--batch-size", "4", "--eval-tokens", "64",
            "--sliding-tokens", "16", "--rope-scalings", "none", "--no-progress", "--json", str(tmp_path / "o.json")]
    assert main(argv) == 0
    doc = json.loads((tmp_path / "o.json").read_text())
    assert doc["command"] == "tokenpos " + " ".join(argv) and doc["config"]["protocols"] == ["sliding"]
