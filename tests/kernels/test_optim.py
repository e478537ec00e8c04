"""Row-sparse optimiser kernels against dense references (exact mode) and lazy references."""

from __future__ import annotations

import numpy as np
import pytest

from tests.kernels.compare import assert_close
from tokenpos.kernels import embedding_backward, sparse_adam_update, sparse_sgd_update
from tokenpos.kernels.reference import (
    adam_dense_ref,
    adam_lazy_ref,
    dense_grad,
    sgd_dense_ref,
    sgd_lazy_ref,
)
from tokenpos.tables.errors import ConfigError


def sparse_grads(rng, V, D, steps, dtype):
    out = []
    for _ in range(steps):
        ids = rng.integers(0, V, 3 * V // 4 if V > 4 else 2)     # duplicates, some rows unused
        g = rng.standard_normal((ids.size, D)).astype(dtype)
        u, rows, _ = embedding_backward(g, ids)
        out.append((u, rows))
    return out


ADAM_CONFIGS = [
    dict(weight_decay=0.0, decoupled=False),
    dict(weight_decay=0.1, decoupled=False),
    dict(weight_decay=0.1, decoupled=True),
]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("cfg", ADAM_CONFIGS)
def test_adam_exact_equals_dense(dtype, cfg, rng) -> None:
    V, D = 37, 20
    p = rng.standard_normal((V, D)).astype(dtype)
    m, v = np.zeros_like(p), np.zeros_like(p)
    p2, m2, v2 = p.copy(), m.copy(), v.copy()
    for step, (u, rows) in enumerate(sparse_grads(rng, V, D, 5, dtype), start=1):
        sparse_adam_update(p, m, v, u, rows, step=step, lr=1e-2, mode="exact", **cfg)
        adam_dense_ref(p2, m2, v2, dense_grad(p.shape, u, rows), step=step, lr=1e-2, **cfg)
    assert_close(p, p2)
    assert_close(m, m2)
    assert_close(v, v2)


@pytest.mark.parametrize("cfg", ADAM_CONFIGS)
def test_adam_lazy_touches_only_used_rows(cfg, rng) -> None:
    V, D = 50, 16
    p = rng.standard_normal((V, D)).astype(np.float32)
    m, v = np.zeros_like(p), np.zeros_like(p)
    p2, m2, v2 = p.copy(), m.copy(), v.copy()
    for step, (u, rows) in enumerate(sparse_grads(rng, V, D, 4, np.float32), start=1):
        before = p.copy(), m.copy(), v.copy()
        sparse_adam_update(p, m, v, u, rows, step=step, lr=1e-2, mode="lazy", **cfg)
        adam_lazy_ref(p2, m2, v2, u, rows, step=step, lr=1e-2, **cfg)
        untouched = np.setdiff1d(np.arange(V), u)
        for new, old in zip((p, m, v), before, strict=True):
            assert np.array_equal(new[untouched], old[untouched])
    assert_close(p, p2)
    assert_close(m, m2)
    assert_close(v, v2)


def test_adam_exact_matches_torch(rng) -> None:
    torch = pytest.importorskip("torch")
    V, D = 23, 8
    p = rng.standard_normal((V, D))
    m, v = np.zeros_like(p), np.zeros_like(p)
    tp = torch.nn.Parameter(torch.tensor(p))
    opt = torch.optim.AdamW([tp], lr=1e-2, weight_decay=0.05)
    for step, (u, rows) in enumerate(sparse_grads(rng, V, D, 4, np.float64), start=1):
        sparse_adam_update(p, m, v, u, rows, step=step, lr=1e-2, weight_decay=0.05, decoupled=True,
                           mode="exact")
        tp.grad = torch.tensor(dense_grad(p.shape, u, rows))
        opt.step()
    np.testing.assert_allclose(p, tp.detach().numpy(), rtol=1e-12, atol=1e-12)


SGD_CONFIGS = [
    dict(momentum=0.0, weight_decay=0.0),
    dict(momentum=0.0, weight_decay=0.1),
    dict(momentum=0.9, weight_decay=0.0),
    dict(momentum=0.9, dampening=0.1, weight_decay=0.01),
    dict(momentum=0.9, nesterov=True, weight_decay=0.01),
]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("cfg", SGD_CONFIGS)
def test_sgd_exact_equals_dense(dtype, cfg, rng) -> None:
    V, D = 31, 12
    p = rng.standard_normal((V, D)).astype(dtype)
    buf = np.zeros_like(p)
    p2, buf2 = p.copy(), buf.copy()
    for step, (u, rows) in enumerate(sparse_grads(rng, V, D, 4, dtype), start=1):
        sparse_sgd_update(p, u, rows, lr=0.1, momentum_buffer=buf, first_step=step == 1, mode="exact", **cfg)
        sgd_dense_ref(p2, dense_grad(p.shape, u, rows), lr=0.1, momentum_buffer=buf2, first_step=step == 1,
                      **cfg)
    assert_close(p, p2)
    assert_close(buf, buf2)


@pytest.mark.parametrize("cfg", SGD_CONFIGS)
def test_sgd_lazy(cfg, rng) -> None:
    V, D = 40, 9
    p = rng.standard_normal((V, D)).astype(np.float32)
    buf = np.zeros_like(p)
    p2, buf2 = p.copy(), buf.copy()
    for step, (u, rows) in enumerate(sparse_grads(rng, V, D, 3, np.float32), start=1):
        before = p.copy()
        sparse_sgd_update(p, u, rows, lr=0.1, momentum_buffer=buf, first_step=step == 1, mode="lazy", **cfg)
        sgd_lazy_ref(p2, u, rows, lr=0.1, momentum_buffer=buf2, first_step=step == 1, **cfg)
        untouched = np.setdiff1d(np.arange(V), u)
        assert np.array_equal(p[untouched], before[untouched])
    assert_close(p, p2)


def test_sgd_matches_torch(rng) -> None:
    torch = pytest.importorskip("torch")
    V, D = 19, 6
    p = rng.standard_normal((V, D))
    buf = np.zeros_like(p)
    tp = torch.nn.Parameter(torch.tensor(p))
    opt = torch.optim.SGD([tp], lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01)
    for step, (u, rows) in enumerate(sparse_grads(rng, V, D, 3, np.float64), start=1):
        sparse_sgd_update(p, u, rows, lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01,
                          momentum_buffer=buf, first_step=step == 1, mode="exact")
        tp.grad = torch.tensor(dense_grad(p.shape, u, rows))
        opt.step()
    np.testing.assert_allclose(p, tp.detach().numpy(), rtol=1e-12, atol=1e-12)


def test_empty_gradient_exact_still_decays(rng) -> None:
    p = rng.standard_normal((5, 4))
    m, v = rng.standard_normal((5, 4)), np.abs(rng.standard_normal((5, 4)))
    p2, m2, v2 = p.copy(), m.copy(), v.copy()
    sparse_adam_update(p, m, v, np.zeros(0, np.int64), np.zeros((0, 4)), step=3, lr=0.1, mode="exact")
    adam_dense_ref(p2, m2, v2, np.zeros((5, 4)), step=3, lr=0.1)
    np.testing.assert_allclose(p, p2, rtol=1e-12)
    np.testing.assert_allclose(m, m2, rtol=1e-12)


def test_errors(rng) -> None:
    p = np.zeros((4, 3), np.float32)
    m, v = np.zeros_like(p), np.zeros_like(p)
    rows = np.ones((2, 3), np.float32)
    with pytest.raises(ConfigError, match="strictly increasing"):
        sparse_adam_update(p, m, v, np.array([2, 1]), rows, step=1, lr=0.1)
    with pytest.raises(ConfigError):
        sparse_adam_update(p, m, v, np.array([1, 4]), rows, step=1, lr=0.1)
    with pytest.raises(ConfigError):
        sparse_adam_update(p, m, v, np.array([0, 1]), rows, step=0, lr=0.1)
    with pytest.raises(ConfigError):
        sparse_adam_update(p, m[:2], v, np.array([0, 1]), rows, step=1, lr=0.1)
    with pytest.raises(ConfigError, match="mode"):
        sparse_adam_update(p, m, v, np.array([0, 1]), rows, step=1, lr=0.1, mode="dense")
    with pytest.raises(ConfigError):
        sparse_sgd_update(p, np.array([0, 1]), rows, lr=0.1, momentum=0.9)
