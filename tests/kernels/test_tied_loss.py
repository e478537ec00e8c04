"""The tied loss's block kernel (kernels.tied_loss) against its NumPy twin, its determinism, its checks."""

from __future__ import annotations

import numba
import numpy as np
import pytest

from tests.threads import run_threads
from tests.tolerances import TOL
from tokenpos.kernels.reference import tied_loss_block_ref
from tokenpos.kernels.tied_loss import BLOCK_V, tied_loss_block
from tokenpos.tables.errors import ConfigError


def _case(rng: np.random.Generator, dtype: type, c: int = 6, Vl: int = 2 * BLOCK_V + 451, mode: int = 1,
          cap: float | None = None) -> dict:
    z = (3 * rng.standard_normal((c, Vl))).astype(dtype)
    z[0, 5] = 60.0                                        # a max far above the rest of its row
    if Vl > BLOCK_V + 3:
        z[1, BLOCK_V + 3] = 40.0                          # the running max grows in a later column block
    t = rng.integers(-1, Vl, c)
    t[2] = -1                                             # no target here (ignored, or another shard's)
    coef = None if mode == 0 else rng.random(c).astype(dtype)
    lse = None
    if mode == 2:
        zc = z.astype(np.float64) if cap is None else cap * np.tanh(z.astype(np.float64) / cap)
        lse = (np.log(np.exp(zc - zc.max(1, keepdims=True)).sum(1)) + zc.max(1) + 0.25).astype(dtype)
    return {"z": z, "t": t, "coef": coef, "lse": lse, "cap": cap}


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("mode", [0, 1, 2])
@pytest.mark.parametrize("cap", [None, 5.0])
def test_block_matches_its_twin(rng: np.random.Generator, dtype: type, mode: int, cap: float | None) -> None:
    """Stats (max, sum of exp, target logit, sum) and the in-place gradient, across three column blocks."""
    c = _case(rng, dtype, mode=mode, cap=cap)
    a, b = c["z"].copy(), c["z"].copy()
    kw = {"coef": c["coef"], "lse": c["lse"], "eps": 0.1, "vocab_size": a.shape[1] + 7, "softcap": cap}
    sa = tied_loss_block(a, c["t"], **kw)
    sb = tied_loss_block_ref(b, c["t"], **kw)
    tol = TOL["kernels.float64" if dtype == np.float64 else "kernels.float32"]
    assert sa.shape == sb.shape == ((0, 4) if mode == 2 else (6, 4)) and sa.dtype == dtype
    if mode != 2:
        np.testing.assert_allclose(sa[:, :3], sb[:, :3], **tol)
        # the sum of z: the kernel adds in column order, NumPy pairwise; both within rounding of sum |z|
        scale = np.abs(b).sum(axis=1) if mode == 0 else np.abs(c["z"]).sum(axis=1)
        assert np.all(np.abs(sa[:, 3] - sb[:, 3]) <= tol["rtol"] * scale)
    np.testing.assert_allclose(a, b, **tol)
    if mode:
        assert a[2].sum() != 0.0                                   # coef != 0: a gradient even without a target


def test_zero_coef_gives_a_zero_gradient(rng: np.random.Generator) -> None:
    c = _case(rng, np.float32)
    coef = np.zeros(6, np.float32)
    z = c["z"].copy()
    tied_loss_block(z, c["t"], coef=coef, eps=0.3)
    assert not z.any()


def test_bit_identical_run_to_run_threads_and_thread_counts(rng: np.random.Generator) -> None:
    """Each row is reduced in column order on one thread: the same bits on every run, from several Python
    threads at once, and with 1 or all of numba's threads."""
    c = _case(rng, np.float32, c=64)
    kw = {"coef": c["coef"], "eps": 0.1, "softcap": 5.0}

    def run() -> tuple[np.ndarray, np.ndarray]:
        z = c["z"].copy()
        return tied_loss_block(z, c["t"], **kw), z

    first = run()
    results: list[tuple[np.ndarray, np.ndarray]] = []
    run_threads(lambda k: results.append(run()), 3)
    before = numba.get_num_threads()
    numba.set_num_threads(1)
    try:
        results.append(run())
    finally:
        numba.set_num_threads(before)
    for stats, z in results:
        assert stats.tobytes() == first[0].tobytes() and z.tobytes() == first[1].tobytes()


@pytest.mark.parametrize("bad", ["int_z", "fortran", "t_range", "t_dtype", "coef_dtype", "lse_alone", "eps",
                                 "small_vocab"])
def test_the_checked_entry_refuses_bad_arrays_and_leaves_z_unchanged(rng: np.random.Generator, bad: str) -> None:
    c = _case(rng, np.float32, c=3, Vl=10)
    z, t, coef = c["z"], c["t"], c["coef"]
    kw: dict = {"coef": coef}
    if bad == "int_z":
        z = z.astype(np.int32)
    elif bad == "fortran":
        z = np.asfortranarray(z)
    elif bad == "t_range":
        t = np.array([0, 10, 1])
    elif bad == "t_dtype":
        t = t.astype(np.int32)
    elif bad == "coef_dtype":
        kw["coef"] = coef.astype(np.float64)
    elif bad == "lse_alone":
        kw = {"lse": np.zeros(3, np.float32)}
    elif bad == "eps":
        kw["eps"] = 1.5
    else:
        kw["vocab_size"] = 9
    before = z.copy()
    with pytest.raises(ConfigError):
        tied_loss_block(z, t, **kw)
    np.testing.assert_array_equal(z, before)


def test_the_core_never_reads_outside_a_row(rng: np.random.Generator) -> None:
    """block_pass (unchecked, the ops' entry) given a target column past the row treats it as "not here"."""
    from tokenpos.kernels.tied_loss import block_pass

    z = rng.standard_normal((2, 5)).astype(np.float64)
    a, b = z.copy(), z.copy()
    sa = block_pass(a, np.array([5, 1_000_000]), np.ones(2), None, 0.0, 5, None)
    sb = tied_loss_block(b, np.array([-1, -1]), coef=np.ones(2))
    np.testing.assert_array_equal(sa, sb)
    np.testing.assert_array_equal(a, b)
