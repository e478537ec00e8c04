"""Rotary position embedding on q and k in one Triton launch; the backward is the same launch with -sin.

Shapes: B batch, H query heads, Hk key heads (GQA: may differ from H), L length, Dh head dim,
F = R/2 rotary pairs (R <= Dh even), x (B, H, L, Dh) with unit stride along Dh (any other strides).
``cos``/``sin`` are (L, F) or (1, L, F), shared by every batch row, or (B, L, F), per batch row; or, with
``positions`` (L,) / (1, L) / (B, L) int in [0, P), one (P, F) table whose row ``positions[b, l]``
rotates token (b, l) (a cached table read by position: packed documents); float32 or float64: the
angles come from float64 on the host (``tables.formulas.rope``), never from a low-precision cache.

Layouts (dims R..Dh-1 pass through unchanged):

- half-split (HF / GPT-NeoX): x1 = x[:F], x2 = x[F:R]
      out[:F] = x1*cos - x2*sin,   out[F:R] = x2*cos + x1*sin
- interleaved (GPT-J / Meta): pairs (2i, 2i+1)
      out[2i] = x[2i]*cos_i - x[2i+1]*sin_i,   out[2i+1] = x[2i+1]*cos_i + x[2i]*sin_i

Arithmetic is in fp32 (fp64 when x or the tables are float64), rounded once to x's dtype; launches
run with ``enable_fp_fusion=False``, so results equal the NumPy reference bit for bit. ``out`` may be
x itself (in place: each program reads its pairs before writing them, and skips the pass-through copy).

Grid: (B * (H + Hk), cdiv(L, BLOCK_L)), BLOCK_L <= 16 (at most L's next power of two, so a (T, H, 1, Dh)
view of a packed row runs no empty lanes); a program rotates BLOCK_L rows of one (batch, head), selecting its
row pointers from q when head < H and from k otherwise, so q and k share one launch.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tokenpos.kernels.triton._cast import LAUNCH_OPTIONS, round_to
from tokenpos.kernels.triton._grid import cdiv, next_power_of_2
from tokenpos.tables.errors import ConfigError

BLOCK_L = 16


@triton.jit
def _rope_kernel(q_ptr, k_ptr, oq_ptr, ok_ptr, cos_ptr, sin_ptr, H, HK, L, F, TAIL,
                 sqb, sqh, sql, skb, skh, skl, soqb, soqh, soql, sokb, sokh, sokl, scb, scl, pos_ptr, spb, spl,
                 INTERLEAVED: tl.constexpr, NEG_SIN: tl.constexpr, COPY_TAIL: tl.constexpr, F64: tl.constexpr,
                 HAS_POS: tl.constexpr, BLOCK_L: tl.constexpr, BLOCK_F: tl.constexpr, BLOCK_T: tl.constexpr):
    pid = tl.program_id(0)
    b = (pid // (H + HK)).to(tl.int64)
    h = (pid % (H + HK)).to(tl.int64)
    ls = (tl.program_id(1) * BLOCK_L + tl.arange(0, BLOCK_L)).to(tl.int64)    # (BL,)
    fs = tl.arange(0, BLOCK_F)                                                 # (BF,)
    lmask = ls < L
    m2 = lmask[:, None] & (fs < F)[None, :]                                    # (BL, BF)
    if HAS_POS:                                                                # table rows by position
        rows = tl.load(pos_ptr + b * spb + ls * spl, mask=lmask, other=0).to(tl.int64)
        t_off = rows[:, None] * scl + fs[None, :]
    else:
        t_off = b * scb + ls[:, None] * scl + fs[None, :]
    c = tl.load(cos_ptr + t_off, mask=m2, other=0.0)
    s = tl.load(sin_ptr + t_off, mask=m2, other=0.0)
    if INTERLEAVED:
        i1 = 2 * fs
        i2 = 2 * fs + 1
    else:
        i1 = fs
        i2 = fs + F
    is_q = h < H                                                               # else a k head: h - H
    x_rows = tl.where(is_q, q_ptr + b * sqb + h * sqh + ls[:, None] * sql,
                      k_ptr + b * skb + (h - H) * skh + ls[:, None] * skl)     # (BL, 1) row pointers
    o_rows = tl.where(is_q, oq_ptr + b * soqb + h * soqh + ls[:, None] * soql,
                      ok_ptr + b * sokb + (h - H) * sokh + ls[:, None] * sokl)
    x1 = tl.load(x_rows + i1[None, :], mask=m2, other=0.0)
    x2 = tl.load(x_rows + i2[None, :], mask=m2, other=0.0)
    if F64:
        ct = tl.float64
    else:
        ct = tl.float32
    c = c.to(ct)
    s = s.to(ct)
    a1 = x1.to(ct)
    a2 = x2.to(ct)
    if NEG_SIN:
        s = -s
    y1 = a1 * c - a2 * s
    y2 = a2 * c + a1 * s
    tl.store(o_rows + i1[None, :], round_to(y1, x1.dtype), mask=m2)
    tl.store(o_rows + i2[None, :], round_to(y2, x1.dtype), mask=m2)
    if COPY_TAIL:
        for t0 in range(0, TAIL, BLOCK_T):
            ts = t0 + tl.arange(0, BLOCK_T)
            tm = lmask[:, None] & (ts < TAIL)[None, :]
            v = tl.load(x_rows + 2 * F + ts[None, :], mask=tm)
            tl.store(o_rows + 2 * F + ts[None, :], v, mask=tm)


def _tables(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor | None
            ) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Check cos/sin against x (B, H, L, Dh); returns contiguous tables and their batch stride (0 if shared)."""
    B, _, L, Dh = x.shape
    if positions is not None:
        ok = (cos.dtype in (torch.float32, torch.float64) and sin.dtype == cos.dtype and sin.shape == cos.shape
              and cos.dim() == 2 and 2 * cos.shape[-1] <= Dh and not positions.is_floating_point()
              and positions.shape[-1] == L and (positions.dim() == 1 or (positions.dim() == 2
                                                                         and positions.shape[0] in (1, B))))
        if not ok:
            raise ConfigError(f"with positions (({L},) or ({B}, {L}) ints), cos and sin must be one float32/float64 "
                              f"table (P, F) with 2F <= head_dim={Dh}, got {cos.dtype} {tuple(cos.shape)}, "
                              f"{sin.dtype} {tuple(sin.shape)} and positions {positions.dtype} "
                              f"{tuple(positions.shape)}")
        return cos.contiguous(), sin.contiguous(), 0
    ok = (cos.dtype in (torch.float32, torch.float64) and sin.dtype == cos.dtype and sin.shape == cos.shape
          and cos.dim() in (2, 3) and cos.shape[-2] == L and 2 * cos.shape[-1] <= Dh
          and (cos.dim() == 2 or cos.shape[0] in (1, B)))
    if not ok:
        raise ConfigError(f"cos and sin must be float32/float64 tables of one shape ({L}, F) or ({B}, {L}, F) "
                          f"with 2F <= head_dim={Dh}, got {cos.dtype} {tuple(cos.shape)} and "
                          f"{sin.dtype} {tuple(sin.shape)}")
    cos, sin = cos.contiguous(), sin.contiguous()
    return cos, sin, (cos.stride(0) if cos.dim() == 3 and cos.shape[0] > 1 else 0)


def _unit_last(name: str, x: torch.Tensor) -> torch.Tensor:
    if x.dim() != 4 or not x.is_floating_point():
        raise ConfigError(f"{name} must be a float tensor of shape (B, H, L, head_dim), got {x.dtype} "
                          f"{tuple(x.shape)}")
    return x if x.stride(-1) == 1 else x.contiguous()


def _output(name: str, out: torch.Tensor | None, x: torch.Tensor) -> torch.Tensor:
    if out is None:                  # contiguous whatever x's strides, as the ops' fake implementations say
        return torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if out.shape != x.shape or out.dtype != x.dtype or out.device != x.device or out.stride(-1) != 1:
        raise ConfigError(f"{name} must be a {x.dtype} tensor of shape {tuple(x.shape)} on {x.device} with unit "
                          f"stride along head_dim, got {out.dtype} {tuple(out.shape)} on {out.device}")
    return out


def _launch(q, k, oq, ok, HK: int, cos, sin, interleaved: bool, neg_sin: bool, positions=None) -> None:
    """One launch over q's heads and HK heads of k (HK = 0: q alone; k/ok are then ignored); table rows
    by ``positions`` (L,) / (1, L) / (B, L) when given."""
    cos, sin, scb = _tables(q, cos, sin, positions)
    B, H, L, Dh = q.shape
    if L == 1 and B > 1:
        # One row per (b, head): a packed row's (T, H, 1, Dh) view, a decode step. Launched as B rows of
        # one batch, so each program tiles BLOCK_L rows instead of rotating one (views only; positions
        # (B, 1) | (1,) -> (B,), tables (1, F) | (B, 1, F) -> (B, F), stride 0 where shared).
        q, k, oq, ok = (t.transpose(0, 2) for t in (q, k, oq, ok))
        if positions is not None:
            positions = positions.reshape(-1).expand(B)
        else:
            cos, sin = (t.reshape(-1, t.shape[-1]).expand(B, t.shape[-1]) for t in (cos, sin))
            scb = 0
        B, L = 1, B
    F = cos.shape[-1]
    tail = Dh - 2 * F
    copy_tail = tail > 0 and not (oq.data_ptr() == q.data_ptr() and (HK == 0 or ok.data_ptr() == k.data_ptr()))
    if B * (H + HK) * L == 0 or (F == 0 and not copy_tail):
        return
    f64 = torch.float64 in (q.dtype, cos.dtype)
    block_l = min(BLOCK_L, next_power_of_2(L))
    grid = (B * (H + HK), cdiv(L, block_l))
    has_pos = positions is not None
    pos = positions.reshape(-1, L) if has_pos else cos                        # (Bp, L); unread without positions
    spb = pos.stride(0) if has_pos and pos.shape[0] > 1 else 0
    _rope_kernel[grid](
        q, k, oq, ok, cos, sin, H, HK, L, F, tail,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        oq.stride(0), oq.stride(1), oq.stride(2), ok.stride(0), ok.stride(1), ok.stride(2),
        scb, cos.stride(-2), pos, spb, pos.stride(1) if has_pos else 0,
        INTERLEAVED=bool(interleaved), NEG_SIN=neg_sin, COPY_TAIL=copy_tail, F64=f64, HAS_POS=has_pos, BLOCK_L=block_l,
        BLOCK_F=next_power_of_2(max(F, 1)), BLOCK_T=min(next_power_of_2(max(tail, 1)), 128),
        **LAUNCH_OPTIONS)


def _one(x, cos, sin, interleaved, out, neg_sin, positions) -> torch.Tensor:
    x = _unit_last("x", x)
    o = _output("out", out, x)
    _launch(x, x, o, o, 0, cos, sin, interleaved, neg_sin, positions)
    return o


def rope_forward(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool,
                 out: torch.Tensor | None = None, positions: torch.Tensor | None = None) -> torch.Tensor:
    """Rotate x (B, H, L, Dh) by (cos, sin) of shape (L, F) or (B, L, F), or (P, F) read at ``positions``
    (L,) / (1, L) / (B, L); ``out=x`` rotates in place.

    Returns ``out`` (a new tensor when None) of x's shape and dtype.
    """
    return _one(x, cos, sin, interleaved, out, False, positions)


def rope_backward(grad: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool,
                  out: torch.Tensor | None = None, positions: torch.Tensor | None = None) -> torch.Tensor:
    """The transpose rotation (``rope_forward`` with -sin, negated in registers): grad (B, H, L, Dh)."""
    return _one(grad, cos, sin, interleaved, out, True, positions)


def _qk(q, k, cos, sin, interleaved, out_q, out_k, neg_sin, positions) -> tuple[torch.Tensor, torch.Tensor]:
    q = _unit_last("q", q)
    k = _unit_last("k", k)
    oq = _output("out_q", out_q, q)
    ok = _output("out_k", out_k, k)
    same = (q.dtype == k.dtype and q.device == k.device and q.shape[0] == k.shape[0]
            and q.shape[2:] == k.shape[2:] and k.shape[1] > 0)
    if same:
        _launch(q, k, oq, ok, k.shape[1], cos, sin, interleaved, neg_sin, positions)
    else:                                                                      # shapes/dtypes differ: two launches
        _launch(q, q, oq, oq, 0, cos, sin, interleaved, neg_sin, positions)
        _launch(k, k, ok, ok, 0, cos, sin, interleaved, neg_sin, positions)
    return oq, ok


def rope_qk(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool, *,
            out_q: torch.Tensor | None = None, out_k: torch.Tensor | None = None,
            positions: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate q (B, H, L, Dh) and k (B, Hk, L, Dh) in one launch when they share dtype, B, L and Dh
    (tables as :func:`rope_forward`'s).

    ``out_q=q, out_k=k`` rotates in place. Returns (q', k').
    """
    return _qk(q, k, cos, sin, interleaved, out_q, out_k, False, positions)


def rope_qk_backward(grad_q: torch.Tensor, grad_k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                     interleaved: bool, *, out_q: torch.Tensor | None = None,
                     out_k: torch.Tensor | None = None, positions: torch.Tensor | None = None
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """The transpose rotation of :func:`rope_qk`: (grad_q, grad_k) -> (dq, dk) in one launch."""
    return _qk(grad_q, grad_k, cos, sin, interleaved, out_q, out_k, True, positions)
