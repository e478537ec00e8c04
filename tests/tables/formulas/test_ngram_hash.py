"""The hashed n-gram ids (``tables.formulas.ngram_hash``) bit for bit against the Engram reference's
``NgramHashMapping`` (tests/ngram_reference.py): primes, multipliers and hash ids for layer ids [1, 15],
max_ngram_size 2, 3 and 4, odd and even head counts, the pad id in the input; packed rows and decoding with a
context against the same sequences alone."""

from __future__ import annotations

import numpy as np
import pytest
from sympy import isprime

from tests.ngram_cases import CASES, LAYER_IDS, PAD_ID, make_compress, make_ids, reference_mapping
from tokenpos.tables.errors import ConfigError
from tokenpos.tables.formulas.ngram_hash import (
    head_offsets,
    head_primes,
    is_prime,
    layer_multipliers,
    ngram_hash_ids,
    ngram_primes,
)


def _ours(case, layer_id, seed=0):
    n_max, heads, _, sizes = case
    compress = make_compress(seed)
    mult = layer_multipliers(int(compress.max()) + 1, n_max, layer_id, seed)
    return compress, mult, head_primes(sizes, n_max, heads, LAYER_IDS, layer_id), int(compress[PAD_ID])


def test_is_prime_matches_sympy():
    assert [n for n in range(-3, 5000) if is_prime(n)] == [n for n in range(-3, 5000) if isprime(n)]
    big = [2**61 - 1, 2**61 + 1, 1_000_000_007, 999_999_999_989 * 3, 3_215_031_751, 341_550_071_728_321]
    assert [is_prime(n) for n in big] == [bool(isprime(n)) for n in big]


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("seed", [0, 7])
def test_primes_and_multipliers_equal_the_reference(case, seed):
    ref = reference_mapping(case, seed)
    n_max, heads, _, sizes = case
    assert ngram_primes(sizes, n_max, heads, LAYER_IDS) == ref.vocab_size_across_layers
    for layer in LAYER_IDS:
        got = layer_multipliers(len(ref.compressed_tokenizer), n_max, layer, seed)
        np.testing.assert_array_equal(got, ref.layer_multipliers[layer])
        assert got.dtype == np.int64 and np.all(got % 2 == 1)
        primes = head_primes(sizes, n_max, heads, LAYER_IDS, layer)
        flat = [p for per_n in ref.vocab_size_across_layers[layer] for p in per_n]
        np.testing.assert_array_equal(primes, flat)
        np.testing.assert_array_equal(head_offsets(primes), np.cumsum([0] + flat[:-1]))


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("layer_id", LAYER_IDS)
def test_hash_ids_bit_exact(case, layer_id):
    ref = reference_mapping(case)
    compress, mult, primes, pad = _ours(case, layer_id)
    ids = make_ids((3, 11))
    want = ref.hash(ids)[layer_id]
    got = ngram_hash_ids(compress[ids], mult, primes, pad)
    assert got.dtype == np.int64 and got.shape == want.shape == (3, 11, primes.shape[0])
    np.testing.assert_array_equal(got, want)
    assert np.all((got >= 0) & (got < primes))


def test_wrapping_int64_as_numpy():
    """Large compressed ids (a compressed vocabulary of 10**6) keep the reference's int64 arithmetic: products near
    2**63 and the modulo of their XOR, element for element against the reference's NumPy expression."""
    vc = 10**6
    mult = layer_multipliers(vc, 3, 15, 3)
    assert int(mult.max()) > 2**40
    ids = np.array([[vc - 1, vc - 2, 0, vc - 1, 12345]], np.int64)
    primes = np.array([1_000_003, 1_000_033, 999_983, 1_000_037], np.int64)
    got = ngram_hash_ids(ids, mult, primes, 0)
    shifted = [np.pad(ids, ((0, 0), (k, 0)), constant_values=0)[:, :5] for k in range(3)]
    mix2 = np.bitwise_xor(shifted[0] * mult[0], shifted[1] * mult[1])
    mix3 = np.bitwise_xor(mix2, shifted[2] * mult[2])
    want = np.stack([mix2 % primes[0], mix2 % primes[1], mix3 % primes[2], mix3 % primes[3]], axis=-1)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("case", CASES)
def test_packed_rows_equal_each_document_alone(case):
    compress, mult, primes, pad = _ours(case, 15)
    docs = [make_ids((1, n), seed=n)[0] for n in (1, 6, 2, 9)]
    packed = np.concatenate(docs)
    cu = np.cumsum([0] + [len(d) for d in docs])
    got = ngram_hash_ids(compress[packed], mult, primes, pad, cu_seqlens=cu)
    want = np.concatenate([ngram_hash_ids(compress[d][None], mult, primes, pad)[0] for d in docs])
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("case", CASES)
def test_decode_with_context_equals_the_full_sequence(case):
    n_max = case[0]
    compress, mult, primes, pad = _ours(case, 1)
    ids = compress[make_ids((2, 9))]
    full = ngram_hash_ids(ids, mult, primes, pad)
    for t in range(9):
        ctx = ids[:, max(0, t - (n_max - 1)):t]            # up to n_max - 1 ids before the step
        step = ngram_hash_ids(ids[:, t:t + 1], mult, primes, pad, context=ctx)
        np.testing.assert_array_equal(step[:, 0], full[:, t])
    chunk = ngram_hash_ids(ids[:, 4:], mult, primes, pad, context=ids[:, 4 - (n_max - 1):4])
    np.testing.assert_array_equal(chunk, full[:, 4:])


def test_bad_settings_refused():
    with pytest.raises(ConfigError, match="engram_vocab_size"):
        ngram_primes([10], 3, 2, [1])
    with pytest.raises(ConfigError, match="max_ngram_size"):
        ngram_primes([10], 1, 2, [1])
    with pytest.raises(ConfigError, match="layer_id 3"):
        head_primes([10, 10], 3, 2, [1, 15], 3)
    with pytest.raises(ConfigError, match="distinct"):
        ngram_primes([10], 2, 2, [1, 1])
