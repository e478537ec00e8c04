"""Process-wide switches. The only global state in tokenpos; randomness is never global."""

from __future__ import annotations

_KERNELS_ENABLED = True


def set_kernels(enabled: bool) -> None:
    """Turn the fused numba kernels on or off for both backends.

    When off, every layer runs the plain-NumPy / plain-torch reference path, which gives the same
    results up to float rounding (dropout masks are identical).
    """
    global _KERNELS_ENABLED
    if not isinstance(enabled, bool):
        raise TypeError(f"set_kernels expects a bool, got {enabled!r}")
    _KERNELS_ENABLED = enabled


def kernels_enabled() -> bool:
    """Whether the fused kernels are used where they apply."""
    return _KERNELS_ENABLED
