"""The 8-bit table lookup dequantised inside the gather, on CUDA (the Triton twin of :mod:`tokenpos.kernels.quantized`).

Shapes: V rows, C columns, N = number of ids (any shape (...)), out (..., C).

    out[n, c] = (float(q[ids[n], c]) * float(scale[ids[n]])) * multiplier

in fp32 (two products, ``enable_fp_fusion=False``), rounded once to the scales' dtype (float32, float16 or
bfloat16: :func:`._cast.round_to`): exactly :func:`tokenpos.tables.formulas.quantize.dequantize_rows`. q is int8
(converted) or float8 e4m3fn, loaded as its bit pattern and decoded exactly with integer operations (the float32
of the same value assembled from sign, exponent and mantissa; subnormals m * 2**-9; 0x7F / 0xFF NaN), so no
float8 support is needed from the GPU or the interpreter. Every load is masked: an id outside [0, V) reads zeros,
never foreign memory (the layers check ids, on CUDA with a device-side assert).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tokenpos.kernels.triton._cast import LAUNCH_OPTIONS, round_to
from tokenpos.kernels.triton._grid import cdiv, next_power_of_2
from tokenpos.tables.errors import ConfigError

BLOCK_N = 16                       # ids per program
BLOCK_C = 256                      # columns per program, at most
MAX_IDS = 2**31 - 1 - BLOCK_N      # ids per call (row indices in int32; element offsets in int64)
_SCALES = (torch.float32, torch.float16, torch.bfloat16)


@triton.jit
def _decode_e4m3(b):
    """e4m3fn bit patterns (uint8 widened to int32) -> their exact float32 values."""
    u = b.to(tl.uint32)
    e = (u >> 3) & 15
    m = u & 7
    bits = ((u >> 7) << 31) | ((e + 120) << 23) | (m << 20)                    # normal: (1 + m/8) * 2**(e - 7)
    bits = tl.where((u & 0x7F) == 0x7F, 0x7FC00000, bits)                      # 0x7F / 0xFF: NaN
    normal = bits.to(tl.float32, bitcast=True)
    sub = m.to(tl.float32) * 0.001953125                                       # m * 2**-9, exact
    sub = tl.where((u >> 7) == 1, -sub, sub)
    return tl.where(e == 0, sub, normal)


@triton.jit
def _quantized_kernel(q_ptr, s_ptr, ids_ptr, out_ptr, N, C, V, stride_q, mult,
                      FP8: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_C: tl.constexpr):
    rows32 = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)                # (BN,) int32
    rows = rows32.to(tl.int64)
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)                   # (BC,)
    rmask = rows32 < N
    cmask = cols < C
    ids = tl.load(ids_ptr + rows32, mask=rmask, other=0).to(tl.int64)
    ok = rmask & (ids >= 0) & (ids < V)
    mask = ok[:, None] & cmask[None, :]
    raw = tl.load(q_ptr + ids[:, None] * stride_q + cols[None, :], mask=mask, other=0)   # (BN, BC)
    if FP8:
        v = _decode_e4m3(raw.to(tl.int32))
    else:
        v = raw.to(tl.float32)
    s = tl.load(s_ptr + ids, mask=ok, other=0.0).to(tl.float32)                 # (BN,)
    y = (v * s[:, None]) * mult
    tl.store(out_ptr + rows[:, None] * C + cols[None, :], round_to(y, out_ptr.dtype.element_ty),
             mask=rmask[:, None] & cmask[None, :])


def quantized_embedding(q: torch.Tensor, scale: torch.Tensor, ids: torch.Tensor, multiplier: float) -> torch.Tensor:
    """Dequantised ``q[ids]`` in one launch.

    Args:
        q: (V, C) int8 or float8_e4m3fn, unit stride along C.
        scale: (V,) float32 / float16 / bfloat16: one per row; the output's dtype.
        ids: (...) int32 or int64 ids in [0, V) (checked by the caller; a bad one reads zeros).
        multiplier: a Python float (an fp32 constant).

    Returns:
        (..., C) of ``scale.dtype`` on q's device.
    """
    if q.dim() != 2 or q.dtype not in (torch.int8, torch.float8_e4m3fn):
        raise ConfigError(f"q must be a (V, C) int8 or float8_e4m3fn table, got {q.dtype} {tuple(q.shape)}")
    if scale.dtype not in _SCALES or tuple(scale.shape) != (q.shape[0],):
        raise ConfigError(f"scale must be ({q.shape[0]},) float32 / float16 / bfloat16, got {scale.dtype} "
                          f"{tuple(scale.shape)}")
    fp8 = q.dtype == torch.float8_e4m3fn
    bits = q.view(torch.uint8) if fp8 else q
    if bits.stride(1) != 1:
        bits = bits.contiguous()
    V, C = q.shape
    N = ids.numel()
    if N > MAX_IDS:
        raise ConfigError(f"at most {MAX_IDS} ids per call (the kernel indexes rows in int32), got {N}")
    out = torch.empty((*ids.shape, C), dtype=scale.dtype, device=q.device)
    if N == 0 or C == 0:
        return out
    block_c = min(next_power_of_2(C), BLOCK_C)
    _quantized_kernel[(cdiv(N, BLOCK_N), cdiv(C, block_c))](
        bits, scale.contiguous(), ids.reshape(-1).contiguous(), out, N, C, V, bits.stride(0), float(multiplier),
        FP8=fp8, BLOCK_N=BLOCK_N, BLOCK_C=block_c, **LAUNCH_OPTIONS)
    return out
