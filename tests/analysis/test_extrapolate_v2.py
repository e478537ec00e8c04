"""The extrapolation study's second version: seeds and intervals, the sliding protocol, the synthetic
task, iRoPE, FIRE/KERPLE in the study, tables and figures with intervals. Tiny sizes only."""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from tokenpos.analysis.extrapolate import ExtrapolationConfig, TaskConfig, run_extrapolation  # noqa: E402
from tokenpos.analysis.extrapolate.data import sliding_windows  # noqa: E402
from tokenpos.analysis.extrapolate.render import html_section, markdown_table, task_table  # noqa: E402
from tokenpos.analysis.extrapolate.results import ResultRow, _aggregate, write_json  # noqa: E402
from tokenpos.analysis.extrapolate.schemes import build_model, irope_layers  # noqa: E402
from tokenpos.analysis.extrapolate.stats import mean_ci, t_quantile, wilson_interval  # noqa: E402
from tokenpos.analysis.extrapolate.tasks import exact_match, make_batch  # noqa: E402
from tokenpos.tables.errors import ConfigError  # noqa: E402

TINY = dict(train_len=8, multiples=(1, 2), d_model=16, num_layers=2, num_heads=2, steps=4, batch_size=4, warmup=1,
            eval_tokens=64, sliding_tokens=16, threads=1)
TINY_TASK = TaskConfig(steps=2, eval_examples=10, d_model=16, num_heads=2, eval_lens=(10, 20, 40))


@pytest.fixture(scope="module")
def multi():
    updates = []
    result = run_extrapolation(ExtrapolationConfig(seeds=(0, 1, 2), schemes=("alibi", "fire", "kerple", "irope"),
                                                   rope_scalings=("yarn",), protocols=("nonoverlap", "sliding"),
                                                   task=TINY_TASK, task_seeds=(0,), **TINY),
                               on_update=lambda r: updates.append(r.complete))
    return result, updates


def test_t_interval_by_hand():
    mean, ci = mean_ci([1.0, 2.0, 3.0])
    assert mean == 2.0 and ci == pytest.approx([2 - 4.303 / math.sqrt(3), 2 + 4.303 / math.sqrt(3)])
    assert mean_ci([5.0]) == (5.0, None)
    assert t_quantile(1) == 12.706 and t_quantile(100) == 1.96
    with pytest.raises(ValueError):
        mean_ci([])
    low, high = wilson_interval(0.0, 200)
    assert low == 0.0 and high == pytest.approx(0.0188, abs=1e-4)
    assert wilson_interval(1.0, 10)[1] == 1.0


def test_aggregate_means_and_intervals():
    rows = [ResultRow("a", 8, p, t, r, None, "sliding", s) for s, (p, t, r) in enumerate([(4.0, 1.0, 1.1),
                                                                                          (5.0, 1.2, 1.3)])]
    (entry,) = _aggregate(rows)
    assert entry["seeds"] == [0, 1] and entry["protocol"] == "sliding"
    assert entry["ppl"] == 4.5 and entry["ratio"] == pytest.approx(1.2)
    assert entry["ppl_ci"] == pytest.approx([4.5 - 12.706 * 0.5, 4.5 + 12.706 * 0.5])
    na = _aggregate([ResultRow("l", 16, None, None, None, "n/a", "nonoverlap", s) for s in (0, 1)])[0]
    assert na["ppl"] is None and na["ratio_ci"] is None and na["note"] == "n/a"


def test_sliding_windows_score_the_same_tokens_at_every_length():
    ids = np.arange(200)
    scored = []
    for window in (8, 16, 32):
        x, y = sliding_windows(ids, window, 4, 40, start=32)
        assert x.shape == (10, window) and np.array_equal(y, x + 1)
        scored.append(y[:, -4:].reshape(-1))
        assert x[:, 0].min() >= 0
    assert all(np.array_equal(s, scored[0]) for s in scored)
    assert np.array_equal(scored[0], np.arange(29, 69))
    with pytest.raises(ConfigError, match="cannot score"):
        sliding_windows(ids, 64, 4, 40, start=32)


def test_tasks_make_the_right_targets():
    rng = np.random.default_rng(0)
    for task, fn in (("copy", lambda x: x), ("reverse", lambda x: x[:, ::-1]), ("sort", lambda x: np.sort(x, 1))):
        x, y = make_batch(task, 5, 3, 10, rng)
        assert x.shape == y.shape == (3, 10) and np.all(x[:, 5].numpy() == 10)
        full = np.concatenate([x.numpy(), y[:, -1:].numpy()], axis=1)
        np.testing.assert_array_equal(full[:, 6:], fn(full[:, :5]))
        np.testing.assert_array_equal(y[:, :-1].numpy(), x[:, 1:].numpy())
    with pytest.raises(ConfigError, match="unknown task"):
        make_batch("add", 2, 1, 10, rng)


def test_exact_match_of_an_oracle_and_learned_beyond_range():
    class Oracle(torch.nn.Module):
        def forward(self, ids):
            n = ids.shape[1] // 2
            full = torch.cat([ids, ids[:, :1]], 1)
            out = torch.zeros(*ids.shape, 11)
            out[:, n:].scatter_(-1, full[:, :n].flip(1)[:, :, None], 1.0)
            return out

    assert exact_match(Oracle(), "reverse", 12, TaskConfig(eval_examples=20)) == 1.0
    assert exact_match(Oracle(), "copy", 12, TaskConfig(eval_examples=20)) < 0.5
    learned = build_model("learned", 11, train_len=20, d_model=8, num_heads=2, num_layers=1)
    assert exact_match(learned, "copy", 40, TaskConfig(eval_examples=4)) is None


def test_irope_layers_and_scaled_swap():
    assert irope_layers(4) == [True, True, True, False] and irope_layers(8).count(False) == 2
    assert irope_layers(2) == [True, False] and irope_layers(1) == [False]
    model = build_model("irope", 20, train_len=8, d_model=16, num_heads=2, num_layers=4)
    kinds = [s.kind for s in model.attention_schemes()]
    assert kinds == ["rotary", "rotary", "rotary", "none"] and model.embed.position.kind == "rotary"
    from tokenpos.analysis.extrapolate.model import swapped_position
    from tokenpos.torch import RotaryEmbedding

    before = model.attention_schemes()
    scaled = RotaryEmbedding(8, max_seq_len=8)
    with swapped_position(model, scaled):
        assert [s is scaled for s in model.attention_schemes()] == [True, True, True, False]
    assert all(a is b for a, b in zip(model.attention_schemes(), before, strict=True))


def test_multi_seed_document(multi, tmp_path):
    result, updates = multi
    assert updates == [False, False, False] and result.complete
    doc = result.to_dict()
    assert doc["interval"].startswith("95% Student-t")
    schemes = {r["scheme"] for r in doc["results"]}
    assert schemes == {"alibi", "fire", "kerple", "irope", "irope+yarn"}
    for r in doc["results"]:
        assert r["seeds"] == [0, 1, 2] and r["protocol"] in ("nonoverlap", "sliding")
        per = [s for s in doc["seed_results"] if (s["scheme"], s["eval_len"], s["protocol"]) ==
               (r["scheme"], r["eval_len"], r["protocol"])]
        assert r["ppl"] == pytest.approx(np.mean([s["ppl"] for s in per]))
        assert r["ratio_ci"][0] <= r["ratio"] <= r["ratio_ci"][1] and r["ppl_ci"][0] <= r["ppl"] <= r["ppl_ci"][1]
    tasks = doc["task_results"]
    assert {(t["task"], t["length"]) for t in tasks} == {(a, b) for a in ("copy", "passkey") for b in (10, 20, 40)}
    assert all(t["seeds"] == [0] and "Wilson" in t["interval"] and 0 <= t["accuracy"] <= 1 for t in tasks)
    md = markdown_table(doc, "sliding")
    assert "NLL @8" in md and " [" in md
    headers, rows = task_table(doc, "copy")
    assert headers == ["scheme", "status", "token / exact % @10", "token / exact % @20", "token / exact % @40"]
    assert len(rows) == 4 and all(r[1] == "not trained" for r in rows)        # 2 steps: below 95 % per token
    path = write_json(result, tmp_path / "full.json")
    section = html_section(path)
    assert section.count("<table") == 4 and "sliding window" in section and "Synthetic task copy" in section


def test_plots_with_error_bars(multi, tmp_path):
    pytest.importorskip("matplotlib")
    from tokenpos.analysis.extrapolate.plot import plot_extrapolation, plot_tasks

    result, _ = multi
    assert plot_extrapolation(result, tmp_path / "a.png").stat().st_size > 1000
    assert plot_tasks(result, tmp_path / "b.png").stat().st_size > 1000
    with pytest.raises(ValueError, match="no task_results"):
        plot_tasks({"train_len": 8, "results": []}, tmp_path / "c.png")


@pytest.mark.parametrize("bad", [dict(protocols=("stride",)), dict(seeds=(0, 0)), dict(sliding_stride=99),
                                 dict(task=TaskConfig(tasks=("add",))), dict(task=TaskConfig(train_len=7))])
def test_config_errors(bad):
    with pytest.raises(ConfigError):
        ExtrapolationConfig(**bad).validate()


def test_paired_difference():
    from tokenpos.analysis.extrapolate.stats import paired_difference

    rows = [{"scheme": s, "eval_len": 8, "protocol": "sliding", "seed": seed, "ratio": base + off}
            for seed, base in enumerate([1.0, 2.0, 3.0]) for s, off in (("a", 0.5), ("b", 0.0))]
    mean, ci, n = paired_difference(rows, "a", "b", key="ratio", eval_len=8, protocol="sliding")
    assert n == 3 and mean == pytest.approx(0.5) and ci == pytest.approx([0.5, 0.5])   # no paired spread
    with pytest.raises(ValueError, match="no seed has both"):
        paired_difference(rows, "a", "c", key="ratio", eval_len=8, protocol="sliding")
