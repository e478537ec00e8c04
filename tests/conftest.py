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
    """Every test runs the embedding forward and RoPE through their kernels and parallel cores (their
    launch, threads, fork safety), however small the arrays: by default passes under ``PARALLEL_BYTES``
    run on the calling thread, and a small eager embedding call without autograd is torch's gather
    (``ops.entry.SMALL_BYTES``). ``tests/kernels/test_embedding_serial.py``,
    ``tests/kernels/test_rope_serial.py`` and ``tests/torch/test_call_budgets.py`` test those paths and
    the choice, at the library's defaults (:data:`DEFAULT_SIZES`)."""
    import tokenpos.kernels.embedding as E
    import tokenpos.kernels.rope as R
    import tokenpos.torch.ops.entry as T

    monkeypatch.setattr(E, "PARALLEL_BYTES", 0)
    monkeypatch.setattr(R, "PARALLEL_BYTES", 0)
    monkeypatch.setattr(T, "SMALL_BYTES", 0)


def _default_sizes() -> dict[tuple[str, str], int]:
    import tokenpos.kernels.embedding as E
    import tokenpos.kernels.rope as R
    import tokenpos.torch.ops.entry as T

    return {(E.__name__, "PARALLEL_BYTES"): E.PARALLEL_BYTES, (R.__name__, "PARALLEL_BYTES"): R.PARALLEL_BYTES,
            (T.__name__, "SMALL_BYTES"): T.SMALL_BYTES}


DEFAULT_SIZES = _default_sizes()
"""The size thresholds as the library sets them, read before any test patches them."""


@pytest.fixture
def library_sizes(monkeypatch):
    """The library's own size thresholds (undoing :func:`_parallel_forward_core` for one test)."""
    import importlib

    for (module, name), value in DEFAULT_SIZES.items():
        monkeypatch.setattr(importlib.import_module(module), name, value)
