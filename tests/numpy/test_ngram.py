"""tokenpos.numpy.HashedNgramEmbedding: the reference's hashing and vectors, its row-sparse backward against finite
differences (float64), packed rows against each document alone, decoding step by step against the full sequence,
bad ids and settings refused by name with nothing changed, the kernel against the formula path."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import tokenpos
from tests.ngram_cases import CASES, LAYER_IDS, PAD_ID, V_OLD, make_ids, reference_mapping, settings
from tests.ngram_reference import MultiHeadEmbedding
from tests.numpy.gradcheck import check_grads
from tests.tolerances import TOL
from tokenpos.numpy import HashedNgramEmbedding, optim
from tokenpos.tables.errors import ConfigError, PositionError, TokenIdError


def _layer(case, layer_id=1, dtype=np.float64, **kw):
    return HashedNgramEmbedding(**settings(case, layer_id), dtype=dtype, init_seed=3, **kw)


@pytest.fixture(params=[True, False], ids=["kernel", "formula"])
def kernels(request):
    before = tokenpos.kernels_enabled()
    tokenpos.set_kernels(request.param)
    yield request.param
    tokenpos.set_kernels(before)


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("layer_id", LAYER_IDS)
def test_equals_reference_hash_and_vectors(case, layer_id, kernels):
    layer = _layer(case, layer_id)
    ref = reference_mapping(case)
    ids = make_ids((3, 10))
    hashed = ref.hash(ids)[layer_id]
    np.testing.assert_array_equal(layer.hash_rows(ids) - layer.spec.offsets, hashed)
    mhe = MultiHeadEmbedding([int(p) for p in layer.spec.primes], layer.spec.head_dim).double()
    assert tuple(mhe.embedding.weight.shape) == layer.weight.data.shape == layer.state_dict()["weight"].shape
    with torch.no_grad():
        mhe.embedding.weight.copy_(torch.from_numpy(layer.weight.data))
        want = mhe(torch.from_numpy(hashed)).flatten(start_dim=-2).numpy()
    out = layer(ids)
    assert out.shape == (3, 10, (case[0] - 1) * case[2]) == want.shape
    np.testing.assert_array_equal(out, want)


@pytest.mark.parametrize("case", CASES[1:3])
def test_backward_finite_differences(case, kernels):
    ids = make_ids((2, 5))
    check_grads(lambda: _layer(case, 15), ids, tol="fd.linear")


@pytest.mark.parametrize("case", CASES)
def test_backward_is_row_sparse_and_equals_scatter_add(case, kernels):
    layer = _layer(case)
    ids = make_ids((3, 8))
    out = layer(ids)
    g = np.random.default_rng(5).standard_normal(out.shape)
    layer.backward(g)
    sparse = layer.weight.sparse_grad
    assert sparse is not None
    rows = layer.hash_rows(ids).reshape(-1)
    np.testing.assert_array_equal(sparse.indices, np.unique(rows))
    dense = np.zeros_like(layer.weight.data)
    np.add.at(dense, rows, g.reshape(-1, layer.spec.head_dim))
    np.testing.assert_allclose(layer.weight.grad, dense, **TOL["grad.float64"])


def test_lazy_optimiser_touches_only_the_looked_up_rows():
    layer = _layer(CASES[2], dtype=np.float32)
    before = layer.weight.data.copy()
    ids = make_ids((2, 6))
    opt = optim.Adam(layer.parameters(), lr=0.1, sparse_mode="lazy")
    layer.backward(np.ones_like(layer(ids)))
    opt.step()
    changed = np.flatnonzero(np.any(layer.weight.data != before, axis=1))
    np.testing.assert_array_equal(changed, np.unique(layer.hash_rows(ids)))


@pytest.mark.parametrize("case", CASES)
def test_packed_equals_each_document_alone(case, kernels):
    layer = _layer(case, 15)
    docs = [make_ids((1, n), seed=n)[0] for n in (3, 1, 7, 4)]
    cu = np.cumsum([0] + [len(d) for d in docs])
    packed = layer(np.concatenate(docs), cu_seqlens=cu)
    alone = np.concatenate([layer(d[None])[0] for d in docs])
    np.testing.assert_array_equal(packed, alone)
    g = np.random.default_rng(2).standard_normal(packed.shape)
    layer.zero_grad()
    layer(np.concatenate(docs), cu_seqlens=cu)
    layer.backward(g)
    packed_grad = layer.weight.grad.copy()
    layer.zero_grad()
    for d, gd in zip(docs, np.split(g, cu[1:-1]), strict=True):
        layer(d[None])
        layer.backward(gd[None])
    np.testing.assert_allclose(packed_grad, layer.weight.grad, **TOL["grad.float64"])


@pytest.mark.parametrize("case", CASES)
def test_decode_step_by_step_equals_full_sequence(case, kernels):
    layer = _layer(case)
    c = case[0] - 1
    ids = make_ids((2, 9))
    full = layer(ids)
    steps = [layer(ids[:, t:t + 1], context=ids[:, max(0, t - c):t]) for t in range(9)]
    np.testing.assert_array_equal(np.concatenate(steps, axis=1), full)
    np.testing.assert_array_equal(layer(ids[:, 5:], context=ids[:, 5 - c:5]), full[:, 5:])
    docs_cu = np.array([0, 4, 9])
    packed = layer(ids[0], cu_seqlens=docs_cu, context=np.stack([ids[1, -c:], ids[1, :c]]))
    np.testing.assert_array_equal(packed[4:], layer(ids[None, 0, 4:], context=ids[None, 1, :c])[0])


def test_kernel_equals_formula_float32():
    layer = _layer(CASES[3], dtype=np.float32)
    ids = make_ids((4, 33))
    g = np.random.default_rng(1).standard_normal((4, 33, layer.out_dim)).astype(np.float32)
    tokenpos.set_kernels(True)
    try:
        a = layer(ids)
        layer.backward(g)
        ga = layer.weight.sparse_grad
        layer.zero_grad()
        tokenpos.set_kernels(False)
        b = layer(ids)
        layer.backward(g)
        gb = layer.weight.sparse_grad
    finally:
        tokenpos.set_kernels(True)
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(ga.indices, gb.indices)
    np.testing.assert_allclose(ga.rows, gb.rows, **TOL["kernels.float32"])


def test_float16_table():
    layer = _layer(CASES[1], dtype=np.float16)
    ids = make_ids((2, 4))
    out = layer(ids)
    assert out.dtype == np.float16
    np.testing.assert_array_equal(out, layer.weight.data[layer.hash_rows(ids)].reshape(out.shape))
    layer.backward(np.ones_like(out))
    assert layer.weight.sparse_grad.rows.dtype == np.float16


@pytest.mark.parametrize("bad, where", [(V_OLD, "(1, 2)"), (-1, "(1, 2)")])
def test_bad_ids_refused_by_value_nothing_changed(bad, where, kernels):
    layer = _layer(CASES[1])
    good = make_ids((2, 4))
    layer(good)
    cache = layer._cache
    ids = good.copy()
    ids[1, 2] = bad
    with pytest.raises(TokenIdError, match=rf"token id {bad} at index \(1, 2\) is out of range \[0, {V_OLD}\)"):
        layer(ids)
    assert layer._cache is cache
    with pytest.raises(TokenIdError, match=rf"token id {bad}"):
        layer(good, context=np.full((2, 1), bad))
    with pytest.raises(TokenIdError, match="integers"):
        layer(good.astype(np.float32))


def test_bad_shapes_and_settings_refused():
    layer = _layer(CASES[1])
    with pytest.raises(ConfigError, match="context must be"):
        layer(make_ids((2, 4)), context=make_ids((2, 3)))
    with pytest.raises(ConfigError, match="ids must be"):
        layer(make_ids((2, 2, 2)))
    with pytest.raises(PositionError, match="cu_seqlens"):
        layer(make_ids((6,)), cu_seqlens=np.array([0, 2, 5]))
    s = settings(CASES[1])
    for key, value, match in (("n_embed_per_ngram", 5, "multiple of n_head_per_ngram"),
                              ("layer_id", 2, "layer_id 2 is not in layer_ids"),
                              ("pad_id", V_OLD, "pad_id must be <="),
                              ("compress", np.array([-1, 0]), "compress must map"),
                              ("engram_vocab_size", [61], "engram_vocab_size")):
        with pytest.raises(ConfigError, match=match):
            HashedNgramEmbedding(**{**s, key: value})


def test_state_dict_round_trip():
    a, b = _layer(CASES[2]), HashedNgramEmbedding(**settings(CASES[2]), dtype=np.float64, init_seed=9)
    b.load_state_dict(a.state_dict())
    ids = make_ids((2, 5))
    np.testing.assert_array_equal(a(ids), b(ids))
    assert list(a.state_dict()) == ["weight"]
    assert a.state_dict()["weight"].shape == (int(a.spec.primes.sum()), CASES[2][2] // CASES[2][1])
    assert a.spec.pad == settings(CASES[2])["compress"][PAD_ID]
