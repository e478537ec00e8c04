"""The kernel tests' compare helper (tolerances: ``tests/tolerances.py``, ``kernels.sum.*``)."""

from __future__ import annotations

import numpy as np

from tests.tolerances import TOL


def assert_close(actual: np.ndarray, expected: np.ndarray, *, scale: float = 1.0) -> None:
    """Same shape and dtype, values equal within ``TOL["kernels.sum.<dtype>"]`` (atol times ``scale``)."""
    actual = np.asarray(actual)
    expected = np.asarray(expected)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    assert actual.dtype == expected.dtype, (actual.dtype, expected.dtype)
    tol = TOL[f"kernels.sum.{actual.dtype.name}"]
    np.testing.assert_allclose(actual, expected, rtol=tol["rtol"], atol=tol["atol"] * scale)
