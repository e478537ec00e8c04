"""Run the Triton kernels on CPU tensors through Triton's interpreter, or compiled on CUDA when there is a GPU.

The interpreter is switched on by the suite's root conftest, before anything imports triton
(``tests/triton_mode.py`` says why). If triton was imported without it all the same (a plugin, or
this directory run with a different root), these tests cannot run interpreted: Triton's own
``@triton.jit`` library stays compiled-only, and every kernel that calls it fails. That stops the
run here with the reason, instead of as dozens of unrelated-looking failures. Without triton
installed (no ``gpu`` extra) every test module here skips itself (``pytest.importorskip`` at its
top; a skip raised in a conftest would abort the run instead).
"""

from __future__ import annotations

import pytest
import torch

from tests.triton_mode import ON_CUDA, use_interpreter_on_cpu

use_interpreter_on_cpu()
try:
    import triton
except ImportError:                                              # no gpu extra: the test modules skip themselves
    triton = None

if triton is not None and not ON_CUDA:
    from triton.runtime.interpreter import InterpretedFunction

    if not isinstance(triton.language.zeros, InterpretedFunction):
        raise pytest.UsageError("triton was imported before TRITON_INTERPRET=1 was set, so its kernels cannot "
                                "run on the CPU interpreter; run pytest from the repository root (the root "
                                "conftest sets it), or set TRITON_INTERPRET=1 in the environment")

DEVICE = torch.device("cuda" if ON_CUDA else "cpu")


@pytest.fixture(scope="session")
def device() -> torch.device:
    """Where the kernels' tensors live: CUDA when there is a GPU, else CPU (interpreter)."""
    return DEVICE


@pytest.fixture
def gen() -> torch.Generator:
    return torch.Generator().manual_seed(1234)
