"""Run a function on W local processes joined by a gloo process group, inside a pytest run.

``run_world(W, "module:function", tmp_path, **kwargs)`` starts W processes (torch.multiprocessing with
the forkserver start method, whose server imports torch and tokenpos once for every world of the session: a fresh
interpreter without fork's hazards, minus a few seconds of import per child) joined on a free
localhost port found by binding port 0. Each calls
``function(rank, world, **kwargs) -> dict[str, str | None]`` (check name -> the traceback of its
failure, or None) and the parent gets one such dict per rank. A child that dies or raises outside a
check re-raises in the parent with the child's traceback; a run past ``timeout`` is killed.

Children use one thread each (torch, numba, OpenMP): W processes share a small machine.
"""

from __future__ import annotations

import datetime
import importlib
import json
import os
import socket
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

CheckResults = dict[str, "str | None"]
SKIP = "skipped: "     # a check raising ``RuntimeError(SKIP + reason)`` is reported as skipped (``skips=True``)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_checks(checks: list[tuple[str, Callable[[], None]]]) -> CheckResults:
    """Run each check in order, recording its traceback instead of stopping (collectives stay in step)."""
    out: CheckResults = {}
    for name, fn in checks:
        try:
            fn()
            out[name] = None
        except Exception:
            out[name] = traceback.format_exc()
    return out


def _entry(rank: int, world: int, port: int, target: str, kwargs: dict[str, Any], outdir: str) -> None:
    # numba re-reads NUMBA_NUM_THREADS at every compile and refuses a change once its threads run:
    # set the variable only where numba is not loaded yet, else use its own per-thread setting below
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS") + (() if "numba" in sys.modules else ("NUMBA_NUM_THREADS",)):
        os.environ[var] = "1"
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    if "numba" in sys.modules:                     # preloaded by the forkserver, before the variable was set
        sys.modules["numba"].set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))
    try:
        module, name = target.split(":")
        results = getattr(importlib.import_module(module), name)(rank, world, **kwargs)
        Path(outdir, f"rank{rank}.json").write_text(json.dumps(results))
    finally:
        dist.destroy_process_group()


def run_world(world: int, target: str, tmp_path: Path, *, timeout: float = 240.0, **kwargs: Any) -> list[CheckResults]:
    """Results of ``target`` on every rank of a fresh W-process gloo world (see the module doc)."""
    import multiprocessing

    import torch.multiprocessing as mp

    multiprocessing.set_forkserver_preload(["torch", "torch.distributed", "tokenpos.torch.distributed"])
    outdir = Path(tmp_path) / f"world{world}"
    outdir.mkdir(parents=True, exist_ok=True)
    ctx = mp.start_processes(_entry, args=(world, free_port(), target, kwargs, str(outdir)), nprocs=world,
                             join=False, start_method="forkserver")
    deadline = time.monotonic() + timeout
    try:
        while not ctx.join(timeout=1.0):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{target} on {world} processes did not finish within {timeout:.0f} s")
    finally:
        for p in ctx.processes:
            if p.is_alive():
                p.kill()
                p.join(5)
    return [json.loads((outdir / f"rank{r}.json").read_text()) for r in range(world)]


def run_worlds(tmp_path: Path, target: str, worlds: tuple[int, ...], ckpt_name: str) -> dict[int, list[CheckResults]]:
    """``run_world`` for each of ``worlds`` in order, the first writing the checkpoint ``ckpt_name`` that the others
    load (resharding from the first world size to each other one)."""
    ckpt = str(Path(tmp_path) / ckpt_name)
    return {world: run_world(world, target, tmp_path, ckpt=ckpt, write_ckpt=world == worlds[0]) for world in worlds}


def report_check(results: dict[int, list[CheckResults]], world: int, check: str, *, suffixed: bool = False,
                 skips: bool = False) -> None:
    """One check on every rank of ``world``, as one test: it fails with the failing rank's traceback, is skipped
    where ``skips`` and the check raised ``SKIP + reason``, and passes otherwise. ``suffixed``: the check may be
    reported under ``<check>_<detail>`` (the first such key counts)."""
    import pytest

    for rank, res in enumerate(results[world]):
        name = next((k for k in res if k == check or (suffixed and k.startswith(check + "_"))), None)
        assert name is not None, f"rank {rank} did not run {check!r}"
        if res[name] is not None:
            if skips and SKIP in res[name]:
                pytest.skip(res[name].split(SKIP)[-1].strip())
            pytest.fail(f"{name} failed on rank {rank} of {world}:\n{res[name]}", pytrace=False)
