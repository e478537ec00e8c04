"""kernels.packing.document_positions: the compiled pass equals its twin
(tables.formulas.packing.document_positions) on every cu_seqlens, and refuses what the twin refuses
with the same typed error and message, kernels on and off."""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tokenpos import use_kernels
from tokenpos.kernels.packing import _positions_core, document_positions
from tokenpos.tables.errors import ConfigError, DtypeError, PositionError
from tokenpos.tables.formulas import packing as formulas


@given(lengths=st.lists(st.integers(0, 40), max_size=12), dtype=st.sampled_from([np.int32, np.int64]),
       kernels=st.booleans(), data=st.data())
def test_equals_the_formula(lengths: list[int], dtype: type, kernels: bool, data: st.DataObject) -> None:
    cu = np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)]).astype(dtype)   # empty documents too
    total = int(cu[-1])
    with use_kernels(kernels):
        pos, longest = document_positions(cu, total)
    want, want_longest = formulas.document_positions(cu, total)
    assert pos.dtype == np.int64 and longest == want_longest == max(lengths, default=0)
    np.testing.assert_array_equal(pos, want)
    # where each document starts counting (flash-attn's seqlen_offsets): one int for all, or one per document
    per_document = st.lists(st.integers(0, 10**6), min_size=len(lengths), max_size=len(lengths))
    start_pos = data.draw(st.one_of(st.integers(0, 10**6), per_document.map(lambda v: np.array(v, np.int64))))
    with use_kernels(kernels):
        pos, end = document_positions(cu, total, start_pos)
    starts = np.broadcast_to(start_pos, len(lengths))
    truth = [s + i for s, n in zip(starts, lengths, strict=True) for i in range(n)]
    np.testing.assert_array_equal(pos, np.array(truth, np.int64))
    assert end == (max(truth) + 1 if truth else 0)
    np.testing.assert_array_equal(formulas.positions_from_cu_seqlens(cu, start_pos=start_pos), pos)


@pytest.mark.parametrize("kernels", [True, False])
@pytest.mark.parametrize("cu, start_pos, error, text", [
    ([0, 3, 5], [1], ConfigError, r"one int per document, shape \(2,\); got shape \(1,\)"),
    ([0, 3, 5], [[1, 2]], ConfigError, r"one int per document, shape \(2,\); got shape \(1, 2\)"),
    ([0, 3, 5], [1, -2], PositionError, r"start_pos -2 at index \(1,\) is negative"),
    ([0, 3, 5], -1, ConfigError, "start_pos must be >= 0, got -1"),
    ([0, 3, 5], np.array([0.5, 1.0]), PositionError, "integer"),
    ([0, 3, 5], [0, 2**63 - 2], PositionError, "start_pos 9223372036854775806 of document 1 with its 2 tokens "
                                                "overflows int64"),
    ([0, 6, 5], [1, 2], PositionError, "non-decreasing"),          # cu's error first, as the twin's
])
def test_bad_document_starts_are_refused_as_the_formula_refuses_them(cu: list, start_pos: Any, error: type,
                                                                     text: str, kernels: bool) -> None:
    arr = np.asarray(cu, np.int64)
    with pytest.raises(error, match=text) as want:
        formulas.document_positions(arr, 5, start_pos)
    with use_kernels(kernels), pytest.raises(error, match=re.escape(str(want.value))):
        document_positions(arr, 5, start_pos)


@pytest.mark.parametrize("kernels", [True, False])
@pytest.mark.parametrize("cu, total, error", [
    ([1, 3, 5], 5, PositionError),            # not 0 first
    ([0, 4, 3, 5], 5, PositionError),         # decreasing
    ([0, 1, 7, 5], 5, PositionError),         # above T inside, then decreasing (wrote past T once)
    ([0, 1, 10**8, 5], 5, PositionError),
    ([0, 3, 5], 6, PositionError),            # not ending at T
    ([0.0, 5.0], 5, DtypeError),              # not int32 / int64
    ([[0, 5]], 5, ConfigError),               # not (N + 1,)
    ([], 0, ConfigError),
])
def test_refusals_are_the_formulas(cu: list, total: int, error: type, kernels: bool) -> None:
    arr = np.asarray(cu, None if not cu or not isinstance(cu[0], int) else np.int64)
    with pytest.raises(error) as want:
        formulas.document_positions(arr, total)
    with use_kernels(kernels), pytest.raises(error, match=re.escape(str(want.value))):
        document_positions(arr, total)


@given(cu=st.lists(st.integers(-3, 12), min_size=1, max_size=6), total=st.integers(0, 8),
       dtype=st.sampled_from([np.int32, np.int64]))
def test_any_cu_seqlens_gives_the_formulas_answer_and_the_core_writes_only_its_output(
        cu: list[int], total: int, dtype: type) -> None:
    """Any values, valid or not: the compiled pass returns the twin's positions or raises its error, and
    its core never writes outside ``out`` (canaries on both sides); a value above T inside ``cu`` once
    made it write past the end of its (T,) buffer."""
    arr = np.asarray(cu, dtype)
    buf = np.full(total + 16, -7, np.int64)
    assert _positions_core(arr, np.zeros(max(arr.size - 1, 0), np.int64), buf[8:8 + total]) >= -1
    assert (buf[:8] == -7).all() and (buf[8 + total:] == -7).all()
    try:
        want = formulas.document_positions(arr, total)
    except (ConfigError, PositionError) as err:
        with pytest.raises(type(err), match=re.escape(str(err))):
            document_positions(arr, total)
        return
    got = document_positions(arr, total)
    np.testing.assert_array_equal(got[0], want[0])
    assert got[1] == want[1]


def test_every_packed_layer_takes_its_positions_from_the_one_compiled_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    """TransformerEmbedding and RotaryEmbedding, in both backends, get a packed call's positions from one
    call of this module's compiled pass (which checks ``cu_seqlens`` too), never from a second route: the
    NumPy RotaryEmbedding ran the NumPy formula (about 30 us more per call, and a second pass for the
    longest document) until 2026-11-27."""
    import torch

    import tokenpos.kernels.packing as packing
    import tokenpos.numpy as tpn
    import tokenpos.torch as tpt

    calls: list[int] = []
    core = packing._positions_core
    monkeypatch.setattr(packing, "_positions_core", lambda cu, starts, out: calls.append(1) or core(cu, starts, out))
    cu = np.array([0, 3, 8], np.int64)
    q = np.zeros((8, 2, 4), np.float32)
    ids = np.arange(8)
    layers: dict[str, Any] = {
        "numpy TransformerEmbedding": lambda: tpn.TransformerEmbedding(10, 4, 8, seed=0)(ids, cu_seqlens=cu),
        "torch TransformerEmbedding": lambda: tpt.TransformerEmbedding(10, 4, 8, seed=0)(
            torch.from_numpy(ids), cu_seqlens=torch.from_numpy(cu)),
        "numpy RotaryEmbedding": lambda: tpn.RotaryEmbedding(4, max_seq_len=8, qk_layout="thd").apply(
            q, q, cu_seqlens=cu),
        "torch RotaryEmbedding": lambda: tpt.RotaryEmbedding(4, max_seq_len=8, qk_layout="thd").apply(
            torch.from_numpy(q), torch.from_numpy(q), cu_seqlens=torch.from_numpy(cu)),
    }
    for name, call in layers.items():
        calls.clear()
        with use_kernels(True):
            call()
        assert len(calls) == 1, name
