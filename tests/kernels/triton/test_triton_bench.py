"""benchmarks/gpu_bench.py: refuses to measure without CUDA; its smoke mode runs every impl on the interpreter."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest
import torch

triton = pytest.importorskip("triton")          # the optional gpu extra

SCRIPT = Path(__file__).resolve().parents[3] / "benchmarks" / "gpu_bench.py"


@pytest.fixture(scope="module")
def gpu_bench():
    spec = importlib.util.spec_from_file_location("gpu_bench", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message printed on machines without CUDA")
def test_without_cuda_it_says_so_and_measures_nothing(gpu_bench, capsys) -> None:
    assert gpu_bench.main([]) == 2
    captured = capsys.readouterr()
    assert "no CUDA device" in captured.err and "nothing was measured" in captured.err
    assert captured.out == ""


@pytest.mark.slow  # every impl on the Triton interpreter
@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="smoke mode runs on the Triton interpreter")
def test_smoke_runs_every_impl_and_agrees_with_the_formula(gpu_bench, capsys) -> None:
    assert gpu_bench.main(["--smoke"]) == 0
    out = capsys.readouterr().out
    assert "rows ran on the CPU interpreter" in out and "GB/s" not in out        # no timings in smoke mode
