"""Triton RoPE (q and k in one launch) against the NumPy reference, plain torch and torch autograd."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

triton = pytest.importorskip("triton")          # the optional gpu extra

from tests.tolerances import TOL  # noqa: E402
from tokenpos.kernels.reference import rope_apply_backward_ref, rope_apply_ref  # noqa: E402
from tokenpos.kernels.triton import rope_backward, rope_forward, rope_qk, rope_qk_backward  # noqa: E402
from tokenpos.tables.errors import ConfigError  # noqa: E402
from tokenpos.tables.formulas.rope import rope_angles, rope_inv_freq  # noqa: E402

SETTINGS = settings(max_examples=12, deadline=None)


def tables(positions: np.ndarray, R: int, dtype=np.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin (..., L, R/2) from float64 angles (tables.formulas.rope), stored as ``dtype``."""
    ang = rope_angles(positions, rope_inv_freq(R)[0])                          # (..., L, R/2) float64
    return torch.from_numpy(np.cos(ang).astype(dtype)), torch.from_numpy(np.sin(ang).astype(dtype))


def torch_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool) -> torch.Tensor:
    """The plain-torch rotation, computed in x's dtype (callers widen first)."""
    F = cos.shape[-1]
    c = (cos[:, None] if cos.dim() == 3 else cos).to(x.dtype)                  # (B, 1, L, F) or (L, F)
    s = (sin[:, None] if sin.dim() == 3 else sin).to(x.dtype)
    xr = x[..., : 2 * F]
    x1, x2 = (xr[..., 0::2], xr[..., 1::2]) if interleaved else (xr[..., :F], xr[..., F:])
    y1, y2 = x1 * c - x2 * s, x2 * c + x1 * s
    rot = torch.stack([y1, y2], -1).flatten(-2) if interleaved else torch.cat([y1, y2], -1)
    return torch.cat([rot, x[..., 2 * F:]], -1)


@st.composite
def cases(draw):
    B, H, L = draw(st.integers(1, 2)), draw(st.integers(1, 3)), draw(st.integers(1, 20))
    Hk = draw(st.sampled_from([H, 1]))
    Dh = 2 * draw(st.integers(1, 9)) + draw(st.sampled_from([0, 0, 1]))
    R = 2 * draw(st.integers(1, Dh // 2))                                      # partial rotary when R < Dh
    dtype = draw(st.sampled_from([np.float32, np.float64]))
    tdtype = draw(st.sampled_from([np.float32, np.float64]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    pos = rng.integers(0, 5000, (B, L)) if draw(st.booleans()) else np.arange(L) + 3   # per-batch (packed) or shared
    cos, sin = tables(pos, R, tdtype)
    q = rng.standard_normal((B, H, L, Dh)).astype(dtype)
    k = rng.standard_normal((B, Hk, L, Dh)).astype(dtype)
    return q, k, cos, sin, draw(st.booleans())


@pytest.mark.slow  # hypothesis on the Triton interpreter
@SETTINGS
@given(c=cases())
def test_forward_and_backward_equal_numpy_reference_bit_for_bit(c, device) -> None:
    q, k, cos, sin, interleaved = c
    layout = "interleaved" if interleaved else "half"
    rq, rk = rope_apply_ref(q, k, cos.numpy(), sin.numpy(), layout=layout)
    bq, bk = rope_apply_backward_ref(q, k, cos.numpy(), sin.numpy(), layout=layout)
    Q, K = torch.from_numpy(q).to(device), torch.from_numpy(k).to(device)
    cos, sin = cos.to(device), sin.to(device)
    gq, gk = rope_qk(Q, K, cos, sin, interleaved)
    np.testing.assert_array_equal(gq.cpu().numpy(), rq)
    np.testing.assert_array_equal(gk.cpu().numpy(), rk)
    np.testing.assert_array_equal(rope_forward(Q, cos, sin, interleaved).cpu().numpy(), rq)
    dq, dk = rope_qk_backward(Q, K, cos, sin, interleaved)
    np.testing.assert_array_equal(dq.cpu().numpy(), bq)
    np.testing.assert_array_equal(dk.cpu().numpy(), bk)
    np.testing.assert_array_equal(rope_backward(K, cos, sin, interleaved).cpu().numpy(), bk)


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_is_fp32_rotation_rounded_once(dtype, interleaved, device, gen) -> None:
    x = torch.randn(2, 3, 7, 12, generator=gen).to(dtype)
    cos, sin = tables(np.arange(7) + 100, 8)                                   # partial rotary: R = 8 < 12
    got = rope_forward(x.to(device), cos.to(device), sin.to(device), interleaved)
    assert got.dtype == dtype
    assert torch.equal(got.cpu(), torch_rope(x.float(), cos, sin, interleaved).to(dtype))


@pytest.mark.parametrize("interleaved", [False, True])
def test_in_place_equals_out_of_place(interleaved, device, gen) -> None:
    q = torch.randn(2, 4, 9, 10, generator=gen).to(device)
    k = torch.randn(2, 2, 9, 10, generator=gen).to(device)                   # GQA: Hk = 2
    cos, sin = tables(np.arange(18).reshape(2, 9), 6)                          # per-batch tables, partial rotary
    cos, sin = cos.to(device), sin.to(device)
    want_q, want_k = rope_qk(q, k, cos, sin, interleaved)
    q2, k2 = q.clone(), k.clone()
    oq, ok = rope_qk(q2, k2, cos, sin, interleaved, out_q=q2, out_k=k2)
    assert oq is q2 and ok is k2
    assert torch.equal(q2, want_q) and torch.equal(k2, want_k)
    x = q.clone()
    assert rope_forward(x, cos, sin, interleaved, out=x) is x and torch.equal(x, want_q)
    assert rope_backward(x, cos, sin, interleaved, out=x) is x                # the transpose undoes the rotation
    np.testing.assert_allclose(x.cpu().numpy(), q.cpu().numpy(), **TOL["kernels.float32"])


def test_strided_views_and_mixed_dtypes(device, gen) -> None:
    # q laid out (B, L, H, Dh) and viewed as (B, H, L, Dh), written into a strided output view
    q = torch.randn(2, 5, 3, 8, generator=gen).to(device).transpose(1, 2)
    out = torch.empty(2, 5, 3, 8, device=device).transpose(1, 2)
    k = torch.randn(2, 1, 5, 8, generator=gen, dtype=torch.float64).to(device)   # another dtype: two launches
    cos, sin = tables(np.arange(5), 8)
    oq, ok = rope_qk(q, k, cos.to(device), sin.to(device), False, out_q=out)
    assert oq is out
    assert torch.equal(out.cpu(), torch_rope(q.cpu(), cos, sin, False))
    assert ok.dtype == torch.float64
    assert torch.equal(ok.cpu(), torch_rope(k.cpu(), cos.double(), sin.double(), False))


@pytest.mark.parametrize("interleaved", [False, True])
def test_backward_is_the_autograd_gradient(interleaved, device, gen) -> None:
    x = torch.randn(2, 2, 6, 10, generator=gen, dtype=torch.float64)
    g = torch.randn(2, 2, 6, 10, generator=gen, dtype=torch.float64)
    cos, sin = tables(np.array([[0, 5, 9, 2, 7, 1], [3, 3, 8, 0, 4, 6]]), 8, np.float64)
    xr = x.clone().requires_grad_()
    torch_rope(xr, cos, sin, interleaved).backward(g)
    got = rope_backward(g.to(device), cos.to(device), sin.to(device), interleaved).cpu()
    np.testing.assert_allclose(got.numpy(), xr.grad.numpy(), **TOL["kernels.float64"])


def test_bf16_angle_error_at_position_one_million_is_bounded(device, gen) -> None:
    """Angles come from float64 (tables.formulas.rope), so only the bf16 output rounding remains.

    Each rotated pair of a bf16 input, compared with the float64 rotation of the same input, is off
    by at most 2**-8 + 2**-20 rad (TOL "triton.rope_bf16_angle"). Angles formed in fp32 instead
    (``pos * inv_freq`` at ~1e6, as a fp32 cache does) are already off by more than that.
    """
    B, H, L, Dh = 1, 2, 8, 64
    pos = np.arange(1_000_000 - L + 1, 1_000_001)                             # up to 1,000,000
    cos, sin = tables(pos, Dh)
    x = torch.randn(B, H, L, Dh, generator=gen).to(torch.bfloat16)
    got = rope_forward(x.to(device), cos.to(device), sin.to(device), False).cpu().double()
    ang = torch.from_numpy(rope_angles(pos, rope_inv_freq(Dh)[0]))             # (L, F) float64
    exact = torch_rope(x.double(), torch.cos(ang), torch.sin(ang), False)
    F = Dh // 2

    def pair_angle(y):
        return torch.atan2(y[..., F:], y[..., :F])                             # (B, H, L, F)

    d = pair_angle(got) - pair_angle(exact)
    err = torch.remainder(d + torch.pi, 2 * torch.pi) - torch.pi
    bound = TOL["triton.rope_bf16_angle"]["atol"]
    assert err.abs().max().item() <= bound
    fp32_angles = (torch.from_numpy(pos).float()[:, None] * torch.from_numpy(rope_inv_freq(Dh)[0]).float()).double()
    assert (fp32_angles - ang).abs().max().item() > bound


def test_bad_tables_are_refused(device) -> None:
    x = torch.zeros(1, 1, 4, 8, device=device)
    with pytest.raises(ValueError, match="cos and sin"):
        rope_forward(x, torch.zeros(5, 4, device=device), torch.zeros(5, 4, device=device), False)
    with pytest.raises(ValueError, match="cos and sin"):
        rope_forward(x, torch.zeros(4, 5, device=device), torch.zeros(4, 5, device=device), False)
    with pytest.raises(ValueError, match="cos and sin"):
        half = torch.zeros(4, 4, device=device, dtype=torch.float16)
        rope_forward(x, half, half, False)


def test_long_pass_through_tail(device, gen) -> None:
    # R = 8 of Dh = 300: the 292 pass-through dims take several tail blocks
    x = torch.randn(1, 2, 5, 300, generator=gen)
    cos, sin = tables(np.arange(5), 8)
    for interleaved in (False, True):
        got = rope_forward(x.to(device), cos.to(device), sin.to(device), interleaved).cpu()
        want, _ = rope_apply_ref(x.numpy(), None, cos.numpy(), sin.numpy(),
                                 layout="interleaved" if interleaved else "half")
        np.testing.assert_array_equal(got.numpy(), want)


def test_same_tensor_as_q_and_k_and_a_leading_one_table(device, gen) -> None:
    x = torch.randn(2, 2, 4, 8, generator=gen).to(device)
    cos, sin = tables(np.arange(4), 8)
    want = torch_rope(x.cpu(), cos, sin, True)
    a, b = rope_qk(x, x, cos[None].to(device), sin[None].to(device), True)   # (1, L, F) tables, k is q
    assert torch.equal(a.cpu(), want) and torch.equal(b.cpu(), want)


@SETTINGS
@given(c=cases(), shape=st.sampled_from(["l", "1l", "bl", "token"]), seed=st.integers(0, 2**16))
def test_positions_read_the_table_rows_like_the_numpy_reference(c, shape, seed, device) -> None:
    """A (P, F) table read at positions (L,), (1, L), (B, L) (strided positions too) equals the NumPy
    twin bit for bit, forward and backward, one launch for q and k."""
    q, k, _, _, interleaved = c
    B, _, L, Dh = q.shape
    rng = np.random.default_rng(seed)
    P = 11
    cos, sin = tables(np.arange(P) * 5, 2 * rng.integers(1, Dh // 2 + 1))
    full = torch.from_numpy(rng.integers(0, P, (B, 2 * L)))
    pos = {"l": full[0, :L], "1l": full[:1, ::2], "bl": full[:, ::2], "token": full[:, :L].contiguous()}[shape]
    layout = "interleaved" if interleaved else "half"
    rq, rk = rope_apply_ref(q, k, cos.numpy(), sin.numpy(), layout=layout, positions=pos.numpy())
    bq, bk = rope_apply_backward_ref(q, k, cos.numpy(), sin.numpy(), layout=layout, positions=pos.numpy())
    Q, K = torch.from_numpy(q).to(device), torch.from_numpy(k).to(device)
    cos, sin, pos = cos.to(device), sin.to(device), pos.to(device)
    gq, gk = rope_qk(Q, K, cos, sin, interleaved, positions=pos)
    np.testing.assert_array_equal(gq.cpu().numpy(), rq)
    np.testing.assert_array_equal(gk.cpu().numpy(), rk)
    np.testing.assert_array_equal(rope_forward(Q, cos, sin, interleaved, positions=pos).cpu().numpy(), rq)
    dq, dk = rope_qk_backward(Q, K, cos, sin, interleaved, positions=pos)
    np.testing.assert_array_equal(dq.cpu().numpy(), bq)
    np.testing.assert_array_equal(dk.cpu().numpy(), bk)
    np.testing.assert_array_equal(rope_backward(K, cos, sin, interleaved, positions=pos).cpu().numpy(), bk)


def test_token_major_view_of_a_packed_row(device, gen) -> None:
    """(T, H, 1, Dh) with positions (T, 1): one token per batch row (L = 1), as the layers call a packed row."""
    T, H, Dh, P = 37, 3, 8, 20
    x = torch.randn(T, H, 1, Dh, generator=gen)
    pos = torch.randint(0, P, (T, 1), generator=gen)
    cos, sin = tables(np.arange(P), 6)
    want = rope_apply_ref(x.numpy(), None, cos.numpy(), sin.numpy(), positions=pos.numpy())[0]
    got = rope_forward(x.to(device), cos.to(device), sin.to(device), False, positions=pos.to(device))
    np.testing.assert_array_equal(got.cpu().numpy(), want)


class _Grids:
    """Stands in for ``_rope_kernel``: records each launch's grid, then launches the real kernel."""

    def __init__(self, kernel) -> None:
        self.kernel, self.grids = kernel, []

    def __getitem__(self, grid):
        self.grids.append(grid)
        return self.kernel[grid]


@pytest.mark.parametrize("table", ["shared", "per_batch", "positions_b1", "positions_1", "positions_11"])
def test_one_token_rows_are_launched_as_rows_of_one_batch(table, device, gen, monkeypatch) -> None:
    """(B, H, 1, Dh) (a decode step, a packed row's token-major view): one program per head tiling the
    B rows, not B * heads programs of one row each (per-program work paid per row: a packed RoPE call took 4.8x
    the padded call's time on an H100). Every table form gives the reference's bits, forward,
    backward and in place."""
    import tokenpos.kernels.triton.rope as R

    B, H, Hk, Dh, P = 37, 3, 2, 8, 50
    q, k = torch.randn(B, H, 1, Dh, generator=gen), torch.randn(B, Hk, 1, Dh, generator=gen)
    where = torch.randint(0, P, (B,), generator=gen)
    full_cos, full_sin = tables(np.arange(P), 6)
    cos, sin, pos = {"shared": (full_cos[7:8], full_sin[7:8], None),
                     "per_batch": (full_cos[where][:, None], full_sin[where][:, None], None),
                     "positions_b1": (full_cos, full_sin, where[:, None]),
                     "positions_1": (full_cos, full_sin, where[:1]),
                     "positions_11": (full_cos, full_sin, where[:1, None])}[table]
    kw = {} if pos is None else {"positions": pos.numpy()}
    rq, rk = rope_apply_ref(q.numpy(), k.numpy(), cos.numpy(), sin.numpy(), **kw)
    bq, bk = rope_apply_backward_ref(q.numpy(), k.numpy(), cos.numpy(), sin.numpy(), **kw)
    grids = _Grids(R._rope_kernel)
    monkeypatch.setattr(R, "_rope_kernel", grids)
    Q, K, C, S = q.to(device), k.to(device), cos.to(device), sin.to(device)
    at = {} if pos is None else {"positions": pos.to(device)}
    gq, gk = rope_qk(Q, K, C, S, False, **at)
    assert grids.grids == [(H + Hk, -(-B // R.BLOCK_L))]                              # heads x row tiles
    np.testing.assert_array_equal(gq.cpu().numpy(), rq)
    np.testing.assert_array_equal(gk.cpu().numpy(), rk)
    dq, dk = rope_qk_backward(Q, K, C, S, False, **at)
    np.testing.assert_array_equal(dq.cpu().numpy(), bq)
    np.testing.assert_array_equal(dk.cpu().numpy(), bk)
    rope_forward(Q, C, S, False, out=Q, **at)                                       # in place
    np.testing.assert_array_equal(Q.cpu().numpy(), rq)


def test_bad_positions_are_refused(device) -> None:
    x = torch.zeros(2, 1, 4, 8, device=device)
    cos, sin = (t.to(device) for t in tables(np.arange(6), 8))
    for pos, c in ((torch.zeros(3, 4, dtype=torch.long), cos), (torch.zeros(4), cos),
                   (torch.zeros(4, dtype=torch.long), cos[None])):
        with pytest.raises(ConfigError, match="with positions"):
            rope_forward(x, c, sin if c.dim() == 2 else sin[None], False, positions=pos.to(device))
