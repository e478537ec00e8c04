"""tokenpos.torch.HashedNgramEmbedding and EngramMemory: the reference's hash ids and vectors (its
``MultiHeadEmbedding`` given the same weights), the whole module equal to the reference's ``Engram.forward``
(hc_mult 1 and 4), gradients equal to the reference's ``nn.Embedding``, kernel == plain path, packed rows and
decoding, bad ids refused by name, double backward (opcheck: tests/torch/test_ops.py, on ``ops.samples()``)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.ngram_cases import CASES, LAYER_IDS, V_OLD, make_compress, make_ids, reference_mapping, settings
from tests.ngram_reference import BackBoneConfig, Engram, EngramConfig, MultiHeadEmbedding
from tests.tolerances import TOL
from tokenpos import use_kernels
from tokenpos.tables.errors import ConfigError, TokenIdError
from tokenpos.torch import EngramMemory, HashedNgramEmbedding


def _layer(case, layer_id=1, dtype=torch.float64):
    return HashedNgramEmbedding(**settings(case, layer_id), dtype=dtype, init_seed=3)


@pytest.mark.parametrize("kernels", [True, False])
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("layer_id", LAYER_IDS)
def test_equals_reference_forward_and_gradient(case, layer_id, kernels):
    layer = _layer(case, layer_id)
    ids = make_ids((3, 10))
    hashed = reference_mapping(case).hash(ids)[layer_id]
    np.testing.assert_array_equal(layer.hash_rows(torch.from_numpy(ids)).numpy() - layer.spec.offsets, hashed)
    mhe = MultiHeadEmbedding([int(p) for p in layer.spec.primes], layer.spec.head_dim).double()
    with torch.no_grad():
        mhe.embedding.weight.copy_(layer.weight)
    want = mhe(torch.from_numpy(hashed)).flatten(start_dim=-2)
    with use_kernels(kernels):
        out = layer(torch.from_numpy(ids))
    assert out.shape == want.shape == (3, 10, (case[0] - 1) * case[2])
    torch.testing.assert_close(out, want, rtol=0, atol=0)
    g = torch.randn(out.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    with use_kernels(kernels):
        out.backward(g)
    want.backward(g)
    torch.testing.assert_close(layer.weight.grad, mhe.embedding.weight.grad, **TOL["grad.float64"])


def test_numpy_state_dict_and_outputs_match():
    import tokenpos.numpy as tpn

    np_layer = tpn.HashedNgramEmbedding(**settings(CASES[3], 15), dtype=np.float32, init_seed=4)
    layer = HashedNgramEmbedding(**settings(CASES[3], 15), dtype=torch.float32, init_seed=4)
    torch.testing.assert_close(layer.weight.detach(), torch.from_numpy(np_layer.weight.data), rtol=0, atol=0)
    layer.load_state_dict(np_layer.state_dict())
    assert list(layer.state_dict()) == ["weight"]
    ids = make_ids((2, 7))
    np.testing.assert_array_equal(layer(torch.from_numpy(ids)).detach().numpy(), np_layer(ids))


@pytest.mark.parametrize("kernels", [True, False])
def test_packed_and_decode(kernels):
    case = CASES[3]
    c = case[0] - 1
    layer = _layer(case, 15)
    ids = torch.from_numpy(make_ids((2, 9)))
    with use_kernels(kernels), torch.no_grad():
        full = layer(ids)
        steps = [layer(ids[:, t:t + 1], context=ids[:, max(0, t - c):t]) for t in range(9)]
        torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=0, atol=0)
        docs = [ids[0, :4], ids[0, 4:4], ids[1], ids[0, 4:]]
        cu = torch.tensor([0, 4, 4, 13, 18])
        packed = layer(torch.cat(docs), cu_seqlens=cu)
        alone = torch.cat([layer(d[None])[0] for d in docs])
        torch.testing.assert_close(packed, alone, rtol=0, atol=0)


def test_torch_func_grad_equals_autograd():
    """Under torch.func (grad, vmap) the layer runs the op's plain formula, whose gradient equals the op's
    registered backward (a custom op's autograd cannot run inside a transform)."""
    layer = _layer(CASES[3], 15)
    ids = torch.from_numpy(make_ids((2, 9)))
    w = torch.randn((*ids.shape, layer(ids).shape[-1]), generator=torch.Generator().manual_seed(1))
    params = {"weight": layer.weight.detach()}
    got = torch.func.grad(lambda p: (torch.func.functional_call(layer, p, (ids,)) * w).sum())(params)["weight"]
    (layer(ids) * w).sum().backward()
    assert layer.weight.grad is not None
    torch.testing.assert_close(got, layer.weight.grad, rtol=1e-6, atol=1e-6)


def test_bad_ids_refused_by_value():
    layer = _layer(CASES[1])
    ids = torch.from_numpy(make_ids((2, 4)))
    ids[1, 2] = V_OLD + 3
    with pytest.raises(TokenIdError, match=rf"token id {V_OLD + 3} at index \(1, 2\) is out of range \[0, {V_OLD}\)"):
        layer(ids)
    ids[1, 2] = -4
    with pytest.raises(TokenIdError, match=r"token id -4 at index \(1, 2\)"):
        layer(ids)
    with pytest.raises(TokenIdError, match="token id -1"):
        layer(ids.clamp(min=0), context=torch.full((2, 1), -1))
    with pytest.raises(ConfigError, match="context must be"):
        layer(ids.clamp(min=0), context=torch.zeros(3, 1, dtype=torch.long))


def test_kernel_refuses_a_bad_id_it_meets():
    """Called directly (no layer check), the kernel keeps its memory bound and names the id."""
    layer = _layer(CASES[1])
    ids = torch.from_numpy(make_ids((2, 4)))
    ids[0, 3] = 10**6
    with use_kernels(True), pytest.raises(TokenIdError, match="token id 1000000"):
        torch.ops.tokenpos.ngram_embedding(layer.weight, ids, None, None, layer.compress, layer.multipliers,
                                           layer.primes, layer.offsets, layer.spec.pad)


@pytest.mark.slow
def test_double_backward_is_the_forward():
    """gradcheck and gradgradcheck of the op on a small table (primes 5 and 7: 12 rows of 2)."""
    tiny = (3, 1, 2, [5, 7])
    layer = _layer(tiny)
    ids = torch.from_numpy(make_ids((2, 5)))
    w = layer.weight

    def f(weight):
        return torch.ops.tokenpos.ngram_embedding(weight, ids, None, None, layer.compress, layer.multipliers,
                                                  layer.primes, layer.offsets, layer.spec.pad)

    torch.autograd.gradcheck(f, (w,))
    torch.autograd.gradgradcheck(f, (w,))


def _engram_pair(case, hc_mult, layer_id):
    n_max, heads, dim, sizes = case
    cfg = EngramConfig(engram_vocab_size=sizes, max_ngram_size=n_max, n_embed_per_ngram=dim, n_head_per_ngram=heads,
                       layer_ids=LAYER_IDS, pad_id=2, seed=0, kernel_size=3)
    backbone = BackBoneConfig(hidden_size=8, hc_mult=hc_mult, vocab_size=V_OLD, num_layers=16)
    mapping = reference_mapping(case)
    torch.manual_seed(0)
    ref = Engram(layer_id, cfg, backbone, mapping).double()
    with torch.no_grad():
        for p in ref.parameters():                    # norms start at 1: move them off it, so they are compared
            p.add_(torch.randn(p.shape, dtype=p.dtype) * 0.1)
    ours = EngramMemory(8, hc_mult=hc_mult, kernel_size=3, compress=make_compress(0), **{
        k: v for k, v in settings(case, layer_id).items() if k != "compress"}, dtype=torch.float64, init_seed=0)
    ours.load_reference_state_dict(ref.state_dict())
    return ref, ours


@pytest.mark.parametrize("hc_mult", [1, 4])
@pytest.mark.parametrize("case", [CASES[0], CASES[3]])
@pytest.mark.parametrize("layer_id", LAYER_IDS)
def test_engram_memory_equals_reference_forward(hc_mult, case, layer_id):
    ref, ours = _engram_pair(case, hc_mult, layer_id)
    ids = make_ids((2, 11))
    h = torch.randn(2, 11, hc_mult, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    want = ref(h, ids)
    got = ours(h, torch.from_numpy(ids))
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    want.square().sum().backward()
    got.square().sum().backward()
    torch.testing.assert_close(ours.multi_head_embedding.weight.grad, ref.multi_head_embedding.embedding.weight.grad,
                               **TOL["grad.float64"])
    torch.testing.assert_close(ours.short_conv.conv.weight.grad, ref.short_conv.conv.weight.grad,
                               **TOL["grad.float64"])


def test_engram_memory_refuses_bad_inputs():
    _, ours = _engram_pair(CASES[1], 4, 1)
    ids = torch.from_numpy(make_ids((2, 5)))
    with pytest.raises(ConfigError, match=r"hidden_states must be \(B, L, 4, 8\)"):
        ours(torch.zeros(2, 5, 1, 8, dtype=torch.float64), ids)
    with pytest.raises(ConfigError, match="ids must be"):
        ours(torch.zeros(2, 4, 4, 8, dtype=torch.float64), ids)
    bad = ids.clone()
    bad[0, 0] = V_OLD
    with pytest.raises(TokenIdError, match=f"token id {V_OLD}"):
        ours(torch.zeros(2, 5, 4, 8, dtype=torch.float64), bad)


@pytest.mark.parametrize("grad", [False, True])
def test_eager_call_is_the_op_without_its_dispatcher(grad):
    """In eager mode the layer calls the op's implementation directly (``ops.ngram.ngram_lookup``, as
    ``ops.entry.embed`` does): no frame of torch's custom-op machinery (``torch/_library``) runs, and the output,
    the gradient and the double backward are the op's."""
    from pathlib import Path

    from tokenpos.analysis.calls import trace_call

    layer = _layer(CASES[3], 15)
    ids = torch.from_numpy(make_ids((2, 9)))
    with torch.set_grad_enabled(grad):
        trace = trace_call(lambda: layer(ids), package=Path(torch._library.__file__).parent)
    assert trace.functions == (), trace.functions
    out = layer(ids)
    want = torch.ops.tokenpos.ngram_embedding(layer.weight, ids, None, None, layer.compress, layer.multipliers,
                                              layer.primes, layer.offsets, layer.spec.pad)
    torch.testing.assert_close(out, want, rtol=0, atol=0)
    if grad:
        g = torch.randn(out.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(2), requires_grad=True)
        (gw,) = torch.autograd.grad(out, layer.weight, g, create_graph=True)
        (gw_op,) = torch.autograd.grad(want, layer.weight, g, create_graph=True)
        torch.testing.assert_close(gw, gw_op, rtol=0, atol=0)
        v = torch.randn(gw.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
        (gg,) = torch.autograd.grad(gw, g, v)
        (gg_op,) = torch.autograd.grad(gw_op, g, v)
        torch.testing.assert_close(gg, gg_op, rtol=0, atol=0)
        torch.testing.assert_close(gg, torch.ops.tokenpos.ngram_embedding(
            v, ids, None, None, layer.compress, layer.multipliers, layer.primes, layer.offsets, layer.spec.pad),
            rtol=0, atol=0)                                     # the backward's adjoint: the forward on v


@pytest.mark.parametrize("kernels", [True, False])
def test_op_row_start_is_a_shard_of_the_table(kernels):
    """``row_start``: the op on rows [start, start + Rw) of the table gives the whole lookup's values where the row
    is the shard's and zeros elsewhere; the shards sum to the whole lookup, and each shard's gradient (the backward
    op's ``row_start``) is its slice of the whole gradient, bit for bit."""
    layer = _layer(CASES[2], 1)
    R = layer.spec.num_rows
    ids = torch.from_numpy(make_ids((3, 8)))
    bufs = (layer.compress, layer.multipliers, layer.primes, layer.offsets, layer.spec.pad)
    w = layer.weight.detach()
    rows = layer.hash_rows(ids)                                                       # (B, L, K)
    g = torch.randn(3, 8, layer.out_dim, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    with use_kernels(kernels):
        whole = torch.ops.tokenpos.ngram_embedding(w, ids, None, None, *bufs)
        gw = torch.ops.tokenpos.ngram_embedding_backward(g, ids, None, None, *bufs, R)
        total = torch.zeros_like(whole)
        for start, end in ((0, 40), (40, 41), (41, R // 2), (R // 2, R + 5)):
            shard = torch.zeros(end - start, w.shape[1], dtype=w.dtype)
            shard[: min(end, R) - start] = w[start:end]
            part = torch.ops.tokenpos.ngram_embedding(shard, ids, None, None, *bufs, start)
            mine = ((rows >= start) & (rows < end)).repeat_interleave(w.shape[1], dim=-1)
            assert torch.equal(part[mine], whole[mine]) and not part[~mine].any()
            total += part
            gs = torch.ops.tokenpos.ngram_embedding_backward(g, ids, None, None, *bufs, end - start, start)
            assert torch.equal(gs[: min(end, R) - start], gw[start:end]) and not gs[min(end, R) - start:].any()
    assert torch.equal(total, whole)


def test_sparse_gradient_is_the_kernels_backward_of_the_looked_up_rows():
    """``sparse=True`` on the CPU (kernels on): the fused lookup, whose weight gradient is a row-sparse tensor of
    exactly the looked-up rows (sorted, each once), equal to the dense layer's gradient rows (float64)."""
    from tokenpos.analysis.calls import trace_call

    dense, sparse = _layer(CASES[3], 15), HashedNgramEmbedding(**settings(CASES[3], 15), dtype=torch.float64,
                                                                init_seed=3, sparse=True)
    ids = torch.from_numpy(make_ids((3, 7)))
    assert "torch/ops/ngram.py:ngram_lookup_sparse" in trace_call(lambda: sparse(ids)).functions
    a, b = dense(ids), sparse(ids)
    assert torch.equal(a, b)
    g = torch.randn(a.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    a.backward(g)
    b.backward(g)
    gs = sparse.weight.grad
    assert gs.is_sparse and tuple(gs.shape) == tuple(sparse.weight.shape)
    rows = torch.unique(dense.hash_rows(ids))
    assert torch.equal(gs._indices()[0], rows)                 # as stored (not coalesced by torch): each row once
    torch.testing.assert_close(gs._values(), dense.weight.grad[rows], rtol=0, atol=0)
