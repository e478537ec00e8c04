"""Settings shared by the hashed n-gram tests: the cases the issue names (layer ids [1, 15], max_ngram_size 2, 3
and 4, odd and even head counts, the pad id in the input), a compress array, ids, and the reference's mapping."""

from __future__ import annotations

from typing import Any

import numpy as np

from tests.ngram_reference import NgramHashMapping

V_OLD = 50                  # the "tokenizer" vocabulary
LAYER_IDS = [1, 15]
PAD_ID = 2

# (max_ngram_size, n_head_per_ngram, n_embed_per_ngram, engram_vocab_size)
CASES = [
    (2, 1, 4, [37]),
    (3, 2, 6, [61, 53]),
    (3, 3, 6, [64, 64]),
    (4, 4, 8, [97, 89, 101]),
]


def make_compress(seed: int = 0, v_old: int = V_OLD) -> np.ndarray:
    """An old-to-new id array as the reference builds one: new ids numbered 0, 1, ... as they are first met, some
    old ids merged (the pad id shares its compressed id with another token)."""
    rng = np.random.default_rng(seed)
    keys = rng.integers(0, v_old // 2, size=v_old)
    keys[PAD_ID] = keys[7]
    first: dict[int, int] = {}
    return np.array([first.setdefault(int(k), len(first)) for k in keys], np.int64)


def settings(case: tuple[Any, ...], layer_id: int = 1, seed: int = 0) -> dict[str, Any]:
    n_max, heads, dim, sizes = case
    return dict(engram_vocab_size=sizes, max_ngram_size=n_max, n_embed_per_ngram=dim, n_head_per_ngram=heads,
                layer_id=layer_id, layer_ids=LAYER_IDS, pad_id=PAD_ID, seed=seed, compress=make_compress(seed))


def reference_mapping(case: tuple[Any, ...], seed: int = 0) -> NgramHashMapping:
    n_max, heads, dim, sizes = case
    return NgramHashMapping(engram_vocab_size=sizes, max_ngram_size=n_max, n_embed_per_ngram=dim,
                            n_head_per_ngram=heads, layer_ids=LAYER_IDS, compress=make_compress(seed),
                            pad_id=PAD_ID, seed=seed)


def make_ids(shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    """Ids in [0, V_OLD) with the pad id at several places (a run of pads at the start of row 0)."""
    ids = np.random.default_rng(seed + 100).integers(0, V_OLD, size=shape)
    flat = ids.reshape(-1)
    flat[:2] = PAD_ID
    flat[5::7] = PAD_ID
    return ids


def tiny_ngram_kwargs(vocab: int) -> dict[str, Any]:
    """The smallest useful HashedNgramEmbedding settings for a vocabulary of ``vocab`` ids (the guard tables' cases:
    tests/numpy/layers.py, tests/torch/test_compile_dynamic.py, tests/torch/test_no_host_sync.py, ...)."""
    return dict(engram_vocab_size=[7, 5], max_ngram_size=3, n_embed_per_ngram=4, n_head_per_ngram=2, layer_id=1,
                layer_ids=[1], pad_id=0, seed=0, compress=np.arange(vocab) % 6, init_seed=0)
