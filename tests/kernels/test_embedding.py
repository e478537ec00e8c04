"""embedding_forward / embedding_backward against their NumPy twins."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.kernels.compare import assert_close
from tokenpos.kernels import embedding_backward, embedding_forward
from tokenpos.kernels.reference import embedding_backward_ref, embedding_forward_ref
from tokenpos.tables.errors import ConfigError, KernelBoundError, PositionError, TokenIdError

SETTINGS = settings(max_examples=30, deadline=None)


@st.composite
def cases(draw):
    V = draw(st.integers(1, 40))
    D = draw(st.integers(1, 70))
    B = draw(st.integers(1, 4))
    L = draw(st.integers(1, 9))
    dtype = draw(st.sampled_from([np.float32, np.float64]))
    p = draw(st.sampled_from([0.0, 0.1, 0.5]))
    pos_mode = draw(st.sampled_from(["none", "broadcast", "full"]))
    P = L + draw(st.integers(0, 3))
    scale = draw(st.sampled_from([1.0, 0.5, float(np.sqrt(D))]))
    seed = draw(st.integers(0, 2**63 - 1))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    ids = rng.integers(0, V, (B, L))                      # duplicates are likely with small V
    if B > 1 and draw(st.booleans()):
        ids[1] = ids[0]
    padding_idx = draw(st.one_of(st.none(), st.just(int(ids[0, 0]))))
    weight = rng.standard_normal((V, D)).astype(dtype)
    pos_table = pos_ids = None
    if pos_mode != "none":
        pos_table = rng.standard_normal((P, D))         # float64: cast to the weight dtype
        pos_ids = rng.integers(0, P, (L,)) if pos_mode == "broadcast" else rng.integers(0, P, (B, L))
    grad = rng.standard_normal((B, L, D)).astype(dtype)
    return dict(weight=weight, ids=ids, scale=scale, pos_table=pos_table, pos_ids=pos_ids, p=p,
                seed=seed, grad=grad, padding_idx=padding_idx, P=P)


@pytest.mark.parametrize("pos_mode", ["none", "broadcast", "full"])
@pytest.mark.parametrize("ahead, l2_times", [(0, 0), (1, 0), (2, 2), (1, 3), (1000, 2)])
def test_forward_tasks_cover_every_row_once(pos_mode: str, ahead: int, l2_times: int, monkeypatch, rng) -> None:
    """Every row is written once by the row loop; the prefetch (L1 off, the next row, two on, past the
    last row; L2 off, 3 and 4 rows on, past the last row) changes no bit, nor does a row that ends in
    a partial line (D = 70: four lines and 6 elements)."""
    import tokenpos.kernels.embedding as E

    monkeypatch.setattr(E, "PREFETCH_BYTES", ahead * 70 * 4)   # rows of D = 70 float32
    monkeypatch.setattr(E, "PREFETCH_L2_TIMES", l2_times)
    B, L, D, V = 37, 5, 70, 50
    w = rng.standard_normal((V, D)).astype(np.float32)
    ids = rng.integers(0, V, (B, L))
    pt = rng.standard_normal((L + 2, D)).astype(np.float32) if pos_mode != "none" else None
    pos = None if pt is None else (rng.integers(0, L + 2, (L,)) if pos_mode == "broadcast"
                                   else rng.integers(0, L + 2, (B, L)))
    for p in (0.0, 0.1):
        kw = dict(scale=1.5, pos_table=pt, pos_ids=pos, dropout_p=p, seed=9)
        out = np.full((B, L, D), np.nan, np.float32)
        embedding_forward(w, ids, out=out, **kw)
        assert np.array_equal(out, embedding_forward_ref(w, ids, **kw))


@SETTINGS
@given(cases())
def test_forward_bit_exact(c) -> None:
    kw = dict(scale=c["scale"], pos_table=c["pos_table"], pos_ids=c["pos_ids"], dropout_p=c["p"], seed=c["seed"])
    got = embedding_forward(c["weight"], c["ids"], **kw)
    want = embedding_forward_ref(c["weight"], c["ids"], **kw)
    assert got.dtype == c["weight"].dtype and got.shape == c["ids"].shape + (c["weight"].shape[1],)
    assert np.array_equal(got, want)


@SETTINGS
@given(cases())
def test_backward_matches_reference(c) -> None:
    has_pos = c["pos_ids"] is not None
    kw = dict(scale=c["scale"], dropout_p=c["p"], seed=c["seed"], padding_idx=c["padding_idx"],
              pos_ids=c["pos_ids"], num_positions=c["P"] if has_pos else None)
    u, rows, pg = embedding_backward(c["grad"], c["ids"], **kw)
    ru, rrows, rpg = embedding_backward_ref(c["grad"], c["ids"], **kw)
    assert np.array_equal(u, ru) and u.dtype == np.int64
    assert np.all(np.diff(u) > 0)
    if c["padding_idx"] is not None:
        assert c["padding_idx"] not in u
    n = c["ids"].size
    assert_close(rows, rrows, scale=np.sqrt(n) * c["scale"] * 2)
    if has_pos:
        assert_close(pg, rpg, scale=np.sqrt(n) * 2)
    else:
        assert pg is None


def test_backward_is_the_adjoint_of_forward(rng) -> None:
    """<forward(w), g> == <w, backward(g)> for the token table (dense), in float64."""
    V, D, B, L, P = 13, 24, 3, 6, 8
    w = rng.standard_normal((V, D))
    ids = rng.integers(0, V, (B, L))
    g = rng.standard_normal((B, L, D))
    kw = dict(scale=1.7, dropout_p=0.3, seed=5)
    y = embedding_forward(w, ids, **kw)
    u, rows, _ = embedding_backward(g, ids, **kw)
    dense = np.zeros_like(w)
    dense[u] = rows
    assert np.isclose(np.sum(y * g), np.sum(w * dense), rtol=1e-12)
    # positional part: y is linear in the pos table too
    pt = rng.standard_normal((P, D))
    pos = rng.integers(0, P, (L,))
    y2 = embedding_forward(np.zeros_like(w), ids, pos_table=pt, pos_ids=pos, **kw)
    _, _, pg = embedding_backward(g, ids, pos_ids=pos, num_positions=P, **kw)
    assert np.isclose(np.sum(y2 * g), np.sum(pt * pg), rtol=1e-12)


def test_forward_writes_into_out(rng) -> None:
    w = rng.standard_normal((10, 16)).astype(np.float32)
    ids = rng.integers(0, 10, (2, 5))
    out = np.full((2, 5, 16), np.nan, np.float32)
    res = embedding_forward(w, ids, scale=2.0, out=out)
    assert res is out
    assert np.array_equal(out, w[ids] * np.float32(2.0))


def test_large_row_counts_and_threads(rng) -> None:
    """Enough rows for several parallel tasks, with broadcast positions."""
    V, D, B, L = 300, 40, 7, 129
    w = rng.standard_normal((V, D)).astype(np.float32)
    pt = rng.standard_normal((L, D)).astype(np.float32)
    ids = rng.integers(0, V, (B, L))
    pos = np.arange(L)
    for p in (0.0, 0.1):
        kw = dict(scale=3.0, pos_table=pt, pos_ids=pos, dropout_p=p, seed=11)
        assert np.array_equal(embedding_forward(w, ids, **kw), embedding_forward_ref(w, ids, **kw))


def test_empty_ids() -> None:
    w = np.ones((4, 3), np.float32)
    assert embedding_forward(w, np.zeros((0,), np.int64)).shape == (0, 3)
    u, rows, _ = embedding_backward(np.zeros((0, 3), np.float32), np.zeros((0,), np.int64))
    assert u.shape == (0,) and rows.shape == (0, 3)


def test_errors() -> None:
    w = np.ones((4, 3), np.float32)
    with pytest.raises(TokenIdError, match="token id 4 at index"):
        embedding_forward(w, np.array([0, 4]))
    with pytest.raises(TokenIdError):
        embedding_forward(w, np.array([-1]))
    with pytest.raises(TokenIdError):
        embedding_forward(w, np.array([0.0]))
    with pytest.raises(PositionError):
        embedding_forward(w, np.array([0, 1]), pos_table=np.ones((2, 3)), pos_ids=np.array([0, 2]))
    with pytest.raises(ConfigError):
        embedding_forward(w, np.array([0, 1]), pos_table=np.ones((2, 3)))
    with pytest.raises(ConfigError):
        embedding_forward(w, np.array([0]), dropout_p=1.0)
    with pytest.raises(ConfigError):
        embedding_forward(w, np.array([0]), out=np.empty((1, 3), np.float64))
    with pytest.raises(ConfigError):
        embedding_forward(w.astype(np.int32), np.array([0]))


@pytest.mark.parametrize("misalign", [0, 4, 12])
def test_output_alignment_does_not_change_results(misalign: int, rng) -> None:
    """Any output alignment, D not a multiple of a line, gives the same bits."""
    V, D, B, L = 50, 37, 5, 30
    w = rng.standard_normal((V, D)).astype(np.float32)
    pt = rng.standard_normal((L + 2, D)).astype(np.float32)
    ids = rng.integers(0, V, (B, L))
    raw = np.zeros(B * L * D * 4 + 128, np.uint8)
    start = (-raw.ctypes.data) % 64 + misalign
    out = raw[start:start + B * L * D * 4].view(np.float32).reshape(B, L, D)
    for pos in (np.arange(L) + 2, rng.integers(0, L + 2, (B, L))):
        for p in (0.0, 0.5):
            kw = dict(scale=2.0, pos_table=pt, pos_ids=pos, dropout_p=p, seed=4)
            got = embedding_forward(w, ids, out=out, **kw)
            assert np.array_equal(got, embedding_forward_ref(w, ids, **kw))


@pytest.mark.parametrize("through", ["cache", "malloc"])
def test_out_none_is_a_fresh_array_every_call(rng, monkeypatch, through: str) -> None:
    """out=None returns an array no live object refers to: a block is reused only once released
    (by the output cache when the output is at least its min_bytes, else by malloc)."""
    from tokenpos._config import OUTPUTS

    monkeypatch.setattr(OUTPUTS, "min_bytes", 1 << 20 if through == "cache" else 1 << 62)
    w = rng.standard_normal((20, 1024)).astype(np.float32)
    ids = rng.integers(0, 20, (4, 300))                     # 4.9 MB
    a = embedding_forward(w, ids)
    view = a[1:]
    del a
    b = embedding_forward(w, ids * 0)
    assert not np.shares_memory(b, view)
    assert np.array_equal(view, w[ids][1:]) and np.array_equal(b, w[ids * 0])
    addr = b.ctypes.data
    del b
    c = embedding_forward(w, ids)                           # b's block, released, is reused
    assert np.array_equal(c, w[ids])
    if through == "cache":
        assert c.ctypes.data == addr


def test_ids_checked_inside_the_loop_give_the_shared_message(rng) -> None:
    """The first bad id in C order is reported with the shared message."""
    from tokenpos.tables.checks.validation import token_id_range_message

    w = rng.standard_normal((10, 8)).astype(np.float32)
    ids = rng.integers(0, 10, (3, 40))
    ids[1, 7], ids[2, 3] = 10, -2
    with pytest.raises(TokenIdError) as err:
        embedding_forward(w, ids)
    assert str(err.value) == token_id_range_message(10, (1, 7), 10)
    with pytest.raises(TokenIdError):
        embedding_forward(w, ids.astype(np.int32), bf16=False)


def test_forward_rows_on_checked_inputs_gives_the_checked_result(rng) -> None:
    """The entry both backends' ops call (inputs checked by the layer) gives the checked API's bits
    for every integer dtype; a bad row it meets is still refused (its memory bound)."""
    from tokenpos.kernels.embedding import forward_rows

    w = rng.standard_normal((10, 8)).astype(np.float32)
    for dt in (np.int64, np.int32, np.uint16):
        ids = rng.integers(0, 10, (3, 5)).astype(dt)
        kw = dict(scale=1.5, dropout_p=0.2, seed=9)
        out = forward_rows(w, ids, None, None, 1.5, 0.2, 9, np.empty((3, 5, 8), np.float32))
        assert np.array_equal(out, embedding_forward_ref(w, ids, **kw))
        assert np.array_equal(out, embedding_forward(w, ids, **kw))
    with pytest.raises(TokenIdError):                       # the checked API checks the dtype
        embedding_forward(w, np.array([0.0]))
    with pytest.raises(KernelBoundError):                   # an unchecked bad id: never read, refused
        forward_rows(w, np.array([1, 10]), None, None, 1.0, 0.0, 0, np.empty((2, 8), np.float32))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_dropout_propagates_nan_and_inf_like_torch(dtype, rng) -> None:
    """A NaN row stays NaN in every kept and dropped element (x * m, never a select); Inf * 0 is NaN."""
    V, D = 6, 64
    w = rng.standard_normal((V, D)).astype(dtype)
    w[2] = np.nan
    w[3] = np.inf
    ids = np.array([[2, 3, 1], [1, 2, 0]])
    kw = dict(scale=2.0, dropout_p=0.5, seed=17)
    for f in (embedding_forward, embedding_forward_ref):
        y = f(w, ids, **kw)
        assert np.isnan(y[0, 0]).all() and np.isnan(y[1, 1]).all()
        keep = embedding_forward(np.ones_like(w), ids, **kw) != 0
        assert np.all(np.isinf(y[0, 1][keep[0, 1]])) and np.all(np.isnan(y[0, 1][~keep[0, 1]]))
        assert np.all(np.isfinite(y[0, 2]))
    g = np.full(ids.shape + (D,), np.nan, dtype)
    for f in (embedding_backward, embedding_backward_ref):
        _, rows, _ = f(g, ids, **kw)                        # grad * m: NaN grads stay NaN
        assert np.isnan(rows).all()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("D", [16, 37, 64])
@pytest.mark.parametrize("p", [0.0, 0.5])
@pytest.mark.parametrize("has_pos", [True, False])
def test_whole_lines_and_tails_write_the_same_bits_as_the_reference(dtype, D: int, p: float, has_pos: bool,
                                                                      rng) -> None:
    """Rows are computed a 64-byte line at a time (512-bit vectors) and their tails element by
    element: both give the reference's bits on special values (NaN, +-Inf, -0, subnormals, the
    largest finite), with the dropout mask on every lane."""
    info = np.finfo(dtype)
    special = np.array([np.nan, np.inf, -np.inf, -0.0, 0.0, info.smallest_subnormal, -info.smallest_subnormal,
                        info.tiny, info.max, -info.max, 1.0, -1.5], dtype)
    V, L = 9, 4
    w = rng.standard_normal((V, D)).astype(dtype)
    w[:3] = rng.choice(special, (3, D))                     # rows of special values, lanes and tail alike
    pt = rng.choice(special, (L, D)) if has_pos else None
    ids = rng.integers(0, V, (5, L))
    kw = dict(scale=float(info.max) if D == 37 else 0.5, pos_table=pt, pos_ids=np.arange(L) if has_pos else None,
              dropout_p=p, seed=123, dropout_offset=7)
    with np.errstate(all="ignore"):
        want = embedding_forward_ref(w, ids, **kw)
    got = embedding_forward(w, ids, **kw)
    assert got.tobytes() == want.tobytes()


def test_backward_with_huge_ids_uses_a_sort(rng) -> None:
    """A stray huge id does not allocate a V-sized table; results match the reference."""
    ids = np.array([[5, 2**40, 5], [7, 2**40, 3]])
    g = rng.standard_normal((2, 3, 4))
    u, rows, _ = embedding_backward(g, ids, padding_idx=7)
    ru, rrows, _ = embedding_backward_ref(g, ids, padding_idx=7)
    assert np.array_equal(u, ru) and list(u) == [3, 5, 2**40]
    np.testing.assert_allclose(rows, rrows, rtol=1e-12)


@pytest.mark.parametrize("pos", [np.array([0, 2]), np.array([-1, 0]), np.array([0, -3], np.int32),
                                 np.array([[0, 1], [5, 0]])], ids=["high", "negative", "int32", "2d"])
def test_positions_are_checked_with_the_shared_message(pos: np.ndarray) -> None:
    """Bad positions never reach a table read: the checked API refuses them with the shared message."""
    from tokenpos.tables.checks.validation import check_positions

    w, pt = np.ones((4, 3), np.float32), np.ones((2, 3), np.float32)
    ids = np.zeros(pos.shape if pos.ndim == 2 else (2,), np.int64)
    with pytest.raises(PositionError) as expected:
        check_positions(pos, 2)
    for fn in (embedding_forward, embedding_forward_ref):
        with pytest.raises(PositionError) as got:
            fn(w, ids, pos_table=pt, pos_ids=pos)
        assert str(got.value) == str(expected.value)


def test_values_are_checked_when_rows_are_empty() -> None:
    """D == 0: no loop runs, and bad ids and positions are still refused."""
    w, pt = np.ones((4, 0), np.float32), np.ones((2, 0), np.float32)
    with pytest.raises(TokenIdError):
        embedding_forward(w, np.array([0, 4]))
    with pytest.raises(PositionError):
        embedding_forward(w, np.array([0, 1]), pos_table=pt, pos_ids=np.array([0, 2]))
    assert embedding_forward(w, np.array([0, 3]), pos_table=pt, pos_ids=np.array([0, 1])).shape == (2, 0)


def test_forward_rows_reports_bad_rows_without_reading_them(rng) -> None:
    """The unchecked entry both backends' ops use: it raises KernelBoundError naming how many rows it
    skipped, and writes the good ones."""
    from tokenpos.kernels.embedding import forward_rows

    w = rng.standard_normal((5, 4)).astype(np.float32)
    pt = rng.standard_normal((3, 4)).astype(np.float32)
    ids = np.array([0, 7, 2, -1, 4, 1], np.int64)
    pid = np.array([0, 1, 9], np.int64)                                 # row n uses pid[n % 3]
    out = np.zeros((6, 4), np.float32)
    with pytest.raises(KernelBoundError, match=r"^token id 7 at index \(1,\) is out of range \[0, 5\): .*"
                                               r"skipped 4 rows"):       # rows 1, 3 (ids), 2, 5 (position 9)
        forward_rows(w, ids, pt, pid, 2.0, 0.0, 0, out)
    for n in (0, 4):
        assert np.array_equal(out[n], w[ids[n]] * np.float32(2.0) + pt[pid[n % 3]])
    good_ids = np.array([0, 1, 2, 3, 4, 1], np.int64)
    with pytest.raises(KernelBoundError, match=r"^position 9 at index \(2,\) is out of range \[0, 3\) .*"
                                               r"skipped 2 rows"):       # position 9: rows 2 and 5
        forward_rows(w, good_ids, pt, pid, 2.0, 0.0, 0, out)


@pytest.mark.parametrize("bad", [5, -1, 2**62, -(2**62), np.iinfo(np.int64).max])
@pytest.mark.parametrize("ahead, l2_times", [(1, 2), (3, 1), (1, 0)])
def test_bad_ids_ahead_of_good_rows_are_never_prefetched_or_read(bad: int, ahead: int, l2_times: int, monkeypatch,
                                                                  rng) -> None:
    """A bad id that the prefetch reaches before its own row (any distance, any magnitude) is skipped
    there and reported after the loop; the good rows around it are exact."""
    import tokenpos.kernels.embedding as E
    from tokenpos.kernels.embedding import forward_rows

    monkeypatch.setattr(E, "PREFETCH_BYTES", ahead * 4 * 4)      # rows of D = 4 float32
    monkeypatch.setattr(E, "PREFETCH_L2_TIMES", l2_times)
    w = rng.standard_normal((5, 4)).astype(np.float32)
    ids = np.array([0, 1, 2, bad, 3, 4, bad, 1], np.int64)
    out = np.zeros((8, 4), np.float32)
    with pytest.raises(KernelBoundError, match="skipped 2 rows"):
        forward_rows(w, ids, None, None, 1.5, 0.0, 0, out)
    for n in (0, 1, 2, 4, 5, 7):
        assert np.array_equal(out[n], w[ids[n]] * np.float32(1.5))
    with pytest.raises(TokenIdError):
        embedding_forward(w, ids)


def test_prefetch_distance_is_in_bytes(monkeypatch) -> None:
    """The forward prefetches about PREFETCH_BYTES of rows ahead into L1 (twice the rows for half-width
    rows, at least one row, none when it is off) and PREFETCH_L2_TIMES times as far into L2."""
    import tokenpos.kernels.embedding as E

    monkeypatch.setattr(E, "PREFETCH_BYTES", 12 << 10)
    monkeypatch.setattr(E, "PREFETCH_L2_TIMES", 2)
    assert (E.prefetch_rows(768 * 4), E.prefetch_rows(768 * 2), E.prefetch_rows(1 << 20)) == ((4, 8), (8, 16), (1, 2))
    assert E.prefetch_rows(0) == (12 << 10, 24 << 10)
    monkeypatch.setattr(E, "PREFETCH_L2_TIMES", 0)
    assert E.prefetch_rows(768 * 4) == (4, 0)
    monkeypatch.setattr(E, "PREFETCH_BYTES", 0)
    monkeypatch.setattr(E, "PREFETCH_L2_TIMES", 2)
    assert E.prefetch_rows(768 * 4) == (0, 0)
