"""tables.checks.validation and tables.errors: every check, its exception type, and its message."""

from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from tokenpos.tables import ConfigError, PositionError, StateDictError, TokenIdError
from tokenpos.tables.checks import validation as v

FAST = settings(max_examples=40, deadline=None)


def test_exception_hierarchy():
    assert issubclass(TokenIdError, ValueError) and issubclass(TokenIdError, IndexError)
    assert issubclass(PositionError, ValueError) and issubclass(PositionError, IndexError)
    assert issubclass(ConfigError, ValueError)
    assert issubclass(StateDictError, ValueError)


def test_message_builders_follow_what_got_expected():
    assert v.token_id_range_message(50257, (1, 3), 50257) == "token id 50257 at index (1, 3) is out of range [0, 50257)"
    assert v.token_id_range_message(-1, (4,), 10) == "token id -1 at index (4,) is out of range [0, 10)"
    assert v.position_range_message(1024, (0, 5), 1024) == (
        "position 1024 at index (0, 5) is out of range [0, 1024) (max_seq_len=1024)")


def test_check_token_ids_accepts_and_converts():
    for dt in (np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64):
        out = v.check_token_ids(np.array([[0, 3], [9, 1]], dtype=dt), 10)
        assert out.dtype == np.int64
        np.testing.assert_array_equal(out, [[0, 3], [9, 1]])
    assert v.check_token_ids([1, 2], 3).dtype == np.int64
    assert v.check_token_ids(np.zeros((0, 4), dtype=np.int64), 3).shape == (0, 4)
    assert v.check_token_ids(np.int64(2), 3).shape == ()


@pytest.mark.parametrize("ids, value, index", [
    (np.array([[1, 2], [3, 10]]), "10", "(1, 1)"),
    (np.array([0, -1, 20]), "-1", "(1,)"),
    (np.array([[5, 9], [12, -3]]), "12", "(1, 0)"),          # the first bad one in C order
    (np.array([np.iinfo(np.uint64).max], dtype=np.uint64), str(np.iinfo(np.uint64).max), "(0,)"),
])
def test_check_token_ids_range(ids, value, index):
    with pytest.raises(TokenIdError) as err:
        v.check_token_ids(ids, 10)
    msg = str(err.value)
    assert f"token id {value} at index {index}" in msg
    assert "[0, 10)" in msg


@pytest.mark.parametrize("ids", [np.array([1.0, 2.0]), np.array([True, False]), np.array(["1"]),
                                 np.array([1, None], dtype=object), [0.5], np.array([1 + 0j])])
def test_check_token_ids_non_integer(ids):
    with pytest.raises(TokenIdError, match=r"integers, got dtype .*\[0, 7\)"):
        v.check_token_ids(ids, 7)


@FAST
@given(ids=hnp.arrays(np.int64, hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=5),
                      elements=st.integers(-20, 20)), vocab=st.integers(1, 15))
def test_check_token_ids_property(ids, vocab):
    bad = (ids < 0) | (ids >= vocab)
    if bad.any():
        with pytest.raises(TokenIdError) as err:
            v.check_token_ids(ids, vocab)
        first = tuple(np.argwhere(bad)[0])
        assert f"token id {ids[first]} at index" in str(err.value)
        assert f"[0, {vocab})" in str(err.value)
    else:
        np.testing.assert_array_equal(v.check_token_ids(ids, vocab), ids)


def test_check_positions():
    np.testing.assert_array_equal(v.check_positions(np.array([0, 4]), 5), [0, 4])
    with pytest.raises(PositionError, match=r"position 5 at index \(1,\) is out of range \[0, 5\).*max_seq_len=5"):
        v.check_positions(np.array([0, 5]), 5)
    with pytest.raises(PositionError, match="position -2 at index .* is negative"):
        v.check_positions(np.array([[1, -2]]))
    with pytest.raises(PositionError, match="float64"):
        v.check_positions(np.array([1.0]))
    assert v.check_positions(np.array([10**9])).dtype == np.int64    # no maximum: anything >= 0


def test_check_seq_len_or_positions():
    np.testing.assert_array_equal(v.check_seq_len_or_positions(3, 8), [0, 1, 2])
    np.testing.assert_array_equal(v.check_seq_len_or_positions(8, 8), np.arange(8))
    assert v.check_seq_len_or_positions(0, 8).shape == (0,)
    with pytest.raises(PositionError, match="seq_len 9 exceeds max_seq_len 8"):
        v.check_seq_len_or_positions(9, 8)
    with pytest.raises(ConfigError, match="seq_len must be >= 0, got -1"):
        v.check_seq_len_or_positions(-1, 8)
    with pytest.raises(PositionError, match="position 8 at index"):
        v.check_seq_len_or_positions(np.array([[0, 8]]), 8)
    np.testing.assert_array_equal(v.check_seq_len_or_positions(np.int32(2), 8), [0, 1])


@pytest.mark.parametrize("value", [0, -5, 1.5, "3", None, True])
def test_check_positive_int(value):
    with pytest.raises(ConfigError, match="d_model") as err:
        v.check_positive_int("d_model", value)
    assert repr(value) in str(err.value) or str(value) in str(err.value)
    if isinstance(value, int) and not isinstance(value, bool):
        assert ">= 1" in str(err.value)


def test_scalar_checks():
    assert v.check_positive_int("vocab_size", np.int32(5)) == 5
    assert v.check_probability("dropout", 0.0) == 0.0
    for p in (1.0, -0.1, float("nan"), float("inf"), "0.1", True):
        with pytest.raises(ConfigError, match="dropout"):
            v.check_probability("dropout", p)
    with pytest.raises(ConfigError, match=r"positional must be one of 'a', 'b'; got 'c'"):
        v.check_choice("positional", "c", ["a", "b"])
    assert v.check_padding_idx(None, 5) is None
    assert v.check_padding_idx(4, 5) == 4
    for bad in (-1, 5):
        with pytest.raises(ConfigError, match=rf"padding_idx must be in \[0, 5\) or None, got {bad}"):
            v.check_padding_idx(bad, 5)
    assert v.check_dtype("dtype", "float16") == np.float16
    with pytest.raises(ConfigError, match="dtype must be one of float16, float32, float64; got int32"):
        v.check_dtype("dtype", np.int32)
    with pytest.raises(ConfigError, match="last dimension 4, got shape"):
        v.check_feature_dim("h", (2, 3), 4)


def test_check_state_dict():
    exp = {"weight": ((3, 4), np.float32)}
    v.check_state_dict({"weight": np.zeros((3, 4), np.float32)}, exp)
    with pytest.raises(StateDictError, match=r"state_dict\['weight'\].*shape \(4, 4\), expected \(3, 4\)"):
        v.check_state_dict({"weight": np.zeros((4, 4), np.float32)}, exp)
    with pytest.raises(StateDictError, match=r"state_dict\['weight'\].*dtype float64, expected float32"):
        v.check_state_dict({"weight": np.zeros((3, 4))}, exp)
    with pytest.raises(StateDictError, match=r"missing keys \['weight'\], unexpected keys \['w'\]"):
        v.check_state_dict({"w": np.zeros((3, 4), np.float32)}, exp)
    v.check_state_dict({"extra": np.zeros(2)}, exp, strict=False)


# ---------------------------------------------------------------------------------------------- odd dtypes


@pytest.mark.parametrize("dtype", ["m8[s]", "M8[D]", object, np.float64, np.complex64, np.bool_])
def test_ids_and_positions_of_non_integer_dtypes_are_refused(dtype):
    """timedelta64 is a subtype of np.integer for NumPy, yet it is not an id (nor is datetime64 or object)."""
    arr = np.array([1, 2]).astype(dtype)
    with pytest.raises(TokenIdError, match=re.escape(f"must be integers, got dtype {np.dtype(dtype)};")):
        v.check_token_ids(arr, 10)
    with pytest.raises(PositionError, match="must be integers"):
        v.check_positions(arr, 10)


@given(hnp.arrays(st.sampled_from([np.uint8, np.uint16, np.uint32, np.uint64, np.int8, np.int32]),
                  hnp.array_shapes(max_dims=2, max_side=4), elements=st.integers(0, 9)))
@FAST
def test_every_integer_dtype_is_an_id(ids):
    np.testing.assert_array_equal(v.check_token_ids(ids, 10), ids.astype(np.int64))


def test_uint64_positions_beyond_int64_are_refused_not_wrapped():
    with pytest.raises(PositionError, match=r"position 18446744073709551615 at index \(1,\) is out of range"):
        v.check_positions(np.array([0, 2**64 - 1], np.uint64))


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.bool_, np.complex64, object])
def test_float_inputs_of_integer_bool_complex_or_object_dtype_are_refused(dtype):
    from tokenpos.tables.errors import DtypeError

    with pytest.raises(DtypeError, match=r"q must be a floating-point array, got dtype") as err:
        v.check_float_array("q", np.ones((2, 3)).astype(dtype))
    assert isinstance(err.value, ConfigError) and isinstance(err.value, TypeError)
    for dt in (np.float16, np.float32, np.float64):
        assert v.check_float_array("q", np.ones(3, dt)).dtype == dt


@pytest.mark.parametrize("value", ["yes", 1, 0, None, 1.0, "False"])
def test_check_bool_refuses_everything_but_bools(value):
    with pytest.raises(ConfigError, match="scale must be True or False"):
        v.check_bool("scale", value)
    assert v.check_bool("scale", np.bool_(True)) is True and v.check_bool("scale", False) is False


def test_start_pos_whose_positions_overflow_int64_is_a_position_error():
    assert v.check_start_pos(2**63 - 4, 3) == 2**63 - 4
    with pytest.raises(PositionError, match="overflows int64"):
        v.check_start_pos(2**63 - 2, 3)
    with pytest.raises(ConfigError, match="start_pos must be >= 0"):
        v.check_start_pos(-1, 3)


@pytest.mark.parametrize("none_ok", [False, True])
@pytest.mark.parametrize("start_pos", [0, np.int64(0), np.uint8(0), None, 3, np.int64(3), -1, True, False, 1.5, "3"])
def test_start_pos_with_positions_must_be_zero(start_pos, none_ok):
    """Positions given: start_pos 0 (any integer type; None where it is the default) passes, anything
    else is a ConfigError naming the value and what was expected. Without positions nothing is checked
    here (check_start_pos does that where the default positions are built)."""
    v.check_start_pos_with_positions(start_pos, None, none_ok=none_ok)
    ok = (start_pos is None and none_ok) or (
        start_pos is not None and not isinstance(start_pos, (bool, float, str)) and int(start_pos) == 0)
    if ok:
        assert v.check_start_pos_with_positions(start_pos, np.arange(3), none_ok=none_ok) is None
        return
    got = repr(start_pos) if isinstance(start_pos, (bool, float, str)) or start_pos is None else int(start_pos)
    expected = "start_pos=None or 0" if none_ok else "start_pos=0"
    message = (f"start_pos={got} given with positions: positions are used as given, so start_pos would be "
               f"ignored; expected {expected} (add the offset to positions instead)")
    with pytest.raises(ConfigError) as err:
        v.check_start_pos_with_positions(start_pos, np.arange(3), none_ok=none_ok)
    assert str(err.value) == message


@given(st.sampled_from([np.int8, np.int32, np.int64, np.uint16, np.uint64]), st.data())
@settings(max_examples=60, deadline=None)
def test_check_token_ids_checks_the_values_of_every_integer_dtype(dtype: type, data: st.DataObject) -> None:
    """The one id check has no way to skip values (int64 included): a bad id raises the message of
    the first bad value in C order, quoted as given; good ids come back as int64, equal."""
    V, low = 20, (0 if np.dtype(dtype).kind == "u" else -5)
    ids = data.draw(hnp.arrays(dtype, hnp.array_shapes(max_dims=3), elements=st.integers(low, 40)))
    bad = (ids.astype(np.float64) < 0) | (ids.astype(np.float64) >= V)
    if bad.any():
        first = tuple(int(i) for i in np.argwhere(bad)[0])
        with pytest.raises(TokenIdError, match=re.escape(v.token_id_range_message(ids[first], first, V))):
            v.check_token_ids(ids, V)
        return
    got = v.check_token_ids(ids, V)
    assert got.dtype == np.int64 and np.array_equal(got, ids)


def test_check_token_ids_checks_the_dtype() -> None:
    with pytest.raises(TokenIdError, match="integers, got dtype float64"):
        v.check_token_ids(np.array([1.0]), 10)
