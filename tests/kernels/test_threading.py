"""Fork and threads: the numba threading layer chosen in tokenpos.kernels._threading.

Every scenario runs in a fresh interpreter with a timeout, so a hang fails the test instead of
blocking the run, and an abort (the OpenMP/workqueue failure modes) shows up as a bad exit code.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from tokenpos.kernels import _threading, embedding_forward, rope_apply
from tokenpos.kernels.reference import embedding_forward_ref

pytestmark = pytest.mark.slow   # child processes and threads (fork, pools)

PRELUDE = """
import sys
if TORCH_FIRST:
    import torch                                # tokenpos then runs its kernels on torch's OpenMP pool
import numpy as np, tokenpos.kernels as K
from tokenpos.kernels import embedding as E, rope as RO
E.PARALLEL_BYTES = RO.PARALLEL_BYTES = 0        # the parallel cores, however small the arrays
rng = np.random.default_rng(0)
W = rng.standard_normal((500, 64)).astype(np.float32)
IDS = rng.integers(0, 500, (8, 300))

def call(seed=1):
    return K.embedding_forward(W, IDS, scale=8.0, dropout_p=0.1, seed=seed)

want = call()                                   # the parent has launched the parallel kernels
"""


HAS_TORCH = importlib.util.find_spec("torch") is not None
POOLS = [False, pytest.param(True, marks=pytest.mark.skipif(not HAS_TORCH, reason="needs torch"))]


def run_script(body: str, timeout: float = 120, torch_first: bool = False, env: dict | None = None) -> str:
    """Run PRELUDE + body in a fresh interpreter (``torch_first``: torch imported before tokenpos)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p), **(env or {})}
    env.pop("NUMBA_THREADING_LAYER", None)
    code = f"TORCH_FIRST = {torch_first}\n" + PRELUDE + textwrap.dedent(body)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, env=env)
    assert res.returncode == 0, res.stderr[-2000:]
    return res.stdout


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork is POSIX-only")
@pytest.mark.parametrize("torch_first", POOLS)
def test_forked_child_calls_kernels_after_the_parent_did(torch_first: bool) -> None:
    out = run_script(torch_first=torch_first, body="""
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
@pytest.mark.parametrize("torch_first", POOLS)
def test_multiprocessing_pool_with_fork_does_not_hang(torch_first: bool) -> None:
    out = run_script(torch_first=torch_first, body="""
        import multiprocessing as mp

        def work(seed):
            return float(call(seed).sum())

        with mp.get_context("fork").Pool(2) as pool:
            got = pool.map(work, [1, 2, 3, 4])
        print("ok", got[0] == float(want.sum()), len(got))
    """)
    assert "ok True 4" in out


@pytest.mark.parametrize("torch_first", POOLS)
def test_threads_calling_kernels_concurrently_do_not_abort(torch_first: bool) -> None:
    out = run_script(torch_first=torch_first, body="""
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
    # omp only on torch's own pool (torch imported first; forked children then run serially), else tbb
    assert _threading.layer() in (("tbb", "workqueue", "omp") if _threading._chosen == "omp" else ("tbb", "workqueue"))
    assert numba.threading_layer() == _threading.layer()


@pytest.mark.skipif(not HAS_TORCH, reason="needs torch")
def test_the_first_kernel_call_leaves_torchs_thread_count_alone() -> None:
    """On torch's OpenMP pool, numba's first launch set the calling thread's OpenMP thread count to numba's
    (the CPU count): a torch.set_num_threads(1) was undone by the first large tokenpos call, and every compiled
    graph recompiled ("GLOBAL_STATE changed: num_threads")."""
    code = textwrap.dedent("""
        import torch
        torch.set_num_threads(1)
        import tokenpos.torch as tpt
        emb = tpt.TransformerEmbedding(500, 256, 512, seed=0).eval()
        emb(torch.randint(0, 500, (8, 512)))            # 4 MiB out: the parallel kernel
        print(torch.get_num_threads())
    """)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    env.pop("NUMBA_THREADING_LAYER", None)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.split()[-1] == "1"


def test_workqueue_fallback_serialises_launches(monkeypatch) -> None:
    """Without TBB, launches take one lock (workqueue aborts on concurrent launches)."""
    monkeypatch.setattr(_threading, "_lock_needed", True)
    with _threading.parallel_guard():
        assert _threading._lock.locked()
    assert not _threading._lock.locked()
    w = np.arange(12, dtype=np.float32).reshape(6, 2)
    ids = np.array([[5, 0, 3]])
    assert np.array_equal(embedding_forward(w, ids, scale=2.0), embedding_forward_ref(w, ids, scale=2.0))


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork is POSIX-only")
@pytest.mark.skipif(not HAS_TORCH, reason="needs torch")
def test_every_parallel_kernel_runs_in_a_forked_child_on_torchs_pool() -> None:
    """torch imported first: the kernels run on numba's omp layer bound to torch's libgomp; a forked
    child runs every kernel (forward, backward, RoPE, each optimiser) on its calling thread, with the
    parent's results (numba's omp pool would kill it with SIGTERM)."""
    out = run_script(torch_first=True, body="""
        import os
        from tokenpos.kernels import _threading
        g = rng.standard_normal((8, 300, 64)).astype(np.float32)
        q = rng.standard_normal((2, 4, 300, 32)).astype(np.float32)
        c = rng.standard_normal((300, 16)).astype(np.float32)

        def everything():
            res = [call(), *K.embedding_backward(g, IDS, dropout_p=0.1, seed=1, pos_ids=np.arange(300),
                                                 num_positions=300)]
            res += list(K.rope_apply(q, q, c, c))
            u, rows = res[1], res[2]
            for mode in ("lazy", "exact", "sparse_adam"):
                w, m, v = W.copy(), np.zeros_like(W), np.zeros_like(W)
                K.sparse_adam_update(w, m, v, u, rows, step=1, lr=0.1, mode=mode)
                res += [w, m, v]
            for mode in ("lazy", "exact"):
                w, b = W.copy(), np.zeros_like(W)
                K.sparse_sgd_update(w, u, rows, lr=0.1, momentum=0.9, weight_decay=0.01, momentum_buffer=b,
                                    mode=mode)
                res += [w, b]
            return res

        parent = everything()
        print("layer", _threading.layer(), _threading.serial_only())
        pid = os.fork()
        if pid == 0:
            got = everything()
            same = all(np.array_equal(a, b) for a, b in zip(got, parent, strict=True))
            os._exit(0 if same and _threading.serial_only() else 3)
        _, status = os.waitpid(pid, 0)
        print("child", os.waitstatus_to_exitcode(status))
    """, timeout=600)
    assert "layer omp False" in out and "child 0" in out


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="ELF symbol bindings")
@pytest.mark.skipif(not HAS_TORCH, reason="needs torch")
def test_with_torch_first_numba_binds_to_torchs_openmp_runtime() -> None:
    """One thread pool: numba's omp pool calls GOMP_parallel in the libgomp torch loaded (the loader's
    own record of the binding), not in a second copy of the runtime; without torch, tbb as before."""
    import torch  # noqa: F401 - torch_gomp() reads the imported torch

    from tokenpos.kernels._threading import torch_gomp

    bundled = torch_gomp()
    if bundled is None:
        pytest.skip("this torch build has no bundled libgomp (it uses the system's)")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p), "LD_DEBUG": "bindings"}
    env.pop("NUMBA_THREADING_LAYER", None)
    code = ("import torch, numpy as np, tokenpos.kernels as K, numba\n"
            "K.embedding_forward(np.ones((50000, 64), np.float32), np.arange(50000))\n"
            "print('layer', numba.threading_layer())")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "layer omp" in res.stdout
    binds = [ln for ln in res.stderr.splitlines() if "omppool" in ln and "`GOMP_parallel'" in ln]
    assert binds and all(os.path.realpath(bundled) in ln or bundled in ln for ln in binds), binds
    res = subprocess.run([sys.executable, "-c", "import numpy as np, tokenpos.kernels as K, numba\n"
                          "K.embedding_forward(np.ones((50000, 64), np.float32), np.arange(50000))\n"
                          "print('layer', numba.threading_layer())"],
                         capture_output=True, text=True, timeout=300, env={k: v for k, v in env.items()
                                                                           if k != "LD_DEBUG"})
    assert res.returncode == 0 and "layer tbb" in res.stdout, res.stderr[-2000:]


def test_every_parallel_kernel_is_launched_through_threading_parallel() -> None:
    """The class of the forked-child SIGTERM: every ``@njit(parallel=True)`` core of the package is
    called only as ``parallel(core)`` / ``parallel(core, serial)`` (``kernels/_threading.parallel``:
    on numba's omp pool a forked child must run it serially). Read from the source, so a new kernel
    launched directly fails here."""
    import ast
    from pathlib import Path

    import tokenpos

    root = Path(tokenpos.__file__).parent
    trees = {f: ast.parse(f.read_text()) for f in sorted(root.rglob("*.py"))}

    def is_parallel_njit(d: ast.expr) -> bool:
        return isinstance(d, ast.Call) and any(kw.arg == "parallel" and isinstance(kw.value, ast.Constant)
                                               and kw.value.value is True for kw in d.keywords)

    cores = {fn.name for tree in trees.values() for fn in ast.walk(tree)
             if isinstance(fn, ast.FunctionDef) and any(is_parallel_njit(d) for d in fn.decorator_list)}
    assert {"forward_core", "_rope_core"} <= cores, cores
    direct = [f"{f.relative_to(root)}:{node.lineno} {node.func.id}" for f, tree in trees.items()
              for node in ast.walk(tree)
              if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in cores]
    assert not direct, f"parallel kernels called directly (use _threading.parallel(core)): {direct}"
