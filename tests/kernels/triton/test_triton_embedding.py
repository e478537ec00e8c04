"""Triton embedding forward/backward against the NumPy reference, the NumPy dropout mask and torch autograd."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

triton = pytest.importorskip("triton")          # the optional gpu extra

from tests.tolerances import TOL  # noqa: E402
from tokenpos.kernels.reference import embedding_backward_ref, embedding_forward_ref  # noqa: E402
from tokenpos.kernels.triton import embedding_backward, embedding_forward  # noqa: E402
from tokenpos.tables.formulas.dropout import dropout_keep_mask  # noqa: E402

SETTINGS = settings(max_examples=12, deadline=None)
LOW = [torch.bfloat16, torch.float16]


def torch_forward(w, ids, table, pos, scale, p, seed, offset=0):
    """The plain-torch formula in fp32 (COMMON rule #2), rounded once to w's dtype."""
    y = w.float()[ids] * np.float32(scale).item()                         # (..., D)
    if table is not None:
        n = ids.numel()
        full = pos.reshape(-1)[torch.arange(n) % pos.numel()].reshape(ids.shape)
        y = y + table.float()[full]
    if p > 0.0:
        keep = torch.from_numpy(dropout_keep_mask(seed, tuple(y.shape), p, offset=offset))
        y = y * torch.where(keep, np.float32(1.0 / (1.0 - p)).item(), 0.0)
    return y.to(w.dtype)


@st.composite
def cases(draw):
    V = draw(st.integers(1, 12))
    D = draw(st.integers(1, 40))
    shape = draw(st.sampled_from([(5,), (2, 3), (3, 1, 4), (0, 3)]))
    pos_kind = draw(st.sampled_from(["none", "full", "trailing"]))
    p = draw(st.sampled_from([0.0, 0.1, 0.5]))
    seed = draw(st.integers(0, 2**63 - 1))
    offset = draw(st.sampled_from([0, 7, 2**40]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    w = rng.standard_normal((V, D)).astype(np.float32)
    ids = rng.integers(0, V, shape)
    table = pos = None
    if pos_kind != "none":
        P = int(draw(st.integers(1, 9)))
        table = rng.standard_normal((P, D)).astype(np.float32)
        pos = rng.integers(0, P, shape if pos_kind == "full" else shape[-1:])
    return w, ids, table, pos, float(draw(st.sampled_from([1.0, np.sqrt(D)]))), p, seed, offset


def on(device, a):
    """NumPy array (or None) -> tensor on ``device``."""
    return None if a is None else torch.from_numpy(np.asarray(a)).to(device)


@SETTINGS
@given(c=cases())
def test_forward_fp32_equals_numpy_reference_bit_for_bit(c, device) -> None:
    w, ids, table, pos, scale, p, seed, offset = c
    got = embedding_forward(on(device, w), on(device, ids), on(device, table), on(device, pos), scale, p,
                            torch.tensor(seed, device=device), offset=offset).cpu()
    ref = embedding_forward_ref(w, ids, scale=scale, pos_table=table, pos_ids=pos, dropout_p=p, seed=seed,
                                dropout_offset=offset)
    assert got.shape == (*ids.shape, w.shape[1]) and got.dtype == torch.float32
    np.testing.assert_array_equal(got.numpy(), ref)


@pytest.mark.parametrize("dtype", [torch.float32, *LOW])
def test_gather_is_exact(dtype, device, gen) -> None:
    w = torch.randn(17, 33, generator=gen).to(dtype)
    ids = torch.randint(0, 17, (4, 6), generator=gen)
    got = embedding_forward(w.to(device), ids.to(device), None, None, 1.0, 0.0, 0)
    assert got.dtype == dtype
    assert torch.equal(got.cpu(), w[ids])


@pytest.mark.parametrize("dtype", LOW)
def test_low_precision_forward_is_fp32_rounded_once(dtype, device, gen) -> None:
    w = torch.randn(9, 20, generator=gen).to(dtype)
    table = torch.randn(6, 20, generator=gen)                                 # an fp32 positional table
    ids = torch.randint(0, 9, (3, 6), generator=gen)
    pos = torch.arange(6)
    scale, p, seed = float(np.sqrt(20)), 0.25, 99
    got = embedding_forward(w.to(device), ids.to(device), table.to(device), pos.to(device), scale, p, seed)
    assert torch.equal(got.cpu(), torch_forward(w, ids, table, pos, scale, p, seed))


@pytest.mark.parametrize("seed", [0, 1, 123456789, 2**63 - 1, -5])
@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
@pytest.mark.parametrize("D,offset", [(37, 11), (64, 12), (64, 11)])   # one hash per element / per pair
def test_dropout_mask_is_bit_identical_to_numpy(seed, p, D, offset, device) -> None:
    N = 7
    w = torch.ones(3, D)
    ids = torch.zeros(N, dtype=torch.int64)
    got = embedding_forward(w.to(device), ids.to(device), None, None, 1.0, p, torch.tensor(seed), offset=offset)
    keep = dropout_keep_mask(seed, (N, D), p, offset=offset)
    np.testing.assert_array_equal(got.cpu().numpy() != 0, keep)
    np.testing.assert_array_equal(got.cpu().numpy()[keep], np.float32(1.0 / (1.0 - p)))


@pytest.mark.filterwarnings("ignore:invalid value encountered in multiply:RuntimeWarning")   # the interpreter's numpy
def test_dropout_multiplies_so_nan_and_inf_propagate(device) -> None:
    w = torch.full((2, 64), float("nan"))
    w[1] = float("inf")
    ids = torch.tensor([0, 1])
    got = embedding_forward(w.to(device), ids.to(device), None, None, 1.0, 0.5, 3).cpu()
    keep = torch.from_numpy(dropout_keep_mask(3, (2, 64), 0.5)[1])
    assert torch.isnan(got[0]).all()                                          # nan * m is nan
    assert torch.equal(torch.isinf(got[1]), keep) and torch.isnan(got[1][~keep]).all()   # inf * 0 is nan


def test_p_one_drops_everything_and_p_zero_is_identity(device, gen) -> None:
    w = torch.randn(5, 8, generator=gen)
    ids = torch.randint(0, 5, (6,), generator=gen)
    assert torch.equal(embedding_forward(w.to(device), ids.to(device), None, None, 1.0, 1.0, 7).cpu(),
                       torch.zeros(6, 8))
    assert torch.equal(embedding_forward(w.to(device), ids.to(device), None, None, 2.0, 0.0, 7).cpu(), w[ids] * 2)


def test_ids_outside_the_table_never_read_out_of_bounds(device, gen) -> None:
    # the ops layer rejects such ids; the kernel's loads are masked, so they read zeros, not foreign memory
    w = torch.randn(4, 8, generator=gen)
    got = embedding_forward(w.to(device), torch.tensor([0, 4, -1, 3]).to(device), None, None, 1.0, 0.0, 0).cpu()
    assert torch.equal(got[[0, 3]], w[[0, 3]]) and torch.equal(got[[1, 2]], torch.zeros(2, 8))


def test_int32_ids_and_seed_as_int_equal_int64_ids_and_seed_tensor(device, gen) -> None:
    w = torch.randn(10, 12, generator=gen)
    ids = torch.randint(0, 10, (2, 5), generator=gen)
    a = embedding_forward(w.to(device), ids.to(device), None, None, 3.0, 0.3, 42)
    b = embedding_forward(w.to(device), ids.to(device, torch.int32), None, None, 3.0, 0.3, torch.tensor(42))
    assert torch.equal(a, b)


# --------------------------------------------------------------------------------------------------
# backward
# --------------------------------------------------------------------------------------------------


def autograd_reference(w, ids, table, pos, scale, p, seed, grad, padding_idx):
    """float64 torch autograd of the same formula (padding row excluded as nn.Embedding does)."""
    w64 = w.double().requires_grad_()
    t64 = None if table is None else table.double().requires_grad_()
    y = torch.nn.functional.embedding(ids, w64, padding_idx=None if padding_idx < 0 else padding_idx) * scale
    if t64 is not None:
        y = y + t64[pos.reshape(-1)[torch.arange(ids.numel()) % pos.numel()].reshape(ids.shape)]
    if p > 0.0:
        keep = torch.from_numpy(dropout_keep_mask(seed, tuple(y.shape), p))
        y = y * torch.where(keep, 1.0 / (1.0 - p), 0.0).double()
    y.backward(grad.double())
    return w64.grad, (None if t64 is None else t64.grad)


@pytest.mark.parametrize("with_pos", [False, True])
@pytest.mark.parametrize("p", [0.0, 0.3])
def test_backward_fp32_matches_autograd_and_numpy_reference(with_pos, p, device, gen) -> None:
    V, D, P = 13, 21, 8
    w = torch.randn(V, D, generator=gen)
    ids = torch.randint(0, V, (3, 8), generator=gen)
    ids[0, :] = 5                                                             # id 5: a segment of >= 11 rows,
    ids[2, :3] = 5                                                            # more than one SEGMENT_ROWS step
    ids[1, 0] = 7                                                             # the padding row
    table = torch.randn(P, D, generator=gen) if with_pos else None
    pos = torch.randint(0, P, (8,), generator=gen) if with_pos else None
    grad = torch.randn(3, 8, D, generator=gen)
    scale, seed, pad = 2.5, 17, 7
    gw, gt = embedding_backward(grad.to(device), ids.to(device), None if pos is None else pos.to(device), V, P,
                                scale, p, torch.tensor(seed), pad)
    rw, rt = autograd_reference(w, ids, table, pos, scale, p, seed, grad, pad)
    tol = TOL["triton.grad.float32"]
    assert gw.shape == (V, D) and gw.dtype == torch.float32
    np.testing.assert_allclose(gw.cpu().numpy(), rw.numpy(), **tol)
    assert torch.equal(gw[pad].cpu(), torch.zeros(D))                         # padding row: no gradient
    if with_pos:
        np.testing.assert_allclose(gt.cpu().numpy(), rt.numpy(), **tol)
    else:
        assert gt is None
    # the row-sparse NumPy reference: same rows at its unique ids, zeros elsewhere
    uniq, rows, pos_grad = embedding_backward_ref(grad.numpy(), ids.numpy(), scale=scale, dropout_p=p, seed=seed,
                                                  padding_idx=pad, pos_ids=None if pos is None else pos.numpy(),
                                                  num_positions=P)
    np.testing.assert_allclose(gw.cpu().numpy()[uniq], rows, **tol)
    untouched = np.setdiff1d(np.arange(V), uniq)
    assert not gw.cpu().numpy()[untouched].any()
    if with_pos:
        np.testing.assert_allclose(gt.cpu().numpy(), pos_grad, **tol)


@pytest.mark.parametrize("dtype", LOW)
def test_backward_low_precision_sums_in_fp32(dtype, device, gen) -> None:
    V, D = 6, 16
    ids = torch.randint(0, V, (40,), generator=gen)                           # ~7 rows per id
    grad = torch.randn(40, D, generator=gen).to(dtype)
    gw, _ = embedding_backward(grad.to(device), ids.to(device), None, V, 0, 1.5, 0.2, 5, -1)
    rw, _ = autograd_reference(torch.zeros(V, D), ids, None, None, 1.5, 0.2, 5, grad.float(), -1)
    assert gw.dtype == dtype
    err = (gw.cpu().double() - rw).abs().max().item()
    assert err <= TOL[f"triton.grad.{str(dtype)[6:]}"]["scale"] * rw.abs().max().item()


def test_backward_is_deterministic_and_empty_inputs_give_zeros(device, gen) -> None:
    ids = torch.randint(0, 4, (3, 9), generator=gen).to(device)
    grad = torch.randn(3, 9, 10, generator=gen).to(device)
    pos = torch.arange(9).to(device)
    a = embedding_backward(grad, ids, pos, 4, 9, 1.0, 0.4, 8, -1)
    b = embedding_backward(grad, ids, pos, 4, 9, 1.0, 0.4, 8, -1)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    gw, gt = embedding_backward(torch.zeros(0, 10).to(device), torch.zeros(0, dtype=torch.int64).to(device),
                                None, 4, 0, 1.0, 0.0, 0, -1)
    assert torch.equal(gw.cpu(), torch.zeros(4, 10)) and gt is None


@SETTINGS
@given(c=cases(), padding_idx=st.sampled_from([-1, 0, 3]))
def test_backward_matches_numpy_reference(c, padding_idx, device) -> None:
    w, ids, table, pos, scale, p, seed, offset = c
    V, D = w.shape
    P = 0 if table is None else table.shape[0]
    grad = np.random.default_rng(seed % 2**32).standard_normal((*ids.shape, D)).astype(np.float32)
    gw, gt = embedding_backward(on(device, grad), on(device, ids), on(device, pos), V, P, scale, p,
                                torch.tensor(seed, device=device), padding_idx, offset=offset)
    gw, gt = gw.cpu(), (None if gt is None else gt.cpu())
    uniq, rows, pos_grad = embedding_backward_ref(grad, ids, scale=scale, dropout_p=p, seed=seed, dropout_offset=offset,
                                                  padding_idx=None if padding_idx < 0 else padding_idx, pos_ids=pos,
                                                  num_positions=P)
    want = np.zeros((V, D), np.float32)
    want[uniq] = rows
    np.testing.assert_allclose(gw.numpy(), want, **TOL["triton.grad.float32"])
    if pos is None:
        assert gt is None
    else:
        np.testing.assert_allclose(gt.numpy(), pos_grad, **TOL["triton.grad.float32"])


def test_wide_rows_and_strided_weight(device, gen) -> None:
    # D = 1030 spans several column blocks in both kernels; the weight is a column slice (row stride 1040)
    big = torch.randn(6, 1040, generator=gen)
    w = big[:, 5:1035]
    ids = torch.tensor([[1, 5, 1], [0, 2, 1]])
    table, pos = torch.randn(3, 1030, generator=gen), torch.tensor([2, 0, 1])
    got = embedding_forward(w.to(device), ids.to(device), table.to(device), pos.to(device), 0.5, 0.2, 9).cpu()
    want = embedding_forward_ref(w.numpy(), ids.numpy(), scale=0.5, pos_table=table.numpy(), pos_ids=pos.numpy(),
                                 dropout_p=0.2, seed=9)
    np.testing.assert_array_equal(got.numpy(), want)
    grad = torch.randn(2, 3, 1030, generator=gen)
    gw, gt = embedding_backward(grad.to(device), ids.to(device), pos.to(device), 6, 3, 0.5, 0.2, 9, -1)
    rw, rt = autograd_reference(w, ids, table, pos, 0.5, 0.2, 9, grad, -1)
    np.testing.assert_allclose(gw.cpu().numpy(), rw.numpy(), **TOL["triton.grad.float32"])
    np.testing.assert_allclose(gt.cpu().numpy(), rt.numpy(), **TOL["triton.grad.float32"])


def test_bad_arguments_are_refused(device) -> None:
    w = torch.zeros(4, 8, device=device)
    ids = torch.zeros(2, 3, dtype=torch.int64, device=device)
    with pytest.raises(TypeError, match="float32, float16 or bfloat16"):
        embedding_forward(w.double(), ids, None, None, 1.0, 0.0, 0)
    with pytest.raises(ValueError, match="table and pos go together"):
        embedding_forward(w, ids, torch.zeros(3, 8, device=device), None, 1.0, 0.0, 0)
    with pytest.raises(ValueError, match="trailing part"):
        embedding_forward(w, ids, torch.zeros(3, 8, device=device), torch.zeros(2, dtype=torch.int64), 1.0, 0.0, 0)
    with pytest.raises(ValueError, match=r"dropout p must be <= 1.0, got 1.5"):
        embedding_forward(w, ids, None, None, 1.0, 1.5, 0)
    with pytest.raises(TypeError, match="seed"):
        embedding_forward(w, ids, None, None, 1.0, 0.5, torch.tensor([1, 2]))
    with pytest.raises(ValueError, match="the ids' shape plus D"):
        embedding_backward(torch.zeros(2, 4, 8, device=device), ids, None, 4, 0, 1.0, 0.0, 0, -1)
    from tokenpos.kernels.triton.embedding import MAX_IDS
    too_many = torch.zeros((), dtype=torch.int64, device=device).expand(MAX_IDS + 1)   # a view: no memory
    with pytest.raises(ValueError, match=rf"at most {MAX_IDS} ids per call .* got {MAX_IDS + 1}"):
        embedding_forward(w, too_many, None, None, 1.0, 0.0, 0)
