"""The tied cross-entropy's work on one block of logits, in place: soft-cap, online log-sum-exp, gradient.

Shapes: c tokens of a block, Vl <= V columns (a vocab shard, or all V), z (c, Vl) the block's logits
``h_block @ weight.T`` (the caller's matmul: BLAS / cuBLAS does that work), float32 or float64, C-contiguous.
Per row n (formulas: :mod:`tokenpos.tables.formulas.tied_loss`), eps = label smoothing, V the full vocab:

    z <- softcap * tanh(z / softcap)                                  (when softcap is given)
    stats[n] = (m, s, z_t, sum_v z_v):  m = max_v z_v,  s = sum_v exp(z_v - m),  z_t = z[n, t_n] (t_n >= 0, else 0)
    g[n, v]  = coef_n * (exp(z_v - lse_n) - (1 - eps) [v == t_n] - eps / V) * (1 - tanh^2)   written over z

- :func:`block_stats` (``coef=None``): the stats only (z left soft-capped).
- with ``coef`` (N,) and no ``lse``: the stats, then lse = m + log s, then the gradient (z holds every column).
- with ``coef`` and ``lse`` (c,): the gradient from that lse (the backward, or a vocab-parallel shard).

m and s come from one pass over column blocks of :data:`BLOCK_V` (online log-sum-exp: a block's max,
the running sum rescaled by exp(m_old - m_new) when the max grows, then the block's exponentials, summed in
float64). The exponentials are :func:`_exp_into`'s (a polynomial the compiler vectorises, within the dtype's
rounding of ``np.exp``: libm's scalar exp made the kernel slower than NumPy's vectorised passes). Rows run
in parallel (``prange``), each row on one thread, its sums in an order fixed when the kernel compiles: the
same inputs give bit-identical results run to run, whatever the thread count. t_n < 0 means "no target
column here" (ignored, or another shard's); coef_n is 0 for an ignored token. The plain-NumPy twin is
:func:`tokenpos.kernels.reference.tied_loss_block_ref` (same results up to float rounding).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from tokenpos.kernels._launch import launch
from tokenpos.kernels._threading import parallel
from tokenpos.tables.errors import ConfigError

BLOCK_V = 1024                  # columns per step of the online log-sum-exp
_LOG2E = 1.4426950408889634
_LN2_HI = 0.693145751953125     # ln 2 in two parts: k * _LN2_HI is exact for |k| < 2**13
_LN2_LO = math.log(2.0) - _LN2_HI
_C = tuple(1.0 / math.factorial(i) for i in range(14))
_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))


@njit(inline="always", cache=True)
def _exp_into(x, sub, out, bits, lim, bias, shift):  # pragma: no cover - compiled
    """out[j] = exp(x[j] - sub) for a slice of one row, in two loops LLVM vectorises (no libm call): the
    argument clamped to [-lim, lim] (exp(-lim) is the dtype's smallest normal), k = round(y / ln 2),
    r = y - k ln 2 in two parts (Cody-Waite), exp(r) by its Taylor polynomial to r^13 (|r| <= ln 2 / 2: below
    the dtype's rounding), times 2^k built from its bits in ``bits`` (int32 / int64 for float32 / float64)."""
    typ = out.dtype.type
    for j in range(x.shape[0]):
        y = min(max(x[j] - sub, typ(-lim)), typ(lim))
        k = np.floor(y * typ(_LOG2E) + typ(0.5))
        r = (y - k * typ(_LN2_HI)) - k * typ(_LN2_LO)
        p = typ(_C[13])
        p = p * r + typ(_C[12])
        p = p * r + typ(_C[11])
        p = p * r + typ(_C[10])
        p = p * r + typ(_C[9])
        p = p * r + typ(_C[8])
        p = p * r + typ(_C[7])
        p = p * r + typ(_C[6])
        p = p * r + typ(_C[5])
        p = p * r + typ(_C[4])
        p = p * r + typ(_C[3])
        p = p * r + typ(_C[2])
        p = p * r + typ(_C[1])
        out[j] = p * r + typ(_C[0])
        bits[j] = (bits.dtype.type(k) + bias) << shift
    scale = bits.view(out.dtype)
    for j in range(x.shape[0]):
        out[j] *= scale[j]


@njit(fastmath={"reassoc", "nsz"}, cache=True)
def _max_and_sum(x):  # pragma: no cover - compiled
    """(max, float64 sum) of a slice of one row; the compiler may split each into lanes (``reassoc``), an order
    fixed when it compiles, so the same inputs give the same bits on every run."""
    m = x[0]
    s = 0.0
    for j in range(x.shape[0]):
        m = max(m, x[j])
        s += x[j]
    return m, s


@njit(fastmath={"reassoc"}, cache=True)
def _sum(x):  # pragma: no cover - compiled
    """The float64 sum of a slice (lanes as in :func:`_max_and_sum`)."""
    s = 0.0
    for j in range(x.shape[0]):
        s += x[j]
    return s


@njit(parallel=True, cache=True)
def _block_core(z, t, coef, lse, stats, eps, vocab_size, softcap, mode, bits_like, lim, bias,
                shift):  # pragma: no cover - compiled
    """mode 0: stats; 1: stats then gradient; 2: gradient from ``lse`` (module doc). softcap 0: no cap."""
    c, Vl = z.shape
    typ = z.dtype.type
    one = typ(1.0)
    zero = typ(0.0)
    neg_inf = typ(-np.inf)
    cap = typ(softcap)
    for n in prange(c):
        row = z[n]
        tn = t[n] if t[n] < Vl else -1                                         # never read outside the row
        buf = np.empty(BLOCK_V, z.dtype)                                       # exp of one column block
        bits = np.empty(BLOCK_V, bits_like.dtype)
        if softcap > 0.0:
            for v in range(Vl):
                row[v] = cap * np.tanh(row[v] / cap)
        zt = row[tn] if tn >= 0 else zero
        if mode != 2:
            m = neg_inf
            s = 0.0                                                            # float64 sums, rounded once
            zsum = 0.0
            for v0 in range(0, Vl, BLOCK_V):
                v1 = min(Vl, v0 + BLOCK_V)
                bm, bs = _max_and_sum(row[v0:v1])
                zsum += bs
                if bm > m:                                                     # online: rescale the sum so far
                    if m > neg_inf:
                        s *= np.exp(np.float64(m) - np.float64(bm))
                    m = bm
                if m > neg_inf:
                    _exp_into(row[v0:v1], m, buf, bits, lim, bias, shift)
                    s += _sum(buf[:v1 - v0])
            stats[n, 0] = m
            stats[n, 1] = s
            stats[n, 2] = zt
            stats[n, 3] = zsum
            if mode == 0:
                continue
            ln = typ(np.float64(m) + np.log(s))
        else:
            ln = lse[n]
        k = coef[n]
        off = k * typ(eps / vocab_size)
        for v0 in range(0, Vl, BLOCK_V):
            v1 = min(Vl, v0 + BLOCK_V)
            _exp_into(row[v0:v1], ln, buf, bits, lim, bias, shift)
            if softcap > 0.0:
                for j in range(v1 - v0):
                    th = row[v0 + j] / cap
                    row[v0 + j] = (k * buf[j] - off) * (one - th * th)
            else:
                for j in range(v1 - v0):
                    row[v0 + j] = k * buf[j] - off
        if tn >= 0:
            d = k * (one - typ(eps))
            if softcap > 0.0:
                th = zt / cap
                d *= one - th * th
            row[tn] -= d


#: _exp_into's constants per dtype: (an array of the bits' dtype, clamp, exponent bias, mantissa bits)
_EXP_ARGS = {np.dtype(np.float32): (np.empty(0, np.int32), 87.0, 127, 23),
             np.dtype(np.float64): (np.empty(0, np.int64), 708.0, 1023, 52)}


def _check(z: np.ndarray, t: np.ndarray, coef: np.ndarray | None, lse: np.ndarray | None) -> None:
    if z.ndim != 2 or z.dtype not in _FLOATS or not z.flags.c_contiguous or not z.flags.writeable:
        raise ConfigError(f"z must be a writeable C-contiguous float32/float64 array of shape (c, Vl), got "
                          f"{z.dtype} {z.shape}")
    c, Vl = z.shape
    if t.shape != (c,) or t.dtype != np.int64 or (c and (int(t.max()) >= Vl or int(t.min()) < -1)):
        raise ConfigError(f"t must be an int64 array of shape ({c},) with values in [-1, {Vl}), got {t.dtype} "
                          f"{t.shape}")
    for name, a in (("coef", coef), ("lse", lse)):
        if a is not None and (a.shape != (c,) or a.dtype != z.dtype):
            raise ConfigError(f"{name} must be a {z.dtype} array of shape ({c},), got {a.dtype} {a.shape}")
    if lse is not None and coef is None:
        raise ConfigError("lse is only used with coef (the gradient from a given lse)")


def block_pass(z: np.ndarray, t: np.ndarray, coef: np.ndarray | None, lse: np.ndarray | None, eps: float,
               vocab_size: int, softcap: float | None) -> np.ndarray:
    """:func:`tied_loss_block` on checked arrays (the entry both backends' ops call): stats (c, 4), or (0, 4)
    when ``lse`` is given (nothing computed but the gradient)."""
    c = z.shape[0]
    mode = 0 if coef is None else (1 if lse is None else 2)
    stats = np.empty((0 if mode == 2 else c, 4), z.dtype)
    dummy = np.empty(0, z.dtype)
    if c and z.shape[1]:
        with launch(c, z.nbytes, max_chunk=4):
            parallel(_block_core)(z, t, dummy if coef is None else coef, dummy if lse is None else lse, stats,
                                  float(eps), int(vocab_size), 0.0 if softcap is None else float(softcap), mode,
                                  *_EXP_ARGS[z.dtype])
    return stats


def tied_loss_block(z: np.ndarray, t: np.ndarray, *, coef: np.ndarray | None = None, lse: np.ndarray | None = None,
                    eps: float = 0.0, vocab_size: int | None = None, softcap: float | None = None) -> np.ndarray:
    """z (c, Vl) logits, overwritten (soft-capped; the gradient when ``coef`` is given), t (c,) int64 target
    columns (-1: none here), coef (c,) each token's gradient weight, lse (c,) -> stats (c, 4) = (max, sum of
    exp(z - max), z at the target or 0, sum of z) of the capped logits, or (0, 4) with ``lse`` (module doc).

    ``vocab_size`` (default Vl) divides the label smoothing.

    Raises:
        ConfigError: arrays of other shapes or dtypes, a target column out of [-1, Vl), eps outside [0, 1],
            softcap <= 0, vocab_size < Vl.
    """
    _check(z, t, coef, lse)
    V = z.shape[1] if vocab_size is None else int(vocab_size)
    if V < z.shape[1] or not 0.0 <= float(eps) <= 1.0 or (softcap is not None and not float(softcap) > 0.0):
        raise ConfigError(f"expected vocab_size >= {z.shape[1]}, eps in [0, 1] and softcap > 0 or None, got "
                          f"vocab_size={V}, eps={eps}, softcap={softcap}")
    return block_pass(z, t, coef, lse, eps, V, softcap)
