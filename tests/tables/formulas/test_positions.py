"""tables.formulas.positions: default positions and RoBERTa's padding-derived positions."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from tokenpos.tables import ConfigError
from tokenpos.tables.formulas.positions import default_positions, positions_from_padding, shared_default_positions

FAST = settings(max_examples=40, deadline=None)


def padding_positions_loop(ids: np.ndarray, padding_idx: int, start_pos: int = 0) -> np.ndarray:
    out = np.full(ids.shape, padding_idx, dtype=np.int64)
    for row in np.ndindex(*ids.shape[:-1]):
        count = 0
        for j in range(ids.shape[-1]):
            if ids[row + (j,)] != padding_idx:
                count += 1
                out[row + (j,)] = padding_idx + start_pos + count
    return out


def test_default_positions():
    np.testing.assert_array_equal(default_positions(4), [0, 1, 2, 3])
    np.testing.assert_array_equal(default_positions(3, start_pos=7), [7, 8, 9])
    assert default_positions(0, 5).shape == (0,)
    assert default_positions(2).dtype == np.int64
    with pytest.raises(ConfigError, match="start_pos must be >= 0, got -1"):
        default_positions(3, -1)


def test_roberta_example():
    ids = np.array([[0, 31414, 232, 1, 1], [0, 9, 1, 1, 1]])
    np.testing.assert_array_equal(positions_from_padding(ids, 1), [[2, 3, 4, 1, 1], [2, 3, 1, 1, 1]])


@FAST
@given(ids=hnp.arrays(np.int64, hnp.array_shapes(min_dims=1, max_dims=2, min_side=0, max_side=7),
                      elements=st.integers(0, 3)),
       padding_idx=st.integers(0, 3), start_pos=st.integers(0, 5))
def test_matches_a_loop(ids, padding_idx, start_pos):
    got = positions_from_padding(ids, padding_idx, start_pos)
    assert got.shape == ids.shape and got.dtype == np.int64
    np.testing.assert_array_equal(got, padding_positions_loop(ids, padding_idx, start_pos))


@FAST
@given(ids=hnp.arrays(np.int64, st.tuples(st.integers(1, 3), st.integers(1, 7)), elements=st.integers(0, 3)),
       padding_idx=st.integers(0, 3), start_pos=st.integers(0, 5))
def test_matches_hf_roberta(ids, padding_idx, start_pos):
    torch = pytest.importorskip("torch")
    roberta = pytest.importorskip("transformers.models.roberta.modeling_roberta")
    ref = roberta.RobertaEmbeddings.create_position_ids_from_input_ids(torch.from_numpy(ids), padding_idx, start_pos)
    np.testing.assert_array_equal(positions_from_padding(ids, padding_idx, start_pos), ref.numpy())


def test_shared_default_positions_are_one_read_only_array_per_length_and_start() -> None:
    a = shared_default_positions(6, 2)
    np.testing.assert_array_equal(a, default_positions(6, 2))
    assert a.dtype == np.int64 and a is shared_default_positions(6, 2)
    assert shared_default_positions(6, 3) is not a and shared_default_positions(5, 2) is not a
    with pytest.raises(ValueError, match="read-only"):
        a[0] = 99                                              # nobody can change what other calls share
    with pytest.raises(ConfigError):
        shared_default_positions(3, -1)                        # checked as default_positions is
