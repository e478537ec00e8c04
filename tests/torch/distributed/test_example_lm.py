"""The README's torchrun command, as CI runs it: 2 processes, --check (the one-process losses agree)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.torch.distributed.harness import free_port

pytestmark = pytest.mark.slow   # torchrun, two processes

SRC = str(Path(__file__).resolve().parents[3] / "src")


def test_torchrun_two_ranks_matches_one_process() -> None:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")]),
               OMP_NUM_THREADS="1", NUMBA_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", str(free_port()),
           "-m", "tokenpos.examples.vocab_parallel_lm", "--steps", "4", "--check"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("world 2: vocab 1003 padded to 1008, 504 rows per rank")
    steps = [ln for ln in lines if ln.startswith("step")]
    assert len(steps) == 4 and all("one process" in ln for ln in steps)     # rank 0 prints, once per step
    assert lines[-1].startswith("check passed: 4 steps on 2 ranks")
