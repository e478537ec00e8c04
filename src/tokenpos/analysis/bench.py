"""The kernel benchmark as a library: returns a :class:`BenchReport`, never prints.

Every case times its implementations interleaved (rep 1 of each, rep 2 of each, ...) in one process,
in model conditions (each timed call, references included, right after a torch matmul of the
model's size with the default OpenMP wait policy: :func:`.bench_timing.time_interleaved`), next to
references measured in the same loop: the case's physical limit (the random-row gather
for the embedding cases, the copy bandwidth (torch ``copy_`` of the output's bytes into a
preallocated tensor) for RoPE), torch eager and ``torch.compile`` of the same formula. The order
is shuffled every round (no impl always follows the same neighbour, none twice in a row) and the
embedding cases cycle
through several id batches, so no impl finds its previous call's rows or buffers still in cache.
A row's ``seconds`` is its best rep (the machine is shared: other load only ever adds time),
and its ratios compare best with best; ``median_seconds`` and the note give the medians too.
A ratio whose best (best / best) and median (median / median) disagree by more than ``RATIO_AGREEMENT``
(2x) is unstable: it is listed in ``row.unstable`` and shown as not claimed. The
counters of other processes' CPU time are read at every case boundary: ``row.other_cpus`` is its
case's, and a row above ``BUSY_CPUS`` is ``competed`` (measured under load; the report does not draw
it as a result), ``report.competition`` the whole run's.

    effective GB/s = 2 * (bytes of the output) / seconds          (read once + written once)

Cases (default workload V=50257, D=768, B=16, L=512 fp32; RoPE B=2 H=32 L=2048 Dh=128, 134 MB of q
and k: DRAM-sized):

- ``forward``: inference forward ``W[ids] * sqrt(D) + P[pos]``.
- ``dropout``: the training forward, the same plus dropout 0.1.
- ``bf16``: the forward on bf16 tables (fused bf16 kernel vs torch eager/compile in bf16).
- ``rope``: RoPE on q and k vs the HF-style eager ``q*cos + rotate_half(q)*sin``.
- ``block``: one transformer block (embedding, RoPE, attention, MLP), forward + backward, in torch
  eager, ``torch.compile``, and with the tokenpos layers, eager and compiled (:mod:`.bench_block`).
- ``compiled``: ``torch.compile`` of a model containing TransformerEmbedding vs eager (full runs).
- ``train_lazy`` / ``train_exact``: one embedding step (forward, backward, AdamW) on Zipf ids vs
  ``nn.Embedding`` + fused AdamW (dense gradient); the ratio is the speed-up over torch.
- ``ngram``: the hashed n-gram lookup (Engram): the fused kernel against the reference's two steps (NumPy hashing +
  ``nn.Embedding`` gather) and the random-gather limit of the same rows (:mod:`.bench_ngram`; its own sizes:
  :data:`NGRAM_FULL`, :data:`NGRAM_QUICK`).
- ``jit``: import and first-call latency of every kernel in a fresh process (cold = empty numba
  cache, warm = cache filled; the quick run measures the installed package cache only).
- ``calls``: host time of decode-sized calls (and a training forward, a small tied loss, a patched
  HF decode step) as the calling thread's CPU time, tokenpos against the torch / HF way, alternating
  in one process, with what one call runs of tokenpos's code (:mod:`.bench_calls`). Not in model
  conditions: it measures the host work of a call, which another process's load does not change.

"tokenpos kernel" rows call :mod:`tokenpos.kernels` directly; "tokenpos numpy" / "tokenpos torch"
rows call the public layers (``TransformerEmbedding(...)(ids)``, ``RotaryEmbedding(...).apply``),
so they show what a user gets, whether or not the layers use the kernels yet. The cases
themselves live in :mod:`.bench_cases` (bandwidth cases) and here (train steps, JIT).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from tokenpos.analysis.bench_block import block_case
from tokenpos.analysis.bench_calls import calls_case
from tokenpos.analysis.bench_cases import compiled_model_case, embedding_case, rope_case
from tokenpos.analysis.bench_names import CASES
from tokenpos.analysis.bench_ngram import DEFAULT as NGRAM_DEFAULT
from tokenpos.analysis.bench_ngram import ngram_case
from tokenpos.analysis.bench_timing import (
    NBATCH,
    BenchReport,
    BenchRow,
    add_impl,
    bench_rows,
    competition,
    cpu_counters,
    cycle,
    machine,
    model_op,
    note_rows,
    public,
    time_interleaved,
)


def zipf_ids(rng: np.random.Generator, V: int, shape: tuple[int, ...], s: float = 1.0) -> np.ndarray:
    """Ids with P(id = r) proportional to 1 / (r + 1)**s (rank = id, as BPE vocabularies roughly are)."""
    w = 1.0 / np.arange(1, V + 1, dtype=np.float64) ** s
    return rng.choice(V, size=shape, p=w / w.sum())


def _train_case(cfg: dict, mode: str, reps: int) -> list[BenchRow]:
    import torch

    import tokenpos.kernels as K
    V, D, B, L = cfg["V"], cfg["D"], cfg["B"], cfg["L"]
    rng = np.random.default_rng(0)
    batches = [zipf_ids(rng, V, (B, L)) for _ in range(NBATCH)]
    g = rng.standard_normal((B, L, D), dtype=np.float32)
    w0 = rng.standard_normal((V, D), dtype=np.float32) * 0.02
    hp = dict(lr=1e-3, weight_decay=0.01)
    emb = torch.nn.Embedding(V, D)
    with torch.no_grad():
        emb.weight.copy_(torch.from_numpy(w0))
    opt = torch.optim.AdamW(emb.parameters(), lr=hp["lr"], weight_decay=hp["weight_decay"], fused=True)
    tg = torch.from_numpy(g)
    ids_t = cycle([torch.from_numpy(b) for b in batches])

    def torch_step() -> None:
        emb(next(ids_t)).backward(tg)
        opt.step()
        opt.zero_grad(set_to_none=True)

    w, m, v = w0.copy(), np.zeros_like(w0), np.zeros_like(w0)
    m.fill(0)                                              # fault the state in now, as torch's zeros_like
    v.fill(0)                                              # does (calloc'd pages fault on first write)
    step = [0]

    ids_k = cycle(batches)

    def kernel_step() -> None:
        ids = next(ids_k)
        K.embedding_forward(w, ids)
        u, rows, _ = K.embedding_backward(g, ids)
        step[0] += 1
        K.sparse_adam_update(w, m, v, u, rows, step=step[0], decoupled=True, mode=mode, **hp)

    impls: dict[str, Callable[[], Any]] = {"torch nn.Embedding + fused AdamW": torch_step,
                                           f"tokenpos kernel ({mode})": kernel_step}
    notes: dict[str, str] = {}

    def numpy_layer() -> Callable[[], Any]:
        layer = public("numpy", "token", "TokenEmbedding")(V, D, seed=0)
        nopt = public("numpy", "optim", "AdamW")(layer.parameters(), sparse_mode=mode, **hp)

        it = cycle(batches)

        def run() -> None:
            layer(next(it))
            layer.backward(g)
            nopt.step()
            nopt.zero_grad()
        return run

    add_impl(impls, notes, f"tokenpos numpy ({mode}, public layer)", numpy_layer)
    times = time_interleaved(impls, reps, model_op(D))
    times = {"torch eager" if k.startswith("torch nn") else k: t for k, t in times.items()}
    rows = bench_rows(f"train_{mode}", times, 2 * B * L * D * 4, bandwidth=False, notes=notes)
    rows[0].impl = "torch nn.Embedding + fused AdamW"
    return rows + note_rows(f"train_{mode}", notes)


_JIT_SCRIPT = r"""
import json, time
t0 = time.perf_counter()
import numpy as np
import tokenpos.kernels as K
t1 = time.perf_counter()
w = np.ones((8, 4), np.float32); ids = np.array([[1, 2], [3, 4]])
K.embedding_forward(w, ids, scale=2.0, pos_table=w, pos_ids=np.array([0, 1]), dropout_p=0.1, seed=1)
K.embedding_backward(np.ones((2, 2, 4), np.float32), ids, dropout_p=0.1, seed=1)
q = np.ones((1, 2, 2, 4), np.float32); c = np.ones((2, 2), np.float32)
K.rope_apply(q, q, c, c)
m = np.zeros_like(w); v = np.zeros_like(w)
for mode in ("lazy", "exact"):
    K.sparse_adam_update(w, m, v, np.array([1]), np.ones((1, 4), np.float32), step=1, lr=0.1, mode=mode)
t2 = time.perf_counter()
print(json.dumps({"import": t1 - t0, "first_calls": t2 - t1}))
"""


def _jit_case(quick: bool) -> list[BenchRow]:
    def run(env: dict[str, str]) -> dict[str, float]:
        out = subprocess.run([sys.executable, "-c", _JIT_SCRIPT], capture_output=True, text=True,
                             env={**os.environ, **env}, timeout=600, check=True).stdout
        return json.loads(out.strip().splitlines()[-1])

    rows = []
    runs: list[tuple[str, dict[str, str]]] = []
    tmp = None
    if not quick:
        tmp = tempfile.mkdtemp(prefix="tokenpos-numba-cache-")
        runs += [("cold (empty numba cache)", {"NUMBA_CACHE_DIR": tmp}),
                 ("warm (numba cache filled)", {"NUMBA_CACHE_DIR": tmp})]
    runs.append(("package cache (as installed)", {}))
    for label, env in runs:
        r = run(env)
        rows.append(BenchRow("jit", f"first calls, {label}", r["first_calls"], float("nan"), None, None,
                             f"import tokenpos.kernels {r['import'] * 1e3:.0f} ms; all kernels, float32"))
    if tmp:
        import shutil
        shutil.rmtree(tmp, ignore_errors=True)
    return rows


# ----------------------------------------------------------------------------------------------
# entry point
# ----------------------------------------------------------------------------------------------

TIMING = ("model conditions: best of interleaved, shuffled reps, each timed call right after a ~1 GFLOP torch "
          "matmul of the model dim, default OpenMP wait policy (medians in notes)")
CALLS_TIMING = ("calls: CPU time of the calling thread (time.thread_time), blocks of n calls of tokenpos and of "
                "the reference alternating over rounds, torch and numba on one thread, no torch op in between")
# RoPE: q and k of 67 MB each (B2 H32 L2048 Dh128, a Llama-7B-sized prefill), far larger than an L3
# block: one transformer block (D, H=12 heads) on (bB, bL) ids, forward + backward
# calls: rounds per row, and the CPU milliseconds of a block of calls (bench_calls)
FULL = dict(V=50257, D=768, B=16, L=512, rB=2, rH=32, L_rope=2048, Dh=128, bB=2, bL=256, bH=12, reps=20,
            train_reps=8, calls_rounds=41, calls_block_ms=10)
# quick: the same workload (cache-resident shapes would flatter copy), fewer reps and rounds
QUICK = dict(FULL, reps=5, train_reps=3, calls_rounds=11, calls_block_ms=2)
# ngram: the reference's settings (max_ngram_size 3, 8 heads per n, 512 per n) on bench_ngram's table (2**17 rows
# per n: R ~ 2.1M rows x 64 fp32 = 537 MB); quick: the same (4, 1024) batch on 2**15 rows per n (R ~ 0.5M rows,
# 134 MB: still far past the L3, and quicker to build), fewer reps
NGRAM_FULL = dict(NGRAM_DEFAULT)
NGRAM_QUICK = dict(NGRAM_DEFAULT, V=1 << 15, reps=5)


def run_bench(*, quick: bool = False, compile: bool | None = None, cases: Sequence[str] | None = None,
              progress: Callable[[str, int, int], None] | None = None) -> BenchReport:
    """Run the benchmark cases; ``progress(label, done, total)`` is called before each case and at the end.

    ``compile``: time ``torch.compile`` rows (None: yes unless ``quick``; the "compiled" case
    always compiles and is left out of quick runs unless named in ``cases``).
    """
    flag = "" if compile is None or compile == (not quick) else (" --compile" if compile else " --no-compile")
    if compile is None:
        compile = not quick
    import torch  # noqa: F401 - the references need it; fail early with a clear ImportError

    todo = list(CASES if cases is None else cases)
    if cases is None and (quick or not compile):
        todo.remove("compiled")
    bad = [c for c in todo if c not in CASES]
    if bad:
        raise ValueError(f"unknown bench case(s) {bad}; expected some of {list(CASES)}")
    cfg = dict(QUICK if quick else FULL)
    command = "tokenpos bench" + (" --quick" if quick else "") + flag + (
        f" --cases {','.join(todo)}" if cases is not None else "")
    ngram_cfg = NGRAM_QUICK if quick else NGRAM_FULL
    report = BenchReport(machine(), command, {**cfg, "dtype": "float32", "dropout": 0.1, "zipf_s": 1.0,
                                               "id_batches": NBATCH,
                                               "timing": TIMING, "calls_timing": CALLS_TIMING,
                                               **({"ngram": dict(ngram_cfg)} if "ngram" in todo else {})})
    start = now = cpu_counters()                            # competition: other processes' CPU time
    for i, case in enumerate(todo):
        if progress:
            progress(case, i, len(todo))
        first, case_start = len(report.rows), now
        if case in ("forward", "dropout", "bf16"):
            report.rows += embedding_case(cfg, 0.1 if case == "dropout" else 0.0, cfg["reps"], compile,
                                          bf16=case == "bf16")
        elif case == "rope":
            report.rows += rope_case(cfg, cfg["reps"], compile)
        elif case == "block":
            report.rows += block_case(cfg, cfg["train_reps"], compile)
        elif case == "compiled":
            report.rows += compiled_model_case(cfg, cfg["reps"])
        elif case.startswith("train_"):
            report.rows += _train_case(cfg, case[len("train_"):], cfg["train_reps"])
        elif case == "calls":
            report.rows += calls_case(cfg)
        elif case == "ngram":
            report.rows += ngram_case(ngram_cfg)
        else:
            report.rows += _jit_case(quick)
        now = cpu_counters()
        measured = competition(case_start, now)                # this case's competition: its rows are marked
        for row in report.rows[first:]:
            row.other_cpus = None if measured is None else measured.other_cpus
    report.competition = competition(start, now)
    if progress:
        progress("done", len(todo), len(todo))
    return report
