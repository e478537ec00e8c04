"""One finite-difference checker for every hand-written NumPy backward.

The loss is ``sum(out * G)`` for a fixed random ``G``; its gradient with respect to the output is
``G``, so ``layer.backward(G)`` must give d loss / d param in ``param.grad`` and d loss / d x as the
return value. Central differences in float64 check both, element by element.

``make()`` must build a *fresh, deterministic* float64 layer on every call (same seed: same weights
and the same dropout seeds for its first forward), so a layer with dropout sees the same mask in
every evaluation. Only public API is used: ``named_parameters()``, ``Parameter.data``/``.grad``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from tests.tolerances import TOL

Run = Callable[[Any, Any], np.ndarray]
Backward = Callable[[Any, np.ndarray], Any]


def _forward(layer: Any, x: Any) -> np.ndarray:
    return layer(x)


def _backward(layer: Any, g: np.ndarray) -> Any:
    return layer.backward(g)


def _elements(shape: tuple[int, ...], max_elems: int | None, rng: np.random.Generator) -> list[tuple[int, ...]]:
    every = list(np.ndindex(*shape))
    if max_elems is None or len(every) <= max_elems:
        return every
    pick = rng.choice(len(every), size=max_elems, replace=False)
    return [every[i] for i in sorted(pick)]


def check_grads(make: Callable[[], Any], x: Any = None, *, run: Run = _forward, backward: Backward = _backward,
                x_is_float: bool = False, eps: float = 1e-6, tol: str = "fd.linear",
                max_elems: int | None = None, seed: int = 0,
                no_grad_rows: dict[str, Any] | None = None) -> dict[str, np.ndarray]:
    """Compare ``layer.backward`` with central differences; returns the analytic gradients.

    Args:
        make: () -> a fresh float64 layer, deterministic.
        x: the input passed to ``run`` (ids, positions or a float array).
        run: (layer, x) -> output array; default ``layer(x)``.
        backward: (layer, G) -> grad wrt x (or None); default ``layer.backward(G)``.
        x_is_float: also check the returned input gradient against differences in ``x``.
        max_elems: check at most this many elements per array (a random subset), None = all.
        no_grad_rows: {param name: row ids} that by contract get no gradient although the output
            depends on them (a padding row): their analytic gradient must be exactly zero, and they
            are left out of the difference check.
    """
    rng = np.random.default_rng(seed)
    layer = make()
    out = np.asarray(run(layer, x))
    assert out.dtype == np.float64, f"finite differences need a float64 layer, got output dtype {out.dtype}"
    G = rng.standard_normal(out.shape)
    gx = backward(layer, G)
    analytic = {}
    for name, p in layer.named_parameters():
        if not p.requires_grad:
            assert p.grad is None, f"frozen parameter {name} received a gradient"
            continue
        analytic[name] = np.zeros_like(p.data) if p.grad is None else np.array(p.grad, dtype=np.float64)
        assert analytic[name].shape == p.data.shape, f"{name}.grad has shape {analytic[name].shape}"

    def loss(name: str | None = None, idx: tuple[int, ...] = (), delta: float = 0.0, xx: Any = x) -> float:
        fresh = make()
        if name is not None:
            dict(fresh.named_parameters())[name].data[idx] += delta
        return float(np.sum(np.asarray(run(fresh, xx)) * G))

    kw = TOL[tol]
    skip = {k: set(np.atleast_1d(v).tolist()) for k, v in (no_grad_rows or {}).items()}
    for name, rows in skip.items():
        assert not analytic[name][sorted(rows)].any(), f"rows {sorted(rows)} of {name} received gradient"
    for name, grad in analytic.items():
        idxs = [i for i in _elements(grad.shape, max_elems, rng) if i[0] not in skip.get(name, ())]
        numeric = np.array([(loss(name, i, eps) - loss(name, i, -eps)) / (2 * eps) for i in idxs])
        got = np.array([grad[i] for i in idxs])
        np.testing.assert_allclose(got, numeric, err_msg=f"d loss / d {name}", **kw)

    if x_is_float:
        assert gx is not None, "backward returned no input gradient"
        gx = np.asarray(gx)
        xa = np.asarray(x, dtype=np.float64)
        assert gx.shape == xa.shape, f"input gradient has shape {gx.shape}, expected {xa.shape}"
        idxs = _elements(xa.shape, max_elems, rng)
        numeric = []
        for i in idxs:
            xp, xm = xa.copy(), xa.copy()
            xp[i] += eps
            xm[i] -= eps
            numeric.append((loss(xx=xp) - loss(xx=xm)) / (2 * eps))
        got = np.array([gx[i] for i in idxs])
        np.testing.assert_allclose(got, np.array(numeric), err_msg="d loss / d x", **kw)
        analytic["<input>"] = gx
    return analytic
