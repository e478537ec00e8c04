"""Where the Triton kernel tests run: compiled on CUDA when there is a GPU, else on the CPU through
Triton's interpreter (``TRITON_INTERPRET=1``).

Triton decides whether a ``@triton.jit`` function is interpreted when the function is decorated,
and that includes Triton's own library (``tl.zeros`` and the rest of ``triton.language.standard``),
decorated when ``triton`` is first imported. So the interpreter must be on before anything imports
``triton``: transformers and torch may import it while pytest collects unrelated test modules.
The suite's root ``conftest.py`` therefore calls :func:`use_interpreter_on_cpu` before any test
module is collected; ``tests/kernels/triton/conftest.py`` checks that it worked.

On a machine with a GPU the interpreter stays off (it would also turn torch.compile's own Triton
kernels into interpreted ones); ``TOKENPOS_TRITON_DEVICE=cpu`` forces the interpreter there.
"""

from __future__ import annotations

import os

import torch

ON_CUDA = torch.cuda.is_available() and os.environ.get("TOKENPOS_TRITON_DEVICE", "cuda") != "cpu"


def use_interpreter_on_cpu() -> None:
    """Turn Triton's interpreter on (the environment variable Triton reads), unless on CUDA."""
    if not ON_CUDA:
        os.environ["TRITON_INTERPRET"] = "1"
