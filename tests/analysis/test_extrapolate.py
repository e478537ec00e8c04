"""tokenpos extrapolate: a tiny configuration that runs in seconds (the real run is in docs/EXTRAPOLATION.md)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from tokenpos.analysis.extrapolate import (  # noqa: E402
    ExtrapolationConfig,
    html_table,
    load_json,
    markdown_table,
    run_extrapolation,
    write_json,
)
from tokenpos.analysis.extrapolate.data import eval_token_count, load_corpus, tail_targets, tail_windows  # noqa: E402
from tokenpos.analysis.extrapolate.evaluate import NA_NOTE, score_length  # noqa: E402
from tokenpos.analysis.extrapolate.experiment import rope_scaling_dict  # noqa: E402
from tokenpos.analysis.extrapolate.model import swapped_position  # noqa: E402
from tokenpos.analysis.extrapolate.schemes import build_model  # noqa: E402
from tokenpos.analysis.extrapolate.train import train_model  # noqa: E402
from tokenpos.tables.errors import ConfigError  # noqa: E402

TINY = dict(train_len=8, multiples=(1, 2, 4), d_model=16, num_layers=1, num_heads=2, steps=12, batch_size=4,
            warmup=2, eval_tokens=256, threads=1)


@pytest.fixture(scope="module")
def tiny_result():
    return run_extrapolation(ExtrapolationConfig(seed=0, **TINY))


def _numbers(doc):
    return [(r["scheme"], r["eval_len"], r["ppl"], r["tail_nll"], r["ratio"]) for r in doc["results"]]


def test_the_runs_threads_bound_torch_and_the_compiled_kernels_and_are_restored(monkeypatch) -> None:
    """``threads=1``: every training step runs with one torch thread and one numba thread (numba's default,
    the core count, had the kernels launch a second OpenMP thread that spun between launches), and both
    counts are back to what they were after the run."""
    import numba

    from tokenpos.analysis.extrapolate import train as train_module

    seen: list[tuple[int, int]] = []
    real = train_module.train_model

    def spy(*args, **kwargs):
        seen.append((torch.get_num_threads(), numba.get_num_threads()))
        return real(*args, **kwargs)

    before = (torch.get_num_threads(), numba.get_num_threads())
    monkeypatch.setattr(train_module, "train_model", spy)                # (the runner imports it per call)
    run_extrapolation(ExtrapolationConfig(seed=0, **{**TINY, "steps": 2, "multiples": (1,)}, schemes=("rope",)))
    assert seen and set(seen) == {(1, 1)}
    assert (torch.get_num_threads(), numba.get_num_threads()) == before


@pytest.mark.slow  # trains a language model
def test_loss_goes_down():
    corpus = load_corpus()
    model = build_model("alibi", corpus.vocab_size, d_model=16, num_layers=1, num_heads=2, train_len=16, seed=0)
    stats = train_model(model, torch.from_numpy(corpus.train), steps=60, batch_size=8, seq_len=16, lr=3e-3,
                        warmup=5, weight_decay=0.0, grad_clip=1.0, seed=0)
    assert np.mean(stats.losses[-10:]) < np.mean(stats.losses[:5]) - 0.5
    assert stats.final_loss < math.log(corpus.vocab_size)


def test_every_scheme_runs_beyond_L_except_learned(tiny_result):
    doc = tiny_result.to_dict()
    L = doc["train_len"]
    schemes = {r["scheme"] for r in doc["results"]}
    assert schemes == {"sinusoidal", "learned", "rope", "rope+linear", "rope+dynamic", "rope+yarn", "alibi", "t5",
                       "nope"}
    for r in doc["results"]:
        if r["scheme"] == "learned" and r["eval_len"] > L:
            assert (r["ppl"], r["tail_nll"], r["ratio"]) == (None, None, None)
            assert r["note"] == NA_NOTE == "n/a (cannot represent positions >= L)"
        else:
            assert "note" not in r
            assert math.isfinite(r["ppl"]) and math.isfinite(r["tail_nll"]) and r["ppl"] > 1
            assert r["ratio"] == pytest.approx(r["tail_nll"] / tiny_result.row(r["scheme"], L).tail_nll)
    assert {r["eval_len"] for r in doc["results"]} == {8, 16, 32}


def test_rope_scalings_at_factor_one_equal_plain_rope(tiny_result):
    L = tiny_result.config.train_len
    plain = tiny_result.row("rope", L)
    for name in ("rope+linear", "rope+dynamic", "rope+yarn"):
        assert tiny_result.row(name, L).tail_nll == pytest.approx(plain.tail_nll, rel=1e-6)


@pytest.mark.slow  # trains language models twice
def test_deterministic_by_seed(tiny_result):
    again = run_extrapolation(ExtrapolationConfig(seed=0, **TINY))
    assert _numbers(again.to_dict()) == _numbers(tiny_result.to_dict())
    other = run_extrapolation(ExtrapolationConfig(seed=1, **{**TINY, "schemes": ("alibi",), "rope_scalings": ()}))
    assert other.row("alibi", 8).tail_nll != tiny_result.row("alibi", 8).tail_nll


def test_json_round_trip_and_tables(tiny_result, tmp_path):
    path = write_json(tiny_result, tmp_path / "out.json")
    raw = json.loads(path.read_text())
    assert raw["train_len"] == 8 and isinstance(raw["results"], list)
    assert set(raw["results"][0]) >= {"scheme", "eval_len", "ppl", "tail_nll", "ratio", "protocol"}
    assert {r["protocol"] for r in raw["results"]} == {"sliding"} and "seed_results" not in raw
    doc = load_json(path)
    md = markdown_table(doc, "sliding")
    assert "n/a (cannot represent positions >= L)" in md and "R(4)" in md and md.count("\n") == 1 + 9 + 3
    assert "| 4-gram (add-k " in md
    assert "<table" in html_table(doc, "sliding") and "&gt;=" in html_table(doc, "sliding")
    bad = tmp_path / "bad.json"
    bad.write_text('{"results": 1}')
    with pytest.raises(ConfigError, match="not an extrapolation result"):
        load_json(bad)


def test_tail_windows_score_the_same_targets_at_every_length():
    """The non-overlapping protocol's tails are the same targets at every length (the old windows were not:
    R(k) compared different text at each k)."""
    ids = np.arange(1000)
    total = eval_token_count(len(ids), 64)
    assert total == 960
    tails = []
    for window in (8, 16, 64):
        x, y = tail_windows(ids, window, 64, total)
        assert x.shape == (total // 64, window) and np.array_equal(y, x + 1)
        tails.append(y[:, -4:].reshape(-1))
    assert all(np.array_equal(t, tails[0]) for t in tails)
    assert np.array_equal(tails[0], tail_targets(64, total, 4))
    assert np.array_equal(tail_windows(ids, 64, 64, total)[0].reshape(-1), ids[:total])   # plain windows at 8L
    assert eval_token_count(len(ids), 64, cap=100) == 64
    with pytest.raises(ConfigError):
        eval_token_count(10, 64)
    with pytest.raises(ConfigError, match="cannot cut"):
        tail_windows(ids, 128, 64, total)


def test_corpus_split_and_custom_corpus(tmp_path):
    corpus = load_corpus()
    assert 400_000 < len(corpus.train) + len(corpus.eval) < 600_000
    assert len(corpus.eval) == pytest.approx(0.1 * (len(corpus.train) + len(corpus.eval)), abs=2)
    text = "abcabcabd" * 10
    (tmp_path / "t.txt").write_text(text)
    mine = load_corpus(tmp_path / "t.txt")
    assert mine.chars == "abcd" and len(mine.train) == 81 and len(mine.eval) == 9


def test_learned_past_L_is_na_and_swap_is_restored():
    corpus = load_corpus()
    model = build_model("learned", corpus.vocab_size, d_model=16, num_layers=1, num_heads=2, train_len=8)
    score = score_length(model, corpus.eval, 16, 64, 4, longest=16, bin_width=4)
    assert score.ppl is None and score.note == NA_NOTE
    from tokenpos.torch import RotaryEmbedding

    rope = build_model("rope", corpus.vocab_size, d_model=16, num_layers=1, num_heads=2, train_len=8)
    original = rope.embed.position
    scaled = RotaryEmbedding(8, max_seq_len=8, scaling=rope_scaling_dict("yarn", 2.0, 8))
    with swapped_position(rope, scaled):
        assert rope.embed.position is scaled
    assert rope.embed.position is original


@pytest.mark.parametrize("bad", [dict(train_len=1), dict(multiples=(2, 4)), dict(schemes=("xpos",)),
                                 dict(rope_scalings=("ntk",)), dict(d_model=30, num_heads=4)])
def test_config_errors(bad):
    with pytest.raises(ConfigError):
        ExtrapolationConfig(**bad).validate()
