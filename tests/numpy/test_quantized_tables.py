"""8-bit tables in the NumPy layers (``weight_dtype=np.int8``): TokenEmbedding, PerLayerEmbedding and
HashedNgramEmbedding each equal the definition (``tables.formulas.quantize.dequantize_rows``) on their own rows,
kernels on and off; state_dict round trips and float state_dicts quantised on load; tied logits; the refusals
(float8 is torch's only)."""

from __future__ import annotations

import numpy as np
import pytest

import tokenpos.numpy as tpn
import tokenpos.numpy._quantized as Q
from tests.ngram_cases import make_ids, settings
from tokenpos import use_kernels
from tokenpos.tables.errors import ConfigError, TokenIdError
from tokenpos.tables.formulas.quantize import dequantize_rows, quantize_rows

V, D, L, P = 23, 12, 3, 4
NGRAM = (3, 2, 6, [61, 53])
IDS = np.random.default_rng(0).integers(0, V, (2, 7))
DTYPES = [np.float16, np.float32, np.float64]


def token(dtype=np.float32, **kw):
    return tpn.TokenEmbedding(V, D, scale=True, padding_idx=1, weight_dtype=np.int8, dtype=dtype, seed=0, **kw)


def per_layer(dtype=np.float32, **kw):
    return tpn.PerLayerEmbedding(V, L, P, weight_dtype="int8", dtype=dtype, seed=0, **kw)


def ngram(dtype=np.float32, **kw):
    return tpn.HashedNgramEmbedding(**settings(NGRAM), weight_dtype=np.int8, dtype=dtype, init_seed=0, **kw)


def definition(layer, rows, multiplier):
    return dequantize_rows(layer.weight.data, layer.weight_scale.data, np.asarray(rows), multiplier)


def same(a, b):
    assert a.dtype == b.dtype and a.shape == b.shape
    np.testing.assert_array_equal(np.ascontiguousarray(a).view(np.uint8), np.ascontiguousarray(b).view(np.uint8))


@pytest.mark.parametrize("kernels", [True, False], ids=["kernels", "plain"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_each_layer_equals_the_definition_on_its_own_rows(dtype, kernels):
    t, p, n = token(dtype), per_layer(dtype), ngram(dtype)
    for layer in (t, p, n):
        assert layer.weight.data.dtype == np.int8 and layer.weight_scale.data.dtype == np.dtype(dtype)
        assert not layer.weight.requires_grad and not layer.weight_scale.requires_grad
    ids = make_ids((2, 7))
    with use_kernels(kernels):
        same(t(IDS), definition(t, IDS, t.multiplier))
        same(p(IDS), definition(p, IDS, p.multiplier).reshape(2, 7, L, P))
        same(n(ids), definition(n, n.hash_rows(ids), 1.0).reshape(2, 7, n.out_dim))
        packed, cu = ids.reshape(-1), np.array([0, 5, 14])
        same(n(packed, cu_seqlens=cu), definition(n, n.hash_rows(packed, cu_seqlens=cu), 1.0).reshape(14, -1))
        ctx = make_ids((2, 2), seed=3)
        same(n(ids, context=ctx), definition(n, n.hash_rows(ids, context=ctx), 1.0).reshape(2, 7, -1))


def test_state_dict_round_trip_and_float_state_quantised_on_load():
    for make, float_layer in ((token, tpn.TokenEmbedding(V, D, seed=5)),
                              (per_layer, tpn.PerLayerEmbedding(V, L, P, seed=5)),
                              (ngram, tpn.HashedNgramEmbedding(**settings(NGRAM), init_seed=5))):
        a, b = make(), make()
        b.reset_parameters(seed=9)
        sd = a.state_dict()
        assert set(sd) == {"weight", "weight_scale"} and sd["weight"].dtype == np.int8
        b.load_state_dict(sd)
        same(b.weight.data, a.weight.data)
        same(b.weight_scale.data, a.weight_scale.data)
        a.load_state_dict(float_layer.state_dict())                         # a float table: quantised
        qw, sw = quantize_rows(float_layer.weight.data, np.float32)
        same(a.weight.data, qw)
        same(a.weight_scale.data, sw)
    t = tpn.TokenEmbedding.from_pretrained(float_layer.weight.data, weight_dtype=np.int8)
    same(t.weight.data, qw)


@pytest.mark.parametrize("kernels", [True, False], ids=["kernels", "plain"])
def test_attend_is_h_times_the_dequantised_table(kernels, monkeypatch):
    t = token(np.float64)
    h = np.random.default_rng(1).standard_normal((2, 3, D))
    monkeypatch.setattr(Q, "ATTEND_ROWS", 5)                                # several blocks and a short last one
    with use_kernels(kernels):
        got = t.attend(h)
    want = h @ definition(t, np.arange(V), 1.0).T
    np.testing.assert_allclose(got, want, rtol=1e-13, atol=1e-15)


def test_refusals_name_what_and_why():
    with pytest.raises(ConfigError, match="no float8 dtype"):
        tpn.TokenEmbedding(V, D, weight_dtype="float8_e4m3fn")
    with pytest.raises(ConfigError, match="weight_dtype must be None"):
        tpn.HashedNgramEmbedding(**settings(NGRAM), weight_dtype=np.int16)
    t, n = token(), ngram()
    t(IDS)
    for call, what in ((lambda: t.backward(np.ones((2, 7, D), np.float32)), "backward"),
                       (lambda: t.attend_backward(np.ones((2, V), np.float32)), "attend_backward"),
                       (lambda: t.loss(np.ones((2, D), np.float32), np.array([0, 1])), "loss"),
                       (lambda: t.resize(V + 3), "resize"),
                       (lambda: n.backward(np.ones((2, 7, n.out_dim), np.float32)), "backward"),
                       (lambda: tpn.TokenEmbedding.from_pretrained(np.ones((3, 2)), freeze=False,
                                                                   weight_dtype=np.int8), "freeze=False")):
        with pytest.raises(ConfigError, match=what):
            call()
    assert t.vocab_size == V and t.weight.data.dtype == np.int8
    with pytest.raises(TokenIdError, match=r"token id 23 at index \(1,\)"):
        t(np.array([0, V]))
