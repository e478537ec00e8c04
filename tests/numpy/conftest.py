"""Fixtures of the NumPy-backend tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import tokenpos


@pytest.fixture(params=[True, False], ids=["kernels-on", "kernels-off"])
def kernel_mode(request: pytest.FixtureRequest) -> Iterator[bool]:
    """Run the test with the fused kernels on, then off (the switch is restored afterwards)."""
    before = tokenpos.kernels_enabled()
    tokenpos.set_kernels(request.param)
    yield request.param
    tokenpos.set_kernels(before)
