"""The fused numba path and the plain NumPy path of every wired layer give the same results.

``tokenpos.set_kernels(False)`` switches to the reference path; dropout masks must be identical and
values equal to float rounding (the kernels accumulate in float64, the reference in the dtype).
"""

from __future__ import annotations

import numpy as np
import pytest

import tokenpos
import tokenpos.numpy as tpn
from tests.tolerances import TOL


@pytest.fixture
def kernels_switch():
    yield tokenpos.set_kernels
    tokenpos.set_kernels(True)


def _run_embedding(kernels: bool, kwargs: dict, ids: np.ndarray, start_pos: int, G: np.ndarray):
    tokenpos.set_kernels(kernels)
    emb = tpn.TransformerEmbedding(50, 12, 16, seed=3, **kwargs)
    out = emb(ids, start_pos=start_pos)
    emb.backward(G)
    grads = {n: p.grad.copy() for n, p in emb.named_parameters() if p.has_grad}
    return out, grads


@pytest.mark.parametrize("positional", ["learned", "sinusoidal", "none", "rope"])
@pytest.mark.parametrize("scale", [False, True])
@pytest.mark.parametrize("dropout", [0.0, 0.3])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_transformer_embedding_fused_equals_reference(kernels_switch, positional, scale, dropout, dtype):
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 50, size=(3, 7))
    ids[0, :3] = 0                                                   # padding and duplicates
    G = rng.standard_normal((3, 7, 12)).astype(dtype)
    kwargs = dict(positional=positional, scale=scale, dropout=dropout, padding_idx=0, dtype=dtype, num_heads=3)
    out_k, grads_k = _run_embedding(True, kwargs, ids, 2, G)
    out_r, grads_r = _run_embedding(False, kwargs, ids, 2, G)
    tol = TOL["kernels.float32"] if dtype == np.float32 else TOL["kernels.float64"]
    np.testing.assert_allclose(out_k, out_r, **tol)
    np.testing.assert_array_equal(out_k == 0, out_r == 0)             # identical dropout masks
    assert grads_k.keys() == grads_r.keys()
    for name in grads_k:
        np.testing.assert_allclose(grads_k[name], grads_r[name], **tol, err_msg=name)


@pytest.mark.parametrize("scale", [False, True])
def test_token_embedding_fused_equals_reference(kernels_switch, scale):
    rng = np.random.default_rng(1)
    ids = rng.integers(0, 30, size=(4, 5))
    G = rng.standard_normal((4, 5, 8)).astype(np.float32)
    results = []
    for kernels in (True, False):
        kernels_switch(kernels)
        tok = tpn.TokenEmbedding(30, 8, seed=0, scale=scale, padding_idx=2)
        out = tok(ids)
        tok.backward(G)
        results.append((out, tok.weight.sparse_grad))
    (out_k, sg_k), (out_r, sg_r) = results
    np.testing.assert_allclose(out_k, out_r, **TOL["kernels.float32"])
    np.testing.assert_array_equal(sg_k.indices, sg_r.indices)
    assert 2 not in sg_k.indices
    np.testing.assert_allclose(sg_k.rows, sg_r.rows, **TOL["kernels.float32"])


@pytest.mark.parametrize("make_opt", [
    lambda ps: tpn.optim.Adam(ps, lr=1e-2, sparse_mode="exact"),
    lambda ps: tpn.optim.Adam(ps, lr=1e-2, sparse_mode="lazy"),
    lambda ps: tpn.optim.AdamW(ps, lr=1e-2, weight_decay=0.1, sparse_mode="exact"),
    lambda ps: tpn.optim.AdamW(ps, lr=1e-2, weight_decay=0.1, sparse_mode="lazy"),
    lambda ps: tpn.optim.Adam(ps, lr=1e-2, weight_decay=0.1, sparse_mode="lazy"),
    lambda ps: tpn.optim.SGD(ps, lr=0.1, momentum=0.9, weight_decay=0.01, sparse_mode="exact"),
    lambda ps: tpn.optim.SGD(ps, lr=0.1, momentum=0.9, sparse_mode="lazy"),
    lambda ps: tpn.optim.SGD(ps, lr=0.1),
], ids=["adam-exact", "adam-lazy", "adamw-exact", "adamw-lazy", "adam-l2-lazy", "sgd-mom-exact",
        "sgd-mom-lazy", "sgd"])
def test_sparse_optimiser_steps_fused_equal_reference(kernels_switch, make_opt):
    rng = np.random.default_rng(2)
    batches = [rng.integers(0, 40, size=(2, 6)) for _ in range(4)]
    finals = []
    for kernels in (True, False):
        kernels_switch(kernels)
        tok = tpn.TokenEmbedding(40, 6, seed=0)
        opt = make_opt(tok.parameters())
        for ids in batches:
            opt.zero_grad()
            out = tok(ids)
            tok.backward(np.sin(out))
            opt.step()
        finals.append(tok.weight.data.copy())
    np.testing.assert_allclose(finals[0], finals[1], **TOL["kernels.optim"])


# ----------------------------------------------------------------------------------------------
# RotaryEmbedding: apply / backward / rotate, kernel vs plain NumPy
# ----------------------------------------------------------------------------------------------

ROPE_POSITIONS = {
    "default": {},
    "start_pos": {"start_pos": 5},
    "beyond_cache": {"start_pos": 300},                                   # far: the formula, not cached
    "1d": {"positions": np.array([0, 3, 9, 2, 40])},                      # 40: the cache grows
    "2d": {"positions": np.array([[0, 3, 9, 2, 4], [1, 1, 1, 7, 15]])},
    "key_positions": {"positions": np.array([4, 5, 6, 7, 8]), "key_positions": np.arange(9)},
}


def _run_rope(kernels: bool, interleaved: bool, rotary_dim, dtype, kwargs, scaling=None):
    tokenpos.set_kernels(kernels)
    rope = tpn.RotaryEmbedding(16, max_seq_len=16, interleaved=interleaved, rotary_dim=rotary_dim, scaling=scaling)
    rng = np.random.default_rng(0)
    lk = 9 if "key_positions" in kwargs else 5
    q = rng.standard_normal((2, 4, 5, 16)).astype(dtype)
    k = rng.standard_normal((2, 2, lk, 16)).astype(dtype)                # GQA
    q2, k2 = rope.apply(q, k, **kwargs)
    dq, dk = rope.backward(np.cos(q2), rng.standard_normal(k2.shape).astype(dtype))
    x = rope.rotate(q, kwargs.get("positions"), start_pos=kwargs.get("start_pos", 0))
    return q2, k2, dq, dk, x


@pytest.mark.parametrize("where", sorted(ROPE_POSITIONS))
@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("rotary_dim", [None, 6])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_rotary_fused_equals_reference(kernels_switch, monkeypatch, where, interleaved, rotary_dim, dtype):
    import tokenpos.numpy.functional.rope as rotary_module  # the layer's one kernel switch point

    calls = []
    for name in ("rope_apply", "rope_apply_backward"):
        fn = getattr(rotary_module, name)
        monkeypatch.setattr(rotary_module, name, lambda *a, _fn=fn, _n=name, **kw: calls.append(_n) or _fn(*a, **kw))
    got = _run_rope(True, interleaved, rotary_dim, dtype, ROPE_POSITIONS[where])
    assert "rope_apply" in calls and "rope_apply_backward" in calls
    n = len(calls)
    ref = _run_rope(False, interleaved, rotary_dim, dtype, ROPE_POSITIONS[where])
    assert len(calls) == n                                               # kernels off: the plain path
    tol = TOL["kernels.float32"] if dtype == np.float32 else TOL["kernels.float64"]
    for name, a, b in zip(("q'", "k'", "dq", "dk", "rotate"), got, ref, strict=True):
        assert a.dtype == b.dtype == dtype and a.shape == b.shape
        np.testing.assert_allclose(a, b, **tol, err_msg=name)


@pytest.mark.parametrize("scaling", [{"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8},
                                     {"rope_type": "dynamic", "factor": 2.0}])
def test_rotary_fused_scalings(kernels_switch, scaling):
    for where in ("default", "1d", "2d"):
        got = _run_rope(True, False, None, np.float64, ROPE_POSITIONS[where], scaling)
        ref = _run_rope(False, False, None, np.float64, ROPE_POSITIONS[where], scaling)
        for a, b in zip(got, ref, strict=True):
            np.testing.assert_allclose(a, b, **TOL["kernels.float64"])


def test_rotary_backward_after_switching_kernels_off_and_fp16(kernels_switch):
    rng = np.random.default_rng(1)
    q, k = rng.standard_normal((2, 2, 3, 8)), rng.standard_normal((2, 1, 3, 8))
    g = rng.standard_normal(q.shape)
    rope = tpn.RotaryEmbedding(8, interleaved=True, rotary_dim=4)
    rope.apply(q, k, np.array([[1, 2, 3], [7, 0, 5]]))                     # kernel forward ...
    kernels_switch(False)
    dq, dk = rope.backward(g, np.ones_like(k))                             # ... plain backward from its tables
    rope.apply(q, k, np.array([[1, 2, 3], [7, 0, 5]]))
    rq, rk = rope.backward(g, np.ones_like(k))
    np.testing.assert_allclose(dq, rq, **TOL["kernels.float64"])
    np.testing.assert_allclose(dk, rk, **TOL["kernels.float64"])
    kernels_switch(True)
    h = q.astype(np.float16)                                               # fp16: the plain path
    out = tpn.RotaryEmbedding(8).apply(h, h)[0]
    kernels_switch(False)
    np.testing.assert_array_equal(out, tpn.RotaryEmbedding(8).apply(h, h)[0])
