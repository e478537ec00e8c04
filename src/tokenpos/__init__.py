"""tokenpos: the input block of a transformer, token ids to position-aware vectors.

Backends are imported explicitly (``import tokenpos.numpy`` / ``import tokenpos.torch``); importing
``tokenpos`` itself loads nothing heavy (no torch, no numba compilation). Process-wide switches live
in :mod:`tokenpos._config` (re-exported here).
"""

from tokenpos._config import (
    device_checks_enabled,
    kernels_enabled,
    output_cache_bytes,
    set_device_checks,
    set_kernels,
    set_output_cache,
    use_kernels,
)

__version__ = "0.1.0"

__all__ = ["__version__", "device_checks_enabled", "kernels_enabled", "output_cache_bytes", "set_device_checks",
           "set_kernels", "set_output_cache", "use_kernels"]
