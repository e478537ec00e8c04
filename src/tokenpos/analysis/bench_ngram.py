"""The hashed n-gram lookup's bench (Engram): the fused CPU lookup against the reference's two steps and the
random-gather limit, in model conditions.

Shapes: B batch, L length, T = B * L tokens, K = (max_ngram_size - 1) * n_head_per_ngram hash heads, Dh the row
width, R table rows (the sum of the heads' primes), E = K * Dh.

Rows, timed interleaved in one process (:func:`.bench_timing.time_interleaved`, each call right after a torch
matmul of the output width E, :func:`.bench_timing.model_op`):

- the limit: a gather of the same T * K rows (the lookup's own addresses, hashed once beforehand) with no
  hashing, the faster of ``torch.index_select(W, 0, rows, out=)`` and a plain parallel numba gather
  (``bench_cases.gather_rows``): what moving those rows costs, whatever computes their addresses;
- the reference: deepseek-ai/Engram ``engram_demo_v1.py``'s two steps, its NumPy hashing (``CompressedTokenizer``
  lookup, ``np.pad`` shifts, XOR of products, one modulo per head: :func:`reference_hash`, transcribed) and
  ``MultiHeadEmbedding``'s ``nn.Embedding`` gather of ids plus offsets (:data:`REFERENCE`);
- tokenpos: the fused kernel with ``out=`` (hash and gather in one pass), and the public layers of both backends
  as a user calls them (forward, eval mode, no grad: ids checked, a fresh output each call), so that what the layer
  adds to the kernel is measured next to it. The torch layer reaches the kernel without the custom-op dispatcher
  (``ops.ngram.ngram_lookup``); through the dispatcher its host work per call was about 70 us against 40 us now
  (eager, no grad, a (1, 8) call on the 2-core guest, warm caches; 116 against 54 us with grad).

Same work in every row: the same table (the torch layer's, huge pages advised; the NumPy layer shares it), the
same T * K rows of Dh float32, each preallocated output allocated alike (NumPy's, huge pages advised from 4 MiB as
for the kernel's ``out=``; the limits once wrote ``torch.empty`` outputs of 4 KiB pages). The table at the defaults
is 512 MiB (:func:`table_bytes`), beyond the L3 of the guests measured (300 MiB reported, shared); there the plain
serial gather of B = 8, L = 2048 took 10.9, 11.1 and 11.5 ms (best of 30-40, thread time, a loaded 2-core Xeon
guest) from tables of 128 MiB, 512 MiB and 2 GiB: the rows come from memory, not the cache, at every such size.

Acceptance (issue 51): the fused lookup at >= 0.8x the limit and >= 3x the reference. The settings default to the
reference's (max_ngram_size 3, 8 heads per n, 512 per n: Dh = 64, E = 1024) with a smaller table
(``engram_vocab_size`` per n: ``V``) so that it fits next to a model on a small machine.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from tokenpos.analysis.bench_cases import numba_gather
from tokenpos.analysis.bench_timing import (
    GATHER,
    GATHER_NUMBA,
    KERNEL,
    NBATCH,
    BenchRow,
    add_impl,
    bench_rows,
    cycle,
    model_op,
    note_rows,
    time_interleaved,
)

CASE = "ngram"
REFERENCE = "reference: NumPy hash + nn.Embedding gather (engram_demo_v1.py)"
LIMITS = (GATHER, GATHER_NUMBA)
DEFAULT = {"V": 1 << 17, "B": 4, "L": 1024, "max_ngram_size": 3, "n_head_per_ngram": 8, "n_embed_per_ngram": 512,
           "old_vocab": 129280, "reps": 30}


def reference_hash(ids: np.ndarray, lookup: np.ndarray, pad_id: int, multipliers: np.ndarray,
                   head_primes: list[list[int]]) -> np.ndarray:
    """The reference's hashing of one layer (``NgramHashMapping.hash`` for that layer: ``CompressedTokenizer``'s
    lookup, then ``_get_ngram_hashes``), transcribed: ids (B, T) -> (B, T, K) int64."""
    arr = np.asarray(ids, dtype=np.int64)
    pos_mask = arr >= 0
    x = arr.copy()
    x[pos_mask] = lookup[arr[pos_mask]]
    pad = int(lookup[pad_id])
    B, T = x.shape
    n_max = len(multipliers)

    def shift_k(k: int) -> np.ndarray:
        if k == 0:
            return x
        return np.pad(x, ((0, 0), (k, 0)), mode="constant", constant_values=pad)[:, :T]

    base_shifts = [shift_k(k) for k in range(n_max)]
    all_hashes = []
    for n in range(2, n_max + 1):
        tokens = base_shifts[:n]
        mix = tokens[0] * multipliers[0]
        for k in range(1, n):
            mix = np.bitwise_xor(mix, tokens[k] * multipliers[k])
        for mod in head_primes[n - 2]:
            all_hashes.append((mix % int(mod)).astype(np.int64, copy=False))
    return np.stack(all_hashes, axis=2)


def table_bytes(cfg: dict[str, Any] | None = None) -> int:
    """Bytes of the float32 table :func:`ngram_case` gathers from for ``cfg``: R rows (the sum of layer 1's head
    primes) of Dh."""
    from tokenpos.tables.formulas.ngram_hash import head_primes

    c = {**DEFAULT, **(cfg or {})}
    n_max, H = c["max_ngram_size"], c["n_head_per_ngram"]
    primes = head_primes([c["V"]] * (n_max - 1), n_max, H, [1, 15], 1)
    return int(primes.sum()) * (c["n_embed_per_ngram"] // H) * 4


def ngram_case(cfg: dict[str, Any] | None = None, reps: int | None = None) -> list[BenchRow]:
    """The rows of the module doc for ``cfg`` (keys of :data:`DEFAULT`; missing ones take its values)."""
    import torch

    import tokenpos.numpy as tpn
    import tokenpos.torch as tpt
    from tokenpos.kernels import ngram as kernel
    from tokenpos.tables.formulas.ngram_hash import ngram_primes
    from tokenpos.torch.ops._dispatch import np_view

    c = {**DEFAULT, **(cfg or {})}
    reps = int(c["reps"] if reps is None else reps)
    n_max, H, E1, B, L = c["max_ngram_size"], c["n_head_per_ngram"], c["n_embed_per_ngram"], c["B"], c["L"]
    rng = np.random.default_rng(0)
    lookup = np.unique(rng.integers(0, c["old_vocab"] * 3 // 4, c["old_vocab"]), return_inverse=True)[1]
    settings = dict(engram_vocab_size=[c["V"]] * (n_max - 1), max_ngram_size=n_max, n_embed_per_ngram=E1,
                    n_head_per_ngram=H, layer_id=1, layer_ids=[1, 15], pad_id=2, seed=0, compress=lookup)
    t_layer = tpt.HashedNgramEmbedding(**settings, dtype=torch.float32, init="zeros").eval()
    spec = t_layer.spec
    W = t_layer.weight.detach()
    with torch.no_grad():
        W.copy_(torch.from_numpy(rng.standard_normal(tuple(W.shape), dtype=np.float32)))
    w = np_view(W)
    np_layer = tpn.HashedNgramEmbedding(**settings, dtype=np.float32, init="zeros")
    np_layer.weight.data = w                                            # the same table (shared memory, no copy)
    primes = ngram_primes(settings["engram_vocab_size"], n_max, H, [1, 15])[1]
    offsets_t = torch.from_numpy(spec.offsets)
    batches = [rng.integers(0, c["old_vocab"], (B, L)) for _ in range(NBATCH)]
    tbatches = [torch.from_numpy(b) for b in batches]
    rows = [np.ascontiguousarray(t_layer.hash_rows(b).numpy().reshape(-1)) for b in tbatches]   # (T * K,)
    trows = [torch.from_numpy(r) for r in rows]
    K, Dh, T = spec.num_heads, spec.head_dim, B * L
    # every preallocated output the same way (NumPy's: huge pages advised from 4 MiB, as the kernel's out_k); a
    # torch.empty output gets 4 KiB pages (AnonHugePages unchanged after filling 128 MiB of it, on this guest)
    outs = [torch.from_numpy(np.empty((T * K, Dh), np.float32)) for _ in range(2)]
    ids_r, ids_g, ids_k, ids_n, ids_t = cycle(batches), cycle(trows), cycle(batches), cycle(batches), cycle(tbatches)
    out_k = np.empty((B, L, K * Dh), np.float32)

    def reference() -> torch.Tensor:
        h = torch.from_numpy(reference_hash(next(ids_r), lookup, 2, spec.multipliers, primes))   # (B, L, K)
        return torch.nn.functional.embedding(h + offsets_t, W).flatten(start_dim=-2)           # (B, L, E)

    impls: dict[str, Callable[[], Any]] = {
        GATHER: lambda: torch.index_select(W, 0, next(ids_g), out=outs[0]),
        GATHER_NUMBA: numba_gather(w, [r.reshape(1, -1) for r in rows], np_view(outs[1]).reshape(1, T * K, Dh)),
        REFERENCE: reference,
        KERNEL: lambda: kernel.ngram_forward(w, next(ids_k), spec.compress, spec.multipliers, spec.primes,
                                             spec.offsets, spec.pad, out_k),
    }
    notes: dict[str, str] = {}
    add_impl(impls, notes, "tokenpos numpy (public layer)", lambda: lambda: np_layer(next(ids_n)))
    add_impl(impls, notes, "tokenpos torch (public layer)", lambda: lambda: t_layer(next(ids_t)))
    grad = torch.is_grad_enabled()
    torch.set_grad_enabled(False)
    try:
        times = time_interleaved(impls, reps, model_op(K * Dh))
    finally:
        torch.set_grad_enabled(grad)
    return (bench_rows(CASE, times, 2 * T * K * Dh * 4, notes=notes, limit=LIMITS, eager=REFERENCE)
            + note_rows(CASE, notes))
