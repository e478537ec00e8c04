"""tables.formulas.packing: positions from cu_seqlens and back, and the checks of tables.checks.packing."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tokenpos.numpy as tpn
import tokenpos.tables as tables
from tokenpos.tables import ConfigError, DtypeError, PositionError
from tokenpos.tables.formulas.packing import cu_seqlens_from_positions, positions_from_cu_seqlens

FAST = settings(max_examples=40, deadline=None)


def loop_positions(lengths: list[int]) -> np.ndarray:
    """The definition, one document at a time: 0, 1, ..., n - 1 for each length n."""
    out: list[int] = []
    for n in lengths:
        out.extend(range(n))
    return np.array(out, dtype=np.int64)


def test_example_and_exports() -> None:
    np.testing.assert_array_equal(positions_from_cu_seqlens([0, 3, 5]), [0, 1, 2, 0, 1])
    assert tables.positions_from_cu_seqlens is tpn.positions_from_cu_seqlens is positions_from_cu_seqlens
    assert tables.cu_seqlens_from_positions is tpn.cu_seqlens_from_positions is cu_seqlens_from_positions
    assert positions_from_cu_seqlens(np.array([0, 2], np.int32), total=2).dtype == np.int64
    assert cu_seqlens_from_positions([0, 1, 0]).dtype == np.int32     # flash-attn's dtype
    assert positions_from_cu_seqlens([0]).shape == (0,)


@FAST
@given(st.lists(st.integers(0, 6), min_size=1, max_size=8), st.sampled_from([np.int32, np.int64]))
def test_positions_restart_per_document(lengths: list[int], dtype: type) -> None:
    cu = np.concatenate([[0], np.cumsum(lengths)]).astype(dtype)
    pos = positions_from_cu_seqlens(cu, total=int(cu[-1]))
    np.testing.assert_array_equal(pos, loop_positions(lengths))
    nonempty = [n for n in lengths if n]
    np.testing.assert_array_equal(cu_seqlens_from_positions(pos), np.concatenate([[0], np.cumsum(nonempty)]))


def test_hf_flattening_collator_position_ids_give_the_cu_seqlens() -> None:
    """HF's DataCollatorWithFlattening writes position_ids 0..n-1 per example; our inverse reads them
    back to the cumulative lengths (as HF's flash-attention path does)."""
    from transformers import DataCollatorWithFlattening
    docs = [[5, 6, 7], [8, 9], [1, 2, 3, 4]]
    batch = DataCollatorWithFlattening(return_position_ids=True)([{"input_ids": d} for d in docs],
                                                                return_tensors="np")
    np.testing.assert_array_equal(cu_seqlens_from_positions(batch["position_ids"]), [0, 3, 5, 9])
    np.testing.assert_array_equal(positions_from_cu_seqlens([0, 3, 5, 9]), batch["position_ids"][0])


@pytest.mark.parametrize("cu, total, error, text", [
    ([1, 3], None, PositionError, "cu_seqlens[0] must be 0 (the first document starts there), got 1"),
    ([0, 3, 2], None, PositionError,
     "cu_seqlens must be non-decreasing, got cu_seqlens[2] = 2 after cu_seqlens[1] = 3"),
    ([0, 3], 4, PositionError, "cu_seqlens must end at the number of tokens T = 4, got cu_seqlens[-1] = 3"),
    (np.array([0.0, 3.0]), None, DtypeError, "cu_seqlens must be an int32 or int64 vector, got dtype float64"),
    (np.array([0, 3], np.int16), None, DtypeError, "got dtype int16"),
    ([[0, 3]], None, ConfigError, "cu_seqlens must have shape (num_docs + 1,): 0, the cumulative lengths, T; "
                                  "got shape (1, 2)"),
    (np.zeros(0, np.int64), None, ConfigError, "got shape (0,)"),
    ([], None, ConfigError, "got shape (0,)"),                  # an empty list: no values, so no dtype to refuse
    ([0, 3], -1, ConfigError, "total must be >= 0, got -1"),
])
def test_bad_cu_seqlens_are_refused_with_the_value(cu: object, total: object, error: type, text: str) -> None:
    with pytest.raises(error) as info:
        positions_from_cu_seqlens(cu, total)
    assert text in str(info.value)


@pytest.mark.parametrize("pos, error, text", [
    ([1, 2, 0], PositionError, "positions of a packed row must start at 0, got positions[0] = 1"),
    ([0, 1, 3], PositionError, "must count up by 1 or restart at 0, got positions[2] = 3 after positions[1] = 1"),
    ([0, -1], PositionError, "is negative"),
    ([[0, 1], [0, 1]], ConfigError, "must have shape (T,) or (1, T), got (2, 2)"),
    ([0.0, 1.0], PositionError, "dtype"),
])
def test_bad_positions_are_refused(pos: object, error: type, text: str) -> None:
    with pytest.raises(error) as info:
        cu_seqlens_from_positions(pos)
    assert text in str(info.value)


def test_an_empty_list_is_no_tokens() -> None:
    """An empty Python list holds no values (NumPy would call it float64): no tokens, as an empty int array."""
    np.testing.assert_array_equal(cu_seqlens_from_positions([]), [0])
    np.testing.assert_array_equal(positions_from_cu_seqlens([0]), np.zeros(0, np.int64))
