"""tokenpos.torch.positions_from_cu_seqlens / cu_seqlens_from_positions: the NumPy formula's values and
texts on the CPU; on a (fake) CUDA device no host sync when ``total`` is given, and bad values fail a
device-side assert (``tests/torch/fake_cuda.py``)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import tokenpos.torch as tpt
from tests.torch.fake_cuda import HostSync, cpu_of, no_host_sync, to_fake_cuda
from tokenpos.tables import ConfigError, DtypeError, PositionError
from tokenpos.tables.formulas import packing as formula

FAST = settings(max_examples=30, deadline=None)


@FAST
@given(st.lists(st.integers(0, 6), min_size=1, max_size=8), st.sampled_from([torch.int32, torch.int64]))
def test_equal_to_the_numpy_formula(lengths: list[int], dtype: torch.dtype) -> None:
    cu = torch.tensor([0, *np.cumsum(lengths)], dtype=dtype)
    want = formula.positions_from_cu_seqlens(cu.numpy())
    for total in (None, int(cu[-1])):
        got = tpt.positions_from_cu_seqlens(cu, total)
        assert got.dtype == torch.int64
        np.testing.assert_array_equal(got.numpy(), want)
    if len(want):
        np.testing.assert_array_equal(tpt.cu_seqlens_from_positions(torch.from_numpy(want)).numpy(),
                                      formula.cu_seqlens_from_positions(want))
    starts = np.arange(len(lengths)) * 7 + 1                   # where each document starts counting
    for start_pos in (starts, torch.from_numpy(starts), starts.tolist(), 5):
        np.testing.assert_array_equal(tpt.positions_from_cu_seqlens(cu, start_pos=start_pos).numpy(),
                                      formula.positions_from_cu_seqlens(cu.numpy(), start_pos=start_pos))


@pytest.mark.parametrize("cu, total", [([1, 3], None), ([0, 3, 2], None), ([0, 3], 4)])
def test_bad_values_raise_the_numpy_text_on_the_cpu(cu: list[int], total: int | None) -> None:
    with pytest.raises(PositionError) as want:
        formula.positions_from_cu_seqlens(cu, total)
    with pytest.raises(PositionError) as got:
        tpt.positions_from_cu_seqlens(torch.tensor(cu), total)
    assert str(got.value) == str(want.value)


def test_dtype_and_shape_are_refused() -> None:
    with pytest.raises(DtypeError, match="int32 or int64 vector, got dtype float32"):
        tpt.positions_from_cu_seqlens(torch.tensor([0.0, 2.0]))
    with pytest.raises(DtypeError, match="got dtype int16"):
        tpt.positions_from_cu_seqlens(torch.tensor([0, 2], dtype=torch.int16))
    with pytest.raises(ConfigError, match=r"got shape \(1, 2\)"):
        tpt.positions_from_cu_seqlens(torch.tensor([[0, 2]]))
    with pytest.raises(PositionError, match="must count up by 1 or restart at 0"):
        tpt.cu_seqlens_from_positions(torch.tensor([0, 2]))


def test_meta_tensors_need_total_and_have_no_positions_to_read() -> None:
    cu = torch.tensor([0, 2, 5], device="meta")
    assert tpt.positions_from_cu_seqlens(cu, total=5).shape == (5,)
    with pytest.raises(ConfigError, match=r"meta device, which holds no values: pass total="):
        tpt.positions_from_cu_seqlens(cu)
    with pytest.raises(ConfigError, match="positions are on the meta device"):
        tpt.cu_seqlens_from_positions(torch.tensor([0, 1, 0], device="meta"))


def test_no_host_sync_on_cuda_when_total_is_given() -> None:
    cu = to_fake_cuda(torch.tensor([0, 3, 3, 5, 9], dtype=torch.int32))
    with no_host_sync():
        pos = tpt.positions_from_cu_seqlens(cu, total=9)
    assert pos.device.type == "cuda"
    np.testing.assert_array_equal(cpu_of(pos).numpy(), [0, 1, 2, 0, 1, 0, 1, 2, 3])
    with no_host_sync(), pytest.raises(HostSync):            # without total, T is read: one sync
        tpt.positions_from_cu_seqlens(cu)
    with no_host_sync():                                     # per-document starts on the device too
        pos = tpt.positions_from_cu_seqlens(cu, total=9, start_pos=to_fake_cuda(torch.tensor([5, 9, 0, 2])))
    np.testing.assert_array_equal(cpu_of(pos).numpy(), [5, 6, 7, 0, 1, 2, 3, 4, 5])


@pytest.mark.parametrize("cu, total", [([1, 3], 3), ([0, 3, 2], 2), ([0, 3], 4)])
def test_bad_values_fail_a_device_assert_on_cuda(cu: list[int], total: int) -> None:
    with no_host_sync(), pytest.raises(RuntimeError, match="device-side assert") as info:
        tpt.positions_from_cu_seqlens(to_fake_cuda(torch.tensor(cu)), total=total)
    assert f"cu_seqlens on cuda:0 invalid: expected 0 first, non-decreasing, ending at T = {total}" in str(info.value)


def test_device_checks_read_the_values_for_the_typed_error() -> None:
    tpt.set_device_checks(True)
    try:
        with pytest.raises(PositionError, match="cu_seqlens must end at the number of tokens T = 4"):
            tpt.positions_from_cu_seqlens(to_fake_cuda(torch.tensor([0, 3])), total=4)
    finally:
        tpt.set_device_checks(False)
