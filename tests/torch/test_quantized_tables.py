"""8-bit tables in the torch layers (``weight_dtype=torch.int8`` / ``torch.float8_e4m3fn``): TokenEmbedding,
PerLayerEmbedding and HashedNgramEmbedding each equal the definition (``tables.formulas.quantize.dequantize_rows``)
on their own rows (the token multiplier, the per-layer multiplier, the hashed rows), with kernels on and off;
state_dict round trips and float state_dicts quantised on load; the refusals; tied logits; casts that keep a
float8 table; torch.compile; no host sync on the CUDA path (fake CUDA)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import tokenpos.torch as tpt
from tests.ngram_cases import make_ids, settings
from tests.torch.fake_cuda import cpu_of, no_host_sync, to_fake_cuda
from tests.torch.test_no_host_sync import fake_cuda_module
from tokenpos import use_kernels
from tokenpos.tables.errors import ConfigError, TokenIdError
from tokenpos.tables.formulas.quantize import dequantize_rows

WEIGHT_DTYPES = [torch.int8, torch.float8_e4m3fn]
DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
V, D, L, P = 23, 12, 3, 4
NGRAM = (3, 2, 6, [61, 53])


def q_np(layer):
    """The layer's stored 8-bit table as the formulas hold it: int8, or e4m3fn bit patterns (uint8)."""
    w = layer.weight.detach().cpu()
    return (w.view(torch.uint8) if w.dtype == torch.float8_e4m3fn else w).numpy()


def definition(layer, rows, multiplier):
    """``dequantize_rows`` of the layer's own q and scales at ``rows`` (...) -> (..., C) as a tensor of the scales'
    dtype (bfloat16 scales: computed in float32 and rounded once, as the formula does for its float32 scales)."""
    s = layer.weight_scale.detach().cpu()
    s_np = s.float().numpy() if s.dtype == torch.bfloat16 else s.numpy()
    return torch.from_numpy(dequantize_rows(q_np(layer), s_np, np.asarray(rows), multiplier)).to(s.dtype)


def same(a, b):
    assert a.dtype == b.dtype and a.shape == b.shape
    assert torch.equal(a.detach().cpu().contiguous().view(torch.uint8), b.detach().cpu().contiguous().view(torch.uint8))


def token(wd, dtype=torch.float32, **kw):
    return tpt.TokenEmbedding(V, D, scale=True, padding_idx=1, weight_dtype=wd, dtype=dtype, seed=0, **kw)


def per_layer(wd, dtype=torch.float32, **kw):
    return tpt.PerLayerEmbedding(V, L, P, weight_dtype=wd, dtype=dtype, seed=0, **kw)


def ngram(wd, dtype=torch.float32, **kw):
    return tpt.HashedNgramEmbedding(**settings(NGRAM), weight_dtype=wd, dtype=dtype, init_seed=0, **kw)


IDS = torch.from_numpy(np.random.default_rng(0).integers(0, V, (2, 7)))


@pytest.mark.parametrize("kernels", [True, False], ids=["kernels", "plain"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("wd", WEIGHT_DTYPES)
def test_each_layer_equals_the_definition_on_its_own_rows(wd, dtype, kernels):
    t, p, n = token(wd, dtype), per_layer(wd, dtype), ngram(wd, dtype)
    for layer in (t, p, n):
        assert layer.weight.dtype == wd and layer.weight_scale.dtype == dtype
        assert not layer.weight.requires_grad and not layer.weight_scale.requires_grad
    ids = torch.from_numpy(make_ids((2, 7)))
    with use_kernels(kernels):
        same(t(IDS), definition(t, IDS.numpy(), t.multiplier))
        same(p(IDS), definition(p, IDS.numpy(), p.multiplier).reshape(2, 7, L, P))
        rows = n.hash_rows(ids)                                             # (B, L, K): the layer's own rows
        same(n(ids), definition(n, rows.numpy(), 1.0).reshape(2, 7, n.out_dim))
        packed, cu = ids.reshape(-1), torch.tensor([0, 5, 14])
        same(n(packed, cu_seqlens=cu), definition(n, n.hash_rows(packed, cu_seqlens=cu).numpy(), 1.0).reshape(14, -1))


@pytest.mark.parametrize("wd", WEIGHT_DTYPES)
def test_the_quantised_table_is_the_float_table_within_its_rounding(wd):
    f = tpt.TokenEmbedding(V, D, seed=3)
    q = tpt.TokenEmbedding.from_pretrained(f.weight, weight_dtype=wd)
    err = (q(IDS) - f(IDS)).abs()
    rowmax = f.weight.detach().abs().max(dim=1).values[IDS][..., None]
    assert (err <= rowmax * (0.5 / 127 if wd == torch.int8 else 2.0 ** -4) * 1.01).all()


@pytest.mark.parametrize("wd", WEIGHT_DTYPES)
def test_state_dict_round_trip_and_float_state_quantised_on_load(wd):
    for make, float_layer in ((token, tpt.TokenEmbedding(V, D, seed=5)),
                              (per_layer, tpt.PerLayerEmbedding(V, L, P, seed=5)),
                              (ngram, tpt.HashedNgramEmbedding(**settings(NGRAM), init_seed=5))):
        a, b = make(wd), make(wd)
        b.reset_parameters(seed=9)
        sd = a.state_dict()
        assert set(sd) == {"weight", "weight_scale"} and sd["weight"].dtype == wd
        b.load_state_dict(sd)
        same(b.weight, a.weight)
        same(b.weight_scale, a.weight_scale)
        a.load_state_dict(float_layer.state_dict())                         # a float table: quantised
        want = make(wd)
        from tokenpos.torch._quantized import quantize_table
        qw, sw = quantize_table(float_layer.weight, wd, torch.float32)
        same(a.weight, qw)
        same(a.weight_scale, sw)
        # inside a model too (the load_state_dict pre-hook)
        outer = torch.nn.ModuleDict({"t": want})
        outer.load_state_dict({"t.weight": float_layer.weight.detach()})
        same(want.weight, qw)
        # a NumPy float state_dict loads the same way
        c = make(wd)
        c.load_state_dict({"weight": float_layer.weight.detach().numpy()})
        same(c.weight, qw)


def test_refusals_name_what_and_why():
    with pytest.raises(ConfigError, match="weight_dtype must be None"):
        tpt.TokenEmbedding(V, D, weight_dtype=torch.float16)
    with pytest.raises(ConfigError, match="weight_dtype must be None"):
        ngram(torch.uint8)
    for wd in WEIGHT_DTYPES:
        with pytest.raises(ConfigError, match="sparse=True"):
            token(wd, sparse=True)
        with pytest.raises(ConfigError, match="sparse=True"):
            ngram(wd, sparse=True)
        with pytest.raises(ConfigError, match="gradient"):
            per_layer(wd, sparse=True)
        t = token(wd)
        with pytest.raises(ConfigError, match="resize is not available for an 8-bit TokenEmbedding"):
            t.resize(V + 3)
        with pytest.raises(ConfigError, match="loss"):
            t.loss(torch.randn(2, D), torch.tensor([0, 1]))
        with pytest.raises(ConfigError, match="freeze=False"):
            tpt.TokenEmbedding.from_pretrained(torch.randn(V, D), freeze=False, weight_dtype=wd)
        assert t.vocab_size == V and t.weight.dtype == wd                   # state unchanged
        with pytest.raises(TokenIdError, match=r"token id 23 at index \(1,\)"):
            t(torch.tensor([0, V]))
        with pytest.raises(TokenIdError, match=r"token id -1"):
            per_layer(wd)(torch.tensor([-1]))


@pytest.mark.parametrize("wd", WEIGHT_DTYPES)
def test_attend_is_h_times_the_dequantised_table(wd, monkeypatch):
    import tokenpos.torch._quantized as Q

    t = token(wd)
    h = torch.randn(2, 3, D, dtype=torch.float64).float()
    full = definition(t, np.arange(V), 1.0)                                 # (V, D), multiplier 1
    want = h @ full.T
    monkeypatch.setattr(Q, "ATTEND_ROWS", 5)                                # several blocks and a short last one
    got = t.attend(h)
    assert got.shape == (2, 3, V)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


def test_a_cast_keeps_a_float8_table_and_casts_its_scales():
    t = token(torch.float8_e4m3fn)
    q = t.weight.detach().view(torch.uint8).clone()
    t.half()
    assert t.weight.dtype == torch.float8_e4m3fn and t.weight_scale.dtype == torch.float16
    assert torch.equal(t.weight.view(torch.uint8), q)
    same(t(IDS), definition(t, IDS.numpy(), t.multiplier))
    t.to(torch.float64)
    assert t.weight.dtype == torch.float8_e4m3fn and t(IDS).dtype == torch.float64


@pytest.mark.parametrize("wd", WEIGHT_DTYPES)
def test_compiles_whole_and_equals_eager(wd):
    for layer, ids in ((token(wd), IDS), (per_layer(wd), IDS), (ngram(wd), torch.from_numpy(make_ids((2, 7))))):
        torch._dynamo.reset()
        compiled = torch.compile(layer, fullgraph=True, backend="aot_eager")
        same(compiled(ids), layer(ids))


@pytest.mark.parametrize("wd", WEIGHT_DTYPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_no_host_sync_on_the_cuda_path(wd, dtype, monkeypatch):
    import tokenpos.kernels.triton.quantized as TQ

    calls = []
    kernel = TQ.quantized_embedding
    monkeypatch.setattr(TQ, "quantized_embedding", lambda *a: calls.append(1) or kernel(*a))
    ids = torch.from_numpy(make_ids((2, 7)))
    for make, x in ((token, IDS), (per_layer, IDS), (ngram, ids)):
        layer = make(wd, dtype).eval()
        want = layer(x)
        dev = fake_cuda_module(make(wd, dtype).eval())
        assert dev.weight.dtype == wd
        fx = to_fake_cuda(x)
        with no_host_sync():
            got = dev(fx)
        same(cpu_of(got), want)
    assert len(calls) == 3                                                  # the Triton kernel ran, once a layer


def test_the_op_checks_shapes_and_dtypes_on_every_path():
    from tokenpos.torch.ops.quantized import quantized_embedding

    t = token(torch.float8_e4m3fn)
    bits, scale, ids = t.weight.view(torch.uint8), t.weight_scale.detach(), IDS
    for kernels in (True, False):
        with use_kernels(kernels):
            same(quantized_embedding(bits, scale, ids, 2.0, True), definition(t, IDS.numpy(), 2.0))
            with pytest.raises(ConfigError, match=r"uint8 table of float8 e4m3fn bits \(float8=True\)"):
                quantized_embedding(t.weight, scale, ids, 1.0, True)
            with pytest.raises(ConfigError, match=r"int8 table \(float8=False\), got torch.uint8"):
                quantized_embedding(bits, scale, ids, 1.0, False)
            with pytest.raises(ConfigError, match="scale must be"):
                quantized_embedding(bits, scale[:-1], ids, 1.0, True)
            with pytest.raises(ConfigError, match="ids must be int32 or int64"):
                quantized_embedding(bits, scale, ids.to(torch.int16), 1.0, True)
