"""The NumPy tied cross-entropy (issue 33): the loss of ``h @ W.T`` without the logits, its gradients, its memory."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

import tokenpos.numpy as tpn
from tests.numpy.gradcheck import check_grads
from tests.tolerances import TOL
from tokenpos.numpy import functional as F
from tokenpos.tables.errors import ConfigError, DtypeError, TokenIdError

CASES = [  # (reduction, label_smoothing, softcap)
    ("mean", 0.0, None), ("sum", 0.0, None), ("none", 0.0, None),
    ("mean", 0.1, None), ("sum", 0.2, 3.0), ("none", 0.1, 2.0), ("mean", 0.0, 1.5),
]


def materialised(h: np.ndarray, w: np.ndarray, t: np.ndarray, *, ignore_index: int = -100, label_smoothing: float = 0.0,
                 reduction: str = "mean", softcap: float | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The eager path, float64: (loss, dh, dW) with d loss = 1 ("none": d loss_n = 1), from the whole (N, V) logits."""
    D, V = h.shape[-1], w.shape[0]
    h2, t2 = h.reshape(-1, D).astype(np.float64), t.reshape(-1)
    z0 = h2 @ w.astype(np.float64).T
    z = z0 if softcap is None else softcap * np.tanh(z0 / softcap)
    lse = np.log(np.exp(z - z.max(1, keepdims=True)).sum(1)) + z.max(1)
    valid = t2 != ignore_index
    safe = np.where(valid, t2, 0)
    eps = label_smoothing
    per = (1 - eps) * (lse - z[np.arange(len(t2)), safe]) + eps * (lse - z.mean(1))
    per = np.where(valid, per, 0.0)
    count = max(valid.sum(), 1)
    loss = {"none": per.reshape(t.shape), "sum": per.sum(), "mean": per.sum() / count}[reduction]
    dz = np.exp(z - lse[:, None])
    dz[np.arange(len(t2)), safe] -= 1 - eps
    dz -= eps / V
    dz *= valid[:, None] / (count if reduction == "mean" else 1)
    if softcap is not None:
        dz *= 1 - np.tanh(z0 / softcap) ** 2
    return np.asarray(loss), (dz @ w).reshape(h.shape), dz.T @ h2


def _inputs(V: int, shape: tuple[int, ...], D: int = 6, seed: int = 0, dtype: type = np.float64
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    h = rng.standard_normal((*shape, D)).astype(dtype)
    w = (0.5 * rng.standard_normal((V, D))).astype(dtype)
    t = rng.integers(0, V, shape)
    t.reshape(-1)[1] = -100
    return h, w, t


@pytest.mark.parametrize("with_grad", [False, True])
@pytest.mark.parametrize("V", [1003, 50257])
@pytest.mark.parametrize("case", CASES)
def test_loss_and_gradients_equal_the_materialised_logits_float64(V: int, case: tuple, with_grad: bool) -> None:
    """Both routes: gradients from the forward's own blocks (with_grad) and recomputed in the backward."""
    reduction, eps, cap = case
    h, w, t = _inputs(V, (2, 3) if V > 2000 else (3, 5))
    loss, cache = F.tied_cross_entropy_forward(h, w, t, reduction=reduction, label_smoothing=eps, softcap=cap,
                                               chunk_size=2, with_grad=with_grad)
    assert bool(cache.grads) == (with_grad and reduction != "none")
    ref, dh_ref, dw_ref = materialised(h, w, t, reduction=reduction, label_smoothing=eps, softcap=cap)
    dh, dw = F.tied_cross_entropy_backward(np.ones(t.shape) if reduction == "none" else 1.0, cache)
    assert loss.shape == ref.shape and loss.dtype == np.float64
    for got, want in ((loss, ref), (dh, dh_ref), (dw, dw_ref)):
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("case", CASES)
def test_float32_is_the_float64_result_to_float32_rounding(case: tuple) -> None:
    reduction, eps, cap = case
    h, w, t = _inputs(1003, (4, 5), D=16, dtype=np.float32)
    loss, cache = F.tied_cross_entropy_forward(h, w, t, reduction=reduction, label_smoothing=eps, softcap=cap)
    dh, dw = F.tied_cross_entropy_backward(np.ones(t.shape) if reduction == "none" else 1.0, cache)
    assert loss.dtype == dh.dtype == dw.dtype == np.float32
    scale = TOL["parity.f32"]["scale"]
    for got, want in zip((loss, dh, dw), materialised(h, w, t, reduction=reduction, label_smoothing=eps, softcap=cap),
                         strict=True):
        assert np.abs(got - want).max() <= scale * np.abs(want).max()


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("training", [True, False])
def test_the_layer_backward_matches_finite_differences(case: tuple, training: bool) -> None:
    reduction, eps, cap = case
    rng = np.random.default_rng(3)
    h = rng.standard_normal((2, 3, 5))
    t = np.array([[4, -100, 0], [6, 6, 2]])

    def make() -> tpn.TokenEmbedding:
        layer = tpn.TokenEmbedding(7, 5, init="standard_normal", dtype=np.float64, seed=1)
        return layer.train(training)

    check_grads(make, h, run=lambda layer, x: layer.loss(x, t, reduction=reduction, label_smoothing=eps, softcap=cap,
                                                         chunk_size=4),
                backward=lambda layer, g: layer.loss_backward(g), x_is_float=True, tol="fd.nonlinear")


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_an_all_ignored_batch_has_loss_zero_and_gradient_zero(reduction: str) -> None:
    h, w, _ = _inputs(1003, (3, 4))
    t = np.full((3, 4), -100)
    loss, cache = F.tied_cross_entropy_forward(h, w, t, reduction=reduction, label_smoothing=0.1, softcap=2.0)
    dh, dw = F.tied_cross_entropy_backward(np.ones(t.shape) if reduction == "none" else 1.0, cache)
    assert not loss.any() and np.isfinite(loss).all()
    assert not dh.any() and not dw.any()


def test_every_chunk_size_gives_the_same_result_and_a_repeat_is_bit_identical() -> None:
    h, w, t = _inputs(1003, (5, 7))
    base = None
    for chunk in (1, 3, 35, None):
        loss, cache = F.tied_cross_entropy_forward(h, w, t, label_smoothing=0.1, softcap=4.0, chunk_size=chunk)
        grads = F.tied_cross_entropy_backward(1.0, cache)
        again = F.tied_cross_entropy_forward(h, w, t, label_smoothing=0.1, softcap=4.0, chunk_size=chunk)
        regrads = F.tied_cross_entropy_backward(1.0, again[1])
        assert np.array_equal(loss, again[0])                             # deterministic: bit for bit
        assert all(np.array_equal(a, b) for a, b in zip(grads, regrads, strict=True))
        if base is None:
            base = (loss, *grads)
        for a, b in zip((loss, *grads), base, strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-13)


@pytest.mark.slow  # traces every allocation
def test_forward_and_backward_never_hold_the_logits() -> None:
    """tracemalloc: the peak of forward + backward stays far below the (N, V) logits (one chunk is 16 x V)."""
    N, D, V = 1024, 32, 50257
    h, w, t = _inputs(V, (N,), D=D, dtype=np.float32)
    tracemalloc.start()
    loss, cache = F.tied_cross_entropy_forward(h, w, t, chunk_size=16)
    dh, dw = F.tied_cross_entropy_backward(1.0, cache)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    logits = N * V * 4
    outputs = dw.nbytes + dh.nbytes
    assert peak - outputs < 8 * 16 * V * 4 + 4096 * D * 4 + 2 * h.nbytes
    assert peak < logits / 5


def test_the_layer_keeps_the_cache_and_accumulates_the_weight_gradient() -> None:
    layer = tpn.TokenEmbedding(50, 8, dtype=np.float64, seed=0, padding_idx=0)
    h, _, t = _inputs(50, (2, 3), D=8)
    loss = layer.loss(h, t, label_smoothing=0.1)
    ref, dh_ref, dw_ref = materialised(h, layer.weight.data, t, label_smoothing=0.1)
    np.testing.assert_allclose(loss, ref, rtol=1e-12)
    np.testing.assert_allclose(layer.loss_backward(), dh_ref, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(layer.weight.grad, dw_ref, rtol=1e-10, atol=1e-12)
    assert layer.weight.grad[0].any()                                     # dense, like attend: the padding row too
    np.testing.assert_allclose(tpn.tied_cross_entropy(h, layer.weight.data, t, label_smoothing=0.1), ref, rtol=1e-12)
    with pytest.raises(ValueError, match=r"grad_loss must have shape \(\)"):
        layer.loss_backward(np.ones(3))


def test_loss_backward_before_loss_raises() -> None:
    with pytest.raises(RuntimeError, match="loss_backward"):
        tpn.TokenEmbedding(5, 3).loss_backward()


ENTRIES = {"tied_cross_entropy": tpn.tied_cross_entropy,
           # the public functional pair checks what the function checks (a target of -1 read row V - 1 before)
           "functional.tied_cross_entropy_forward": lambda *a, **k: F.tied_cross_entropy_forward(*a, **k)[0]}


@pytest.mark.parametrize(("targets", "match"), [
    ([[1, 5]], r"target 5 at index \(0, 1\) is out of range \[0, 5\) and is not ignore_index=-100"),
    ([[-1, 0]], r"target -1 at index \(0, 0\) is out of range"),
    (np.array([[0, 2**63 + 5]], dtype=np.uint64), r"target 9223372036854775813 at index \(0, 1\)"),
    (np.array([[0.0, 1.0]]), "targets must be integers, got dtype float64"),
])
def test_a_bad_target_raises_token_id_error_and_changes_nothing(targets: object, match: str) -> None:
    layer = tpn.TokenEmbedding(5, 3, dtype=np.float64, seed=0)
    layer.loss(np.ones((1, 2, 3)), [[1, 2]])
    cache = layer._loss_cache
    with pytest.raises(TokenIdError, match=match):
        layer.loss(np.ones((1, 2, 3)), targets)
    assert layer._loss_cache is cache
    for call in ENTRIES.values():
        with pytest.raises(TokenIdError, match=match):
            call(np.ones((1, 2, 3)), np.ones((5, 3)), targets)


@pytest.mark.parametrize("entry", sorted(ENTRIES))
def test_bad_shapes_dtypes_and_options_raise_typed_errors(entry: str) -> None:
    call = ENTRIES[entry]
    h, w, t = np.ones((2, 4)), np.ones((7, 4)), np.array([1, 2])
    with pytest.raises(DtypeError, match="h and weight must have the same dtype, got h float32 and weight float64"):
        call(h.astype(np.float32), w, t)
    with pytest.raises(DtypeError, match="h must be"):
        call(h.astype(np.int64), w, t)
    with pytest.raises(ConfigError, match=r"h must have shape \(\.\.\., 4\)"):
        call(np.ones((2, 3)), w, t)
    with pytest.raises(ConfigError, match=r"targets must have shape \(2,\)"):
        call(h, w, np.array([1, 2, 3]))
    with pytest.raises(ConfigError, match="reduction"):
        call(h, w, t, reduction="avg")
    with pytest.raises(ConfigError, match="softcap must be > 0"):
        call(h, w, t, softcap=0.0)
    with pytest.raises(ConfigError, match="label_smoothing"):
        call(h, w, t, label_smoothing=1.5)
    with pytest.raises(ConfigError, match="chunk_size"):
        call(h, w, t, chunk_size=0)


def _pair(h: np.ndarray, w: np.ndarray, t: np.ndarray, with_grad: bool, **kw: object) -> tuple[np.ndarray, ...]:
    loss, cache = F.tied_cross_entropy_forward(h, w, t, with_grad=with_grad, **kw)  # type: ignore[arg-type]
    dloss = np.ones(t.shape) if kw.get("reduction") == "none" else 1.0
    return (loss, *F.tied_cross_entropy_backward(dloss, cache))


def test_bit_identical_run_to_run() -> None:
    """Determinism (issue 33): the same inputs give the same bits of loss, dh and dweight on every run, by both
    gradient routes (the forward's and the recomputing backward's; blocks in token order, dweight added block
    after block)."""
    h, w, t = _inputs(3000, (8, 40), D=16, dtype=np.float32)
    kw = {"label_smoothing": 0.1, "softcap": 4.0, "chunk_size": 64}
    for with_grad in (True, False):
        runs = [_pair(h, w, t, with_grad, **kw) for _ in range(3)]
        for r in runs[1:]:
            assert all(a.tobytes() == b.tobytes() for a, b in zip(r, runs[0], strict=True))


# -- the forward's gradients are handed over, never copied, never aliased -----------------------------


def _cache_arrays(cache: F.TiedLossCache) -> list[np.ndarray]:
    """Every array the cache holds now (its fields and the kept gradients)."""
    arrays = [v for v in vars(cache).values() if isinstance(v, np.ndarray)]
    return arrays + [g for pair in cache.grads for g in pair]


@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("case", [(0.0, None), (0.1, 2.0)], ids=["plain", "smoothed-capped"])
def test_a_second_backward_of_a_with_grad_cache_recomputes_the_same_gradients(reduction: str, case: tuple) -> None:
    """The first backward takes the forward's gradients out of the cache (scaled by dloss in place); a second
    one recomputes them from lse through the chunked path: both equal the materialised float64 gradients
    times their dloss, and the second equals the first."""
    eps, cap = case
    h, w, t = _inputs(1003, (3, 5))
    _, cache = F.tied_cross_entropy_forward(h, w, t, reduction=reduction, label_smoothing=eps, softcap=cap,
                                            chunk_size=4, with_grad=True)
    _, dh_ref, dw_ref = materialised(h, w, t, reduction=reduction, label_smoothing=eps, softcap=cap)
    first = F.tied_cross_entropy_backward(2.5, cache)
    assert not cache.grads                                               # handed over: the cache keeps none
    second = F.tied_cross_entropy_backward(2.5, cache)
    third = F.tied_cross_entropy_backward(-0.5, cache)
    for grads, scale in ((first, 2.5), (second, 2.5), (third, -0.5)):
        for got, want in zip(grads, (dh_ref, dw_ref), strict=True):
            np.testing.assert_allclose(got, scale * want, rtol=1e-10, atol=1e-10)
    for a, b in zip(first, second, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("with_grad", [True, False])
def test_the_backward_never_returns_memory_the_cache_or_the_inputs_hold(with_grad: bool, reduction: str,
                                                                        dtype: type) -> None:
    """Outputs never alias state: neither backward's dh / dweight shares memory with any array the cache holds
    (before or after the call), with the inputs, or with the other backward's outputs."""
    h, w, t = _inputs(300, (2, 7), D=8, dtype=dtype)
    _, cache = F.tied_cross_entropy_forward(h, w, t, reduction=reduction, chunk_size=3, with_grad=with_grad)
    dloss = np.ones(t.shape) if reduction == "none" else 1.0
    held_before = _cache_arrays(cache)
    first = F.tied_cross_entropy_backward(dloss, cache)
    second = F.tied_cross_entropy_backward(dloss, cache)
    assert first[0].dtype == second[0].dtype == first[1].dtype == np.dtype(dtype)
    for out in (*first, *second):
        for held in (*_cache_arrays(cache), h, w, t):
            assert not np.shares_memory(out, held)
    for a, b in zip(first, second, strict=True):
        assert not np.shares_memory(a, b)
    if dtype != np.float16:               # compute dtype = input dtype: the forward's arrays handed over, not copied
        handed = any(np.shares_memory(first[1], held) for held in held_before)
        assert handed == (with_grad and reduction != "none")


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_backward_of_a_with_grad_cache_allocates_no_gradient_sized_array(dtype: type) -> None:
    """tracemalloc, structural: after a with_grad forward, the backward's peak extra allocation is below one
    (N, D) array of dh, itself smaller than the (V, D) table (the old backward copied both, a (V, D) + (N, D)
    peak); a second backward recomputes and allocates its outputs."""
    h, w, t = _inputs(20000, (64, 8), D=32, dtype=dtype)                # (N, D) = (512, 32) < (V, D) = (20000, 32)
    _, cache = F.tied_cross_entropy_forward(h, w, t, with_grad=True)
    tracemalloc.start()
    dh, dw = F.tied_cross_entropy_backward(1.0, cache)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < dh.nbytes < dw.nbytes
