"""Shared helpers for the kernel tests: one tolerance table, one compare helper."""

from __future__ import annotations

import numpy as np
import pytest

# Tolerances, in one place: (rtol, atol) by result dtype. Forwards are bit-exact (no entry needed);
# these cover float64-accumulated sums and float64 optimiser math rounded to the parameter dtype.
TOL = {
    np.dtype(np.float32): (2e-6, 2e-6),
    np.dtype(np.float64): (1e-12, 1e-12),
}


def assert_close(actual: np.ndarray, expected: np.ndarray, *, scale: float = 1.0) -> None:
    """Same shape and dtype, values equal within TOL[dtype] (atol scaled by ``scale``)."""
    actual = np.asarray(actual)
    expected = np.asarray(expected)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    assert actual.dtype == expected.dtype, (actual.dtype, expected.dtype)
    rtol, atol = TOL[actual.dtype]
    np.testing.assert_allclose(actual, expected, rtol=rtol, atol=atol * scale)


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(1234)
