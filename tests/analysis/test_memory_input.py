"""The input-table memory rows (``analysis.memory_input``): every size equals what the real layers allocate, built
tiny with the same formula; the presets equal their configs (transformers' Gemma3nTextConfig, the Engram
reference's EngramConfig)."""

from __future__ import annotations

from dataclasses import fields

import numpy as np
import pytest
import torch

import tokenpos.numpy as tpn
import tokenpos.torch as tpt
from tests.ngram_cases import PAD_ID, make_compress
from tests.ngram_reference import EngramConfig, NgramHashMapping
from tokenpos.analysis.memory_input import (
    ENGRAM_DEMO,
    GEMMA3N,
    EngramSettings,
    PerLayerConfig,
    engram_tables,
    input_tables,
    per_layer_table,
)

TINY_PER_LAYER = PerLayerConfig("tiny", 11, 3, 4, "test")
TINY_ENGRAM = EngramSettings((61, 53), 3, 6, 2, (1, 15))


def _torch_nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def test_per_layer_sizes_are_the_layers_own():
    tab = per_layer_table(TINY_PER_LAYER)
    V, L, P = 11, 3, 4
    f32 = tpn.PerLayerEmbedding(V, L, P, seed=0)
    assert f32.weight.data.shape == (tab.rows, tab.cols) and tab.params == f32.weight.data.size
    assert tab.nbytes("fp32") == f32.weight.data.nbytes
    q = tpn.PerLayerEmbedding(V, L, P, weight_dtype=np.int8, seed=0)
    assert tab.nbytes("int8") == q.weight.data.nbytes + q.weight_scale.data.nbytes
    tq = tpt.PerLayerEmbedding(V, L, P, weight_dtype=torch.int8, seed=0)
    assert tab.nbytes("int8") == _torch_nbytes(tq.weight) + _torch_nbytes(tq.weight_scale)
    bf = tpt.PerLayerEmbedding(V, L, P, dtype=torch.bfloat16, seed=0)
    assert tab.nbytes("bf16") == _torch_nbytes(bf.weight)
    f8 = tpt.PerLayerEmbedding(V, L, P, weight_dtype=torch.float8_e4m3fn, seed=0)
    assert tab.nbytes("fp8") == _torch_nbytes(f8.weight) + _torch_nbytes(f8.weight_scale)
    ids = torch.tensor([[0, 3, 5], [9, 9, 1]])
    assert tab.host_device_bytes(ids.numel()) == _torch_nbytes(f8(ids))     # the step's rows sent to the device


def test_hashed_sizes_are_the_layers_own_in_every_storage():
    tables = engram_tables(TINY_ENGRAM)
    assert [t.name.split(",")[1].split("(")[0].strip() for t in tables] == ["layer 1", "layer 15"]
    for layer, tab in zip(TINY_ENGRAM.layer_ids, tables, strict=True):
        kw = dict(engram_vocab_size=list(TINY_ENGRAM.engram_vocab_size), max_ngram_size=3, n_embed_per_ngram=6,
                  n_head_per_ngram=2, layer_id=layer, layer_ids=list(TINY_ENGRAM.layer_ids), pad_id=PAD_ID, seed=0,
                  compress=make_compress(0))
        n = tpn.HashedNgramEmbedding(**kw)
        assert n.weight.data.shape == (tab.rows, tab.cols) and tab.nbytes("fp32") == n.weight.data.nbytes
        assert tab.lookups_per_token == n.spec.num_heads
        t = tpt.HashedNgramEmbedding(**kw, dtype=torch.bfloat16)
        assert tab.nbytes("bf16") == _torch_nbytes(t.weight)
        for name, wd in (("int8", torch.int8), ("fp8", torch.float8_e4m3fn)):
            q = tpt.HashedNgramEmbedding(**kw, weight_dtype=wd)
            assert tab.nbytes(name) == _torch_nbytes(q.weight) + _torch_nbytes(q.weight_scale)
        ids = torch.tensor([[0, 3, 5, 9]])
        assert tab.host_device_bytes(ids.numel()) == _torch_nbytes(t.float()(ids))


def test_training_counts_match_a_lazy_adam_step():
    """Row-sparse training: the lazy optimiser's dense m and v (8 B/param) + fp32 weights, and a gradient of as many
    rows as the step touched (distinct ids: T rows), as train_sparse_bytes counts them."""
    tab = per_layer_table(TINY_PER_LAYER)
    layer = tpn.PerLayerEmbedding(11, 3, 4, seed=0)
    opt = tpn.optim.Adam(layer.parameters(), sparse_mode="lazy")
    ids = np.array([[0, 3, 5, 9]])
    layer(ids)
    layer.backward(np.ones((1, 4, 3, 4), np.float32))
    g = layer.weight.sparse_grad
    assert g is not None and g.indices.size == tab.grad_rows(ids.size)
    grad_bytes = g.rows.nbytes + g.indices.nbytes
    opt.step()
    state = opt.state[id(layer.weight)]
    assert tab.train_sparse_bytes(ids.size) == layer.weight.data.nbytes + state["m"].nbytes + state["v"].nbytes \
        + grad_bytes
    assert tab.train_dense_bytes == 4 * layer.weight.data.nbytes        # weights, dense grad, m, v
    assert tab.grad_rows(10**6) == tab.rows                             # never more rows than the table has


def test_hashed_gradient_rows_are_at_most_tokens_times_heads():
    tab = engram_tables(TINY_ENGRAM)[0]
    layer = tpn.HashedNgramEmbedding(engram_vocab_size=[61, 53], max_ngram_size=3, n_embed_per_ngram=6,
                                     n_head_per_ngram=2, layer_id=1, layer_ids=[1, 15], pad_id=PAD_ID, seed=0,
                                     compress=make_compress(0))
    ids = np.arange(10, 16)[None, :]
    out = layer(ids)
    layer.backward(np.ones_like(out))
    g = layer.weight.sparse_grad
    assert g is not None and 0 < g.indices.size <= tab.grad_rows(ids.size) == ids.size * 4


def test_gemma3n_presets_are_the_hf_configs():
    transformers = pytest.importorskip("transformers")
    hf = transformers.Gemma3nTextConfig()           # the E4B configuration (its docstring)
    e4b = GEMMA3N["gemma3n-e4b"]
    assert (e4b.vocab_size_per_layer_input, e4b.hidden_size_per_layer_input, e4b.num_hidden_layers) == (
        hf.vocab_size_per_layer_input, hf.hidden_size_per_layer_input, hf.num_hidden_layers)
    e2b = GEMMA3N["gemma3n-e2b"]                    # E2B: the 30-layer slice, the same per-layer vocab and width
    assert (e2b.vocab_size_per_layer_input, e2b.hidden_size_per_layer_input) == (
        hf.vocab_size_per_layer_input, hf.hidden_size_per_layer_input)
    assert e2b.num_hidden_layers < e4b.num_hidden_layers
    tab = per_layer_table(e4b)
    assert (tab.rows, tab.cols) == (hf.vocab_size_per_layer_input,
                                    hf.num_hidden_layers * hf.hidden_size_per_layer_input)


def test_engram_preset_is_the_reference_config_and_its_rows_the_references_primes():
    ref = EngramConfig()
    names = [f.name for f in fields(EngramSettings)]
    assert {n: tuple(v) if isinstance(v, list) else v for n, v in vars(ref).items() if n in names} == {
        n: getattr(ENGRAM_DEMO, n) for n in names}
    mapping = NgramHashMapping(engram_vocab_size=ref.engram_vocab_size, max_ngram_size=ref.max_ngram_size,
                               n_embed_per_ngram=ref.n_embed_per_ngram, n_head_per_ngram=ref.n_head_per_ngram,
                               layer_ids=ref.layer_ids, compress=make_compress(0), pad_id=ref.pad_id, seed=ref.seed)
    tables = engram_tables()
    assert [t.rows for t in tables] == [sum(sum(p) for p in mapping.vocab_size_across_layers[layer])
                                        for layer in ref.layer_ids]
    assert all(t.cols == ref.n_embed_per_ngram // ref.n_head_per_ngram for t in tables)


def test_every_row_serialises():
    rows = [t.to_dict(4096) for t in input_tables()]
    assert [r["model"] for r in rows] == ["gemma3n-e2b", "gemma3n-e4b", "engram-demo", "engram-demo"]
    assert all(r["bytes"]["fp32"] == 2 * r["bytes"]["bf16"] == 4 * r["params"] for r in rows)
