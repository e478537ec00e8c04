"""tokenpos: the input block of a transformer, token ids to position-aware vectors.

Backends are imported explicitly (``import tokenpos.numpy`` / ``import tokenpos.torch``); importing
``tokenpos`` itself loads nothing heavy (no torch, no numba compilation).
"""

from tokenpos._config import kernels_enabled, set_kernels

__version__ = "0.1.0"

__all__ = ["__version__", "kernels_enabled", "set_kernels"]
