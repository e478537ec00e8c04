"""torch.per_layer: PerLayerEmbedding through the token embedding's op; HF's scale bit for bit in every dtype."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import tokenpos.numpy as tpn
import tokenpos.torch as tpt
from tests.tolerances import TOL

V, L, P = 23, 3, 6
IDS = torch.tensor([[0, 0, 5, 9, 5, 22], [3, 3, 7, 0, 11, 2]])                  # padding and duplicates


def hf_rows(weight: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """HF Gemma 3n / 4's scaled table and ``get_per_layer_inputs``' reshape, written as HF writes them."""
    embed_scale = torch.tensor(P ** 0.5)                                        # the float32 buffer
    return (F.embedding(ids, weight) * embed_scale.to(weight.dtype)).reshape(*ids.shape, L, P)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
def test_forward_equals_hfs_scaled_lookup_bit_for_bit(kernel_calls, dtype: torch.dtype) -> None:
    layer = tpt.PerLayerEmbedding(V, L, P, padding_idx=0, dtype=dtype, seed=0)
    with torch.no_grad():
        layer.weight.normal_(generator=torch.Generator().manual_seed(1))          # off bf16-friendly values
    out = layer(IDS)
    assert out.shape == (2, 6, L, P) and out.dtype == dtype
    assert torch.equal(out, hf_rows(layer.weight.detach(), IDS))
    assert kernel_calls["forward"] == (0 if dtype == torch.float16 else 1)      # the token embedding's kernel


def test_the_multiplier_follows_the_weights_dtype_and_scale_false_is_one() -> None:
    layer = tpt.PerLayerEmbedding(V, L, 12, seed=0)
    assert layer.multiplier == float(np.float32(12 ** 0.5))
    layer.to(torch.bfloat16)
    assert layer.multiplier == float(torch.tensor(12 ** 0.5).to(torch.bfloat16)) == 3.46875
    assert tpt.PerLayerEmbedding(V, L, 12, scale=False, seed=0).multiplier == 1.0
    plain = tpt.PerLayerEmbedding(V, L, P, scale=False, seed=0)
    assert torch.equal(plain(IDS), plain.weight.detach()[IDS].reshape(2, 6, L, P))


def test_same_seed_same_table_as_numpy_and_factory_kwargs() -> None:
    t = tpt.PerLayerEmbedding(V, L, P, padding_idx=4, seed=3)
    n = tpn.PerLayerEmbedding(V, L, P, padding_idx=4, seed=3)
    np.testing.assert_array_equal(t.weight.detach().numpy(), n.weight.data)
    assert list(t.state_dict()) == ["weight"] and t.weight.shape == (V, L * P)
    assert not t.weight[4].any()
    meta = tpt.PerLayerEmbedding(V, L, P, device="meta", dtype=torch.float64)
    assert meta.weight.is_meta and meta.weight.dtype == torch.float64
    assert meta(torch.zeros(2, 3, dtype=torch.int64, device="meta")).shape == (2, 3, L, P)
    t.reset_parameters(seed=9)
    n.reset_parameters(seed=9)
    np.testing.assert_array_equal(t.weight.detach().numpy(), n.weight.data)
    a = tpt.PerLayerEmbedding(V, L, P, generator=torch.Generator().manual_seed(5))
    b = tpt.PerLayerEmbedding(V, L, P, generator=torch.Generator().manual_seed(5))
    assert torch.equal(a.weight, b.weight)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_autograd_gives_the_scaled_row_sums_and_no_padding_gradient(kernel_calls, dtype: torch.dtype) -> None:
    layer = tpt.PerLayerEmbedding(V, L, P, padding_idx=0, dtype=dtype, seed=0)
    g = torch.randn(2, 6, L, P, dtype=dtype, generator=torch.Generator().manual_seed(0))
    layer(IDS).backward(g)
    want = torch.zeros(V, L * P, dtype=torch.float64)
    want.index_add_(0, IDS.reshape(-1), g.reshape(-1, L * P).double() * layer.multiplier)
    want[0] = 0
    tol = TOL["kernels.float32"] if dtype == torch.float32 else TOL["kernels.float64"]
    np.testing.assert_allclose(layer.weight.grad.double().numpy(), want.numpy(), **tol)
    assert kernel_calls["backward"] == 1


def test_sparse_gradient_equals_the_dense_one() -> None:
    dense = tpt.PerLayerEmbedding(V, L, P, padding_idx=0, seed=0)
    sparse = tpt.PerLayerEmbedding(V, L, P, padding_idx=0, sparse=True, seed=0)
    for m in (dense, sparse):
        m(IDS).pow(2).sum().backward()
    assert torch.equal(sparse(IDS), dense(IDS))
    assert sparse.weight.grad.is_sparse
    torch.testing.assert_close(sparse.weight.grad.to_dense(), dense.weight.grad, **TOL["hf.patch"])


def test_double_backward_through_the_op() -> None:
    layer = tpt.PerLayerEmbedding(V, L, P, dtype=torch.float64, seed=0)
    (g,) = torch.autograd.grad(layer(IDS).pow(3).sum(), layer.weight, create_graph=True)
    (gg,) = torch.autograd.grad(g.pow(2).sum(), layer.weight)
    w = layer.weight.detach().requires_grad_()
    (g_ref,) = torch.autograd.grad(hf_rows(w, IDS).pow(3).sum(), w, create_graph=True)
    (gg_ref,) = torch.autograd.grad(g_ref.pow(2).sum(), w)
    np.testing.assert_allclose(gg.numpy(), gg_ref.numpy(), **TOL["kernels.float64"])


def test_an_id_out_of_range_is_the_shared_token_id_error() -> None:
    layer = tpt.PerLayerEmbedding(V, L, P, seed=0)
    for bad, text in ((torch.tensor([[1, V]]), rf"token id {V} at index \(0, 1\) is out of range \[0, {V}\)"),
                      (torch.tensor([2, -1], dtype=torch.int32), r"token id -1 at index \(1,\)"),
                      ([1, V + 1], rf"token id {V + 1} at index \(1,\)"),
                      (torch.tensor([1.0]), "float32")):
        with pytest.raises(tpt.TokenIdError, match=text):
            layer(bad)


@pytest.mark.parametrize("make", [lambda x: torch.tensor(x), lambda x: torch.tensor(x, dtype=torch.int32),
                                  lambda x: torch.tensor(x, dtype=torch.uint8),
                                  lambda x: torch.tensor(x, dtype=torch.uint64), lambda x: x],
                         ids=["int64", "int32", "uint8", "uint64", "list"])
def test_out_of_range_zero_reads_row_zero_as_hf_gemma3n_does(make) -> None:
    layer = tpt.PerLayerEmbedding(V, L, P, out_of_range="zero", seed=0)          # row 0 holds values here
    raw = [[3, V, V + 100], [200, 0, 22]]
    want = torch.tensor(raw)
    want = torch.where(torch.logical_and(want >= 0, want < V), want, 0)        # HF's get_per_layer_inputs
    assert torch.equal(layer(make(raw)), hf_rows(layer.weight.detach(), want))


def test_out_of_range_zero_still_refuses_negative_ids_and_sends_gradient_to_row_zero() -> None:
    layer = tpt.PerLayerEmbedding(V, L, P, out_of_range="zero", seed=0)
    with pytest.raises(tpt.TokenIdError, match=r"token id -2 at index \(1,\)"):
        layer(torch.tensor([V, -2]))
    for bad, text in ((torch.tensor([1.0, 2.0]), "float32"), ([V, -7], r"token id -7 at index \(1,\)"),
                      (torch.tensor([V, 2 ** 63 + 5], dtype=torch.uint64), None)):
        if text is None:                                      # past int64: past the table too, so row 0
            assert torch.equal(layer(bad), hf_rows(layer.weight.detach(), torch.tensor([0, 0])))
            continue
        with pytest.raises(tpt.TokenIdError, match=text):
            layer(bad)
    layer(torch.tensor([V, V + 5, 4])).sum().backward()
    rows = torch.nonzero(layer.weight.grad.abs().sum(1)).reshape(-1).tolist()
    assert rows == [0, 4]
    torch.testing.assert_close(layer.weight.grad[0], torch.full((L * P,), 2 * layer.multiplier))


def test_compiled_forward_and_backward_equal_eager() -> None:
    eager = tpt.PerLayerEmbedding(V, L, P, padding_idx=0, out_of_range="zero", seed=0)
    traced = tpt.PerLayerEmbedding(V, L, P, padding_idx=0, out_of_range="zero", seed=0)
    torch._dynamo.reset()
    compiled = torch.compile(traced, fullgraph=True, backend="eager")
    ids = IDS + 2                                                                # some ids past the table
    compiled(ids).pow(2).sum().backward()
    eager(ids).pow(2).sum().backward()
    assert torch.equal(compiled(ids), eager(ids))
    torch.testing.assert_close(traced.weight.grad, eager.weight.grad, rtol=0.0, atol=0.0)


def test_bad_constructor_arguments_name_the_argument() -> None:
    for kw, text in (({"out_of_range": "clamp"}, "out_of_range must be one of 'raise', 'zero'; got 'clamp'"),
                     ({"dtype": torch.int64}, "dtype must be one of"), ({"sparse": 1}, "sparse"),
                     ({"padding_idx": -1}, "padding_idx")):
        with pytest.raises(tpt.ConfigError, match=text):
            tpt.PerLayerEmbedding(V, L, P, **kw)
    assert "PerLayerEmbedding(23, 3, 6, padding_idx=0, out_of_range='zero'" in repr(
        tpt.PerLayerEmbedding(V, L, P, padding_idx=0, out_of_range="zero", seed=0))


# -- int8 tables (weight_dtype=torch.int8) -----------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_an_int8_table_reads_its_definition_and_only_the_gathered_rows(dtype: torch.dtype) -> None:
    layer = tpt.PerLayerEmbedding(V, L, P, padding_idx=0, weight_dtype=torch.int8, dtype=dtype, seed=0)
    q, s = layer.weight, layer.weight_scale
    assert q.dtype == torch.int8 and s.dtype == dtype and not q.requires_grad and not s.requires_grad
    assert list(layer.state_dict()) == ["weight", "weight_scale"]
    ct = torch.float64 if dtype == torch.float64 else torch.float32
    want = ((q.to(ct)[IDS] * s.to(ct)[IDS, None]) * layer.multiplier).to(dtype).reshape(2, 6, L, P)
    out = layer(IDS)
    assert out.dtype == dtype and torch.equal(out, want) and not out.requires_grad
    assert layer.multiplier == float(torch.tensor(P ** 0.5).to(dtype))


def test_an_int8_table_equals_numpy_and_compiles_whole() -> None:
    layer = tpt.PerLayerEmbedding(V, L, P, padding_idx=0, out_of_range="zero", weight_dtype=torch.int8, seed=2)
    n = tpn.PerLayerEmbedding(V, L, P, padding_idx=0, out_of_range="zero", weight_dtype=np.int8, seed=2)
    np.testing.assert_array_equal(layer.weight.numpy(), n.weight.data)                  # same draw, same rounding
    ids = IDS + 3                                                                      # some past the table
    np.testing.assert_array_equal(layer(ids).numpy(), n(ids.numpy()))
    other = tpn.PerLayerEmbedding(V, L, P, weight_dtype=np.int8, seed=7)
    other.load_state_dict(layer.state_dict())                                          # across backends
    np.testing.assert_array_equal(other(IDS.numpy()), layer(IDS).numpy())
    torch._dynamo.reset()
    compiled = torch.compile(layer, fullgraph=True, backend="eager")
    assert torch.equal(compiled(ids), layer(ids))


def test_an_int8_table_refuses_bad_ids_and_bad_arguments() -> None:
    layer = tpt.PerLayerEmbedding(V, L, P, weight_dtype=torch.int8, seed=0)
    for bad, text in ((torch.tensor([1, V]), rf"token id {V} at index \(1,\)"),
                      (torch.tensor([-1, 2]), r"token id -1 at index \(0,\)")):
        with pytest.raises(tpt.TokenIdError, match=text):
            layer(bad)
    with pytest.raises(tpt.ConfigError, match="weight_dtype must be None"):
        tpt.PerLayerEmbedding(V, L, P, weight_dtype=torch.float16)
    with pytest.raises(tpt.ConfigError, match="8-bit table takes no gradient"):
        tpt.PerLayerEmbedding(V, L, P, weight_dtype=torch.int8, sparse=True)
    meta = tpt.PerLayerEmbedding(V, L, P, weight_dtype=torch.int8, device="meta")
    assert meta(torch.zeros(2, 3, dtype=torch.int64, device="meta")).shape == (2, 3, L, P)
