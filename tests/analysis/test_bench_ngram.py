"""The hashed n-gram bench (``analysis.bench_ngram``): its transcription of the reference's hashing equals the
reference's ``NgramHashMapping`` itself, and a tiny run times every row on the same work."""

from __future__ import annotations

import numpy as np
import pytest

from tests.ngram_cases import CASES, LAYER_IDS, PAD_ID, make_compress, make_ids, reference_mapping
from tokenpos.analysis.bench_ngram import LIMITS, REFERENCE, ngram_case, reference_hash


@pytest.mark.parametrize("case", CASES)
def test_reference_hash_is_the_reference(case):
    ref = reference_mapping(case)
    ids = make_ids((2, 9))
    for layer in LAYER_IDS:
        got = reference_hash(ids, make_compress(0), PAD_ID, ref.layer_multipliers[layer],
                             ref.vocab_size_across_layers[layer])
        np.testing.assert_array_equal(got, ref.hash(ids)[layer])


def test_tiny_run_has_every_row():
    rows = ngram_case({"V": 64, "B": 1, "L": 8, "old_vocab": 100}, reps=2)
    names = {r.impl for r in rows}
    assert {*LIMITS, REFERENCE, "tokenpos kernel (out=)", "tokenpos numpy (public layer)",
            "tokenpos torch (public layer)"} <= names
    assert all(r.seconds > 0 and r.ratio_vs_limit is not None for r in rows if r.median_seconds is not None)


def test_bench_runs_the_ngram_case_at_its_quick_size(monkeypatch):
    """``tokenpos bench --quick --cases ngram``: run_bench runs this case with NGRAM_QUICK (made tiny here) and
    reports its rows, the size it ran in the report's config."""
    from tokenpos.analysis import bench
    from tokenpos.analysis.bench_names import CASES as BENCH_CASES
    from tokenpos.cli.bench import _cases

    assert "ngram" in BENCH_CASES and _cases("ngram") == ["ngram"]
    tiny = {**bench.NGRAM_QUICK, "V": 64, "B": 1, "L": 8, "old_vocab": 100, "reps": 2}
    monkeypatch.setattr(bench, "NGRAM_QUICK", tiny)
    report = bench.run_bench(quick=True, cases=["ngram"])
    assert report.config["ngram"] == tiny and report.command.endswith("--cases ngram")
    names = {r.impl for r in report.rows}
    assert {r.case for r in report.rows} == {"ngram"}
    assert {*LIMITS, REFERENCE, "tokenpos kernel (out=)"} <= names
    kernel = next(r for r in report.rows if r.impl == "tokenpos kernel (out=)")
    assert kernel.ratio_vs_limit is not None and kernel.ratio_vs_reference is not None


def test_quick_ngram_size_is_smaller_than_the_full_one():
    from tokenpos.analysis.bench import NGRAM_FULL, NGRAM_QUICK

    assert NGRAM_QUICK["V"] < NGRAM_FULL["V"] and NGRAM_QUICK["reps"] < NGRAM_FULL["reps"]
    assert {k: v for k, v in NGRAM_QUICK.items() if k not in ("V", "B", "L", "reps")} == {
        k: v for k, v in NGRAM_FULL.items() if k not in ("V", "B", "L", "reps")}
