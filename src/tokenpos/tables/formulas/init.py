"""Weight-initialisation schemes, drawn in float64 from an explicit generator.

There is no global seeding anywhere in tokenpos: every draw takes a ``np.random.Generator`` (or a
seed that makes one). Both backends call :func:`init_weight`, so one seed gives the same table in
NumPy and in torch.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tokenpos.tables.checks.validation import check_choice, check_float
from tokenpos.tables.errors import ConfigError

INIT_SCHEMES = ("normal", "trunc_normal", "xavier_uniform", "standard_normal", "zeros")
RESIZE_INITS = ("mean",) + INIT_SCHEMES   # new rows of a resized table: the mean of the old rows, or a scheme


def resolve_rng(seed: Any = None, rng: np.random.Generator | None = None) -> np.random.Generator:
    """One explicit generator from ``seed=`` or ``rng=`` (not both).

    ``seed=None, rng=None`` gives a generator seeded from fresh OS entropy: explicit, not global.
    """
    if seed is not None and rng is not None:
        raise ConfigError(f"pass seed= or rng=, not both; got seed={seed!r} and rng={rng!r}")
    if rng is not None:
        if not isinstance(rng, np.random.Generator):
            raise ConfigError(f"rng must be a numpy.random.Generator, got {type(rng).__name__}")
        return rng
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0):
        raise ConfigError(f"seed must be an integer >= 0 or None, got {seed!r}")
    return np.random.default_rng(seed)


def trunc_normal(rng: np.random.Generator, shape: tuple[int, ...], std: float, bound: float = 2.0) -> np.ndarray:
    """N(0, std) truncated to [-bound*std, bound*std] by resampling the draws that fall outside."""
    out = rng.standard_normal(shape)
    bad = np.abs(out) > bound
    while bad.any():
        out[bad] = rng.standard_normal(int(bad.sum()))
        bad = np.abs(out) > bound
    return out * std


def init_weight(shape: tuple[int, int], scheme: str = "normal", *, std: float = 0.02,
                rng: np.random.Generator, padding_idx: int | None = None) -> np.ndarray:
    """A freshly initialised (rows, cols) table in float64.

    Schemes:
        normal: N(0, std) (GPT-2, BERT use std=0.02).
        trunc_normal: N(0, std) truncated at +-2 std (resampled, so the std is slightly below ``std``).
        xavier_uniform: U(-a, a) with a = sqrt(6 / (rows + cols)) (seed 004, TinyTorch).
        standard_normal: N(0, 1), torch.nn.Embedding's default.
        zeros: all zeros.

    ``padding_idx``: that row is zero (drawn, then cleared, so the other rows do not depend on it).
    """
    w = _draw(shape, scheme, std, rng)
    if padding_idx is not None:
        w[padding_idx] = 0.0
    return w


def _draw(shape: tuple[int, int], scheme: str, std: float, rng: np.random.Generator) -> np.ndarray:
    check_choice("init", scheme, INIT_SCHEMES)
    rows, cols = (int(s) for s in shape)
    if scheme == "normal":
        return rng.normal(0.0, check_float("std", std, low=0.0), size=(rows, cols))
    if scheme == "trunc_normal":
        return trunc_normal(rng, (rows, cols), check_float("std", std, low=0.0))
    if scheme == "xavier_uniform":
        limit = np.sqrt(6.0 / (rows + cols))
        return rng.uniform(-limit, limit, size=(rows, cols))
    if scheme == "standard_normal":
        return rng.standard_normal((rows, cols))
    return np.zeros((rows, cols), dtype=np.float64)
