"""Every bad input of issue #2 section 6: a typed error naming the value and the valid range, and a layer
left exactly as it was (weights, gradients, training flags, the forward cache and the dropout stream)."""

from __future__ import annotations

import numpy as np
import pytest

import tokenpos.numpy as tpn
from tests.numpy.helpers import Snapshot

V, D, P = 10, 4, 5
GOOD = np.array([[1, 2, 3], [4, 5, 6]])


def transformer(**kw):
    kw = {"positional": "learned", "dropout": 0.3, "norm": "layernorm", "num_token_types": 2, "seed": 0,
          "dtype": np.float64, **kw}
    return tpn.TransformerEmbedding(V, D, P, **kw)


def fused_transformer(dtype):
    """The block as one kernel call: no dropout, no norm, no token types."""
    return lambda: tpn.TransformerEmbedding(V, D, P, scale=True, seed=0, dtype=dtype)


def token():
    return tpn.TokenEmbedding(V, D, seed=0, dtype=np.float64, padding_idx=0)


def learned():
    return tpn.LearnedPositionalEmbedding(P, D, seed=0, dtype=np.float64)


# (name, factory, good call, bad call, exception, message pattern)
CASES = [
    # token ids
    ("token: id == V", token, lambda m: m(GOOD), lambda m: m(np.array([[1, 10]])), tpn.TokenIdError,
     r"token id 10 at index \(0, 1\) is out of range \[0, 10\)"),
    ("token: id > V", token, lambda m: m(GOOD), lambda m: m(np.array([50257])), tpn.TokenIdError,
     r"token id 50257 at index \(0,\) is out of range \[0, 10\)"),
    ("token: negative id (no wrap-around)", token, lambda m: m(GOOD), lambda m: m(np.array([[3, -1]])),
     tpn.TokenIdError, r"token id -1 at index \(0, 1\) is out of range \[0, 10\)"),
    ("token: float ids", token, lambda m: m(GOOD), lambda m: m(np.array([1.0, 2.0])), tpn.TokenIdError,
     r"integers, got dtype float64.*\[0, 10\)"),
    ("token: bool ids", token, lambda m: m(GOOD), lambda m: m(np.array([True])), tpn.TokenIdError,
     r"integers, got dtype bool"),
    ("transformer: id == V", transformer, lambda m: m(GOOD), lambda m: m(np.array([[1, 2, 10]])),
     tpn.TokenIdError, r"token id 10 at index \(0, 2\) is out of range \[0, 10\)"),
    ("transformer: negative id", transformer, lambda m: m(GOOD), lambda m: m(np.array([-3, 1])),
     tpn.TokenIdError, r"token id -3 at index \(0,\) is out of range \[0, 10\)"),
    ("transformer: float ids", transformer, lambda m: m(GOOD), lambda m: m(GOOD.astype(np.float32)),
     tpn.TokenIdError, r"integers, got dtype float32"),
    # the fused block without dropout leaves the id values to the kernel's gather loop (float16:
    # no kernel, so the layer checks them); the error and the untouched state are the same
    *[(f"fused transformer ({dt.__name__}): {what}", fused_transformer(dt), lambda m: m(GOOD), bad,
       tpn.TokenIdError, pattern)
      for dt in (np.float64, np.float32, np.float16)
      for what, bad, pattern in (
          ("id == V", lambda m: m(np.array([[1, 2, 10]])), r"token id 10 at index \(0, 2\) is out of range \[0, 10\)"),
          ("negative id", lambda m: m(np.array([-3, 1])), r"token id -3 at index \(0,\) is out of range \[0, 10\)"),
          ("int32 id > V", lambda m: m(np.array([[1, 12, 2]], np.int32)), r"token id 12 at index \(0, 1\)"),
          ("uint64 beyond int64", lambda m: m(np.array([2**63 + 1], np.uint64)), r"token id 9223372036854775809 "))],
    # positions
    ("transformer: sequence longer than max_seq_len", transformer, lambda m: m(GOOD),
     lambda m: m(np.ones((2, 6), dtype=int)), tpn.PositionError,
     r"position 5 at index \(0, 5\) is out of range \[0, 5\) \(max_seq_len=5\)"),
    ("transformer: start_pos past the table", transformer, lambda m: m(GOOD), lambda m: m(GOOD, start_pos=3),
     tpn.PositionError, r"position 5 at index \(0, 2\) is out of range \[0, 5\)"),
    ("transformer: explicit position >= max_seq_len", transformer, lambda m: m(GOOD),
     lambda m: m(GOOD, np.array([0, 1, 7])), tpn.PositionError, r"position 7 .*\[0, 5\)"),
    ("transformer: negative position", transformer, lambda m: m(GOOD), lambda m: m(GOOD, np.array([0, -1, 2])),
     tpn.PositionError, r"position -1 at index \(1,\) is negative"),
    ("transformer: negative start_pos", transformer, lambda m: m(GOOD), lambda m: m(GOOD, start_pos=-1),
     ValueError, r"start_pos must be >= 0, got -1"),
    ("transformer: float positions", transformer, lambda m: m(GOOD), lambda m: m(GOOD, np.array([0.0, 1.0, 2.0])),
     tpn.PositionError, r"positions must be integers, got dtype float64"),
    ("transformer: positions of the wrong shape", transformer, lambda m: m(GOOD),
     lambda m: m(GOOD, np.array([0, 1])), ValueError, r"positions must have shape \(3,\) or \(2, 3\), got \(2,\)"),
    ("transformer: 3-D ids", transformer, lambda m: m(GOOD), lambda m: m(GOOD[None]), ValueError,
     r"ids must have shape \(B, L\) or \(L,\), got \(1, 2, 3\)"),
    ("transformer: token type out of range", transformer, lambda m: m(GOOD),
     lambda m: m(GOOD, token_type_ids=np.full((2, 3), 2)), tpn.TokenIdError, r"token id 2 .*\[0, 2\)"),
    ("learned: seq_len > max_seq_len", learned, lambda m: m(3), lambda m: m(6), tpn.PositionError,
     r"seq_len 6 exceeds max_seq_len 5"),
    ("learned: position >= max_seq_len", learned, lambda m: m(3), lambda m: m(np.array([[0, 5]])),
     tpn.PositionError, r"position 5 at index \(0, 1\) is out of range \[0, 5\) \(max_seq_len=5\)"),
    ("learned: negative position", learned, lambda m: m(3), lambda m: m(np.array([-2])), tpn.PositionError,
     r"position -2 at index \(0,\) is negative"),
    ("learned: negative seq_len", learned, lambda m: m(3), lambda m: m(-1), ValueError,
     r"seq_len must be >= 0, got -1"),
    ("layernorm: wrong width", lambda: tpn.LayerNorm(D, dtype=np.float64), lambda m: m(np.ones((2, D))),
     lambda m: m(np.ones((2, D + 1))), ValueError, r"last dimension 4, got shape \(2, 5\)"),
]


@pytest.mark.parametrize("name, factory, good, bad, exc, pattern", CASES, ids=[c[0] for c in CASES])
def test_bad_call_raises_and_changes_nothing(name, factory, good, bad, exc, pattern):
    layer, twin = factory(), factory()
    out, out_twin = good(layer), good(twin)
    np.testing.assert_array_equal(out, out_twin)
    g = np.random.default_rng(0).standard_normal(out.shape)
    layer.backward(g)
    twin.backward(g)
    before = Snapshot(layer)
    Snapshot(twin)                     # read the twin's gradients too: same summation order afterwards
    with pytest.raises(exc, match=pattern) as err:
        bad(layer)
    assert isinstance(err.value, ValueError), "every bad input is a ValueError (or a subclass)"
    before.assert_same(Snapshot(layer))
    # the forward cache still belongs to the last good call: backward again gives the twin's gradients
    layer.backward(g)
    twin.backward(g)
    for (n, p), (_, q) in zip(layer.named_parameters(), twin.named_parameters(), strict=True):
        np.testing.assert_array_equal(p.grad, q.grad, err_msg=n)
    # the random stream (dropout masks) did not advance
    np.testing.assert_array_equal(good(layer), good(twin))


@pytest.mark.parametrize("name, factory, good, bad, exc, pattern", CASES, ids=[c[0] for c in CASES])
def test_bad_first_call_leaves_no_cache(name, factory, good, bad, exc, pattern):
    layer = factory()
    with pytest.raises(exc):
        bad(layer)
    with pytest.raises(RuntimeError, match="before forward"):
        layer.backward(np.ones((2, 3, D)))


def test_ids_errors_are_index_errors_too():
    with pytest.raises(IndexError):
        token()(np.array([10]))
    with pytest.raises(IndexError):
        learned()(np.array([5]))


def test_eval_mode_survives_a_failed_call():
    layer = transformer().eval()
    with pytest.raises(tpn.TokenIdError):
        layer(np.array([[99]]))
    assert not any(m.training for m in layer.modules())


# -- constructors ----------------------------------------------------------------------------------

@pytest.mark.parametrize("build, pattern", [
    (lambda: tpn.TokenEmbedding(0, 4), r"vocab_size must be >= 1, got 0"),
    (lambda: tpn.TokenEmbedding(-5, 4), r"vocab_size must be >= 1, got -5"),
    (lambda: tpn.TokenEmbedding(10, 0), r"d_model must be >= 1, got 0"),
    (lambda: tpn.TokenEmbedding(10, -1), r"d_model must be >= 1, got -1"),
    (lambda: tpn.TokenEmbedding(10.0, 4), r"vocab_size must be an integer, got 10.0"),
    (lambda: tpn.TokenEmbedding(10, 4, padding_idx=10), r"padding_idx must be in \[0, 10\) or None, got 10"),
    (lambda: tpn.TokenEmbedding(10, 4, padding_idx=-1), r"padding_idx must be in \[0, 10\) or None, got -1"),
    (lambda: tpn.TokenEmbedding(10, 4, init="he"), r"init must be one of 'normal', .*; got 'he'"),
    (lambda: tpn.TokenEmbedding(10, 4, dtype=np.int64), r"dtype must be one of float16, float32, float64; got int64"),
    (lambda: tpn.TokenEmbedding(10, 4, std=-0.1), r"std must be >= 0.0, got -0.1"),
    (lambda: tpn.TokenEmbedding(10, 4, seed=1, rng=np.random.default_rng()), r"seed= or rng=, not both"),
    (lambda: tpn.LearnedPositionalEmbedding(0, 4), r"max_seq_len must be >= 1, got 0"),
    (lambda: tpn.LearnedPositionalEmbedding(8, 0), r"d_model must be >= 1, got 0"),
    (lambda: tpn.SinusoidalPositionalEncoding(8, -2), r"d_model must be >= 1, got -2"),
    (lambda: tpn.SinusoidalPositionalEncoding(8, 4, base=0.5), r"base must be > 1.0, got 0.5"),
    (lambda: tpn.LayerNorm(0), r"d_model must be >= 1, got 0"),
    (lambda: tpn.TransformerEmbedding(10, 4, positional="rotary-ish"),
     r"positional must be one of .*'learned'.*'none'.*'sinusoidal'.*; got 'rotary-ish'"),
    (lambda: tpn.TransformerEmbedding(10, 4, positional="Learned"), r"positional must be one of .*; got 'Learned'"),
    (lambda: tpn.TransformerEmbedding(10, 0), r"d_model must be >= 1, got 0"),
    (lambda: tpn.TransformerEmbedding(0, 4), r"vocab_size must be >= 1, got 0"),
    (lambda: tpn.TransformerEmbedding(10, 4, 0), r"max_seq_len must be >= 1, got 0"),
    (lambda: tpn.TransformerEmbedding(10, 4, dropout=1.0), r"dropout must be < 1.0, got 1.0"),
    (lambda: tpn.TransformerEmbedding(10, 4, dropout=-0.1), r"dropout must be >= 0.0, got -0.1"),
    (lambda: tpn.TransformerEmbedding(10, 4, norm="batchnorm"), r"norm must be one of 'layernorm', 'rmsnorm'; got"),
    (lambda: tpn.TransformerEmbedding(10, 4, num_token_types=-1), r"num_token_types must be >= 0, got -1"),
    (lambda: tpn.SinusoidalPositionalEncoding(10, 4, layout="x"), r"layout must be"),
    (lambda: tpn.SinCos2DPositionalEncoding(2, 2, 4, dtype=np.int32),
     r"dtype must be one of float16, float32, float64; got int32"),   # gave a truncated table
    (lambda: tpn.SinCos2DPositionalEncoding(2, 2, 4, dtype=np.complex64), r"dtype must be one of .*; got complex64"),
])
def test_bad_constructor_arguments(build, pattern):
    with pytest.raises(ValueError, match=pattern) as err:
        build()
    assert isinstance(err.value, tpn.ConfigError)


@pytest.mark.parametrize("name, factory, good, bad, exc, pattern", [c for c in CASES if c[0].startswith("fused")],
                         ids=[c[0] for c in CASES if c[0].startswith("fused")])
def test_bad_ids_of_the_fused_block_with_kernels_off(name, factory, good, bad, exc, pattern):
    """Kernels off: the plain path does not check, so the layer does; same error, same state."""
    import tokenpos

    with tokenpos.use_kernels(False):
        test_bad_call_raises_and_changes_nothing(name, factory, good, bad, exc, pattern)
