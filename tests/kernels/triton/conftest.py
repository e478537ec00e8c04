"""Run the Triton kernels on CPU tensors through Triton's interpreter, or compiled on CUDA when there is a GPU.

Triton 3.9 reads ``TRITON_INTERPRET`` from the environment each time ``triton.jit`` decorates a
function (``triton.knobs.runtime.interpret``), i.e. when :mod:`tokenpos.kernels.triton` is first
imported, so it is set here, before any test module imports that package. If the package was
already imported without it (by an earlier test), its modules are reloaded so the kernels become
interpreted functions. Without triton installed (no ``gpu`` extra) every test module here skips
itself (``pytest.importorskip`` at its top; a skip raised in a conftest would abort the run instead).

On a machine with a GPU the same tests run compiled on CUDA and the interpreter stays off (it would
also turn torch.compile's own Triton kernels into interpreted ones); ``TOKENPOS_TRITON_DEVICE=cpu``
forces the interpreter there.
"""

from __future__ import annotations

import importlib
import os
import sys

import pytest
import torch

ON_CUDA = torch.cuda.is_available() and os.environ.get("TOKENPOS_TRITON_DEVICE", "cuda") != "cpu"
if not ON_CUDA:
    os.environ["TRITON_INTERPRET"] = "1"

try:
    import triton
except ImportError:                                              # no gpu extra: the test modules skip themselves
    triton = None

_MODULES = ("tokenpos.kernels.triton._hash", "tokenpos.kernels.triton._cast",
            "tokenpos.kernels.triton.embedding", "tokenpos.kernels.triton.rope",
            "tokenpos.kernels.triton.cross_entropy", "tokenpos.kernels.triton")
if triton is not None and not ON_CUDA and not triton.knobs.runtime.interpret:   # a knob set explicitly
    triton.knobs.runtime.interpret = True
if triton is not None and not ON_CUDA and _MODULES[0] in sys.modules:
    from triton.runtime.interpreter import InterpretedFunction

    if not isinstance(sys.modules[_MODULES[0]].splitmix64, InterpretedFunction):
        for name in _MODULES:
            if name in sys.modules:
                importlib.reload(sys.modules[name])

DEVICE = torch.device("cuda" if ON_CUDA else "cpu")


@pytest.fixture(scope="session")
def device() -> torch.device:
    """Where the kernels' tensors live: CUDA when there is a GPU, else CPU (interpreter)."""
    return DEVICE


@pytest.fixture
def gen() -> torch.Generator:
    return torch.Generator().manual_seed(1234)
