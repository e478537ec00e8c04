"""Hashed n-gram ids (Engram, arXiv 2601.07372): the reference code's ``NgramHashMapping``, as pure functions.

Shapes: B batch, L length, T packed tokens, S documents (segments), C context ids (at most n_max - 1),
n_max = max_ngram_size, H = n_head_per_ngram, K = (n_max - 1) * H hash heads (all heads of n = 2 first, then
n = 3, ...).

The reference (deepseek-ai/Engram ``engram_demo_v1.py``, Apache-2.0) maps token ids to compressed ids through a
lookup table built from a tokenizer (``compress`` here: the old-to-new id array, its values in [0, Vc)), then for
each n = 2..n_max mixes the last n compressed ids of every token,

    mix_n = (c[t] * m[0]) ^ (c[t-1] * m[1]) ^ ... ^ (c[t-n+1] * m[n-1])        (int64, wrapping as NumPy does)

where ``c[t-k]`` before the sequence start is the compressed pad id, and takes ``mix_n % p`` for each head's prime
``p``. The multipliers ``m`` are odd, drawn per layer from ``np.random.default_rng(seed + 10007 * layer_id)``
below ``(int64 max // Vc) // 2``; the primes are distinct across every head of every layer in ``layer_ids``,
each found by searching upward from the n-gram's table size (``engram_vocab_size[n - 2]``), in the reference's
order (layers, then n, then heads). With compressed ids in [0, Vc) every product stays below 2**63, so no value
wraps; the arithmetic is still the reference's int64 (the kernel's too).

Packed rows (``cu_seqlens``) treat each document as its own sequence: an n-gram never reaches into the previous
document (it sees the pad id there, as the document alone would). ``context`` (S, C) gives, per sequence, the C
ids right before it (decoding: the last n_max - 1 ids of the previous steps); positions before those are pad.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from tokenpos.tables.checks.packing import check_cu_seqlens
from tokenpos.tables.checks.validation import check_int, check_positive_int, check_token_ids
from tokenpos.tables.errors import ConfigError

PRIME_1 = 10007
"""The reference's per-layer seed stride: layer ``i`` draws its multipliers from ``seed + 10007 * i``."""

_MR_BASES = (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37)   # deterministic Miller-Rabin below 3.3e24


def is_prime(n: int) -> bool:
    """Whether the integer ``n`` is prime (deterministic Miller-Rabin; exact for every n < 3.3e24)."""
    if n < 2:
        return False
    for p in _MR_BASES:
        if n % p == 0:
            return n == p
    d, s = n - 1, 0
    while d % 2 == 0:
        d, s = d // 2, s + 1
    for a in _MR_BASES:
        x = pow(a, d, n)
        if x in (1, n - 1):
            continue
        for _ in range(s - 1):
            x = x * x % n
            if x == n - 1:
                break
        else:
            return False
    return True


def next_prime(start: int, seen: set[int]) -> int:
    """The smallest prime > ``start`` not in ``seen`` (the reference's ``find_next_prime``)."""
    candidate = start + 1
    while not (is_prime(candidate) and candidate not in seen):
        candidate += 1
    return candidate


def check_ngram_settings(engram_vocab_size: Any, max_ngram_size: Any, n_head_per_ngram: Any,
                         layer_ids: Any) -> tuple[tuple[int, ...], int, int, tuple[int, ...]]:
    """The hash settings, checked: (table sizes per n, n_max >= 2, H >= 1, layer ids as ints, distinct)."""
    n_max = check_int("max_ngram_size", max_ngram_size, minimum=2)
    heads = check_positive_int("n_head_per_ngram", n_head_per_ngram)
    sizes = tuple(engram_vocab_size) if isinstance(engram_vocab_size, (list, tuple)) else None
    if sizes is None or len(sizes) < n_max - 1:
        raise ConfigError(f"engram_vocab_size must be a list of at least max_ngram_size - 1 = {n_max - 1} table "
                          f"sizes (one per n = 2..{n_max}), got {engram_vocab_size!r}")
    sizes = tuple(check_positive_int(f"engram_vocab_size[{i}]", v) for i, v in enumerate(sizes))
    if not isinstance(layer_ids, (list, tuple)) or not layer_ids:
        raise ConfigError(f"layer_ids must be a non-empty list of layer indices, got {layer_ids!r}")
    layers = tuple(check_int(f"layer_ids[{i}]", v, minimum=0) for i, v in enumerate(layer_ids))
    if len(set(layers)) != len(layers):
        raise ConfigError(f"layer_ids must be distinct, got {list(layers)}")
    return sizes, n_max, heads, layers


def ngram_primes(engram_vocab_size: Any, max_ngram_size: int, n_head_per_ngram: int,
                 layer_ids: Any) -> dict[int, list[list[int]]]:
    """``{layer_id: [[prime per head] per n = 2..n_max]}``: the reference's ``vocab_size_across_layers``.

    Distinct over every head of every layer: a layer's primes depend on the layers listed before it.
    """
    sizes, n_max, heads, layers = check_ngram_settings(engram_vocab_size, max_ngram_size, n_head_per_ngram,
                                                       layer_ids)
    seen: set[int] = set()
    out: dict[int, list[list[int]]] = {}
    for layer in layers:
        per_n = []
        for n in range(2, n_max + 1):
            start, found = sizes[n - 2] - 1, []
            for _ in range(heads):
                p = next_prime(start, seen)
                seen.add(p)
                found.append(p)
                start = p
            per_n.append(found)
        out[layer] = per_n
    return out


def head_primes(engram_vocab_size: Any, max_ngram_size: int, n_head_per_ngram: int, layer_ids: Any,
                layer_id: int) -> np.ndarray:
    """(K,) int64: the primes of ``layer_id``'s K hash heads in output order (n = 2's heads first)."""
    primes = ngram_primes(engram_vocab_size, max_ngram_size, n_head_per_ngram, layer_ids)
    if layer_id not in primes:
        raise ConfigError(f"layer_id {layer_id!r} is not in layer_ids {list(primes)}; expected one of them")
    return np.array([p for per_n in primes[layer_id] for p in per_n], np.int64)


def head_offsets(primes: np.ndarray) -> np.ndarray:
    """(K,) int64: each head's first row in the one table (``MultiHeadEmbedding``'s offsets)."""
    primes = np.asarray(primes, np.int64)
    return np.concatenate([np.zeros(1, np.int64), np.cumsum(primes[:-1])]).astype(np.int64)


def layer_multipliers(compressed_vocab_size: int, max_ngram_size: int, layer_id: int, seed: int) -> np.ndarray:
    """(n_max,) int64 odd multipliers of one layer, as the reference draws them.

    ``compressed_vocab_size``: Vc, the number of compressed ids (the reference's ``len(CompressedTokenizer)``).
    """
    vc = check_positive_int("compressed_vocab_size", compressed_vocab_size)
    n_max = check_int("max_ngram_size", max_ngram_size, minimum=2)
    m_max = int(np.iinfo(np.int64).max // vc)
    half_bound = max(1, m_max // 2)
    g = np.random.default_rng(int(seed + PRIME_1 * int(layer_id)))
    r = g.integers(low=0, high=half_bound, size=(n_max,), dtype=np.int64)
    return (r * 2 + 1).astype(np.int64)


def check_compress(compress: Any) -> np.ndarray:
    """The old-to-new id array as (V,) int64 with values in [0, ...); refused if empty, not integer or negative."""
    arr = np.asarray(compress)
    if arr.ndim != 1 or arr.size == 0 or not np.issubdtype(arr.dtype, np.integer):
        raise ConfigError(f"compress must be a non-empty 1-D integer array (old id -> compressed id), got "
                          f"{arr.dtype} of shape {arr.shape}")
    if int(arr.min()) < 0:
        raise ConfigError(f"compress must map every id to a compressed id >= 0, got {int(arr.min())} at "
                          f"{int(np.argmin(arr))}")
    return np.array(arr, dtype=np.int64, copy=True)                 # a private copy (frozen by ngram_spec)


def lagged(comp: np.ndarray, cu_seqlens: np.ndarray, context: np.ndarray | None, pad: int, k: int) -> np.ndarray:
    """(T,) the compressed id k tokens back from each packed token: inside its document, else the document's
    context (its last C ids, right-aligned), else ``pad``. comp (T,) compressed ids, context (S, C) compressed."""
    T = comp.shape[0]
    if k == 0:
        return comp
    seg = np.searchsorted(cu_seqlens, np.arange(T), side="right") - 1       # (T,) document of each token
    inside = np.arange(T) - cu_seqlens[seg]                                   # (T,) index within the document
    out = np.full(T, pad, np.int64)
    here = k <= inside
    out[here] = comp[np.arange(T)[here] - k]
    if context is not None and context.shape[1]:
        back = k - inside                                                     # 1 = the id right before
        C = context.shape[1]
        use = ~here & (back <= C)
        out[use] = context[seg[use], C - back[use]]
    return out


def ngram_hash_ids(comp_ids: Any, multipliers: Any, primes: Any, pad: int, *, cu_seqlens: Any = None,
                   context: Any = None) -> np.ndarray:
    """Compressed ids (B, L) -> (B, L, K) hash ids (each in [0, its head's prime)); packed (T,) with
    ``cu_seqlens`` (S + 1,) -> (T, K).

    Args:
        comp_ids: compressed ids (already mapped through ``compress``), in [0, Vc).
        multipliers: (n_max,) int64 (:func:`layer_multipliers`).
        primes: (K,) heads' primes, K = (n_max - 1) * H (:func:`head_primes`).
        pad: the compressed pad id.
        cu_seqlens: packed documents' boundaries (``(T,)`` ids only).
        context: (B, C) / (S, C) compressed ids right before each sequence (C <= n_max - 1), or None.
    The reference's ``NgramHashMapping._get_ngram_hashes`` for (B, L) without context.
    """
    x = np.asarray(comp_ids, np.int64)
    m = np.asarray(multipliers, np.int64)
    p = np.asarray(primes, np.int64)
    n_max = m.shape[0]
    heads = p.shape[0] // (n_max - 1)
    if x.ndim == 2:
        B, L = x.shape
        flat, cu = x.reshape(-1), np.arange(B + 1, dtype=np.int64) * L
    else:
        flat = x
        cu = np.asarray([0, x.shape[0]] if cu_seqlens is None else cu_seqlens, np.int64)
    ctx = None if context is None else np.asarray(context, np.int64).reshape(cu.shape[0] - 1, -1)
    cols = []
    mix = lagged(flat, cu, ctx, pad, 0) * m[0]
    for n in range(2, n_max + 1):
        mix = np.bitwise_xor(mix, lagged(flat, cu, ctx, pad, n - 1) * m[n - 1])
        for j in range(heads):
            cols.append(mix % p[(n - 2) * heads + j])
    out = np.stack(cols, axis=-1)                                             # (T, K)
    return out.reshape(*x.shape, p.shape[0])


@dataclass(frozen=True)
class NgramSpec:
    """One layer's hashing, resolved from the reference's settings (both backends' layers hold one).

    Attributes:
        compress: (Vo,) int64 old-to-new ids; ``compressed_vocab_size`` Vc = its max + 1.
        pad: the compressed pad id (``compress[pad_id]``).
        multipliers: (n_max,) int64; primes, offsets: (K,) int64 (heads in output order).
        head_dim: Dh = n_embed_per_ngram // n_head_per_ngram; num_rows: R = sum of the primes.
    """

    compress: np.ndarray
    compressed_vocab_size: int
    pad: int
    multipliers: np.ndarray
    primes: np.ndarray
    offsets: np.ndarray
    head_dim: int
    num_rows: int

    @property
    def max_ngram_size(self) -> int:
        return int(self.multipliers.shape[0])

    @property
    def num_heads(self) -> int:
        """K = (n_max - 1) * n_head_per_ngram."""
        return int(self.primes.shape[0])

    @property
    def out_dim(self) -> int:
        """K * Dh = (n_max - 1) * n_embed_per_ngram."""
        return self.num_heads * self.head_dim


def ngram_spec(*, engram_vocab_size: Any, max_ngram_size: Any, n_embed_per_ngram: Any, n_head_per_ngram: Any,
               layer_id: Any, layer_ids: Any, pad_id: Any, seed: Any, compress: Any) -> NgramSpec:
    """Check the reference's settings and resolve them (:class:`NgramSpec`); ConfigError names a bad one."""
    sizes, n_max, heads, layers = check_ngram_settings(engram_vocab_size, max_ngram_size, n_head_per_ngram,
                                                       layer_ids)
    dim = check_positive_int("n_embed_per_ngram", n_embed_per_ngram)
    if dim % heads:
        raise ConfigError(f"n_embed_per_ngram must be a multiple of n_head_per_ngram = {heads}, got {dim}")
    layer = check_int("layer_id", layer_id, minimum=0)
    seed = check_int("seed", seed, minimum=0)
    comp = check_compress(compress)
    pad = check_int("pad_id", pad_id, minimum=0, maximum=comp.shape[0] - 1)
    comp.flags.writeable = False
    vc = int(comp.max()) + 1
    primes = head_primes(sizes, n_max, heads, layers, layer)
    return NgramSpec(comp, vc, int(comp[pad]), layer_multipliers(vc, n_max, layer, seed), primes,
                     head_offsets(primes), dim // heads, int(primes.sum()))


def check_ngram_shapes(spec: NgramSpec, ids_shape: tuple[int, ...], packed: bool,
                       context_shape: tuple[int, ...] | None, docs: int | None = None) -> None:
    """The shapes of a lookup (both backends): ids (B, L), or (T,) (packed with ``cu_seqlens`` of ``docs``
    documents, else one sequence); context (B, C) / (S, C) / (C,) for one (T,) sequence, C <= n_max - 1."""
    if packed and len(ids_shape) != 1:
        raise ConfigError(f"packed ids with cu_seqlens must be 1-D (T,), got shape {tuple(ids_shape)}")
    if len(ids_shape) not in (1, 2):
        raise ConfigError(f"ids must be (B, L), or packed (T,) with cu_seqlens, got shape {tuple(ids_shape)}")
    if context_shape is None:
        return
    n = docs if packed else (ids_shape[0] if len(ids_shape) == 2 else 1)
    shape = tuple(context_shape)
    if len(ids_shape) == 1 and not packed and len(shape) == 1:
        shape = (1, *shape)
    c_max = spec.max_ngram_size - 1
    if len(shape) != 2 or shape[0] != n or shape[1] > c_max:
        raise ConfigError(f"context must be ({n}, C) with C <= max_ngram_size - 1 = {c_max} (the ids right before "
                          f"each sequence), got shape {tuple(context_shape)}")


def check_ngram_inputs(spec: NgramSpec, ids: Any, cu_seqlens: Any = None, context: Any = None
                       ) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
    """ids (B, L), or packed (T,) with ``cu_seqlens`` (S + 1,); ``context`` as :func:`check_ngram_shapes` says.
    Returns them as int64 (context (S, C)). Every id is in compress's domain [0, Vo): TokenIdError names the
    first bad one (ids, then context)."""
    vo = spec.compress.shape[0]
    x = check_token_ids(ids, vo)
    cu = None if cu_seqlens is None else check_cu_seqlens(cu_seqlens, x.shape[0] if x.ndim == 1 else None)
    ctx = None if context is None else check_token_ids(context, vo)
    check_ngram_shapes(spec, x.shape, cu is not None, None if ctx is None else ctx.shape,
                       None if cu is None else cu.shape[0] - 1)
    if ctx is not None:
        docs = cu.shape[0] - 1 if cu is not None else (x.shape[0] if x.ndim == 2 else 1)
        ctx = ctx.reshape(docs, ctx.shape[-1])
    return x, cu, ctx
