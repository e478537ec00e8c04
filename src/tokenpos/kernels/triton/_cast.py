"""Rounding an fp32 result to the output dtype once, round-to-nearest-even, identically everywhere.

fp32 -> bf16 is done on the bits (as ``c10::BFloat16`` does): ``(b + 0x7FFF + ((b >> 16) & 1)) >> 16``,
NaN kept NaN (quiet bit set). On a GPU this equals the native ``cvt.rn.bf16.f32``; it is spelled out
because Triton's CPU interpreter truncates in ``.to(tl.bfloat16)``, and the interpreter tests must
exercise exactly the arithmetic the GPU runs. Other dtypes use ``.to`` (RNE in both; float64
results bound for bf16 round through fp32, as torch's own conversion does).
"""

from __future__ import annotations

import triton
import triton.language as tl

# Every launch: no FMA contraction, so a product and a sum round separately (as in NumPy / the CPU kernels).
LAUNCH_OPTIONS = {"enable_fp_fusion": False}


@triton.jit
def round_to(y, dtype: tl.constexpr):
    """``y`` (fp32 or fp64) rounded once to ``dtype``."""
    if dtype == tl.bfloat16:
        bits = y.to(tl.float32).to(tl.uint32, bitcast=True)
        rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
        rounded = tl.where(y != y, (bits >> 16) | 0x0040, rounded)
        return rounded.to(tl.uint16).to(tl.bfloat16, bitcast=True)
    else:
        return y.to(dtype)
