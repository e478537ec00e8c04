"""GPU benchmark of tokenpos's layers and Triton kernels, side by side in one run (CUDA only).

Usage:
    python benchmarks/gpu_bench.py [--quick] [--rounds N] [--json PATH]
    python benchmarks/gpu_bench.py --smoke     # CPU, Triton interpreter, tiny shapes: checks agreement only

Rows, each timed in the same process, round-robin (every round runs every impl once, median over rounds):
- copy: ``dst.copy_(src)`` of the output's bytes, the bandwidth ceiling;
- torch eager, torch.compile (default mode) of the same eager function;
- Liger-Kernel's RoPE (``liger_kernel.transformers.rope.liger_rotary_pos_emb``) when importable;
- tokenpos Triton (out of place, and in place for RoPE): the kernel API;
- tokenpos layers, as a user calls them (``RotaryEmbedding.apply``, ``TransformerEmbedding`` in train
  and eval, ``VocabParallelEmbedding`` on a one-rank group): their rows carry the host's Python too;
- ``torch.compile(mode="reduce-overhead")`` of the eager code (CUDA graphs, so no launch overhead; its
  inputs marked static, as a model's weights are, so a replay copies nothing in);
- ", graph" rows: the kernel API, the layer, eager and Liger each captured in a CUDA graph and replayed,
  so the row is the GPU's time alone (the plain rows run 10 calls back to back, and where the host's
  Python and launches take longer than the GPU's work, they time the host).
Effective GB/s = bytes that must move (inputs read once + outputs written once) / time. Ratios are
against copy and against the named reference measured in the same run; the targets (issue 34) are
for the layers: RoPE layer >= 0.85x copy and >= 1.2x Liger's RoPE; the embedding layer (train, p=0.1)
>= 0.8x copy and >= 1.2x torch.compile. The "rope decode" and "embedding decode" rows (one token per
sequence, a KV-cache step) show what the host's time per call costs when the GPU's work is small.

The "rope packed vs padded" case times the RoPE layer on the same tokens packed into one row of four
documents (``cu_seqlens``, ``qk_layout="thd"``), its "eager" row being the padded layer call.

Workloads: RoPE q (4, 32, 4096, 128), k (4, 8, 4096, 128) bf16, half layout, fp32 cos/sin (L, 64);
embedding V=50257, D=4096, ids (4, 2048), learned positions (2048, 4096), bf16, scale sqrt(D), p=0.1.
``--quick`` quarters the lengths.

``--cases host_table`` (not in the default run; ``gpu_check.sh``'s "hosttable" stage): tables kept in host memory
(``storage="host"``, issue 51) against the same table on the device, per layer type (token V=262,144 D=2,048;
per-layer Gemma 3n E2B's V=262,144 x 30 layers x 256; hashed n-gram n=3, 8 heads, Dh=128, ~8M rows), bf16, ids
(4, 2048) from the host. Rows: "eager" is the device-stored lookup; "host, no prefetch" gathers and sends in the
call; "host, prefetched" is ``prefetch(host ids)`` then ``forward(device ids)`` back to back (the host gather on the
critical path); "compute only" is a stand-in for the rest of a step (bf16 matmuls), and "compute + device" /
"compute + host, prefetched" put the lookup after it, the prefetch issued before it: what is left of the host
path's cost when the next step's gather overlaps the GPU's work. Plain rows only (a host path is not capturable).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from tokenpos.tables.formulas.rope import rope_angles, rope_inv_freq

CALLS = 10   # back-to-back calls per timed sample on a GPU


def _timer(device: torch.device) -> Callable[[Callable[[], object]], float]:
    """Milliseconds of one call. On a GPU: CUDA events around CALLS back-to-back calls, divided by
    CALLS, so the GPU's time is measured when the host launches faster than the GPU runs (with one
    call between the events, every row also paid the host's launch latency: 2.4x the kernel time
    for the fused embedding forward, measured on an H100); perf_counter in smoke mode."""
    if device.type == "cuda":
        def run(fn):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(CALLS):
                fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / CALLS
    else:
        def run(fn):
            t = time.perf_counter()
            fn()
            return 1e3 * (time.perf_counter() - t)
    return run


GRAPHED = ("tokenpos", "tokenpos layer", "eager", "liger")   # also timed as a CUDA-graph replay (", graph" rows)


def graphed(fn: Callable[[], object], calls: int = CALLS) -> Callable[[], object]:
    """``calls`` back-to-back calls of ``fn`` captured once in a CUDA graph (after three warm-up calls
    on a side stream, as torch.cuda.graphs asks), returned as its replay: the GPU's time of exactly
    what ``fn`` launches, without the host's Python and launch time (a layer inside a model runs
    ahead of the GPU, or inside a captured graph, so its GPU time is what it costs there).

    Several calls per graph, because a replay has costs of its own that a model's graph pays once
    per step, not once per layer call: the graph launch, and for a graph with random draws (dropout
    seeds) the two ``fill_`` kernels that set its RNG offsets. With one call per graph they were
    charged to that call: 9-11 us of the embedding layer's train row on an H100 (2026-11-28)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    return graph.replay


def replay_ms(replay: Callable[[], object], calls: int = CALLS) -> float:
    """Milliseconds of one call, from one replay of a graph of ``calls`` calls (:func:`graphed`)
    between CUDA events."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / calls


def side_by_side(impls: dict[str, Callable[[], object]], rounds: int, device: torch.device,
                 graphs: bool = True) -> dict[str, float]:
    """Median ms per impl over ``rounds`` round-robin rounds (each impl warmed twice first). On CUDA
    (``graphs``), the impls named in GRAPHED are also timed as CUDA-graph replays ("<name>, graph").

    An optional third-party impl that raises while warming (or capturing) is reported on stderr and
    left out.
    """
    timer = _timer(device)
    if graphs and device.type == "cuda":
        for name in [n for n in impls if n in GRAPHED]:
            try:
                impls[f"{name}, graph"] = graphed(impls[name])
            except Exception as exc:                                          # reported, then dropped
                print(f"gpu_bench: {name} could not be captured in a CUDA graph: {type(exc).__name__}: {exc}",
                      file=sys.stderr)
    for name, fn in list(impls.items()):
        try:
            fn()
            fn()
        except Exception as exc:                                              # reported, then dropped
            if name.startswith("tokenpos") or name in ("eager", "copy"):
                raise
            print(f"gpu_bench: {name} failed and is left out: {type(exc).__name__}: {exc}", file=sys.stderr)
            del impls[name]
    samples: dict[str, list[float]] = {name: [] for name in impls}
    for _ in range(rounds):
        for name, fn in impls.items():                                       # a graph replay is CALLS calls
            samples[name].append(timer(fn) / (CALLS if name.endswith(", graph") else 1))
    return {name: statistics.median(s) for name, s in samples.items()}


# --------------------------------------------------------------------------------------------------
# RoPE
# --------------------------------------------------------------------------------------------------


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    h = x.shape[-1] // 2
    return torch.cat([-x[..., h:], x[..., :h]], dim=-1)


def eager_rope(q, k, cos_full, sin_full):
    """HF's apply_rotary_pos_emb: cos/sin (1, 1, L, Dh) in the activations' dtype."""
    return q * cos_full + _rotate_half(q) * sin_full, k * cos_full + _rotate_half(k) * sin_full


def rope_case(args, device, dtype) -> list[dict]:
    import tokenpos.torch as tpt  # here, not at the top: --smoke turns the interpreter on first
    from tokenpos.kernels.triton import rope_qk, rope_qk_backward

    B, H, Hk, L, Dh = (1, 2, 1, 8, 16) if args.smoke else (4, 32, 8, 4096 // (4 if args.quick else 1), 128)
    g = torch.Generator(device="cpu").manual_seed(0)
    q = torch.randn(B, H, L, Dh, generator=g).to(device, dtype)
    k = torch.randn(B, Hk, L, Dh, generator=g).to(device, dtype)
    ang = torch.from_numpy(rope_angles(torch.arange(L).numpy(), rope_inv_freq(Dh)[0]))   # (L, Dh/2) float64
    cos, sin = ang.cos().float().to(device), ang.sin().float().to(device)
    cos_full = torch.cat([cos, cos], -1)[None, None].to(dtype)                           # HF: cache in bf16
    sin_full = torch.cat([sin, sin], -1)[None, None].to(dtype)
    gq, gk = torch.randn_like(q), torch.randn_like(k)
    qi, ki = q.clone(), k.clone()

    layer = tpt.RotaryEmbedding(Dh, max_seq_len=L).to(device)
    impls = {"tokenpos": lambda: rope_qk(q, k, cos, sin, False),
             "tokenpos in place": lambda: rope_qk(qi, ki, cos, sin, False, out_q=qi, out_k=ki),
             "tokenpos layer": lambda: layer.apply(q, k),
             "eager": lambda: eager_rope(q, k, cos_full, sin_full)}
    _compiled(impls, eager_rope, (q, k, cos_full, sin_full), args)
    liger = _liger()
    if liger is not None and device.type == "cuda":
        impls["liger"] = lambda: liger(q, k, cos_full[0], sin_full[0])         # cos/sin (1, L, Dh)

    c32, s32 = torch.cat([cos, cos], -1)[None, None], torch.cat([sin, sin], -1)[None, None]
    ref_q, ref_k = eager_rope(q.float(), k.float(), c32, s32)
    outputs = (*rope_qk(q, k, cos, sin, False), *layer.apply(q, k))             # kernel API, then the layer
    err = max((ours.float() - ref).abs().max().item() for ours, ref in zip(outputs, (ref_q, ref_k) * 2, strict=True))
    moved = 2 * (q.numel() + k.numel()) * q.element_size()
    rows = _rows("rope fwd", side_by_side(impls, args.rounds, device), moved, args, device, err)

    def eager_fwd_bwd():
        qq, kk = q.detach().requires_grad_(), k.detach().requires_grad_()
        a, b = eager_rope(qq, kk, cos_full, sin_full)
        torch.autograd.backward((a, b), (gq, gk))

    def layer_fwd_bwd():
        qq, kk = q.detach().requires_grad_(), k.detach().requires_grad_()
        torch.autograd.backward(layer.apply(qq, kk), (gq, gk))

    bwd = {"tokenpos": lambda: (rope_qk(q, k, cos, sin, False), rope_qk_backward(gq, gk, cos, sin, False)),
           "tokenpos layer": layer_fwd_bwd, "eager": eager_fwd_bwd}
    if liger is not None and device.type == "cuda":
        def liger_fwd_bwd():
            qq, kk = q.detach().requires_grad_(), k.detach().requires_grad_()
            a, b = liger(qq, kk, cos_full[0], sin_full[0])
            torch.autograd.backward((a, b), (gq, gk))
        bwd["liger"] = liger_fwd_bwd
    rows += _rows("rope fwd+bwd", side_by_side(bwd, args.rounds, device), 2 * moved, args, device, err)
    return rows + rope_decode_case(args, device, dtype, layer, liger) + rope_packed_case(args, device, dtype)


def rope_packed_case(args, device, dtype) -> list[dict]:
    """The same tokens as the "rope fwd" row packed into one row of documents of unequal lengths
    (``qk_layout="thd"``, ``cu_seqlens``: positions restart per document) against the padded
    (B, H, L, Dh) call: packed should cost what padded costs per token (issue 30)."""
    import tokenpos.torch as tpt

    B, H, Hk, L, Dh = (1, 2, 1, 8, 16) if args.smoke else (4, 32, 8, 4096 // (4 if args.quick else 1), 128)
    T = B * L
    lengths = [T] if args.smoke else [3 * L // 4, 5 * L // 4, L // 3, T - 3 * L // 4 - 5 * L // 4 - L // 3]
    cu = torch.tensor([0, *np.cumsum(lengths)], dtype=torch.int32).to(device)
    g = torch.Generator(device="cpu").manual_seed(3)
    q = torch.randn(B, H, L, Dh, generator=g).to(device, dtype)
    k = torch.randn(B, Hk, L, Dh, generator=g).to(device, dtype)
    q_thd = q.permute(0, 2, 1, 3).reshape(T, H, Dh).contiguous()                        # (T, H, Dh)
    k_thd = k.permute(0, 2, 1, 3).reshape(T, Hk, Dh).contiguous()
    padded = tpt.RotaryEmbedding(Dh, max_seq_len=T).to(device)
    packed = tpt.RotaryEmbedding(Dh, max_seq_len=T, qk_layout="thd").to(device)
    pos = torch.cat([torch.arange(n) for n in lengths]).to(device)                     # the reference positions
    ref_q, _ = padded.apply(q_thd.permute(1, 0, 2)[None], k_thd.permute(1, 0, 2)[None], pos)
    err = (packed.apply(q_thd, k_thd, cu_seqlens=cu)[0].float()
           - ref_q[0].permute(1, 0, 2).float()).abs().max().item()
    impls = {"tokenpos layer": lambda: packed.apply(q_thd, k_thd, cu_seqlens=cu),
             "eager": lambda: padded.apply(q, k)}                                       # "eager" = the padded layer
    moved = 2 * (q.numel() + k.numel()) * q.element_size()
    return _rows("rope packed vs padded", side_by_side(impls, args.rounds, device), moved, args, device, err)


def rope_decode_case(args, device, dtype, layer, liger) -> list[dict]:
    """One token at position P - 1 of a KV cache (B, H, 1, Dh): the GPU's work is a few KB, so the time
    per call is the host's (Python, checks, launches); CUDA graphs (reduce-overhead) remove it."""
    B, H, Hk, Dh = (1, 2, 1, 16) if args.smoke else (4, 32, 8, 128)
    P = layer.max_seq_len
    g = torch.Generator(device="cpu").manual_seed(1)
    q = torch.randn(B, H, 1, Dh, generator=g).to(device, dtype)
    k = torch.randn(B, Hk, 1, Dh, generator=g).to(device, dtype)
    ang = torch.from_numpy(rope_angles(np.array([P - 1]), rope_inv_freq(Dh)[0]))      # HF's cache row at P - 1
    cos_full = torch.cat([ang.cos(), ang.cos()], -1)[None, None].to(device, dtype)
    sin_full = torch.cat([ang.sin(), ang.sin()], -1)[None, None].to(device, dtype)
    impls = {"tokenpos layer": lambda: layer.apply(q, k, start_pos=P - 1),
             "eager": lambda: eager_rope(q, k, cos_full, sin_full)}
    _compiled(impls, eager_rope, (q, k, cos_full, sin_full), args)
    if liger is not None and device.type == "cuda":
        impls["liger"] = lambda: liger(q, k, cos_full[0], sin_full[0])
    ref_q, _ = eager_rope(q.float(), k.float(), cos_full.float(), sin_full.float())
    err = (layer.apply(q, k, start_pos=P - 1)[0].float() - ref_q).abs().max().item()
    moved = 2 * (q.numel() + k.numel()) * q.element_size()
    return _rows("rope decode", side_by_side(impls, args.rounds, device), moved, args, device, err)


def _compiled(impls: dict, fn, inputs: tuple, args) -> None:
    """Add torch.compile of ``fn`` (default mode) and, on CUDA, mode="reduce-overhead" (CUDA graphs)."""
    if args.smoke:
        return
    for t in inputs:                 # the same tensors every call: reduce-overhead's graphs need not copy them in
        if isinstance(t, torch.Tensor):
            torch._dynamo.mark_static_address(t)
    default, graphs = torch.compile(fn), torch.compile(fn, mode="reduce-overhead")
    impls["torch.compile"] = lambda: default(*inputs)
    impls["compile reduce-overhead"] = lambda: graphs(*inputs)


def _liger():
    try:
        from liger_kernel.transformers.rope import liger_rotary_pos_emb
    except ImportError:
        return None
    return liger_rotary_pos_emb


# --------------------------------------------------------------------------------------------------
# embedding
# --------------------------------------------------------------------------------------------------


def eager_embedding(w, ids, table, pos, scale: float, p: float):
    """Gather * scale + positional rows, then torch's dropout (its own mask; the same work)."""
    y = torch.nn.functional.embedding(ids, w) * scale + table[pos]
    return torch.nn.functional.dropout(y, p, training=True)


def embedding_inputs(V: int, D: int, B: int, L: int, device: torch.device, dtype: torch.dtype
                     ) -> tuple[torch.Tensor, ...]:
    """The embedding cases' inputs, seeded: weight (V, D), learned table (L, D), ids (B, L), positions
    (L,), the dropout seed 1234 (a 0-d tensor) and an upstream gradient (B, L, D)."""
    g = torch.Generator(device="cpu").manual_seed(0)
    w = (0.02 * torch.randn(V, D, generator=g)).to(device, dtype)
    table = (0.02 * torch.randn(L, D, generator=g)).to(device, dtype)
    ids = torch.randint(0, V, (B, L), generator=g).to(device)
    grad = torch.randn(B, L, D, generator=g).to(device, dtype)
    return w, table, ids, torch.arange(L, device=device), torch.tensor(1234, device=device), grad


def embedding_case(args, device, dtype) -> list[dict]:
    from tokenpos.kernels.triton import embedding_backward, embedding_forward
    from tokenpos.tables.formulas.dropout import dropout_keep_mask

    V, D, B, L = (50, 32, 2, 8) if args.smoke else (50257, 4096, 4, 2048 // (4 if args.quick else 1))
    p, scale = 0.1, math.sqrt(D)
    w, table, ids, pos, seed, grad = embedding_inputs(V, D, B, L, device, dtype)

    train, evaluation = (_embedding_layer(w, table, scale > 1, q, device, dtype) for q in (p, 0.0))
    impls = {"tokenpos": lambda: embedding_forward(w, ids, table, pos, scale, p, seed),
             "tokenpos layer": lambda: train(ids),
             "eager": lambda: eager_embedding(w, ids, table, pos, scale, p)}
    _compiled(impls, eager_embedding, (w, ids, table, pos, scale, p), args)
    keep = torch.from_numpy(dropout_keep_mask(1234, (B, L, D), p)).to(device)
    plain = (w.float()[ids] * scale + table.float()[pos]).to(dtype)
    ref = ((w.float()[ids] * scale + table.float()[pos]) * keep / (1 - p)).to(dtype)
    err = max((embedding_forward(w, ids, table, pos, scale, p, seed).float() - ref.float()).abs().max().item(),
              (evaluation(ids).float() - plain.float()).abs().max().item())
    out_bytes = B * L * D * w.element_size()
    rows = _rows("embedding fwd", side_by_side(impls, args.rounds, device), 2 * out_bytes, args, device, err)
    no_drop = {"tokenpos": lambda: embedding_forward(w, ids, table, pos, scale, 0.0, seed),
               "tokenpos layer": lambda: evaluation(ids),
               "eager": lambda: eager_embedding(w, ids, table, pos, scale, 0.0)}
    _compiled(no_drop, eager_embedding, (w, ids, table, pos, scale, 0.0), args)
    rows += _rows("embedding eval", side_by_side(no_drop, args.rounds, device), 2 * out_bytes, args, device, err)

    mult = keep.to(dtype) / (1 - p)

    def eager_bwd():
        gm = grad * mult                                                      # stored-mask dropout backward
        gw = torch.ops.aten.embedding_dense_backward(gm * scale, ids, V, -1, False)
        gt = torch.ops.aten.embedding_dense_backward(gm, pos.expand(B, L), L, -1, False)
        return gw, gt

    bwd = {"tokenpos": lambda: embedding_backward(grad, ids, pos, V, L, scale, p, seed, -1), "eager": eager_bwd}
    if not args.smoke:
        bwd["torch.compile"] = torch.compile(eager_bwd)
    # bytes: read grad, write the dense (V, D) and (P, D) gradients
    moved = out_bytes + (V + L) * D * w.element_size()
    rows += _rows("embedding bwd", side_by_side(bwd, args.rounds, device), moved, args, device, err)

    def layer_step():                                                         # the layer's training step
        train.zero_grad(set_to_none=True)
        train(ids).backward(grad)

    def eager_step():
        ww, tt = w.detach().requires_grad_(), table.detach().requires_grad_()
        eager_embedding(ww, ids, tt, pos, scale, p).backward(grad)

    step = {"tokenpos layer": layer_step, "eager": eager_step}
    if not args.smoke:
        step["torch.compile"] = torch.compile(eager_step)
    rows += _rows("embedding train step", side_by_side(step, args.rounds, device), 2 * out_bytes + moved, args,
                  device, err)
    return rows + embedding_decode_case(args, device, w, table, evaluation) + vocab_parallel_case(args, device, w, ids,
                                                                                                err)


def embedding_decode_case(args, device, w, table, evaluation) -> list[dict]:
    """One new token per sequence at position P - 1 (a decode step, ids (B, 1)), no dropout: a few KB
    of work, so the time per call is the host's (checks, launches); reduce-overhead removes it."""
    B, P = (2 if args.smoke else 4), table.shape[0]
    g = torch.Generator(device="cpu").manual_seed(2)
    ids = torch.randint(0, w.shape[0], (B, 1), generator=g).to(device)
    pos = torch.full((1,), P - 1, device=device)
    scale = math.sqrt(w.shape[1])
    impls = {"tokenpos layer": lambda: evaluation(ids, start_pos=P - 1),
             "eager": lambda: eager_embedding(w, ids, table, pos, scale, 0.0)}
    _compiled(impls, eager_embedding, (w, ids, table, pos, scale, 0.0), args)
    want = (w.float()[ids] * scale + table.float()[pos]).to(w.dtype)
    err = (evaluation(ids, start_pos=P - 1).float() - want.float()).abs().max().item()
    moved = 2 * B * w.shape[1] * w.element_size()
    return _rows("embedding decode", side_by_side(impls, args.rounds, device), moved, args, device, err)


def _embedding_layer(w, table, scale: bool, p: float, device, dtype):
    """A tokenpos TransformerEmbedding holding copies of ``w`` and ``table`` (learned positions), in
    training mode with dropout ``p`` or in eval mode without."""
    import tokenpos.torch as tpt
    layer = tpt.TransformerEmbedding(w.shape[0], w.shape[1], table.shape[0], scale=scale, dropout=p,
                                     device=device, dtype=dtype)
    with torch.no_grad():
        layer.token.weight.copy_(w)
        layer.position.weight.copy_(table)
    return layer.train(p > 0.0)


def vocab_parallel_case(args, device, w, ids, err: float) -> list[dict]:
    """``VocabParallelEmbedding`` on a one-rank group (NCCL on CUDA, gloo in smoke mode) against
    ``F.embedding`` of the same table: what the vocab-parallel bookkeeping costs on one GPU."""
    import torch.distributed as dist

    from tokenpos.torch.distributed import VocabParallelEmbedding
    started = not dist.is_initialized()
    if started:
        store = dist.HashStore()
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo", store=store, rank=0, world_size=1)
    try:
        layer = VocabParallelEmbedding(w.shape[0], w.shape[1], device=device, dtype=w.dtype, seed=0)
        with torch.no_grad():
            layer.weight.copy_(w)
        impls = {"tokenpos layer": lambda: layer(ids), "eager": lambda: torch.nn.functional.embedding(ids, w)}
        err = max(err, (layer(ids).float() - w.float()[ids]).abs().max().item())
        moved = 2 * ids.numel() * w.shape[1] * w.element_size()
        return _rows("vocab-parallel fwd", side_by_side(impls, args.rounds, device, graphs=False), moved, args,
                     device, err)
    finally:
        if started:
            dist.destroy_process_group()


# --------------------------------------------------------------------------------------------------
# tied loss
# --------------------------------------------------------------------------------------------------


def tied_loss_case(args, device, dtype) -> list[dict]:
    """The tied output projection + cross-entropy, forward + backward (d loss = 1, gradients for h and the table):
    ``tokenpos.torch.tied_cross_entropy`` (chunked cuBLAS matmuls + the Triton block kernel), eager (the (N, V)
    logits in fp32, as HF upcasts them, then ``F.cross_entropy``), torch.compile of eager, and Liger-Kernel's
    ``LigerFusedLinearCrossEntropyLoss`` when importable. Workload: Llama 3's V=128,256, D=4096, N=8,192 tokens
    (``--quick``: 2,048), ``dtype`` h and table. Peak memory above the inputs (``torch.cuda.max_memory_allocated``)
    in a separate, untimed pass per impl: the row's "peak MiB"."""
    import tokenpos.torch as tpt

    V, D, N = (300, 16, 24) if args.smoke else (128256, 4096, 8192 // (4 if args.quick else 1))
    g = torch.Generator(device="cpu").manual_seed(0)
    h = torch.randn(N, D, generator=g).to(device, dtype)
    w = (0.02 * torch.randn(V, D, generator=g)).to(device, dtype)
    t = torch.randint(0, V, (N,), generator=g).to(device)
    t[::7] = -100                                                             # ignored tokens (padding)

    def eager(hh, ww):
        return torch.nn.functional.cross_entropy((hh @ ww.T).float(), t)

    def step(loss_fn):
        def run():
            hh, ww = h.detach().requires_grad_(), w.detach().requires_grad_()
            loss = loss_fn(hh, ww)
            loss.backward()
            return loss.detach(), hh.grad, ww.grad
        return run

    impls = {"tokenpos": step(lambda hh, ww: tpt.tied_cross_entropy(hh, ww, t)), "eager": step(eager)}
    if not args.smoke:
        impls["torch.compile"] = step(torch.compile(eager))
    try:
        from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss
    except ImportError:
        LigerFusedLinearCrossEntropyLoss = None
    if LigerFusedLinearCrossEntropyLoss is not None and device.type == "cuda":
        liger = LigerFusedLinearCrossEntropyLoss()

        def liger_loss(hh, ww):
            out = liger(ww, hh, t)
            return out[0] if isinstance(out, tuple) else out
        impls["liger"] = step(liger_loss)

    ref = step(lambda hh, ww: torch.nn.functional.cross_entropy(hh.float() @ ww.float().T, t))()   # fp32 formula
    ours = impls["tokenpos"]()
    err = max((a.float() - b.float()).abs().max().item() for a, b in zip(ours, ref, strict=True))
    peak = {}
    if device.type == "cuda":
        for name, fn in impls.items():                                       # untimed: one call each
            torch.cuda.synchronize(device)
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(device)
            base = torch.cuda.memory_allocated(device)
            try:
                fn()
            except Exception as exc:                                          # reported; timing decides the row
                print(f"gpu_bench: tied loss {name} memory pass failed: {type(exc).__name__}: {exc}", file=sys.stderr)
                continue
            torch.cuda.synchronize(device)
            peak[name] = (torch.cuda.max_memory_allocated(device) - base) / 2**20
    moved = 2 * (N + V) * D * h.element_size()                                # read h, W; write dh, dW
    rows = _rows("tied loss fwd+bwd", side_by_side(impls, args.rounds, device), moved, args, device, err)
    for r in rows:
        if r["impl"] in peak:
            r["peak MiB"] = peak[r["impl"]]
    if peak:
        print("tied loss fwd+bwd, peak MiB above the inputs: "
              + ", ".join(f"{name} {mib:,.0f}" for name, mib in peak.items()), flush=True)
    return rows


# --------------------------------------------------------------------------------------------------
# tables kept in host memory
# --------------------------------------------------------------------------------------------------


def _host_table_makers(args, dtype) -> list[tuple[str, Callable[..., object]]]:
    """(name, make(storage, device) -> layer) per layer type, bf16, built empty (``init="zeros"``: a normal init of
    GBs would take minutes on the host); :func:`_fill` gives them rows."""
    import tokenpos.torch as tpt

    V, D, L, P = (50, 16, 3, 4) if args.smoke else (262144, 2048, 30, 256)
    sizes = [11, 13] if args.smoke else [500009, 500029]
    heads, dim = (2, 4) if args.smoke else (8, 1024)
    return [("token", lambda storage, device: tpt.TokenEmbedding(V, D, init="zeros", scale=True, storage=storage,
                                                                 device=device, dtype=dtype)),
            ("per-layer", lambda storage, device: tpt.PerLayerEmbedding(V, L, P, init="zeros", storage=storage,
                                                                        device=device, dtype=dtype)),
            ("hashed", lambda storage, device: tpt.HashedNgramEmbedding(
                engram_vocab_size=sizes, max_ngram_size=3, n_embed_per_ngram=dim, n_head_per_ngram=heads, layer_id=1,
                layer_ids=[1], pad_id=0, seed=0, compress=np.arange(V), init="zeros", storage=storage, device=device,
                dtype=dtype))]


@torch.no_grad()
def _fill(w: torch.Tensor, seed: int) -> None:
    """Seeded rows: a (4096, W) random block tiled down the table (one gather, fast for a table of GBs)."""
    block = torch.randn(min(4096, w.shape[0]), w.shape[1], generator=torch.Generator().manual_seed(seed))
    w.copy_(block.to(w.dtype)[torch.arange(w.shape[0]) % block.shape[0]])


def host_table_case(args, device, dtype) -> list[dict]:
    """Host-stored tables with prefetch against device-stored ones (module doc, ``--cases host_table``)."""
    B, L = (2, 8) if args.smoke else (4, 2048)
    n = 256 if args.smoke else 8192
    a = torch.randn(n, n, generator=torch.Generator().manual_seed(6)).to(device, dtype)

    def compute():                                                            # the rest of a step, on the GPU
        x = a
        for _ in range(1 if args.smoke else 4):
            x = x @ a
        return x

    rows = []
    for k, (name, make) in enumerate(_host_table_makers(args, dtype)):
        host = make("host", None)                                             # the table on the host
        _fill(host.weight, k)
        on_device = make("device", device)
        with torch.no_grad():
            on_device.weight.copy_(host.weight)
        host = host.to(device)                                                # outputs to the device, table stays
        assert host.weight.device.type == "cpu"
        plain = make("host", None).to(device)                                 # the same table, never prefetched
        plain.weight = host.weight
        vocab = host.spec.compress.shape[0] if name == "hashed" else host.vocab_size
        ids_host = torch.randint(0, vocab, (B, L), generator=torch.Generator().manual_seed(7))
        ids_dev = ids_host.to(device)

        def prefetched(layer=host, ids_host=ids_host, ids_dev=ids_dev):   # one prefetch queued ahead: each call
            layer.prefetch(ids_host)                                        # adds one, consumes the older one
            return layer(ids_dev)

        def overlapped(layer=host, ids_host=ids_host, ids_dev=ids_dev):
            layer.prefetch(ids_host)
            compute()
            return layer(ids_dev)

        with torch.no_grad():
            host.prefetch(ids_host)
            err = max((host(ids_dev).float() - on_device(ids_dev).float()).abs().max().item(),
                      (plain(ids_host).float() - on_device(ids_dev).float()).abs().max().item())
            host.prefetch(ids_host)
            impls = {"eager": lambda m=on_device, i=ids_dev: m(i),
                     "host, no prefetch": lambda m=plain, i=ids_host: m(i),
                     "host, prefetched": prefetched, "compute only": compute,
                     "compute + device": lambda m=on_device, i=ids_dev: (compute(), m(i)),
                     "compute + host, prefetched": overlapped}
            ms = side_by_side(impls, args.rounds, device, graphs=False)
            out_bytes = on_device(ids_dev).numel() * host.weight.element_size()
        rows += _rows(f"host table {name}", ms, 2 * out_bytes, args, device, err)
        host.clear_prefetch()
        del on_device, host, plain
    return rows


# --------------------------------------------------------------------------------------------------
# report
# --------------------------------------------------------------------------------------------------


def _rows(case: str, ms: dict[str, float], moved: int, args, device, err: float) -> list[dict]:
    src = torch.empty(moved // 2, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    copy_ms = side_by_side({"copy": lambda: dst.copy_(src)}, args.rounds, device, graphs=False)["copy"]
    rows = [{"case": case, "impl": "copy", "ms": copy_ms, "GB/s": moved / copy_ms / 1e6}]
    for name, t in ms.items():
        rows.append({"case": case, "impl": name, "ms": t, "GB/s": moved / t / 1e6, "x copy": copy_ms / t,
                     "x eager": ms["eager"] / t, "max|tokenpos - fp32 formula|": err})
    return rows


TARGETS = [(case, impl + kind, ref, target)
           for kind in ("", ", graph")
           for case, impl, ref, target in (("rope fwd", "tokenpos layer", "copy", 0.85),
                                           ("rope fwd", "tokenpos layer", "liger" + kind, 1.2),
                                           ("embedding fwd", "tokenpos layer", "copy", 0.8),
                                           ("embedding fwd", "tokenpos layer", "torch.compile", 1.2),
                                           ("embedding fwd", "tokenpos layer", "compile reduce-overhead", 1.2),
                                           ("rope fwd", "tokenpos", "copy", 0.85),
                                           ("embedding fwd", "tokenpos", "torch.compile", 1.2))]


def report(rows: list[dict]) -> str:
    lines = [f"{'case':<21} {'impl':<28} {'ms':>9} {'GB/s':>8} {'x copy':>7} {'x eager':>8}"]
    for r in rows:
        lines.append(f"{r['case']:<21} {r['impl']:<28} {r['ms']:9.4f} {r['GB/s']:8.1f} "
                     f"{r.get('x copy', 1.0):7.2f} {r.get('x eager', float('nan')):8.2f}")
    by = {(r["case"], r["impl"]): r["ms"] for r in rows}
    lines.append("")
    for case, impl, ref, target in TARGETS:
        if (case, ref) in by and (case, impl) in by:
            ratio = by[(case, ref)] / by[(case, impl)]
            lines.append(f"target {case}: {impl} >= {target}x {ref}: {ratio:.2f}x "
                         f"{'met' if ratio >= target else 'MISSED'}")
        else:
            lines.append(f"target {case}: {impl} vs {ref}: not measured ({ref} unavailable)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="quarter lengths")
    ap.add_argument("--rounds", type=int, default=None, help="timed rounds per impl (default 30, smoke 2)")
    ap.add_argument("--json", default=None, help="also write the rows as JSON here")
    ap.add_argument("--cases", default=None,
                    help="comma-separated cases: rope, embedding, tied, host_table (default: the first three; "
                         "--smoke: all four)")
    ap.add_argument("--smoke", action="store_true",
                    help="CPU + Triton interpreter, tiny shapes: checks that every impl runs and agrees; "
                         "prints no timings")
    args = ap.parse_args(argv)
    args.rounds = args.rounds or (2 if args.smoke else 30)
    if args.smoke:
        os.environ.setdefault("TRITON_INTERPRET", "1")
        device = torch.device("cpu")
    elif not torch.cuda.is_available():
        print("gpu_bench: no CUDA device (torch.cuda.is_available() is False); nothing was measured. "
              "Run it on a machine with an NVIDIA GPU and `pip install -e .[gpu]` (plus liger-kernel to "
              "include Liger's RoPE).", file=sys.stderr)
        return 2
    else:
        device = torch.device("cuda")
    try:
        import triton
    except ImportError:
        print("gpu_bench: triton is not installed (`pip install -e .[gpu]`).", file=sys.stderr)
        return 2
    json_path = Path(args.json) if args.json else None
    if json_path is not None and (json_path.is_dir() or not json_path.parent.is_dir()):   # before the run, not after
        print(f"gpu_bench: --json {args.json}: not a file in an existing directory; nothing was measured.",
              file=sys.stderr)
        return 2
    if not args.smoke:
        header = (f"device: {torch.cuda.get_device_name(device)}; torch {torch.__version__}; triton "
                  f"{triton.__version__}; {args.rounds} rounds, median; {'quick' if args.quick else 'full'} workload")
        print(header, flush=True)
    rows = []
    cases = {"rope": rope_case, "embedding": embedding_case, "tied": tied_loss_case, "host_table": host_table_case}
    args.cases = args.cases or ",".join(list(cases)[:len(cases) if args.smoke else 3])
    unknown = sorted(set(args.cases.split(",")) - set(cases))
    if unknown:
        print(f"gpu_bench: --cases {args.cases}: unknown {unknown}; expected names from {sorted(cases)}",
              file=sys.stderr)
        return 2
    for case in (cases[c] for c in args.cases.split(",")):
        got = case(args, device, torch.bfloat16)
        if not args.smoke:                                                    # as it goes: a cut-off run keeps them
            print("\n".join(report(got).splitlines()[1:len(got) + 1]), flush=True)
        rows += got
    if args.smoke:
        report(rows)                                                          # formatting runs, output dropped
        worst = max(r["max|tokenpos - fp32 formula|"] for r in rows if "x copy" in r)
        print(f"gpu_bench smoke: {len(rows)} rows ran on the CPU interpreter; max |tokenpos - fp32 formula| = "
              f"{worst:.3g} (timings not meaningful, not printed)")
        return 0 if worst < 0.1 else 1
    print(report(rows))
    if json_path is not None:
        json_path.write_text(json.dumps({"header": header, "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
