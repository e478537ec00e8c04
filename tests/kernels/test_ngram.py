"""The hashed n-gram kernel's division-free modulo (``kernels.ngram.fast_mod``) against Python's ``%`` on the
values the hash makes (non-negative int64 up to 2**63 - 1) and on negative ones, for small and large primes; and the
kernel's rows against the formula on a compressed vocabulary large enough for products near 2**63."""

from __future__ import annotations

import numpy as np
import pytest
from numba import njit

from tokenpos.kernels.ngram import fast_mod, ngram_rows
from tokenpos.tables.formulas.ngram_hash import head_offsets, layer_multipliers, ngram_hash_ids


@njit(cache=False)
def _mods(xs, p):  # pragma: no cover - compiled
    out = np.empty_like(xs)
    inv = 1.0 / p
    for i in range(xs.shape[0]):
        out[i] = fast_mod(xs[i], p, inv)
    return out


@pytest.mark.parametrize("p", [2, 3, 5, 7, 61, 10007, 646403, 2_147_483_647, 1_000_000_000_039])
def test_fast_mod_is_the_remainder(p):
    rng = np.random.default_rng(p % 1000)
    big = np.iinfo(np.int64).max
    xs = np.concatenate([rng.integers(0, big, 4000, dtype=np.int64), rng.integers(-big, 0, 500, dtype=np.int64),
                         np.array([0, 1, p - 1, p, p + 1, big, big - 1, big - p, -1, -p, -big - 1], np.int64)])
    got = _mods(xs, np.int64(p))
    np.testing.assert_array_equal(got, np.array([int(x) % p for x in xs], np.int64))


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
