"""The bandwidth cases of ``tokenpos bench``: forward, dropout, bf16, RoPE, and a compiled model.

Each case times, interleaved in one process and in model conditions (:func:`.bench_timing.time_interleaved`:
each timed call right after a torch matmul of the model dim, :func:`.bench_timing.model_op`): its physical
limit, torch eager, ``torch.compile`` of the same formula (when ``compile_``), the raw tokenpos
kernel (with a preallocated ``out=``, as the layers call it) and the public layers.

- forward / dropout: limit = the random-row gather with no arithmetic, the faster of
  ``torch.index_select(W, 0, ids, out=buf)`` and a plain parallel numba gather; the formula is
  ``W[ids] * sqrt(D) + P[pos]`` (then dropout 0.1). The "compute floor" row runs the same kernel
  on a 64-row table that stays in cache: the time of the arithmetic (dropout hash, bf16 widening
  and rounding) and the output writes without the random reads. Where it is slower than a target
  allows, no memory-side change can meet that target.
- bf16: the same formula on bf16 tables (limit: the bf16 gathers); the kernel widens bf16 exactly,
  computes in float32 and rounds once; eager torch rounds after every op.
- rope: limit = copy bandwidth (q and k read and written once); eager = HF ``rotate_half``.
- packed rows (forward and rope): the public layers on the same B * L tokens packed in one row of
  2B documents (lengths L // 2 and L - L // 2, ``cu_seqlens``), positions restarting per document.
- compiled: ``torch.compile`` of a small model containing TransformerEmbedding vs the same eager.

Shapes: V vocab, D model dim, B batch, L length (ids (B, L), outputs (B, L, D)); RoPE q and k
(B, H, L, Dh).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from numba import njit, prange

from tokenpos.analysis.bench_timing import (
    COMPILE,
    COPY,
    EAGER,
    GATHER,
    GATHER_NUMBA,
    KERNEL,
    NBATCH,
    BenchRow,
    add_impl,
    bench_rows,
    copy_ref,
    cycle,
    model_op,
    note_rows,
    public,
    time_interleaved,
)

LIMITS = (GATHER, GATHER_NUMBA)
FLOOR_ROWS = 64
FLOOR = "compute floor: tokenpos kernel, 64-row table (in cache)"


@njit(parallel=True, cache=True)
def gather_rows(weight, ids, out):  # pragma: no cover - compiled
    """out[n] = weight[ids[n]]: the plain parallel gather (no arithmetic), the other limit."""
    for n in prange(ids.shape[0]):
        w = weight[ids[n]]
        o = out[n]
        for d in range(w.shape[0]):
            o[d] = w[d]


def numba_gather(w: np.ndarray, batches: list[np.ndarray], out: np.ndarray) -> Callable[[], Any]:
    from tokenpos.kernels._threading import parallel, parallel_guard

    flat = cycle([b.reshape(-1) for b in batches])
    o2 = out.reshape(-1, out.shape[-1])

    def run() -> None:
        with parallel_guard():
            parallel(gather_rows)(w, next(flat), o2)
    return run


PACKED = "packed documents"


def packed_cu_seqlens(B: int, L: int) -> np.ndarray:
    """``cu_seqlens`` (2B + 1,) int64 of B * L tokens in 2B documents of lengths L // 2 and L - L // 2."""
    return np.concatenate([[0], np.cumsum([L // 2, L - L // 2] * B)]).astype(np.int64)


def _public_layer(backend: str, V: int, D: int, L: int, p: float, batches: list, tables: tuple,
                  cu_seqlens: Any = None, **kw: Any):
    """The public TransformerEmbedding reading the SAME (V, D) and (L, D) tables as the other rows
    (shared memory, no copy): with a table of its own, the layer would gather from rows the other
    impls do not warm in the shared L3, and the comparison would measure cache luck, not code.
    ``cu_seqlens`` given: each (B, L) batch is called as one packed row (B * L,) of those documents."""
    def make() -> Callable[[], Any]:
        cls = public(backend, "transformer", "TransformerEmbedding")
        layer = cls(V, D, L, positional="learned", scale=True, dropout=p, seed=0, **kw)
        layer.token.weight.data, layer.position.weight.data = tables          # share, do not copy
        layer.train() if p else layer.eval()
        if cu_seqlens is None:
            it = cycle(batches)
            return lambda: layer(next(it))
        flat = cycle([b.reshape(-1) for b in batches])
        return lambda: layer(next(flat), cu_seqlens=cu_seqlens)
    return make


def embedding_case(cfg: dict, p: float, reps: int, compile_: bool, bf16: bool = False) -> list[BenchRow]:
    """forward (p = 0), dropout (p > 0) or bf16 (bf16=True, p = 0)."""
    import torch

    import tokenpos.kernels as K
    from tokenpos.torch._init import empty_table
    from tokenpos.torch.ops._dispatch import np_view
    V, D, B, L = cfg["V"], cfg["D"], cfg["B"], cfg["L"]
    case = "bf16" if bf16 else ("dropout" if p else "forward")
    tdt = torch.bfloat16 if bf16 else torch.float32
    rng = np.random.default_rng(0)
    # allocated as tokenpos allocates its tables (huge pages for the large one: _hugepages), shared by every row
    W = empty_table(V, D, dtype=tdt).copy_(torch.from_numpy(rng.standard_normal((V, D), dtype=np.float32) * 0.02))
    P = empty_table(L, D, dtype=tdt).copy_(torch.from_numpy(rng.standard_normal((L, D), dtype=np.float32) * 0.02))
    w, pt = np_view(W), np_view(P)                               # bf16: the uint16 bit patterns
    batches = [rng.integers(0, V, (B, L)) for _ in range(NBATCH)]
    tbatches = [torch.from_numpy(b) for b in batches]
    pos, tp = np.arange(L), torch.arange(L)
    scale = float(np.sqrt(D))
    esize = 2 if bf16 else 4
    # every row that writes into a given buffer gets one of its own, as the public layers have their
    # own output block: a buffer shared by several timed rows stays in L3 between them (bf16's 12.6 MB
    # fits), and the rows writing it would be timed on warmer memory than any layer output sees
    outs = [torch.empty(B, L, D, dtype=tdt) for _ in range(4)]
    out_g, out_n, out_k, out_f = outs[0], np_view(outs[1]), np_view(outs[2]), np_view(outs[3])
    ids_t, ids_g = cycle(tbatches), cycle([b.reshape(-1) for b in tbatches])

    def formula(ids: torch.Tensor) -> torch.Tensor:
        x = torch.nn.functional.embedding(ids, W) * scale + P[tp]
        return torch.nn.functional.dropout(x, p, training=True) if p else x

    impls: dict[str, Callable[[], Any]] = {
        COPY: copy_ref(B * L * D * esize),
        GATHER: lambda: torch.index_select(W, 0, next(ids_g), out=out_g.view(B * L, D)),
        GATHER_NUMBA: numba_gather(w, batches, out_n),
        EAGER: lambda: formula(next(ids_t)),
    }
    notes: dict[str, str] = {}
    if compile_:
        def make_compiled() -> Callable[[], Any]:
            fn = torch.compile(formula)
            return lambda: fn(next(ids_t))
        add_impl(impls, notes, COMPILE, make_compiled)
    seeds = iter(range(1, 1 << 30))

    ids_k = cycle(batches)
    impls[KERNEL] = lambda: K.embedding_forward(w, next(ids_k), scale=scale, pos_table=pt, pos_ids=pos, dropout_p=p,
                                                seed=next(seeds), out=out_k, bf16=bf16)
    small = np.ascontiguousarray(w[:FLOOR_ROWS])                 # (64, D): stays in L1/L2
    ids_f = cycle([b % FLOOR_ROWS for b in batches])
    impls[FLOOR] = lambda: K.embedding_forward(small, next(ids_f), scale=scale, pos_table=pt, pos_ids=pos,
                                               dropout_p=p, seed=next(seeds), out=out_f, bf16=bf16)
    if not bf16:
        add_impl(impls, notes, "tokenpos numpy (public layer)", _public_layer("numpy", V, D, L, p, batches, (w, pt)))
    add_impl(impls, notes, "tokenpos torch (public layer)",
             _public_layer("torch", V, D, L, p, tbatches, (W, P), **({"dtype": torch.bfloat16} if bf16 else {})))
    if not p and not bf16:                                       # the same tokens, packed in one row
        cu = packed_cu_seqlens(B, L)
        add_impl(impls, notes, f"tokenpos numpy, {PACKED} (public layer)",
                 _public_layer("numpy", V, D, L, p, batches, (w, pt), cu_seqlens=cu))
        add_impl(impls, notes, f"tokenpos torch, {PACKED} (public layer)",
                 _public_layer("torch", V, D, L, p, tbatches, (W, P), cu_seqlens=torch.from_numpy(cu)))
    grad = torch.is_grad_enabled()
    torch.set_grad_enabled(bool(p))                        # inference: no autograd graph anywhere
    try:
        times = time_interleaved(impls, reps, model_op(D))
    finally:
        torch.set_grad_enabled(grad)
    return bench_rows(case, times, 2 * B * L * D * esize, notes=notes, limit=LIMITS) + note_rows(case, notes)


def _rope_tables(L: int, R: int) -> tuple[np.ndarray, np.ndarray]:
    inv = 10000.0 ** (-np.arange(0, R, 2) / R)
    ang = np.arange(L)[:, None] * inv                      # (L, R/2), float64
    return np.cos(ang), np.sin(ang)


def rope_case(cfg: dict, reps: int, compile_: bool) -> list[BenchRow]:
    import torch

    import tokenpos.kernels as K
    B, H, L, Dh = cfg["rB"], cfg["rH"], cfg["L_rope"], cfg["Dh"]
    q = torch.randn(B, H, L, Dh)
    k = torch.randn(B, H, L, Dh)
    c64, s64 = _rope_tables(L, Dh)
    c32, s32 = c64.astype(np.float32), s64.astype(np.float32)
    cos = torch.from_numpy(np.concatenate([c32, c32], -1))[None, None]  # (1, 1, L, Dh) HF layout
    sin = torch.from_numpy(np.concatenate([s32, s32], -1))[None, None]

    def rotate_half(x: torch.Tensor) -> torch.Tensor:
        x1, x2 = x[..., : Dh // 2], x[..., Dh // 2:]
        return torch.cat((-x2, x1), dim=-1)

    def hf() -> tuple[torch.Tensor, torch.Tensor]:
        return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin

    qn, kn = q.numpy(), k.numpy()
    oq, ok = np.empty_like(qn), np.empty_like(kn)
    impls: dict[str, Callable[[], Any]] = {COPY: copy_ref(2 * q.numel() * 4), EAGER: hf}
    notes: dict[str, str] = {}
    if compile_:
        add_impl(impls, notes, COMPILE, lambda: torch.compile(hf))
    impls[KERNEL] = lambda: K.rope_apply(qn, kn, c32, s32, layout="half", out_q=oq, out_k=ok)

    def numpy_layer() -> Callable[[], Any]:
        rope = public("numpy", "rotary", "RotaryEmbedding")(Dh, max_seq_len=L)
        return lambda: rope.apply(qn, kn)

    def torch_layer() -> Callable[[], Any]:
        rope = public("torch", "rotary", "RotaryEmbedding")(Dh, max_seq_len=L)
        return lambda: rope.apply(q, k)

    qt, kt = q.transpose(1, 2).reshape(B * L, H, Dh), k.transpose(1, 2).reshape(B * L, H, Dh)   # (T, H, Dh)
    cu = packed_cu_seqlens(B, L)

    def numpy_packed() -> Callable[[], Any]:
        rope = public("numpy", "rotary", "RotaryEmbedding")(Dh, max_seq_len=L, qk_layout="thd")
        qp, kp = qt.numpy(), kt.numpy()
        return lambda: rope.apply(qp, kp, cu_seqlens=cu)

    def torch_packed() -> Callable[[], Any]:
        rope = public("torch", "rotary", "RotaryEmbedding")(Dh, max_seq_len=L, qk_layout="thd")
        cu_t = torch.from_numpy(cu)
        return lambda: rope.apply(qt, kt, cu_seqlens=cu_t)

    add_impl(impls, notes, "tokenpos numpy (public layer)", numpy_layer)
    add_impl(impls, notes, "tokenpos torch (public layer)", torch_layer)
    add_impl(impls, notes, f"tokenpos numpy, {PACKED} (public layer)", numpy_packed)
    add_impl(impls, notes, f"tokenpos torch, {PACKED} (public layer)", torch_packed)
    with torch.no_grad():
        times = time_interleaved(impls, reps, model_op(H * Dh))
    return bench_rows("rope", times, 2 * 2 * q.numel() * 4, notes=notes) + note_rows("rope", notes)


def compiled_model_case(cfg: dict, reps: int) -> list[BenchRow]:
    """``torch.compile`` of a model containing TransformerEmbedding (then layer_norm) vs the same eager."""
    import torch

    V, D, B, L = cfg["V"], cfg["D"], cfg["B"], cfg["L"]
    cls = public("torch", "transformer", "TransformerEmbedding")
    layer = cls(V, D, L, positional="learned", scale=True, seed=0).eval()

    def model(ids: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.layer_norm(layer(ids), (D,))

    rng = np.random.default_rng(0)
    it = cycle([torch.from_numpy(rng.integers(0, V, (B, L))) for _ in range(NBATCH)])
    impls: dict[str, Callable[[], Any]] = {COPY: copy_ref(B * L * D * 4), EAGER: lambda: model(next(it))}
    notes: dict[str, str] = {}

    def make() -> Callable[[], Any]:
        fn = torch.compile(model)
        return lambda: fn(next(it))
    add_impl(impls, notes, COMPILE, make)
    with torch.no_grad():
        times = time_interleaved(impls, reps, model_op(D))
    times = {("eager model (TransformerEmbedding + layer_norm)" if k == EAGER else
              "torch.compile(model)" if k == COMPILE else k): v for k, v in times.items()}
    return bench_rows("compiled", times, 2 * B * L * D * 4, notes=notes,
                      eager="eager model (TransformerEmbedding + layer_norm)",
                      compiled="torch.compile(model)") + note_rows("compiled", notes)
