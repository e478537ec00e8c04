"""The hashed n-gram kernel's division-free modulo (``kernels.ngram.fast_mod``) against Python's ``%`` on the
values the hash makes (non-negative int64 up to 2**63 - 1) and on negative ones, for small and large primes; and the
kernel's rows against the formula on a compressed vocabulary large enough for products near 2**63."""

from __future__ import annotations

import numpy as np
import pytest
from numba import njit

from tokenpos.kernels.ngram import PRIME_LIMIT, fast_mod, ngram_rows
from tokenpos.tables.errors import ConfigError, KernelBoundError
from tokenpos.tables.formulas.ngram_hash import head_offsets, is_prime, layer_multipliers, ngram_hash_ids


@njit(cache=False)
def _mods(xs, p):  # pragma: no cover - compiled
    out = np.empty_like(xs)
    inv = 1.0 / p
    for i in range(xs.shape[0]):
        out[i] = fast_mod(xs[i], p, inv)
    return out


# the largest prime below PRIME_LIMIT = 2**51 last: the branch-free corrections' bound is tightest there
@pytest.mark.parametrize("p", [2, 3, 5, 7, 61, 10007, 646403, 2_147_483_647, 1_000_000_000_039,
                               2**51 - 129])
def test_fast_mod_is_the_remainder(p):
    rng = np.random.default_rng(p % 1000)
    big = np.iinfo(np.int64).max
    xs = np.concatenate([rng.integers(0, big, 4000, dtype=np.int64), rng.integers(-big, 0, 500, dtype=np.int64),
                         np.array([0, 1, p - 1, p, p + 1, big, big - 1, big - p, -1, -p, -big - 1], np.int64)])
    got = _mods(xs, np.int64(p))
    np.testing.assert_array_equal(got, np.array([int(x) % p for x in xs], np.int64))


@njit(cache=False)
def _pair_mods(xs, ps):  # pragma: no cover - compiled
    out = np.empty_like(xs)
    for i in range(xs.shape[0]):
        out[i] = fast_mod(xs[i], ps[i], 1.0 / ps[i])
    return out


def test_fast_mod_is_the_remainder_for_any_modulus_below_the_limit():
    """Random pairs: x over all of int64 (and near its ends), p log-uniform over [2, PRIME_LIMIT) (the remainder's
    bound needs no primality), every p near the limit, and pairs that need each of the two corrections."""
    rng = np.random.default_rng(11)
    n = 20000
    xs = rng.integers(np.iinfo(np.int64).min, np.iinfo(np.int64).max, n, dtype=np.int64, endpoint=True)
    xs[:200] = np.iinfo(np.int64).max - np.arange(200)
    xs[200:400] = np.iinfo(np.int64).min + np.arange(200)
    ps = np.exp2(rng.uniform(1, 51, n)).astype(np.int64).clip(2, PRIME_LIMIT - 1)
    ps[-300:] = PRIME_LIMIT - 1 - np.arange(300)
    # multiples of p whose second quotient estimate falls one short (found by search): the remainder reaches p
    # there, and only the last correction brings it to 0
    edge = np.array([(3296471811894834867, 1028123002767), (3475292881333307112, 972856343016),
                     (3680661430661947533, 301788969731), (648732210131704986, 124386646314)], np.int64)
    xs, ps = np.concatenate([xs, edge[:, 0]]), np.concatenate([ps, edge[:, 1]])
    got = _pair_mods(xs, ps)
    np.testing.assert_array_equal(got, np.array([int(x) % int(q) for x, q in zip(xs, ps, strict=True)], np.int64))


def test_kernel_rows_equal_formula_with_products_near_2_63():
    vc = 1 << 20
    compress = np.arange(vc, dtype=np.int64)[::-1].copy()
    mult = layer_multipliers(vc, 4, 15, 11)
    primes = np.array([5, 7, 11, 1_000_003, 13, 17], np.int64)
    ids = np.random.default_rng(0).integers(0, vc, (3, 40))
    got = ngram_rows(ids, compress, mult, primes, head_offsets(primes), int(compress[7]))
    want = ngram_hash_ids(compress[ids], mult, primes, int(compress[7])) + head_offsets(primes)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("parallel_bytes", [0, 1 << 40], ids=["parallel", "serial"])
def test_forward_parallel_and_serial_cores_equal_the_formula(parallel_bytes, monkeypatch):
    """Both cores (parallel above ``PARALLEL_BYTES``, serial below) on packed documents with a context, many
    blocks and a last one cut short, against the formula's rows gathered by NumPy."""
    import tokenpos.kernels.ngram as K

    monkeypatch.setattr(K, "PARALLEL_BYTES", parallel_bytes)
    rng = np.random.default_rng(3)
    compress = rng.integers(0, 40, 60)
    mult = layer_multipliers(int(compress.max()) + 1, 3, 1, 0)
    primes = np.array([53, 59, 61, 67], np.int64)
    offsets = head_offsets(primes)
    w = rng.standard_normal((int(primes.sum()), 3))
    ids = rng.integers(0, 60, 203)
    cu = np.array([0, 1, 1, 50, 131, 203])
    ctx = rng.integers(0, 60, (5, 2))
    out = np.empty((203, 12))
    K.ngram_forward(w, ids, compress, mult, primes, offsets, 5, out, cu_seqlens=cu, context=ctx)
    rows = ngram_hash_ids(compress[ids], mult, primes, 5, cu_seqlens=cu, context=compress[ctx]) + offsets
    np.testing.assert_array_equal(out, w[rows].reshape(203, 12))


def test_the_largest_prime_tested_is_the_last_below_the_limit():
    assert is_prime(2**51 - 129) and PRIME_LIMIT == 2**51
    assert not any(is_prime(q) for q in range(2**51 - 128, 2**51))


def test_a_prime_at_the_limit_is_refused_by_name_and_nothing_written():
    import tokenpos.kernels.ngram as K

    compress = np.arange(10, dtype=np.int64)
    mult = layer_multipliers(10, 2, 1, 0)
    primes = np.array([5, PRIME_LIMIT + 1], np.int64)        # any value at or above the limit (a prime or not)
    offsets = head_offsets(primes)
    w = np.zeros((6, 2))
    out = np.full((1, 3, 4), 7.0)
    with pytest.raises(ConfigError, match=f"below 2\\*\\*51.*got {PRIME_LIMIT + 1}"):
        K.ngram_forward(w, np.zeros((1, 3), np.int64), compress, mult, primes, offsets, 0, out)
    assert (out == 7.0).all()
    with pytest.raises(ConfigError, match="below 2"):
        K.ngram_rows(np.zeros((1, 3), np.int64), compress, mult, primes, offsets, 0)


@pytest.mark.parametrize("parallel_bytes", [0, 1 << 40], ids=["parallel", "serial"])
def test_a_bad_id_mid_block_skips_exactly_the_tokens_that_read_it(parallel_bytes, monkeypatch):
    """An id outside [0, Vo) in the middle of a block (and one past a block edge): the tokens whose window reads it
    are skipped (their output left as it was) and counted, every other token is the formula's, in both cores and
    in ``rows_core`` (-1 rows); the error names the id."""
    import tokenpos.kernels.ngram as K

    monkeypatch.setattr(K, "PARALLEL_BYTES", parallel_bytes)
    rng = np.random.default_rng(5)
    V, n_max, T = 50, 3, 2 * K.BLOCK + 9
    compress = rng.integers(0, 20, V)
    mult = layer_multipliers(20, n_max, 1, 0)
    primes = np.array([31, 37, 41, 43, 47, 53], np.int64)            # H = 3 heads per n
    offsets = head_offsets(primes)
    w = rng.standard_normal((int(primes.sum()), 4))
    ids = rng.integers(0, V, T)
    bad_at = [K.BLOCK // 2, K.BLOCK + 1]
    ids[bad_at] = [V, -3]
    reads_bad = np.zeros(T, bool)
    for b in bad_at:
        reads_bad[b:b + n_max] = True                                  # tokens b .. b + n_max - 1 read id b
    good_ids = ids.copy()
    good_ids[bad_at] = 0
    want = ngram_hash_ids(compress[good_ids], mult, primes, int(compress[2])) + offsets        # (T, K)
    out = np.full((T, primes.size * 4), 9.0)
    with pytest.raises(KernelBoundError, match=f"id {V} at index \\({bad_at[0]},\\).*skipped {int(reads_bad.sum())} "):
        K.ngram_forward(w, ids, compress, mult, primes, offsets, int(compress[2]), out)
    np.testing.assert_array_equal(out[reads_bad], 9.0)
    np.testing.assert_array_equal(out[~reads_bad], w[want[~reads_bad]].reshape(-1, primes.size * 4))
    flat, cu, ctx = K._args(ids, None, None, primes)
    rows = np.empty((T, primes.size), np.int64)
    nbad = K.rows_core(flat, compress, cu, ctx, mult, primes, 1.0 / primes, offsets, np.int64(compress[2]), 4, rows)
    assert nbad == reads_bad.sum()
    np.testing.assert_array_equal(rows[reads_bad], -1)
    np.testing.assert_array_equal(rows[~reads_bad], want[~reads_bad])


def _shard_case():
    """Packed documents with a context over many blocks (a last one cut short), a table of R = 240 rows, and its
    split into shards: uneven ones, an empty one, one past the table's end (a vocab-parallel layer's padding)."""
    rng = np.random.default_rng(8)
    compress = rng.integers(0, 40, 60)
    mult = layer_multipliers(int(compress.max()) + 1, 3, 1, 0)
    primes = np.array([53, 59, 61, 67], np.int64)
    w = rng.standard_normal((int(primes.sum()), 3))
    ids = rng.integers(0, 60, 203)
    cu = np.array([0, 1, 1, 50, 131, 203])
    ctx = rng.integers(0, 60, (5, 2))
    bounds = [0, 1, 97, 97, 160, 240, 256]
    return compress, mult, primes, head_offsets(primes), w, ids, cu, ctx, bounds


@pytest.mark.parametrize("parallel_bytes", [0, 1 << 40], ids=["parallel", "serial"])
def test_forward_row_range_gathers_the_shard_and_zeros_the_rest_without_reading_it(parallel_bytes, monkeypatch):
    """``row_start``: weight holds rows [start, start + Rw). Each shard's output is the whole table's where the row
    is its own and exactly zero elsewhere; the shards sum to the whole lookup bit for bit. Each shard sits between
    NaN rows in memory, so a read outside its rows would show."""
    import tokenpos.kernels.ngram as K

    monkeypatch.setattr(K, "PARALLEL_BYTES", parallel_bytes)
    compress, mult, primes, offsets, w, ids, cu, ctx, bounds = _shard_case()
    R = w.shape[0]
    whole = np.empty((203, 12))
    K.ngram_forward(w, ids, compress, mult, primes, offsets, 5, whole, cu_seqlens=cu, context=ctx)
    rows = ngram_hash_ids(compress[ids], mult, primes, 5, cu_seqlens=cu, context=compress[ctx]) + offsets  # (T, K)
    total = np.zeros_like(whole)
    for start, end in zip(bounds[:-1], bounds[1:], strict=True):
        padded = np.full((end - start + 2, 3), np.nan)
        padded[1:-1][: max(0, min(end, R) - start)] = w[start:min(end, R)]
        shard = padded[1:-1]                                      # NaN rows on either side in memory
        out = np.full((203, 12), 7.0)
        K.ngram_forward(shard, ids, compress, mult, primes, offsets, 5, out, cu_seqlens=cu, context=ctx,
                        row_start=start)
        mine = np.repeat((rows >= start) & (rows < end), 3, axis=1)                         # (T, K * Dh)
        np.testing.assert_array_equal(out[mine], whole[mine])
        assert (out[~mine] == 0).all() and not np.signbit(out[~mine]).any()
        total += out
    np.testing.assert_array_equal(total, whole)


def test_backward_row_range_is_the_whole_gradient_restricted_to_the_shard():
    """``num_rows`` / ``row_start``: each shard's (rows, sums) are the whole backward's rows in [start, end),
    renumbered from start, with the same sums bit for bit (each row's slices summed in the same order)."""
    import tokenpos.kernels.ngram as K

    compress, mult, primes, offsets, w, ids, cu, ctx, bounds = _shard_case()
    grad = np.random.default_rng(9).standard_normal((203, 12))
    uniq, summed = K.ngram_backward(grad, ids, compress, mult, primes, offsets, 5, cu_seqlens=cu, context=ctx)
    for start, end in zip(bounds[:-1], bounds[1:], strict=True):
        u, s = K.ngram_backward(grad, ids, compress, mult, primes, offsets, 5, cu_seqlens=cu, context=ctx,
                                row_start=start, num_rows=end - start)
        mine = (uniq >= start) & (uniq < end)
        np.testing.assert_array_equal(u, uniq[mine] - start)
        np.testing.assert_array_equal(s, summed[mine])
