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
