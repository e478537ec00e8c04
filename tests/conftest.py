"""Suite-wide test settings.

Hypothesis: no per-example deadline (a first call may compile a numba kernel) and, under CI, a
derandomized search so a CI run is reproducible; locally every run explores new examples. The
embedding forward always takes its parallel core (below). Triton's interpreter is switched on (on
a machine without a GPU) before any test module can import triton (``tests/triton_mode.py``).
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings

from tests.triton_mode import use_interpreter_on_cpu

use_interpreter_on_cpu()

settings.register_profile("tokenpos", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("ci", parent=settings.get_profile("tokenpos"), derandomize=True, print_blob=True)
settings.load_profile("ci" if os.environ.get("CI") else "tokenpos")


@pytest.fixture(autouse=True)
def _parallel_forward_core(monkeypatch):
    """Every test runs the embedding forward and RoPE through their parallel cores (their launch,
    threads, fork safety), however small the arrays: by default passes under ``PARALLEL_BYTES`` run
    on the calling thread. ``tests/kernels/test_embedding_serial.py`` and
    ``tests/kernels/test_rope_serial.py`` test those serial cores and the choice."""
    import tokenpos.kernels.embedding as E
    import tokenpos.kernels.rope as R

    monkeypatch.setattr(E, "PARALLEL_BYTES", 0)
    monkeypatch.setattr(R, "PARALLEL_BYTES", 0)
