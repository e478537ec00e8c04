"""The benchmark library and its CLI, on tiny shapes (timings themselves are never asserted)."""

from __future__ import annotations

import argparse
import math

import pytest

pytest.importorskip("torch")

from tokenpos.analysis import bench  # noqa: E402

TINY = dict(V=64, D=32, B=2, L=8, rB=1, rH=2, L_rope=8, Dh=16)


@pytest.mark.parametrize("p", [0.0, 0.1])
def test_embedding_case_rows(p: float) -> None:
    rows = bench._embedding_case(TINY, p, reps=2, compile_=False)
    by = {r.impl: r for r in rows}
    assert by[bench.COPY].ratio_vs_copy == pytest.approx(1.0)
    assert by[bench.EAGER].ratio_vs_reference == pytest.approx(1.0)
    k = by["tokenpos kernel"]
    assert k.case == ("dropout" if p else "forward")
    assert k.seconds > 0 and k.gbps > 0 and k.ratio_vs_copy > 0 and k.ratio_vs_reference > 0
    assert k.median_seconds is not None and k.median_seconds >= k.seconds
    for r in rows:                                      # a public layer either ran or says why not
        assert (r.seconds > 0) or r.note.startswith("skipped")


def test_rope_and_train_rows() -> None:
    rows = bench._rope_case(TINY, reps=2, compile_=False)
    assert any(r.impl == "tokenpos kernel" and r.gbps > 0 for r in rows)
    for mode in ("lazy", "exact"):
        rows = bench._train_case(TINY, mode, reps=2)
        assert rows[0].impl.startswith("torch") and rows[0].ratio_vs_reference == pytest.approx(1.0)
        assert all(r.ratio_vs_copy is None for r in rows)
        assert any(r.impl == f"tokenpos kernel ({mode})" and r.ratio_vs_reference > 0 for r in rows)


def test_zipf_ids_are_skewed() -> None:
    import numpy as np

    ids = bench.zipf_ids(np.random.default_rng(0), 1000, (20000,))
    counts = np.bincount(ids, minlength=1000)
    assert counts[0] > counts[10] > counts[500]


def test_unknown_case() -> None:
    with pytest.raises(ValueError, match="unknown bench case"):
        bench.run_bench(cases=["nope"])


def test_cli_parser() -> None:
    from tokenpos.cli import bench as cli_bench

    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command")
    cli_bench.add_parser(sub)
    args = parser.parse_args(["bench", "--quick", "--cases", "forward,rope", "--json", "x.json"])
    assert args.quick and args.cases == ["forward", "rope"] and args.json == "x.json" and not args.compile
    with pytest.raises(SystemExit):
        parser.parse_args(["bench", "--cases", "forward,bogus"])
    assert cli_bench._fmt(float("nan"), ".1f") == "-" and cli_bench._fmt(None, ".1f") == "-"
    assert cli_bench._fmt(1.234, ".1f") == "1.2" and not math.isnan(1.0)
