"""Shared test helpers for the NumPy backend: hypothesis settings and strategies, state snapshots."""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

# Two CPU cores are shared: keep every property small and bounded.
FAST = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SLOW = settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])

DTYPES = (np.float16, np.float32, np.float64)
dtypes = st.sampled_from(DTYPES)


@st.composite
def id_arrays(draw: Any, vocab_size: int, *, padding_idx: int | None = None, max_batch: int = 3,
              max_len: int = 6, ndim: int | None = None) -> np.ndarray:
    """Integer ids (B, L) or (L,), B and L possibly 0, in one of several patterns.

    Patterns: random, all one id (duplicates), all padding, a few ids repeated, and an int dtype
    other than int64.
    """
    nd = draw(st.sampled_from([1, 2])) if ndim is None else ndim
    shape = (draw(st.integers(0, max_batch)), draw(st.integers(0, max_len)))[2 - nd:]
    pattern = draw(st.sampled_from(["random", "one", "padding", "few"]))
    seed = draw(st.integers(0, 2**16))
    rng = np.random.default_rng(seed)
    if pattern == "one":
        ids = np.full(shape, rng.integers(vocab_size))
    elif pattern == "padding" and padding_idx is not None:
        ids = np.full(shape, padding_idx)
    elif pattern == "few":
        ids = rng.choice(rng.integers(0, vocab_size, size=2), size=shape)
    else:
        ids = rng.integers(0, vocab_size, size=shape)
    dtype = draw(st.sampled_from([np.int64, np.int32, np.int16, np.uint8] if vocab_size <= 255
                                 else [np.int64, np.int32]))
    return ids.astype(dtype)


def dense_lookup_grad(ids: np.ndarray, grad_out: np.ndarray, vocab_size: int, *, multiplier: float = 1.0,
                      padding_idx: int | None = None) -> np.ndarray:
    """The reference embedding gradient, in float64: np.add.at over the ids, padding row zeroed."""
    D = grad_out.shape[-1]
    ref = np.zeros((vocab_size, D))
    np.add.at(ref, np.asarray(ids).reshape(-1), grad_out.reshape(-1, D).astype(np.float64) * multiplier)
    if padding_idx is not None:
        ref[padding_idx] = 0.0
    return ref


class Snapshot:
    """Everything observable about a layer's state: weights, gradients, training flags, extra attributes.

    Reading ``.grad`` folds row-sparse chunks into a dense array (a change of representation, not of
    value), so take the snapshot only after the layer's gradients have been read once, or compare two
    snapshots taken the same way.
    """

    def __init__(self, layer: Any, **extra: Any) -> None:
        self.data = {n: p.data.copy() for n, p in layer.named_parameters()}
        self.grads = {n: None if p.grad is None else p.grad.copy() for n, p in layer.named_parameters()}
        self.requires_grad = {n: p.requires_grad for n, p in layer.named_parameters()}
        self.training = [m.training for m in layer.modules()]
        self.extra = dict(extra)
        self.attrs = {k: getattr(layer, k) for k in ("vocab_size", "d_model", "max_seq_len", "padding_idx")
                      if hasattr(layer, k)}

    def assert_same(self, other: Snapshot) -> None:
        assert self.data.keys() == other.data.keys()
        for k in self.data:
            assert self.data[k].shape == other.data[k].shape, k
            assert self.data[k].dtype == other.data[k].dtype, k
            np.testing.assert_array_equal(self.data[k], other.data[k], err_msg=f"weights {k} changed")
            if self.grads[k] is None:
                assert other.grads[k] is None, f"grad {k} appeared"
            else:
                np.testing.assert_array_equal(self.grads[k], other.grads[k], err_msg=f"grad {k} changed")
        assert self.requires_grad == other.requires_grad
        assert self.training == other.training
        assert self.attrs == other.attrs
        assert self.extra.keys() == other.extra.keys()
        for k in self.extra:
            np.testing.assert_array_equal(self.extra[k], other.extra[k], err_msg=f"{k} changed")
