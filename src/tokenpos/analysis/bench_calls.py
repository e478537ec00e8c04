"""The ``calls`` case of ``tokenpos bench``: a call's host cost as the CPU time of the calling thread (issue 47).

At decode sizes a call's data is a few KB and its cost is host work: Python, checks, dispatch, output
allocation. Wall time measures that badly on a shared machine (another process's turn on the core
lands inside the timed call); ``time.thread_time()``, the calling thread's own CPU time, leaves other
processes out, so it is stable where wall time is not. Each row times one tokenpos call against the
torch (or Hugging Face) way of computing the same thing, alternately in one process:

- per row: a warm-up (:data:`WARMUP` calls of each), then ``n`` calls per block, ``n`` chosen so the
  slower side's block takes about ``calls_block_ms`` of CPU time (the same ``n`` for both); ``rounds``
  rounds of one block of each, tokenpos first in even rounds and the reference first in odd ones;
  the garbage collector is off inside a block (as ``timeit`` does).
- torch's intra-op threads and numba's threads are set to 1 for the case (restored after): the calling
  thread then does all of a call's work, so its CPU time is the call's whole CPU cost (a parallel
  region would move work to other threads, where this clock does not see it, and add spin-waits at
  its barriers, which other processes lengthen).
- numbers (:class:`~.bench_timing.HostTime`): each side's median and best microseconds per call; the
  ratio tokenpos / reference (< 1: tokenpos costs less) as the median of the per-round ratios with a
  95 % bootstrap interval (:func:`~.bench_timing.paired_ratio`), and best / best; and what one tokenpos
  call runs of tokenpos's code (:func:`~.calls.trace_call`: functions entered, distinct lines executed,
  lines of the functions' source).

Rows (torch, float32; shapes from :data:`SHAPES`; B batch, L length, V vocab, D model dim, P positions,
H / Hk query / key heads, Dh head dim, N tokens):

- ``TransformerEmbedding(V, D, P, positional="learned")(ids, start_pos=7)``, ids (B, 1), eval, no grad,
  against ``nn.Embedding(V, D)(ids) + nn.Embedding(P, D)(pos)``, pos = ``tensor([7])``.
- ``TokenEmbedding(V, D)(ids)``, ids (B, 1), eval, no grad, against ``nn.Embedding(V, D)(ids)``.
- ``RotaryEmbedding(Dh, max_seq_len=4096).apply(q, k, start_pos=7)``, q (B, H, 1, Dh), k (B, Hk, 1, Dh), no
  grad, against HF Llama's ``apply_rotary_pos_emb(q, k, cos, sin)`` with cos / sin (B, 1, Dh) computed once
  outside the loop (the rotation alone), and against ``apply_rotary_pos_emb(q, k, *LlamaRotaryEmbedding(cfg)(q,
  position_ids))`` (the tables and the rotation, as a Llama layer stack computes them per step).
- ``TransformerEmbedding(..., dropout=0.1)`` in training mode, ids (B, 16), autograd on, forward only (the
  graph is built, then dropped with the output), against ``nn.Embedding`` + ``nn.Embedding`` + add +
  ``nn.Dropout(0.1)``.
- ``tied_cross_entropy(h, W, targets)``, h (N=8, D_loss), W (V_loss, D_loss), forward only under no grad (an
  evaluation loss: a training step's backward adds the (V, D) weight gradient's arithmetic and memory traffic,
  not host work), against ``F.cross_entropy(F.linear(h, W), targets)``.
- one decode step of a random HF ``LlamaForCausalLM`` (hidden 256, 4 layers, 8 heads, 2 KV heads, vocab
  32000; one sequence, one token after an 8-token prompt, KV cache), patched with
  ``tokenpos.torch.hf.patch`` against an unpatched deep copy of it. Each block's calls grow that model's
  cache by ``n`` tokens; after each block it is cropped back to the prompt (untimed), so both sides run
  every step at the same cache lengths.

A row whose setup or first call fails (transformers not installed, an API that moved) becomes a note
row ("skipped: ..."), as the other cases' public layers do. Returns rows, never prints.
"""

from __future__ import annotations

import copy
import gc
import inspect
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np

from tokenpos.analysis.bench_timing import BenchRow, HostTime, note_rows, paired_ratio
from tokenpos.analysis.calls import trace_call

CASE = "calls"
WARMUP = 3            # untimed calls of each side before the calibration
MAX_CALLS = 10_000    # calls per block at most (a call under a microsecond would ask for more)
# the issue's workload: GPT-2's tables, a Llama-7B-sized decode step's q and k, a small tied loss, a tiny Llama
SHAPES = dict(V=50257, D=768, P=1024, B=4, start_pos=7, H=32, Hk=8, Dh=128, rope_len=4096, train_L=16,
              loss_N=8, loss_V=32000, loss_D=256, lm_hidden=256, lm_intermediate=688, lm_layers=4, lm_heads=8,
              lm_kv_heads=2, lm_vocab=32000, prompt=8)


@dataclass
class CallPair:
    """One row: a tokenpos call and its reference, each a function of no arguments.

    grad: autograd on around the calls (off: inference, as a model's forward under one ``torch.no_grad()``).
    reset: run, untimed, after every block and after the trace (e.g. crop a KV cache the calls grew).
    """

    name: str
    reference: str
    tokenpos: Callable[[], Any]
    ref: Callable[[], Any]
    grad: bool = False
    reset: Callable[[], Any] | None = None


# ----------------------------------------------------------------------------------------------
# the rows
# ----------------------------------------------------------------------------------------------


def _ids(V: int, shape: tuple[int, ...]) -> Any:
    import torch

    return torch.from_numpy(np.random.default_rng(0).integers(0, V, shape))


def embedding_pair(s: dict) -> CallPair:
    """TransformerEmbedding (learned positions), ids (B, 1) at start_pos, eval, vs two nn.Embedding and an add."""
    import torch

    from tokenpos.torch import TransformerEmbedding

    V, D, P, B, sp = s["V"], s["D"], s["P"], s["B"], s["start_pos"]
    layer = TransformerEmbedding(V, D, P, positional="learned", seed=0).eval()
    tok, pos_emb = torch.nn.Embedding(V, D), torch.nn.Embedding(P, D)
    ids, pos = _ids(V, (B, 1)), torch.tensor([sp])
    return CallPair(f"TransformerEmbedding eval, ids ({B}, 1), start_pos={sp}",
                    "nn.Embedding(ids) + nn.Embedding(pos)",
                    lambda: layer(ids, start_pos=sp), lambda: tok(ids) + pos_emb(pos))


def token_pair(s: dict) -> CallPair:
    """TokenEmbedding, ids (B, 1), eval, vs nn.Embedding."""
    import torch

    from tokenpos.torch import TokenEmbedding

    V, D, B = s["V"], s["D"], s["B"]
    layer = TokenEmbedding(V, D, seed=0).eval()
    ref = torch.nn.Embedding(V, D)
    ids = _ids(V, (B, 1))
    return CallPair(f"TokenEmbedding eval, ids ({B}, 1)", "nn.Embedding(ids)", lambda: layer(ids), lambda: ref(ids))


def _llama_rotary(s: dict) -> tuple[Any, Any, Any, Any, Any]:
    """(tokenpos RotaryEmbedding, HF's LlamaRotaryEmbedding, apply_rotary_pos_emb, q (B, H, 1, Dh),
    k (B, Hk, 1, Dh))."""
    import torch
    import transformers
    from transformers.models.llama import modeling_llama

    from tokenpos.torch import RotaryEmbedding

    B, H, Hk, Dh, L = s["B"], s["H"], s["Hk"], s["Dh"], s["rope_len"]
    cfg = transformers.LlamaConfig(hidden_size=H * Dh, num_attention_heads=H, num_key_value_heads=Hk,
                                   max_position_embeddings=L)
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(B, H, 1, Dh, generator=g), torch.randn(B, Hk, 1, Dh, generator=g)
    return (RotaryEmbedding(Dh, max_seq_len=L), modeling_llama.LlamaRotaryEmbedding(cfg),
            modeling_llama.apply_rotary_pos_emb, q, k)


def rope_pair(s: dict) -> CallPair:
    """RotaryEmbedding.apply at start_pos vs HF's apply_rotary_pos_emb with cos / sin (B, 1, Dh) given."""
    import torch

    rope, hf_rotary, apply, q, k = _llama_rotary(s)
    sp = s["start_pos"]
    cos, sin = hf_rotary(q, torch.full((q.shape[0], 1), sp))            # once, outside the loop
    return CallPair(f"RotaryEmbedding.apply, q {tuple(q.shape)}, k {tuple(k.shape)}, start_pos={sp}",
                    "HF apply_rotary_pos_emb (cos, sin given)",
                    lambda: rope.apply(q, k, start_pos=sp), lambda: apply(q, k, cos, sin))


def rope_tables_pair(s: dict) -> CallPair:
    """The same call vs HF's rotary module (cos / sin of the positions) and apply_rotary_pos_emb, per call."""
    import torch

    rope, hf_rotary, apply, q, k = _llama_rotary(s)
    sp = s["start_pos"]
    position_ids = torch.full((q.shape[0], 1), sp)
    return CallPair(f"RotaryEmbedding.apply, q {tuple(q.shape)}, k {tuple(k.shape)}, start_pos={sp}",
                    "HF LlamaRotaryEmbedding + apply_rotary_pos_emb",
                    lambda: rope.apply(q, k, start_pos=sp), lambda: apply(q, k, *hf_rotary(q, position_ids)))


def training_pair(s: dict) -> CallPair:
    """TransformerEmbedding with dropout 0.1 in training mode, ids (B, train_L), autograd on, forward only."""
    import torch

    from tokenpos.torch import TransformerEmbedding

    V, D, P, B, L = s["V"], s["D"], s["P"], s["B"], s["train_L"]
    layer = TransformerEmbedding(V, D, P, positional="learned", dropout=0.1, seed=0).train()
    tok, pos_emb, drop = torch.nn.Embedding(V, D), torch.nn.Embedding(P, D), torch.nn.Dropout(0.1).train()
    ids, pos = _ids(V, (B, L)), torch.arange(L)
    return CallPair(f"TransformerEmbedding train, dropout 0.1, ids ({B}, {L}), autograd on",
                    "nn.Embedding + nn.Embedding + add + nn.Dropout",
                    lambda: layer(ids), lambda: drop(tok(ids) + pos_emb(pos)), grad=True)


def tied_loss_pair(s: dict) -> CallPair:
    """tied_cross_entropy(h (N, D), W (V, D), targets (N,)) vs F.cross_entropy(F.linear(h, W), targets), no grad."""
    import torch
    import torch.nn.functional as F

    from tokenpos.torch import tied_cross_entropy

    N, V, D = s["loss_N"], s["loss_V"], s["loss_D"]
    g = torch.Generator().manual_seed(0)
    h, w = torch.randn(N, D, generator=g), torch.randn(V, D, generator=g) * 0.02
    targets = torch.randint(0, V, (N,), generator=g)
    return CallPair(f"tied_cross_entropy, h ({N}, {D}), W ({V}, {D}), forward", "F.cross_entropy(F.linear(h, W))",
                    lambda: tied_cross_entropy(h, w, targets), lambda: F.cross_entropy(F.linear(h, w), targets))


def decode_pair(s: dict) -> CallPair:
    """One decode step (one sequence, one token, KV cache) of a tiny random Llama, patched vs unpatched."""
    import torch
    import transformers

    from tokenpos.torch.hf import patch

    sdpa: dict[str, Any] = {"attn_implementation": "sdpa"}      # (not in LlamaConfig's typed signature)
    cfg = transformers.LlamaConfig(vocab_size=s["lm_vocab"], hidden_size=s["lm_hidden"],
                                   intermediate_size=s["lm_intermediate"], num_hidden_layers=s["lm_layers"],
                                   num_attention_heads=s["lm_heads"], num_key_value_heads=s["lm_kv_heads"],
                                   max_position_embeddings=512, **sdpa)
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = transformers.LlamaForCausalLM(cfg).eval()
    # two copies, made alike: a copy's fresh memory runs a few percent faster than the original's in an A/A
    # test (0.97-0.98x on the 2-vCPU host), which would count for whichever side was the copy
    hf_model, tp_model = copy.deepcopy(model), copy.deepcopy(model)
    del model
    patch(tp_model)
    # transformers 5.24 renamed the KV cache argument and output to ``cache`` (``past_key_values`` before)
    name = "cache" if "cache" in inspect.signature(hf_model.forward).parameters else "past_key_values"
    prompt, n = _ids(s["lm_vocab"], (1, s["prompt"])), s["prompt"]
    token = _ids(s["lm_vocab"], (1, 1))
    with torch.no_grad():
        caches = [m(prompt, use_cache=True)[name] for m in (tp_model, hf_model)]

    def reset() -> None:
        for cache in caches:
            extra = cache.get_seq_length() - n
            if extra > 0:
                cache.crop(-extra)            # a negative count removes that many tokens (every version)

    def step(model: Any, cache: Any) -> Callable[[], Any]:
        return lambda: model(input_ids=token, use_cache=True, **{name: cache})

    return CallPair(f"patched Llama decode step (hidden {s['lm_hidden']}, {s['lm_layers']} layers, vocab "
                    f"{s['lm_vocab']}, KV cache)", "the same model unpatched",
                    step(tp_model, caches[0]), step(hf_model, caches[1]), reset=reset)


PAIRS: tuple[Callable[[dict], CallPair], ...] = (embedding_pair, token_pair, rope_pair, rope_tables_pair,
                                                 training_pair, tied_loss_pair, decode_pair)
# the row names of a pair that cannot even be built (its note row), in PAIRS's order
LABELS = ("TransformerEmbedding eval, decode", "TokenEmbedding eval, decode", "RotaryEmbedding.apply vs HF apply",
          "RotaryEmbedding.apply vs HF rotary module + apply", "TransformerEmbedding train, dropout 0.1",
          "tied_cross_entropy, N=8", "patched Llama decode step")


# ----------------------------------------------------------------------------------------------
# timing
# ----------------------------------------------------------------------------------------------


@contextmanager
def one_thread() -> Iterator[None]:
    """torch's intra-op threads and numba's threads set to 1 inside, restored after (numba first: its first
    launch may set the calling thread's OpenMP count, which torch reads)."""
    import numba
    import torch

    threads, numba_threads = torch.get_num_threads(), numba.get_num_threads()
    numba.set_num_threads(1)
    torch.set_num_threads(1)
    try:
        yield
    finally:
        numba.set_num_threads(numba_threads)
        torch.set_num_threads(threads)


def _block(fn: Callable[[], Any], calls: int) -> float:
    """CPU seconds of the calling thread per call, over ``calls`` calls in a row (garbage collector off)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        t0 = time.thread_time()
        for _ in range(calls):
            fn()
        return (time.thread_time() - t0) / calls
    finally:
        if enabled:
            gc.enable()


def calls_per_block(pair: CallPair, block_seconds: float) -> int:
    """Calls per block: the slower side's block takes about ``block_seconds`` (1 to :data:`MAX_CALLS`)."""
    slow = 0.0
    for fn in (pair.tokenpos, pair.ref):
        for _ in range(3):
            slow = max(slow, _block(fn, 1))
            if pair.reset is not None:
                pair.reset()
    return int(min(MAX_CALLS, max(1, round(block_seconds / max(slow, 1e-9)))))


def time_pair(pair: CallPair, rounds: int, calls: int) -> tuple[list[float], list[float]]:
    """(tokenpos, reference) seconds per call in each round: one block of ``calls`` calls of each per round,
    tokenpos first in even rounds, the reference first in odd ones; ``pair.reset`` after every block."""
    tp: list[float] = []
    ref: list[float] = []
    sides = ((pair.tokenpos, tp), (pair.ref, ref))
    for r in range(rounds):
        for fn, out in (sides if r % 2 == 0 else sides[::-1]):
            out.append(_block(fn, calls))
            if pair.reset is not None:
                pair.reset()
    return tp, ref


def host_row(pair: CallPair, tp: list[float], ref: list[float], calls: int, trace: Any) -> BenchRow:
    """The row of a timed pair: ``seconds`` / ``median_seconds`` are tokenpos's best / median per call;
    ``ratio_vs_reference`` keeps the house convention (reference / tokenpos, best), ``host`` the issue's
    numbers (tokenpos / reference)."""
    ratio, low, high = paired_ratio(tp, ref)             # median of tp[i] / ref[i]: < 1, tokenpos cheaper
    host = HostTime(pair.reference, float(np.median(tp)), float(np.median(ref)), min(tp), min(ref), ratio, low,
                    high, min(tp) / min(ref), len(tp), calls, trace)
    note = (f"thread CPU time, {len(tp)} rounds x {calls} calls; vs {pair.reference}: median "
            f"{host.reference_seconds * 1e6:.1f} us, x {ratio:.2f} [{low:.2f}, {high:.2f}]"
            + ("" if trace is None else f"; {len(trace.functions)} tokenpos functions, {trace.lines} lines"))
    return BenchRow(CASE, pair.name, host.best_seconds, float("nan"), None, min(ref) / min(tp), note,
                    host.seconds, median_ratios={"eager": host.reference_seconds / host.seconds}, host=host)


def measure(pair: CallPair, rounds: int, block_seconds: float, trace: bool = True) -> BenchRow:
    """Warm up, calibrate, time and trace one pair (inside :func:`one_thread` and the pair's grad mode)."""
    import torch

    with torch.set_grad_enabled(pair.grad):
        for _ in range(WARMUP):
            for fn in (pair.tokenpos, pair.ref):
                fn()
                if pair.reset is not None:
                    pair.reset()
        calls = calls_per_block(pair, block_seconds)
        tp, ref = time_pair(pair, rounds, calls)
        traced = trace_call(pair.tokenpos) if trace else None
        if pair.reset is not None:
            pair.reset()
    return host_row(pair, tp, ref, calls, traced)


def calls_case(cfg: dict, shapes: dict | None = None) -> list[BenchRow]:
    """The case's rows, one per pair of :data:`PAIRS` (a note row for a pair that cannot run).

    ``cfg``: ``calls_rounds`` (rounds per row) and ``calls_block_ms`` (CPU milliseconds per block);
    ``shapes``: :data:`SHAPES` (default) or smaller ones (tests).
    """
    s = SHAPES if shapes is None else shapes
    rows: list[BenchRow] = []
    with one_thread():
        for make, label in zip(PAIRS, LABELS, strict=True):
            rows += _row(make, label, s, cfg)
            gc.collect()                                     # the row's tables, before the next row's
    return rows


def _row(make: Callable[[dict], CallPair], label: str, s: dict, cfg: dict) -> list[BenchRow]:
    try:
        return [measure(make(s), cfg["calls_rounds"], cfg["calls_block_ms"] / 1e3)]
    except Exception as exc:  # noqa: BLE001 - reported in the row note
        return note_rows(CASE, {label: f"skipped: {type(exc).__name__}: {exc}"[:160]})
