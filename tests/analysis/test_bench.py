"""The benchmark library and its CLI, on tiny shapes (timings themselves are never asserted)."""

from __future__ import annotations

import argparse
import math

import pytest

pytest.importorskip("torch")

from tokenpos.analysis import bench, bench_cases  # noqa: E402
from tokenpos.analysis.bench_timing import COPY, EAGER, GATHER, GATHER_NUMBA  # noqa: E402

TINY = dict(V=64, D=32, B=2, L=8, rB=1, rH=2, L_rope=8, Dh=16, bB=2, bL=8, bH=2)


@pytest.mark.parametrize(("p", "bf16"), [(0.0, False), (0.1, False), (0.0, True)])
def test_embedding_case_rows(p: float, bf16: bool) -> None:
    """Every row the issue's targets need: both gather limits, eager, the kernel, the layers, with ratios."""
    rows = bench_cases.embedding_case(TINY, p, reps=2, compile_=False, bf16=bf16)
    by = {r.impl: r for r in rows}
    assert by[COPY].ratio_vs_copy == pytest.approx(1.0)
    assert by[EAGER].ratio_vs_reference == pytest.approx(1.0)
    fastest_gather = max(by[GATHER].ratio_vs_limit, by[GATHER_NUMBA].ratio_vs_limit)
    assert fastest_gather == pytest.approx(1.0)          # the limit is the faster gather
    k = by["tokenpos kernel (out=)"]
    assert k.case == ("bf16" if bf16 else "dropout" if p else "forward")
    assert k.seconds > 0 and k.gbps > 0 and k.ratio_vs_limit > 0 and k.ratio_vs_reference > 0
    assert k.median_seconds is not None and k.median_seconds >= k.seconds
    assert set(k.median_ratios) >= {"copy", "eager", "limit"} and k.ratio_vs_compile is None
    for r in rows:                                      # a public layer either ran or says why not
        assert (r.seconds > 0) or r.note.startswith("skipped")
        if "(public layer)" in r.impl and r.seconds > 0:   # and says how close it is to its kernel (#10)
            assert r.ratio_vs_kernel == pytest.approx(k.seconds / r.seconds) and "kernel" in r.median_ratios


def test_numba_gather_limit_is_a_gather() -> None:
    import numpy as np

    w = np.arange(12, dtype=np.float32).reshape(6, 2)
    out = np.empty((3, 2), np.float32)
    bench_cases.gather_rows(w, np.array([5, 0, 2]), out)
    assert np.array_equal(out, w[[5, 0, 2]])


@pytest.mark.slow  # torch.compile
def test_compile_rows_are_timed_when_asked() -> None:
    """torch.compile rows (tiny shapes; compile time is not timed: the first call is the warm-up)."""
    rows = bench_cases.embedding_case(TINY, 0.0, reps=2, compile_=True)
    by = {r.impl: r for r in rows}
    assert by["torch.compile"].ratio_vs_compile == pytest.approx(1.0) or by["torch.compile"].note.startswith(
        "skipped")
    rows = bench_cases.compiled_model_case(TINY, reps=2)
    assert any(r.impl == "torch.compile(model)" for r in rows)


def test_rope_and_train_rows() -> None:
    rows = bench_cases.rope_case(TINY, reps=2, compile_=False)
    assert any(r.impl == "tokenpos kernel (out=)" and r.gbps > 0 and r.ratio_vs_limit > 0 for r in rows)
    for mode in ("lazy", "exact"):
        rows = bench._train_case(TINY, mode, reps=2)
        assert rows[0].impl.startswith("torch") and rows[0].ratio_vs_reference == pytest.approx(1.0)
        assert all(r.ratio_vs_copy is None for r in rows)
        assert any(r.impl == f"tokenpos kernel ({mode})" and r.ratio_vs_reference > 0 for r in rows)


@pytest.mark.slow  # torch.compile
def test_block_rows_compare_tokenpos_with_torch_eager_and_compile() -> None:
    """The end-to-end block: torch eager, torch.compile, tokenpos eager and compiled, each with its ratios."""
    from tokenpos.analysis import bench_block

    rows = bench_block.block_case(TINY, reps=2, compile_=True)
    by = {r.impl: r for r in rows}
    assert set(by) == {EAGER, "torch.compile", bench_block.TOKENPOS, bench_block.TOKENPOS_COMPILE}
    for r in rows:
        assert r.case == "block" and r.seconds > 0, r.note          # every block ran (none skipped)
        assert r.ratio_vs_reference > 0 and r.ratio_vs_compile > 0
    assert by[EAGER].ratio_vs_reference == pytest.approx(1.0)
    assert {r.impl for r in bench_block.block_case(TINY, reps=1, compile_=False)} == {EAGER, bench_block.TOKENPOS}


def test_block_implementations_compute_the_same_loss() -> None:
    """The tokenpos block is the torch block with tokenpos layers: with the same weights and dropout off,
    the same loss and the same gradients (float32 tolerance)."""
    import torch

    from tokenpos.analysis import bench_block

    V, D, H, L = 50, 16, 2, 8
    ref, tp = bench_block._block(V, D, H, L, False).eval(), bench_block._block(V, D, H, L, True).eval()
    with torch.no_grad():
        tp.emb.token.weight.copy_(ref.tok.weight)
        tp.emb.position.weight.copy_(ref.pos.weight)
        for name in ("ln1", "ln2", "qkv", "proj", "up", "down"):
            getattr(tp, name).load_state_dict(getattr(ref, name).state_dict())
    ids = torch.randint(0, V, (2, L))
    a, b = ref(ids), tp(ids)
    a.backward()
    b.backward()
    assert torch.allclose(a, b, rtol=1e-5, atol=1e-6)
    assert torch.allclose(ref.qkv.weight.grad, tp.qkv.weight.grad, rtol=1e-4, atol=1e-6)
    assert torch.allclose(ref.tok.weight.grad, tp.emb.token.weight.grad, rtol=1e-4, atol=1e-6)


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
    assert args.quick and args.cases == ["forward", "rope"] and args.json == "x.json" and args.compile is None
    assert parser.parse_args(["bench", "--no-compile"]).compile is False
    with pytest.raises(SystemExit):
        parser.parse_args(["bench", "--cases", "forward,bogus"])
    assert cli_bench._fmt(float("nan"), ".1f") == "-" and cli_bench._fmt(None, ".1f") == "-"
    assert cli_bench._fmt(1.234, ".1f") == "1.2" and not math.isnan(1.0)


def test_bench_json_path_is_checked_before_the_run(tmp_path, monkeypatch) -> None:
    """A bad --json path fails at once: run_bench is never called."""
    from tokenpos.cli import bench as cli_bench

    called = []
    monkeypatch.setattr(bench, "run_bench", lambda **kw: called.append(kw))
    blocker = tmp_path / "a-file"                  # a missing folder is made (tests/cli/test_output_folders.py);
    blocker.write_text("")                         # a file in the folder's place is a bad path
    args = argparse.Namespace(json=str(blocker / "x.json"), quick=True, compile=None, cases=None, no_progress=True)
    with pytest.raises(NotADirectoryError):
        cli_bench.run(args)
    assert called == []


def test_cli_prints_every_row_with_best_and_median_ratios(tmp_path, monkeypatch, capsys) -> None:
    """The table shows each row's ratios as best/median and writes the JSON report atomically."""
    import json

    from tokenpos.analysis.bench_timing import BenchReport, bench_rows
    from tokenpos.cli import bench as cli_bench

    times = {COPY: [1.0, 1.2], GATHER: [0.8, 1.0], "torch.compile": [2.0, 2.0], EAGER: [4.0, 5.0],
             "tokenpos kernel (out=)": [1.0, 1.25], "tokenpos torch (public layer)": [1.25, 1.5]}
    rows = bench_rows("forward", times, 1e6, limit=(GATHER,))
    monkeypatch.setattr(bench, "run_bench", lambda **kw: BenchReport("m", "tokenpos bench", {}, rows))
    monkeypatch.setenv("COLUMNS", "250")
    out = tmp_path / "r.json"
    args = argparse.Namespace(json=str(out), quick=False, compile=None, cases=None, no_progress=True)
    assert cli_bench.run(args) == 0
    text = capsys.readouterr().out
    assert "x limit" in text and "x compile" in text
    assert "0.80/0.80" in text and "2.00/1.78" in text          # kernel: vs gather, vs compile (best/median)
    assert "x kernel" in text and "0.80/0.82" in text          # the layer: the kernel's time / its own
    saved = json.loads(out.read_text())
    k = [r for r in saved["rows"] if r["impl"] == "tokenpos kernel (out=)"][0]
    assert k["ratio_vs_limit"] == pytest.approx(0.8) and k["median_ratios"]["compile"] == pytest.approx(2.0 / 1.125)
    assert k["ratio_vs_kernel"] is None and "kernel" not in k["median_ratios"]     # only public layers get it
    pub = [r for r in saved["rows"] if r["impl"] == "tokenpos torch (public layer)"][0]
    assert pub["ratio_vs_kernel"] == pytest.approx(0.8)
    assert pub["median_ratios"]["kernel"] == pytest.approx(1.125 / 1.375)


@pytest.mark.parametrize(("other_cpu_seconds", "warned"), [(0.5, False), (30.0, True)])   # 0.05 / 3.0 CPUs
def test_cli_warns_when_other_processes_competed(monkeypatch, capsys, other_cpu_seconds: float, warned: bool) -> None:
    """The note comes from the run's measured competition (other processes' CPU time), with its number;
    a median far above the best rep (normal in model conditions) says nothing by itself."""
    from tokenpos.analysis.bench_timing import BenchReport, Competition, bench_rows
    from tokenpos.cli import bench as cli_bench

    rows = bench_rows("forward", {COPY: [1.0, 3.0, 3.0], GATHER: [1.0, 1.0, 1.0]}, 1e6, limit=(GATHER,))
    report = BenchReport("m", "tokenpos bench", {}, rows, Competition(other_cpu_seconds, 10.0, 16))
    monkeypatch.setattr(bench, "run_bench", lambda **kw: report)
    monkeypatch.setenv("COLUMNS", "250")
    args = argparse.Namespace(json=None, quick=False, compile=None, cases=None, no_progress=True)
    assert cli_bench.run(args) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert ("other processes kept 3.00 of the 16 CPUs busy on average during this run" in out) == warned


def test_run_bench_records_the_competition_between_its_first_and_last_case(monkeypatch) -> None:
    """run_bench reads the counters before the first case and after the last and keeps their difference."""
    from tokenpos.analysis.bench_timing import Competition, CpuCounters

    readings = iter([CpuCounters(100.0, 5.0, 1000.0, 4), CpuCounters(112.0, 11.0, 1010.0, 4)])
    monkeypatch.setattr(bench, "cpu_counters", lambda: next(readings))
    monkeypatch.setattr(bench, "_jit_case", lambda quick: [])
    report = bench.run_bench(cases=["jit"])
    assert report.competition == Competition(6.0, 10.0, 4)                 # 12 busy - 6 own, over 10 s
    assert next(readings, None) is None                                    # read twice, no more
