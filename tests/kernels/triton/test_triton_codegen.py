"""What the interpreter cannot show: the kernels compile for a real GPU, and the output rounding is torch's.

The CUDA compile needs no GPU: ``triton.compile`` for an sm_90 target runs the whole pipeline on the
CPU (TTIR, TTGIR, LLVM IR, PTX, and the bundled ptxas to a cubin), in a subprocess without
TRITON_INTERPRET.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

triton = pytest.importorskip("triton")          # the optional gpu extra

import triton.language as tl  # noqa: E402

import tokenpos  # noqa: E402
from tokenpos.kernels.triton._cast import round_to  # noqa: E402

# One subprocess compiles every variant: in this process triton was imported with the interpreter on,
# which turns triton's own library functions into interpreted ones too, so compiling here is not possible.
_COMPILE = r"""
import importlib, json, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from tokenpos.kernels.triton._cast import LAUNCH_OPTIONS
out = {}
for key, (module, name, signature, constexprs) in json.loads(sys.stdin.read()).items():
    kernel = getattr(importlib.import_module("tokenpos.kernels.triton." + module), name)
    sig = {**signature, **dict.fromkeys(constexprs, "constexpr")}
    k = triton.compile(ASTSource(kernel, sig, constexprs), target=GPUTarget("cuda", 90, 32),
                       options=dict(LAUNCH_OPTIONS))
    out[key] = {"ptx": k.asm["ptx"], "cubin_bytes": len(k.asm["cubin"])}
print(json.dumps(out))
"""

I32 = "i32"
ROPE_INTS = "H HK L F TAIL sqb sqh sql skb skh skl soqb soqh soql sokb sokh sokl scb scl spb spl".split()


def _variants() -> dict[str, tuple]:
    v = {}
    for w, t in [("*bf16", "*fp32"), ("*fp32", "*fp32"), ("*fp16", "*fp16")]:
        v[f"forward{w}"] = ("embedding", "_embedding_forward_kernel", {
            "w_ptr": w, "ids_ptr": "*i64", "t_ptr": t, "pos_ptr": "*i64", "seed_ptr": "*i64", "out_ptr": w,
            "N": I32, "D": I32, "V": I32, "P": I32, "NPOS": I32, "stride_w": I32, "stride_t": I32, "scale": "fp32",
            "inv_keep": "fp32", "threshold": I32, "offset": "i64"},
            {"HAS_POS": True, "HAS_DROPOUT": True, "PAIRS": w != "*fp16", "BLOCK_N": 16, "BLOCK_D": 128})
        if w != "*fp16":                                                        # same code as bf16 but the cast
            for pairs in (True, False):                                        # one hash per pair / per element
                v[f"segment_sum{w}{pairs}"] = ("embedding", "_segment_sum_kernel", {
                    "grad_ptr": w, "perm_ptr": "*i64", "bounds_ptr": "*i64", "seed_ptr": "*i64", "out_ptr": w,
                    "D": I32, "scale": "fp32", "inv_keep": "fp32", "threshold": I32, "offset": I32, "skip_row": I32},
                    {"HAS_DROPOUT": True, "PAIRS": pairs, "BLOCK_D": 128, "ROWS": 8})
    for x, t, f64, interleaved in [("*bf16", "*fp32", False, False), ("*fp32", "*fp64", True, True)]:
        v[f"rope{x}{t}{interleaved}"] = ("rope", "_rope_kernel", {
            "q_ptr": x, "k_ptr": x, "oq_ptr": x, "ok_ptr": x, "cos_ptr": t, "sin_ptr": t, "pos_ptr": "*i64",
            **dict.fromkeys(ROPE_INTS, I32), "sqb": "i64"},
            {"INTERLEAVED": interleaved, "NEG_SIN": True, "COPY_TAIL": True, "F64": f64,
             "HAS_POS": f64, "BLOCK_L": 16, "BLOCK_F": 32, "BLOCK_T": 64})       # (table rows by position: fp32)
    v["ce_stats"] = ("cross_entropy", "_stats_kernel", {
        "x_ptr": "*bf16", "tgt_ptr": "*i64", "out_ptr": "*fp32", "Vs": I32, "stride_x": I32, "vocab_start": I32},
        {"BLOCK": 1024})
    v["ce_backward"] = ("cross_entropy", "_backward_kernel", {
        "x_ptr": "*bf16", "tgt_ptr": "*i64", "lse_ptr": "*fp32", "g_ptr": "*fp32", "out_ptr": "*bf16", "Vs": I32,
        "stride_x": I32, "stride_o": I32, "vocab_start": I32, "ignore_index": I32}, {"BLOCK": 1024})
    return v


@pytest.fixture(scope="module")
def compiled() -> dict[str, dict]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(Path(tokenpos.__file__).parents[1]), env.get("PYTHONPATH", "")])
    run = subprocess.run([sys.executable, "-c", _COMPILE], input=json.dumps(_variants()), capture_output=True,
                         text=True, env=env, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout)


@pytest.mark.slow  # compiles every Triton kernel in a child process
def test_every_kernel_compiles_for_cuda_to_a_cubin(compiled) -> None:
    assert set(compiled) == set(_variants())
    assert all(c["cubin_bytes"] > 0 for c in compiled.values())


@pytest.mark.slow  # compiles every Triton kernel
def test_float_products_and_sums_are_never_contracted(compiled) -> None:
    """With LAUNCH_OPTIONS, products and sums carry an explicit .rn (ptxas never fuses those): no fma."""
    for key, c in compiled.items():
        for op in ("fma.rn.f32", "mul.f32", "add.f32", "sub.f32", "fma.rn.f64", "mul.f64", "add.f64", "sub.f64"):
            assert op not in c["ptx"], (key, op)
        if key.startswith(("forward", "segment_sum")):
            assert "mul.lo.s64" in c["ptx"], key                                # the uint64 hash is there


@pytest.mark.slow  # compiles Triton kernels
def test_compiled_bf16_outputs_use_the_hardware_round_to_nearest_even(compiled) -> None:
    """Compiled kernels convert fp32 -> bf16 with ``cvt.rn.bf16`` (round-to-nearest-even), never the
    interpreter's bit spelling of it (about seven integer instructions per element: ``_cast``)."""
    bf16_out = [k for k in compiled if k.startswith(("forward*bf16", "segment_sum*bf16", "rope*bf16", "ce_backward"))]
    assert len(bf16_out) == 5
    for key in bf16_out:
        ptx = compiled[key]["ptx"]
        assert "cvt.rn.bf16" in ptx, key
        assert "32767" not in ptx and "0x7fff;" not in ptx.lower(), key                # the + 0x7FFF of the bits


@triton.jit
def _round_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    m = offs < n
    tl.store(out_ptr + offs, round_to(tl.load(x_ptr + offs, mask=m), out_ptr.dtype.element_ty), mask=m)


@pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")    # the interpreter's numpy
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_round_to_equals_torch_round_to_nearest_even(dtype, device) -> None:
    lo = float(torch.finfo(dtype).tiny)
    big = float(torch.finfo(dtype).max)
    eps = float(torch.finfo(dtype).eps)
    special = [0.0, -0.0, 1.0, 1.0 + eps / 2, 1.0 + 1.5 * eps, -(1.0 + eps / 2), 3.0 + 3 * eps / 2, big,
               big * (1 + eps / 4), big * (1 + eps), lo, lo / 3, -lo / 5, float("inf"), float("-inf"), float("nan")]
    rand = np.random.default_rng(5).standard_normal(200) * np.exp(np.random.default_rng(6).uniform(-20, 20, 200))
    x = torch.tensor(special + rand.tolist(), dtype=torch.float32)
    out = torch.empty(x.numel(), dtype=dtype, device=device)
    _round_kernel[(1,)](x.to(device), out, x.numel(), BLOCK=triton.next_power_of_2(x.numel()))
    want = x.to(dtype)
    got = out.cpu()
    assert torch.equal(torch.isnan(got), torch.isnan(want))
    keep = ~torch.isnan(want)
    assert torch.equal(got[keep].view(torch.int16), want[keep].view(torch.int16))   # bit for bit, signed zeros too
