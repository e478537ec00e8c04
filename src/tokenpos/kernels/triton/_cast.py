"""Rounding an fp32 result to the output dtype once, round-to-nearest-even, identically everywhere.

On a GPU ``.to(dtype)`` is the hardware's conversion, round-to-nearest-even (``cvt.rn.bf16.f32``,
``cvt.rn.f16.f32``; tests/kernels/triton/test_triton_codegen.py checks the PTX). Triton's CPU
interpreter truncates in ``.to(tl.bfloat16)``, so there fp32 -> bf16 is done on the bits, as
``c10::BFloat16`` does: ``(b + 0x7FFF + ((b >> 16) & 1)) >> 16``, NaN kept NaN (quiet bit set).
Both give torch's result bit for bit (NaN payloads aside), so the interpreter tests check the
values the GPU writes. The bit spelling stays out of compiled kernels: it costs about seven integer
instructions per element, where the conversion is one. Other dtypes use ``.to`` (RNE in both;
float64 results bound for bf16 round through fp32, as torch's own conversion does).
"""

from __future__ import annotations

import os

import triton
import triton.language as tl

# Every launch: no FMA contraction, so a product and a sum round separately (as in NumPy / the CPU kernels).
LAUNCH_OPTIONS = {"enable_fp_fusion": False}

# Read once, when the kernels are imported: Triton itself decides interpretation then
# (tokenpos.kernels.triton's doc: TRITON_INTERPRET=1 is set before the package is imported).
BF16_BY_BITS = tl.constexpr(os.environ.get("TRITON_INTERPRET", "0") == "1")


@triton.jit
def round_to(y, dtype: tl.constexpr):
    """``y`` (fp32 or fp64) rounded once to ``dtype``."""
    if BF16_BY_BITS and dtype == tl.bfloat16:
        bits = y.to(tl.float32).to(tl.uint32, bitcast=True)
        rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
        rounded = tl.where(y != y, (bits >> 16) | 0x0040, rounded)
        return rounded.to(tl.uint16).to(tl.bfloat16, bitcast=True)
    elif dtype == tl.bfloat16:
        return y.to(tl.float32).to(dtype)
    else:
        return y.to(dtype)
