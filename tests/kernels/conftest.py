"""Fixtures of the kernel tests (their compare helper: ``tests/kernels/compare.py``)."""

from __future__ import annotations

import numpy as np
import pytest


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(1234)
