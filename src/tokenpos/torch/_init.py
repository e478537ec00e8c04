"""Initialisation and random sources of the torch backend.

Weights are drawn by :func:`tokenpos.tables.formulas.init.init_weight` (float64, NumPy) and cast, so one
``seed=`` gives the same table in both backends. Without ``seed=``/``rng=`` a seed is drawn from torch's
generator (the given ``torch.Generator``, else the default one), so ``torch.manual_seed`` makes a
torch model reproducible, as torch users expect.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from tokenpos._hugepages import advise_huge_pages
from tokenpos.tables.errors import ConfigError
from tokenpos.tables.formulas.dropout import SEED_MASK
from tokenpos.tables.formulas.init import init_weight, resolve_rng


def torch_seed(generator: torch.Generator | None = None) -> int:
    """A fresh 63-bit seed from ``generator`` (or torch's default CPU generator), drawn on the generator's device
    whatever the default device is (under ``with torch.device("meta")``, deferred init, it would be a meta
    tensor with no value to read)."""
    if generator is not None and not isinstance(generator, torch.Generator):
        raise ConfigError(f"generator must be a torch.Generator or None, got {type(generator).__name__}")
    device = "cpu" if generator is None else generator.device
    return int(torch.randint(0, SEED_MASK, (), generator=generator, dtype=torch.int64, device=device))


def resolve_torch_rng(seed: Any = None, rng: np.random.Generator | None = None,
                      generator: torch.Generator | None = None) -> np.random.Generator:
    """The NumPy generator that draws the initial weights.

    ``seed=`` / ``rng=`` as in the NumPy backend (same numbers); otherwise one seeded from torch.
    """
    if (seed is not None or rng is not None) and generator is not None:
        raise ConfigError("pass seed=/rng= or generator=, not both")
    if seed is None and rng is None:
        return np.random.default_rng(torch_seed(generator))
    return resolve_rng(seed, rng)


@torch.no_grad()
def fill_init_(weight: torch.Tensor, scheme: str, std: float, rng: np.random.Generator,
               padding_idx: int | None = None) -> None:
    """Overwrite ``weight`` (rows, cols) in place with ``init_weight`` (float64, cast at the end)."""
    if weight.is_meta:
        return
    w = init_weight((int(weight.shape[0]), int(weight.shape[1])), scheme, std=std, rng=rng, padding_idx=padding_idx)
    weight.copy_(torch.from_numpy(w))


def empty_table(rows: int, cols: int, *, device: Any = None, dtype: torch.dtype | None = None) -> torch.Tensor:
    """An uninitialised (rows, cols) table; on the CPU a large one asks for transparent huge pages
    before its first write (:mod:`tokenpos._hugepages`: fewer TLB misses in random-row gathers)."""
    t = torch.empty(rows, cols, device=device, dtype=dtype)
    if t.is_cpu:
        advise_huge_pages(t.data_ptr(), t.nbytes)
    return t
