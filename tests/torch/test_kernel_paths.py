"""The fused-kernel path of the torch layers equals their plain torch path (``tokenpos.set_kernels``).

With kernels on, CPU float32/float64 calls go through ``tokenpos.torch._fused`` (autograd Functions
over the numba kernels); with kernels off, through plain torch ops. Outputs agree to float rounding,
dropout masks bit for bit, gradients to the kernels' tolerance. A spy on the kernel entry points
checks which path actually ran.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch

import tokenpos
import tokenpos.torch as tpt
from tests.tolerances import TOL
from tokenpos.kernels import embedding_forward
from tokenpos.tables.dropout import dropout_keep_mask
from tokenpos.torch import _fused

KERNELS = ("embedding_forward", "embedding_backward", "rope_apply", "rope_apply_backward")


@pytest.fixture
def calls(monkeypatch):
    """Counts of kernel calls made through ``tokenpos.torch._fused``; kernels back on afterwards."""
    counts: Counter[str] = Counter()
    for name in KERNELS:
        fn = getattr(_fused, name)

        def spy(*args, _fn=fn, _name=name, **kwargs):
            counts[_name] += 1
            return _fn(*args, **kwargs)

        monkeypatch.setattr(_fused, name, spy)
    yield counts
    tokenpos.set_kernels(True)


def tol(dtype: torch.dtype) -> dict:
    return TOL["kernels.float32"] if dtype == torch.float32 else TOL["kernels.float64"]


def close(a: torch.Tensor, b: torch.Tensor, dtype: torch.dtype, msg: str = "") -> None:
    np.testing.assert_allclose(a.detach().numpy(), b.detach().numpy(), **tol(dtype), err_msg=msg)


# ----------------------------------------------------------------------------------------------
# TransformerEmbedding / TokenEmbedding
# ----------------------------------------------------------------------------------------------

IDS = torch.tensor([[0, 0, 0, 5, 9, 5, 49], [3, 3, 7, 0, 11, 2, 5]])          # padding and duplicates


def run_embedding(kernels: bool, positions=None, start_pos: int = 2, grad_seed: int = 1, **kwargs):
    tokenpos.set_kernels(kernels)
    torch.manual_seed(123)                                 # the dropout seed comes from torch's generator
    emb = tpt.TransformerEmbedding(50, 12, 16, seed=3, num_heads=3, padding_idx=0, **kwargs)
    out = emb(IDS, positions, start_pos=start_pos)
    g = torch.randn(out.shape, dtype=out.dtype, generator=torch.Generator().manual_seed(grad_seed))
    (out * g).sum().backward()
    return out, {n: p.grad for n, p in emb.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("positional", ["learned", "sinusoidal", "rope", "alibi", "t5", "none"])
@pytest.mark.parametrize("scale", [False, True])
@pytest.mark.parametrize("dropout", [0.0, 0.3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_transformer_embedding_fused_equals_plain(calls, positional, scale, dropout, dtype):
    kwargs = dict(positional=positional, scale=scale, dropout=dropout, dtype=dtype)
    out_k, grads_k = run_embedding(True, **kwargs)
    assert calls["embedding_forward"] == 1 and calls["embedding_backward"] == 1
    out_r, grads_r = run_embedding(False, **kwargs)
    assert calls["embedding_forward"] == 1
    assert out_k.dtype == out_r.dtype == dtype
    close(out_k, out_r, dtype)
    assert torch.equal(out_k == 0, out_r == 0)                              # the same dropout mask
    assert grads_k.keys() == grads_r.keys()
    for name in grads_k:
        close(grads_k[name], grads_r[name], dtype, name)
    assert not grads_k["token.weight"][0].any()                           # padding row: no gradient


@pytest.mark.parametrize("positions", [torch.tensor([4, 0, 15, 2, 2, 9, 1]),
                                       torch.tensor([[0, 1, 2, 3, 4, 5, 6], [15, 14, 3, 3, 0, 1, 2]])])
@pytest.mark.parametrize("positional", ["learned", "sinusoidal"])
def test_explicit_positions(calls, positions, positional):
    out_k, grads_k = run_embedding(True, positions, positional=positional, dropout=0.2, scale=True)
    out_r, grads_r = run_embedding(False, positions, positional=positional, dropout=0.2, scale=True)
    assert calls["embedding_forward"] == 1
    close(out_k, out_r, torch.float32)
    for name in grads_r:
        close(grads_k[name], grads_r[name], torch.float32, name)


def test_roberta_positions_and_1d_ids(calls):
    for ids in (IDS, IDS[1]):
        outs = []
        for kernels in (True, False):
            tokenpos.set_kernels(kernels)
            emb = tpt.TransformerEmbedding(50, 8, 16, padding_idx=0, position_ids="padding", seed=0)
            outs.append(emb(ids))
        close(*outs, torch.float32)
    assert calls["embedding_forward"] == 2


def test_sinusoidal_beyond_the_table_falls_back(calls):
    emb = tpt.TransformerEmbedding(50, 8, 4, positional="sinusoidal", seed=0)
    out = emb(IDS[:, :3], start_pos=3)                                      # positions 3..5 > 4 rows
    assert calls["embedding_forward"] == 1 and type(out.grad_fn).__name__ == "AddBackward0"   # lookup only
    tokenpos.set_kernels(False)
    close(out, emb(IDS[:, :3], start_pos=3), torch.float32)


def test_dropout_seed_and_mask_match_numpy_kernel(calls):
    emb = tpt.TransformerEmbedding(50, 12, 16, scale=True, dropout=0.4, seed=3)
    emb._fixed_dropout_seed = 987654321
    out = emb(IDS, start_pos=1)
    ref = embedding_forward(emb.token.weight.detach().numpy(), IDS.numpy(), scale=emb.token.multiplier,
                            pos_table=emb.position.weight.detach().numpy(), pos_ids=np.arange(1, 8),
                            dropout_p=0.4, seed=987654321)
    np.testing.assert_array_equal(out.detach().numpy(), ref)
    np.testing.assert_array_equal(out.detach().numpy() != 0, dropout_keep_mask(987654321, (2, 7, 12), 0.4))
    assert calls["embedding_forward"] == 1                                   # the layer's (ref: direct)


@pytest.mark.parametrize("frozen", ["token", "position", "both"])
def test_frozen_tables_get_no_gradient(calls, frozen):
    results = []
    for kernels in (True, False):
        tokenpos.set_kernels(kernels)
        emb = tpt.TransformerEmbedding(50, 8, 16, dropout=0.3, padding_idx=0, seed=0)
        if frozen in ("token", "both"):
            emb.token.weight.requires_grad_(False)
        if frozen in ("position", "both"):
            emb.position.weight.requires_grad_(False)
        torch.manual_seed(0)
        out = emb(IDS)
        assert out.requires_grad == (frozen != "both")
        if out.requires_grad:
            out.pow(2).sum().backward()
        results.append((out, emb.token.weight.grad, emb.position.weight.grad))
    (out_k, tok_k, pos_k), (out_r, tok_r, pos_r) = results
    close(out_k, out_r, torch.float32)
    for a, b in ((tok_k, tok_r), (pos_k, pos_r)):
        assert (a is None) == (b is None)
        if a is not None:
            close(a, b, torch.float32)
    assert calls["embedding_backward"] == (0 if frozen == "both" else 1)


@pytest.mark.parametrize("mode", [torch.no_grad, torch.inference_mode])
def test_no_grad_modes_call_the_kernel_directly(calls, mode):
    emb = tpt.TransformerEmbedding(50, 8, 16, dropout=0.3, seed=0)
    tok = tpt.TokenEmbedding(50, 8, scale=True, seed=0)
    with mode():
        torch.manual_seed(0)
        out = emb(IDS)
        looked = tok(IDS)
    assert out.grad_fn is None and looked.grad_fn is None and not out.requires_grad
    assert calls["embedding_forward"] == 2
    tokenpos.set_kernels(False)
    with mode():
        torch.manual_seed(0)
        close(out, emb(IDS), torch.float32)
        close(looked, tok(IDS), torch.float32)


@pytest.mark.parametrize("scale", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_token_embedding_fused_equals_plain(calls, scale, dtype):
    results = []
    for kernels in (True, False):
        tokenpos.set_kernels(kernels)
        tok = tpt.TokenEmbedding(50, 8, scale=scale, padding_idx=5, dtype=dtype, seed=0)
        out = tok(IDS)
        out.sin().sum().backward()
        results.append((out, tok.weight.grad))
    assert calls["embedding_forward"] == 1 and calls["embedding_backward"] == 1
    (out_k, g_k), (out_r, g_r) = results
    close(out_k, out_r, dtype)
    close(g_k, g_r, dtype)
    assert not g_k[5].any()


def test_gradcheck_embedding_function():
    """The true derivative (no padding_idx: that one withholds a gradient on purpose, checked above)."""
    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(7, 3, dtype=torch.float64, generator=gen, requires_grad=True)
    table = torch.randn(5, 3, dtype=torch.float64, generator=gen, requires_grad=True)
    ids = torch.tensor([[1, 2, 2, 6], [0, 1, 3, 3]])
    for pos in (torch.tensor([4, 0, 2, 2]), torch.tensor([[0, 1, 2, 3], [4, 4, 0, 1]])):
        def fn(w, t, pos=pos):
            return _fused.embedding(w, ids, scale=1.7, table=t, pos=pos, dropout_p=0.3, seed=11)

        assert torch.autograd.gradcheck(fn, (weight, table))
    assert torch.autograd.gradcheck(lambda w: _fused.embedding(w, ids, scale=0.5), (weight,))


def test_fallbacks_bf16_fp16_sparse_and_other_devices(calls):
    for dtype in (torch.bfloat16, torch.float16):
        emb = tpt.TransformerEmbedding(50, 8, 16, dropout=0.3, dtype=dtype, seed=0)
        out = emb(IDS)
        out.float().sum().backward()
        assert out.dtype == dtype and emb.token.weight.grad is not None
    sparse = tpt.TokenEmbedding(50, 8, sparse=True, seed=0)
    sparse(IDS).sum().backward()
    assert sparse.weight.grad.is_sparse
    assert calls["embedding_forward"] == 0 and calls["embedding_backward"] == 0
    assert not _fused.fusable(torch.empty(2, device="meta"))
    assert not _fused.fusable(torch.empty(2), torch.empty(2, dtype=torch.float64))
    meta = tpt.TokenEmbedding(50, 8, device="meta")
    assert meta(IDS.to("meta")).device.type == "meta" and calls["embedding_forward"] == 0


def test_empty_ids(calls):
    emb = tpt.TransformerEmbedding(50, 8, 16, dropout=0.3, seed=0)
    out = emb(torch.zeros(2, 0, dtype=torch.int64))
    assert out.shape == (2, 0, 8)
    out.sum().backward()
    assert not emb.token.weight.grad.any() and calls["embedding_forward"] == 1


# ----------------------------------------------------------------------------------------------
# RotaryEmbedding
# ----------------------------------------------------------------------------------------------

POSITIONS = {
    "default": {},
    "start_pos": {"start_pos": 5},
    "beyond_cache": {"start_pos": 300},                                   # far: the formula, not cached
    "1d": {"positions": torch.tensor([0, 3, 9, 2, 40])},                  # 40: beyond the cache of 16
    "2d": {"positions": torch.tensor([[0, 3, 9, 2, 4], [1, 1, 1, 7, 15]])},
    "key_positions": {"positions": torch.tensor([4, 5, 6, 7, 8]), "key_positions": torch.arange(9)},
}


def run_rope(kernels: bool, interleaved: bool, rotary_dim, dtype, kwargs):
    tokenpos.set_kernels(kernels)
    rope = tpt.RotaryEmbedding(16, max_seq_len=16, interleaved=interleaved, rotary_dim=rotary_dim)
    gen = torch.Generator().manual_seed(0)
    lk = 9 if "key_positions" in kwargs else 5
    q = torch.randn(2, 4, 5, 16, dtype=dtype, generator=gen, requires_grad=True)
    k = torch.randn(2, 2, lk, 16, dtype=dtype, generator=gen, requires_grad=True)         # GQA
    oq, ok = rope.apply(q, k, **kwargs)
    (oq * torch.randn(oq.shape, dtype=dtype, generator=gen)).sum().backward(retain_graph=True)
    (ok * torch.randn(ok.shape, dtype=dtype, generator=gen)).sum().backward()
    x = rope.rotate(q.detach(), kwargs.get("positions"), start_pos=kwargs.get("start_pos", 0))
    return oq, ok, q.grad, k.grad, x


@pytest.mark.parametrize("where", sorted(POSITIONS))
@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("rotary_dim", [None, 6])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_rope_fused_equals_plain(calls, where, interleaved, rotary_dim, dtype):
    got = run_rope(True, interleaved, rotary_dim, dtype, POSITIONS[where])
    assert calls["rope_apply"] >= 2 and calls["rope_apply_backward"] >= 2
    ref = run_rope(False, interleaved, rotary_dim, dtype, POSITIONS[where])
    for name, a, b in zip(("q'", "k'", "dq", "dk", "rotate"), got, ref, strict=True):
        assert a.dtype == b.dtype == dtype and a.shape == b.shape
        close(a, b, dtype, name)


def test_rope_gradient_only_for_inputs_that_need_it(calls):
    rope = tpt.RotaryEmbedding(8)
    q = torch.randn(1, 2, 3, 8, requires_grad=True)
    k = torch.randn(1, 2, 3, 8)
    oq, ok = rope.apply(q, k)
    assert oq.requires_grad and not ok.requires_grad                     # as the plain path
    oq.sum().backward()
    assert q.grad is not None and k.grad is None
    q2, k2 = torch.randn(1, 2, 3, 8), torch.randn(1, 2, 3, 8, requires_grad=True)
    a, b = rope.apply(q2, k2, torch.tensor([3, 1, 2]))
    b.pow(2).sum().backward()                                              # q' unused: no q gradient pass
    tokenpos.set_kernels(False)
    k3 = k2.detach().clone().requires_grad_()
    rope.apply(q2, k3, torch.tensor([3, 1, 2]))[1].pow(2).sum().backward()
    close(k2.grad, k3.grad, torch.float32)
    with torch.no_grad():
        tokenpos.set_kernels(True)
        assert rope.apply(q, k)[0].grad_fn is None


@pytest.mark.parametrize("interleaved", [False, True])
def test_gradcheck_rope_function(interleaved):
    rope = tpt.RotaryEmbedding(8, max_seq_len=8, interleaved=interleaved, rotary_dim=6)
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(2, 2, 3, 8, dtype=torch.float64, generator=gen, requires_grad=True)
    k = torch.randn(2, 1, 3, 8, dtype=torch.float64, generator=gen, requires_grad=True)
    k4 = torch.randn(2, 1, 4, 8, dtype=torch.float64, generator=gen, requires_grad=True)
    pos = torch.tensor([[0, 5, 20], [3, 4, 7]])
    assert torch.autograd.gradcheck(lambda a, b: rope.apply(a, b, pos), (q, k))
    assert torch.autograd.gradcheck(lambda a, b: rope.apply(a, b, start_pos=2, key_positions=torch.arange(4)),
                                    (q, k4))
    assert torch.autograd.gradcheck(lambda a: rope.rotate(a, start_pos=1), (q,))


def test_rope_fallbacks_and_cache_of_kernel_tables(calls):
    rope = tpt.RotaryEmbedding(16, max_seq_len=8)
    for dtype in (torch.bfloat16, torch.float16):
        q = torch.randn(1, 2, 3, 16).to(dtype).requires_grad_()
        oq, ok = rope.apply(q, q.detach())
        oq.float().sum().backward()
        assert oq.dtype == ok.dtype == dtype and q.grad is not None
    q32, k64 = torch.randn(1, 2, 3, 16), torch.randn(1, 2, 3, 16, dtype=torch.float64)
    rope.apply(q32, k64)                                                   # mixed dtypes: plain path
    assert calls["rope_apply"] == 0
    rope.apply(q32, q32)
    first = rope._halves[torch.float32]
    rope.apply(q32, q32, start_pos=2)
    assert rope._halves[torch.float32] is first                           # reused, not rebuilt
    rope.apply(q32, q32, start_pos=20)                                     # grows the cache: cut again
    assert rope.cos_cached.shape[0] >= 23 and rope._halves_of is rope.cos_cached
    assert calls["rope_apply"] == 3


def test_compiled_graphs_do_not_use_the_kernels(calls):
    torch._dynamo.reset()
    rope = tpt.RotaryEmbedding(8, max_seq_len=8)
    emb = tpt.TransformerEmbedding(50, 8, 16, seed=0).eval()
    q = torch.randn(1, 2, 3, 8)

    def fn(ids, q):
        return emb(ids), rope.apply(q, q, start_pos=1)[0]

    got = torch.compile(fn, fullgraph=True, backend="eager")(IDS, q)
    assert sum(calls.values()) == 0
    ref = fn(IDS, q)
    assert calls["embedding_forward"] == 1 and calls["rope_apply"] == 1
    for a, b in zip(got, ref, strict=True):
        close(a, b, torch.float32)


def test_torch_func_transforms_take_the_plain_path(calls):
    tok = tpt.TokenEmbedding(50, 4, scale=True, seed=0)
    rope = tpt.RotaryEmbedding(8)
    q = torch.randn(1, 2, 3, 8)

    def loss(params, q):
        out = torch.func.functional_call(tok, params, (IDS,))
        return out.pow(2).sum() + rope.apply(q, q)[0].pow(2).sum()

    grads = torch.func.grad(loss, argnums=(0, 1))(dict(tok.named_parameters()), q)
    assert sum(calls.values()) == 0
    tokenpos.set_kernels(False)
    ref = torch.func.grad(loss, argnums=(0, 1))(dict(tok.named_parameters()), q)
    close(grads[0]["weight"], ref[0]["weight"], torch.float32)
    close(grads[1], ref[1], torch.float32)


BAD_CALLS = [
    ((torch.tensor([[1, 50, 2]]),), {}),                                   # id out of range
    ((torch.tensor([[1, -1, 2]]),), {}),                                   # negative id
    ((torch.tensor([[1.0, 2.0]]),), {}),                                   # float ids
    ((torch.zeros(1, 1, 2, dtype=torch.int64),), {}),                      # 3-D ids
    ((IDS,), {"start_pos": -1}),
    ((IDS,), {"start_pos": 1.5}),
    ((IDS,), {"start_pos": 10}),                                           # learned: 10 + 7 > 16 positions
]


@pytest.mark.parametrize("args, kwargs", BAD_CALLS)
def test_errors_and_rng_untouched_on_both_paths(args, kwargs):
    """The fused default call checks the same things in the same order, before drawing a seed."""
    errors = []
    for kernels in (True, False):
        tokenpos.set_kernels(kernels)
        emb = tpt.TransformerEmbedding(50, 8, 16, dropout=0.3, seed=0)
        state = torch.get_rng_state()
        with pytest.raises(Exception) as err:
            emb(*args, **kwargs)
        assert torch.equal(torch.get_rng_state(), state)
        errors.append((type(err.value), str(err.value)))
        if args[0].dim() == 2 and not kwargs:
            with pytest.raises(Exception) as tok_err:
                tpt.TokenEmbedding(50, 8, seed=0)(args[0])
            errors.append((type(tok_err.value), str(tok_err.value)))
    tokenpos.set_kernels(True)
    half = len(errors) // 2
    assert errors[:half] == errors[half:]


@pytest.mark.parametrize("ids", [IDS.to(torch.int32), IDS.to(torch.uint8), IDS.numpy(), IDS.tolist(), IDS.t()])
def test_other_id_types_and_layouts(calls, ids):
    outs = []
    for kernels in (True, False):
        tokenpos.set_kernels(kernels)
        emb = tpt.TransformerEmbedding(50, 8, 16, scale=True, seed=0)
        outs.append(emb(ids, start_pos=3))
    assert calls["embedding_forward"] == 1
    close(*outs, torch.float32)
