"""numpy.functional: the forward/backward pairs, by finite differences, kernel vs plain, and their cache rules."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import tokenpos
import tokenpos.numpy as tpn
from tests.frames import is_package_frame, tokenpos_frames_above
from tests.numpy.gradcheck import check_grads
from tests.numpy.helpers import FAST
from tests.tolerances import TOL
from tokenpos.numpy import functional as F
from tokenpos.numpy.module import Module, Parameter
from tokenpos.tables.formulas.dropout import dropout_keep_mask

V, D, P = 9, 6, 5
IDS = np.array([[3, 1, 3, 8], [1, 0, 4, 3]])           # duplicates; id 1 is the padding id where used
POS = np.array([4, 0, 2, 2])                            # a trailing part of the ids' shape


class EmbeddingPair(Module):
    """The embedding pair wrapped as a layer, so tests.numpy.gradcheck can drive it."""

    def __init__(self, *, scale: float, p: float, padding_idx: int | None, table_padding_idx: int | None) -> None:
        super().__init__()
        rng = np.random.default_rng(0)
        self.weight = Parameter(rng.standard_normal((V, D)))
        self.table = Parameter(rng.standard_normal((P, D)))
        self.kw = dict(scale=scale, p=p, seed=11, padding_idx=padding_idx, table_grad=True,
                       table_padding_idx=table_padding_idx)

    def forward(self, ids: np.ndarray) -> np.ndarray:
        out, self._cache = F.embedding_forward(self.weight.data, ids, table=self.table.data, pos=POS, **self.kw)
        return out

    def backward(self, g: np.ndarray) -> None:
        (ids, rows), table_grad = F.embedding_backward(g, self._cache)
        self.weight.accumulate_rows(ids, rows)
        self.table.accumulate(table_grad)


class RopePair(Module):
    def __init__(self, cos: np.ndarray, sin: np.ndarray, interleaved: bool) -> None:
        super().__init__()
        self.cos, self.sin, self.interleaved = cos, sin, interleaved

    def forward(self, x: np.ndarray) -> np.ndarray:
        out, self._cache = F.rope_forward(np.asarray(x, np.float64), self.cos, self.sin, interleaved=self.interleaved)
        return out

    def backward(self, g: np.ndarray) -> np.ndarray:
        return F.rope_backward(g, self._cache)


def tables(batch: int | None, length: int, half: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    angle = rng.uniform(-3, 3, (length, half) if batch is None else (batch, length, half))
    return np.cos(angle), np.sin(angle)


@pytest.mark.slow  # finite differences (tests/numpy/test_token.py keeps a fast one)
@pytest.mark.parametrize("scale, p, padding_idx, table_padding_idx", [
    (1.0, 0.0, None, None), (2.5, 0.0, 1, None), (1.0, 0.4, None, 2), (np.sqrt(D), 0.3, 1, 0)])
def test_embedding_pair_matches_finite_differences(kernel_mode, scale, p, padding_idx, table_padding_idx):
    rows = {"weight": padding_idx} if padding_idx is not None else {}
    if table_padding_idx is not None:
        rows["table"] = table_padding_idx
    check_grads(lambda: EmbeddingPair(scale=scale, p=p, padding_idx=padding_idx, table_padding_idx=table_padding_idx),
                IDS, no_grad_rows=rows)


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("batch", [None, 2])
def test_rope_pair_matches_finite_differences(kernel_mode, interleaved, batch):
    cos, sin = tables(batch, 3, 2)                       # R = 4 < Dh = 6: a pass-through tail
    x = np.random.default_rng(1).standard_normal((2, 2, 3, 6))
    check_grads(lambda: RopePair(cos, sin, interleaved), x, x_is_float=True)


@given(st.integers(1, 3), st.integers(1, 3), st.integers(1, 5), st.sampled_from([2, 4, 6]), st.booleans(),
       st.booleans(), st.sampled_from([np.float32, np.float64]))
@FAST
def test_rope_kernel_and_plain_paths_agree_and_qk_is_two_single_rotations(b, h, length, dh, interleaved, per_batch,
                                                                          dtype):

    rng = np.random.default_rng(b * 100 + h * 10 + length)
    q, k = (rng.standard_normal((b, hh, length, dh)).astype(dtype) for hh in (h, h + 1))
    cos, sin = tables(b if per_batch else None, length, dh // 2)
    results = {}
    for on in (True, False):
        tokenpos.set_kernels(on)
        try:
            q1, k1, cache = F.rope_qk_forward(q, k, cos, sin, interleaved=interleaved)
            dq, dk = F.rope_qk_backward(q1, k1, cache)            # rotating back gives the input
            results[on] = (q1, k1, F.rope_forward(q, cos, sin, interleaved=interleaved)[0], dq, dk)
        finally:
            tokenpos.set_kernels(True)
    tol = TOL[f"forward.{np.dtype(dtype).name}"]
    for on_arr, off_arr in zip(results[True], results[False], strict=True):
        np.testing.assert_allclose(on_arr, off_arr, **tol)
    q1, _, single, dq, dk = results[True]
    np.testing.assert_array_equal(q1, single)
    np.testing.assert_allclose(dq, q, **tol)
    np.testing.assert_allclose(dk, k, **tol)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_embedding_kernel_and_plain_paths_agree(dtype):

    rng = np.random.default_rng(3)
    w, table = rng.standard_normal((V, D)).astype(dtype), rng.standard_normal((P, D)).astype(dtype)
    g = rng.standard_normal(IDS.shape + (D,)).astype(dtype)
    got = {}
    for on in (True, False):
        tokenpos.set_kernels(on)
        try:
            out, cache = F.embedding_forward(w, IDS, scale=1.7, table=table, pos=POS, p=0.25, seed=5, padding_idx=1,
                                             table_grad=True)
            got[on] = (out, *F.embedding_backward(g, cache))
        finally:
            tokenpos.set_kernels(True)
    (out_on, (i_on, r_on), t_on), (out_off, (i_off, r_off), t_off) = got[True], got[False]
    np.testing.assert_array_equal(out_on, out_off)        # same arithmetic order: bit for bit
    np.testing.assert_array_equal(i_on, i_off)
    np.testing.assert_allclose(r_on, r_off, **TOL[f"grad.{np.dtype(dtype).name}"])
    np.testing.assert_allclose(t_on, t_off, **TOL[f"grad.{np.dtype(dtype).name}"])


def test_the_embedding_cache_keeps_copies_of_ids_and_positions(kernel_mode):
    w = np.random.default_rng(0).standard_normal((V, D))
    ids, pos = IDS.copy(), POS.copy()
    out, cache = F.embedding_forward(w, ids, table=w[:P], pos=pos, table_grad=True)
    ids[...] = 0                                          # the caller refills its batch buffers
    pos[...] = 0
    (rows_at, _), table_grad = F.embedding_backward(np.ones_like(out), cache)
    np.testing.assert_array_equal(rows_at, np.unique(IDS))
    assert table_grad is not None and table_grad[4].sum() == 2 * D and table_grad[0].sum() == 2 * D


def test_dropout_is_a_multiply_so_nan_and_inf_propagate():
    x = np.ones((4, 64), np.float32)
    x[1] = np.nan
    x[2] = np.inf
    out, cache = F.dropout_forward(x, p=0.5, seed=9)
    keep = dropout_keep_mask(9, x.shape, 0.5)
    assert np.isnan(out[1]).all(), "a dropped NaN stays NaN (NaN * 0), like torch.nn.Dropout"
    assert np.isnan(out[2][~keep[2]]).all() and np.isinf(out[2][keep[2]]).all()
    np.testing.assert_array_equal(out[0], np.where(keep[0], np.float32(2.0), np.float32(0.0)))
    np.testing.assert_array_equal(F.dropout_backward(np.ones_like(x), cache),
                                  np.where(keep, np.float32(2.0), np.float32(0.0)))


def test_embedding_dropout_on_the_plain_path_propagates_nan():

    w = np.zeros((V, D), np.float32)
    w[3] = np.nan
    tokenpos.set_kernels(False)
    try:
        out, _ = F.embedding_forward(w, IDS, p=0.5, seed=2)
    finally:
        tokenpos.set_kernels(True)
    assert np.isnan(out[IDS == 3]).all()


@pytest.mark.parametrize("p", [0.0, 0.1, 0.5])
def test_float16_dropout_uses_the_unrounded_multiplier_and_rounds_once(p):
    x = np.random.default_rng(4).standard_normal((8, 3072)).astype(np.float16)
    out, _ = F.dropout_forward(x, p=p, seed=1)
    keep = dropout_keep_mask(1, x.shape, p)
    ref = np.where(keep, x.astype(np.float64) * (1.0 / (1.0 - p)), 0.0).astype(np.float16)
    np.testing.assert_array_equal(out, ref)


def test_kernel_choice_lives_in_one_place():

    f32, f16 = np.zeros(2, np.float32), np.zeros(2, np.float16)
    assert F.use_kernel(f32) and F.use_kernel(f32, f32)
    assert not F.use_kernel(f16) and not F.use_kernel(f32, f32.astype(np.float64))
    tokenpos.set_kernels(False)
    try:
        assert not F.use_kernel(f32)
    finally:
        tokenpos.set_kernels(True)


def test_package_frames_are_told_by_the_package_folder_not_by_a_name_in_the_path(tmp_path) -> None:
    """A checkout named ``tokenpos`` with its venv inside: pytest's own frames carry "tokenpos" in
    their path but are not the package's."""
    package = (tmp_path / "tokenpos" / "src" / "tokenpos").resolve()
    venv_pytest = tmp_path / "tokenpos" / ".venv" / "lib" / "site-packages" / "_pytest" / "python.py"
    assert is_package_frame(str(package / "numpy" / "transformer.py"), package)
    assert not is_package_frame(str(venv_pytest), package)
    assert not is_package_frame(str(tmp_path / "tokenpos" / "tests" / "test_x.py"), package)


@pytest.mark.parametrize("core, threshold", [("forward_core", 0), ("forward_core_serial", 1 << 62)])
def test_a_layer_forward_reaches_the_fused_kernel_in_three_frames(monkeypatch, core: str, threshold: int):
    """docs/DESIGN.md's frame count: layer.forward -> functional pair -> kernel entry, which calls the
    core (the same for the parallel core and the serial one that small outputs take)."""
    import tokenpos.kernels.embedding as kernel

    monkeypatch.setattr(kernel, "PARALLEL_BYTES", threshold)
    layer = tpn.TransformerEmbedding(50, 8, 16, dropout=0.1, seed=0)
    ids = np.array([[1, 2, 3]])
    fwd = tokenpos_frames_above(monkeypatch, kernel, (core,), lambda: layer.forward(ids))
    assert fwd == [["embedding.py:forward_rows", "embedding.py:embedding_forward", "transformer.py:forward"]]
    out = layer.forward(ids)
    bwd = tokenpos_frames_above(monkeypatch, kernel, ("_segment_sum_core",), lambda: layer.backward(np.ones_like(out)))
    assert bwd[0] == ["embedding.py:embedding_backward", "embedding.py:embedding_backward", "transformer.py:backward"]
