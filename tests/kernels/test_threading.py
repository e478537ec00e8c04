"""Fork and threads: the numba threading layer chosen in tokenpos.kernels._threading.

Every scenario runs in a fresh interpreter with a timeout, so a hang fails the test instead of
blocking the run, and an abort (the OpenMP/workqueue failure modes) shows up as a bad exit code.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from tokenpos.kernels import _threading, embedding_forward, rope_apply
from tokenpos.kernels.reference import embedding_forward_ref

PRELUDE = """
import numpy as np, tokenpos.kernels as K
rng = np.random.default_rng(0)
W = rng.standard_normal((500, 64)).astype(np.float32)
IDS = rng.integers(0, 500, (8, 300))

def call(seed=1):
    return K.embedding_forward(W, IDS, scale=8.0, dropout_p=0.1, seed=seed)

want = call()                                   # the parent has launched the parallel kernels
"""


def run_script(body: str, timeout: float = 120) -> str:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    res = subprocess.run([sys.executable, "-c", PRELUDE + textwrap.dedent(body)], capture_output=True, text=True,
                         timeout=timeout, env=env)
    assert res.returncode == 0, res.stderr[-2000:]
    return res.stdout


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork is POSIX-only")
def test_forked_child_calls_kernels_after_the_parent_did() -> None:
    out = run_script("""
        import os
        pid = os.fork()
        if pid == 0:
            code = 0 if np.array_equal(call(), want) else 3
            os._exit(code)
        _, status = os.waitpid(pid, 0)
        print("child", os.waitstatus_to_exitcode(status))
    """)
    assert "child 0" in out


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork is POSIX-only")
def test_multiprocessing_pool_with_fork_does_not_hang() -> None:
    out = run_script("""
        import multiprocessing as mp

        def work(seed):
            return float(call(seed).sum())

        with mp.get_context("fork").Pool(2) as pool:
            got = pool.map(work, [1, 2, 3, 4])
        print("ok", got[0] == float(want.sum()), len(got))
    """)
    assert "ok True 4" in out


def test_threads_calling_kernels_concurrently_do_not_abort() -> None:
    out = run_script("""
        import threading
        q = rng.standard_normal((2, 4, 300, 32)).astype(np.float32)
        c = rng.standard_normal((300, 16)).astype(np.float32)
        rq, rk = K.rope_apply(q, q, c, c)
        bad = []

        def worker():
            for i in range(30):
                if not np.array_equal(call(), want):
                    bad.append("embedding")
                a, b = K.rope_apply(q, q, c, c)
                if not (np.array_equal(a, rq) and np.array_equal(b, rk)):
                    bad.append("rope")

        ts = [threading.Thread(target=worker) for _ in range(4)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        print("bad", len(bad))
    """)
    assert "bad 0" in out


def test_the_layer_is_fork_and_thread_safe_and_thread_count_untouched() -> None:
    import numba

    before = numba.get_num_threads()
    w = np.ones((10, 8), np.float32)
    embedding_forward(w, np.arange(10)[None])
    rope_apply(np.ones((1, 1, 4, 8), np.float32), None, np.ones((4, 4), np.float32), np.zeros((4, 4), np.float32))
    assert numba.get_num_threads() == before
    assert _threading.layer() in ("tbb", "workqueue")    # never omp (fork-unsafe) unless the user chose it
    assert numba.threading_layer() == _threading.layer()


def test_workqueue_fallback_serialises_launches(monkeypatch) -> None:
    """Without TBB, launches take one lock (workqueue aborts on concurrent launches)."""
    monkeypatch.setattr(_threading, "_lock_needed", True)
    with _threading.parallel_guard():
        assert _threading._lock.locked()
    assert not _threading._lock.locked()
    w = np.arange(12, dtype=np.float32).reshape(6, 2)
    ids = np.array([[5, 0, 3]])
    assert np.array_equal(embedding_forward(w, ids, scale=2.0), embedding_forward_ref(w, ids, scale=2.0))
