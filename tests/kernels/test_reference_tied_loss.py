"""The tied loss block's NumPy twin (``kernels.reference.tied_loss_block_ref``), the Triton kernel's oracle
(``tests/kernels/triton/test_triton_tied_loss.py``), against the loss it differentiates: stats from their
definitions, the gradient by central finite differences in float64; and its checks."""

from __future__ import annotations

import numpy as np
import pytest

from tests.tolerances import TOL
from tokenpos.kernels.reference import tied_loss_block_ref
from tokenpos.tables.errors import ConfigError


def _case(rng: np.random.Generator, mode: int, cap: float | None, c: int = 4, Vl: int = 9) -> dict:
    z = 2 * rng.standard_normal((c, Vl))
    z[0, 5] = 30.0                                        # a max far above the rest of its row
    t = rng.integers(0, Vl, c)
    t[2] = -1                                             # no target here (ignored, or another shard's)
    coef = None if mode == 0 else rng.random(c) + 0.5
    if coef is not None:
        coef[-1] = 0.0                                    # an ignored token: no gradient
    lse = None
    if mode == 2:                                         # a given lse, not the row's own (a shard's, say)
        zc = z if cap is None else cap * np.tanh(z / cap)
        lse = np.logaddexp.reduce(zc, axis=1) + 0.25
    return {"z": z, "t": t, "coef": coef, "lse": lse}


def _objective(z: np.ndarray, t: np.ndarray, coef: np.ndarray, lse: np.ndarray | None, eps: float, V: int,
               cap: float | None) -> float:
    """sum_n coef_n * (lse_n - (1 - eps) z_t - eps / V sum_v z_v) of the capped logits, float64; with a given
    lse, sum_v exp(z_v - lse_n) in place of lse_n (whose derivative is the same exp(z - lse))."""
    zc = z if cap is None else cap * np.tanh(z / cap)
    here = t >= 0
    zt = np.where(here, zc[np.arange(z.shape[0]), np.where(here, t, 0)], 0.0)
    first = np.logaddexp.reduce(zc, axis=1) if lse is None else np.exp(zc - lse[:, None]).sum(axis=1)
    return float(np.sum(coef * (first - (1.0 - eps) * zt - eps / V * zc.sum(axis=1))))


@pytest.mark.parametrize("mode", [0, 1, 2])
@pytest.mark.parametrize("cap", [None, 3.0])
def test_the_twin_is_the_loss_it_differentiates(rng: np.random.Generator, mode: int, cap: float | None) -> None:
    """float64: stats (max, sum of exp, target logit, sum) of the capped logits; the gradient written over z is
    the objective's by central differences (vocab_size > Vl: a shard's label smoothing); mode 0 leaves z capped."""
    c = _case(rng, mode, cap)
    eps, V = 0.1, 12
    z = c["z"].copy()
    stats = tied_loss_block_ref(z, c["t"], coef=c["coef"], lse=c["lse"], eps=eps, vocab_size=V, softcap=cap)
    zc = c["z"] if cap is None else cap * np.tanh(c["z"] / cap)
    assert stats.shape == ((0, 4) if mode == 2 else (4, 4)) and stats.dtype == np.float64
    if mode != 2:
        here = c["t"] >= 0
        np.testing.assert_array_equal(stats[:, 0], zc.max(axis=1))
        np.testing.assert_allclose(stats[:, 0] + np.log(stats[:, 1]), np.logaddexp.reduce(zc, axis=1), rtol=1e-14)
        np.testing.assert_array_equal(stats[:, 2], np.where(here, zc[np.arange(4), np.where(here, c["t"], 0)], 0))
        np.testing.assert_allclose(stats[:, 3], zc.sum(axis=1), rtol=1e-14)
    if mode == 0:
        np.testing.assert_allclose(z, zc, rtol=1e-15)
        return
    fd = np.zeros_like(z)
    h = 1e-6
    for idx in np.ndindex(*z.shape):
        up, down = c["z"].copy(), c["z"].copy()
        up[idx] += h
        down[idx] -= h
        fd[idx] = (_objective(up, c["t"], c["coef"], c["lse"], eps, V, cap)
                   - _objective(down, c["t"], c["coef"], c["lse"], eps, V, cap)) / (2 * h)
    np.testing.assert_allclose(z, fd, **TOL["fd.nonlinear"])
    assert not z[-1].any() and z[2].any()          # coef 0: no gradient; no target here: still a gradient


def test_float32_is_the_float64_twin_to_float32_rounding(rng: np.random.Generator) -> None:
    """The Triton kernel is compared with the twin on float32 arrays: the twin computes in their dtype."""
    c = _case(rng, 1, 3.0)
    z64, z32 = c["z"].copy(), c["z"].astype(np.float32)
    s64 = tied_loss_block_ref(z64, c["t"], coef=c["coef"], eps=0.1, vocab_size=12, softcap=3.0)
    s32 = tied_loss_block_ref(z32, c["t"], coef=c["coef"].astype(np.float32), eps=0.1, vocab_size=12, softcap=3.0)
    assert s32.dtype == z32.dtype == np.float32
    np.testing.assert_allclose(s32, s64, **TOL["kernels.float32"])
    np.testing.assert_allclose(z32, z64, **TOL["kernels.float32"])


@pytest.mark.parametrize("bad", ["int_z", "fortran", "read_only", "t_range", "t_dtype", "coef_dtype", "lse_alone"])
def test_the_twin_refuses_bad_arrays_and_leaves_z_unchanged(rng: np.random.Generator, bad: str) -> None:
    c = _case(rng, 1, None, c=3, Vl=10)
    z, t = c["z"].astype(np.float32), c["t"]
    kw: dict = {"coef": c["coef"].astype(np.float32)}
    if bad == "int_z":
        z = z.astype(np.int32)
    elif bad == "fortran":
        z = np.asfortranarray(z)
    elif bad == "read_only":
        z.flags.writeable = False
    elif bad == "t_range":
        t = np.array([0, 10, 1])
    elif bad == "t_dtype":
        t = t.astype(np.int32)
    elif bad == "coef_dtype":
        kw["coef"] = kw["coef"].astype(np.float64)
    else:
        kw = {"lse": np.zeros(3, np.float32)}
    before = z.copy()
    with pytest.raises(ConfigError, match={"t_range": "t must be", "t_dtype": "t must be", "coef_dtype": "coef must be",
                                           "lse_alone": "lse is only used"}.get(bad, "z must be")):
        tied_loss_block_ref(z, t, **kw)
    np.testing.assert_array_equal(z, before)
