"""Every tolerance the tests use, in one table.

Entries are keyword dicts. ``rtol``/``atol`` entries go straight into ``np.testing.assert_allclose``;
``scale`` entries bound ``max|a - b| <= scale * max|ref|`` (relative to the output's scale; see each user).
"""

from __future__ import annotations

from typing import Any

TOL: dict[str, dict[str, Any]] = {
    # finite differences in float64 against the hand-written NumPy backward (tests/numpy/gradcheck.py)
    "fd.linear": {"rtol": 1e-6, "atol": 1e-8},
    "fd.nonlinear": {"rtol": 1e-5, "atol": 1e-7},
    # NumPy <-> torch parity of outputs and gradients: max|a - b| <= scale * max|ref| (shared/API.md)
    "parity.f32": {"scale": 1e-5},
    "parity.f64": {"scale": 1e-12},
    # from_hf against the Hugging Face block itself (float32, eval mode): max abs diff
    "hf.f32": {"rtol": 0.0, "atol": 1e-6},
    # patch(model) against the same HF model unpatched (float32 logits, losses and gradients of tiny models)
    "hf.patch": {"rtol": 1e-5, "atol": 1e-5},
    # patch(loss=True) of a bf16 / fp16 model vs HF, which rounds its logits to that dtype first: loss (relative)
    # and each gradient (max|a - b| <= scale * max|ref|; measured 1.4e-2 in bf16, 1.7e-3 in fp16), a few bf16 ulps
    "hf.patch_loss.half": {"scale": 2.0 ** -5},
    # bf16 positional tables vs the float64 truth: one bf16 ulp at 1.0 (values lie in [-1, 1])
    "bf16.positions": {"rtol": 0.0, "atol": 2.0 ** -7},
    # same-seed init, state_dict round trips, dropout masks: exact
    "exact": {"rtol": 0.0, "atol": 0.0},
    # --- NumPy backend unit tests (tests/numpy, tests/tables) ---
    # forward against a float64 reference, per layer dtype
    "forward.float64": {"rtol": 1e-12, "atol": 1e-12},
    "forward.float32": {"rtol": 1e-6, "atol": 1e-6},
    "forward.float16": {"rtol": 2e-3, "atol": 2e-3},
    # LayerNorm / RMSNorm against a float64 reference
    "norm.float64": {"rtol": 1e-10, "atol": 1e-10},
    "norm.float32": {"rtol": 1e-5, "atol": 1e-5},
    "norm.float16": {"rtol": 1e-2, "atol": 1e-2},
    # sinusoidal tables: ours (float64) vs the formula element by element / vs HF Marian (float32)
    "sinusoidal.formula": {"rtol": 0.0, "atol": 1e-12},
    "sinusoidal.marian": {"rtol": 0.0, "atol": 1e-6},
    # gradients accumulated in the parameter dtype vs a float64 np.add.at reference
    "grad.float64": {"rtol": 1e-12, "atol": 1e-12},
    "grad.float32": {"rtol": 1e-5, "atol": 1e-5},
    "grad.float16": {"rtol": 2e-2, "atol": 2e-2},
    # optimisers: ours vs a float64 restatement of the formula / vs torch.optim (float64 runs)
    "optim.formula": {"rtol": 1e-6, "atol": 1e-7},
    "optim.torch": {"rtol": 1e-6, "atol": 1e-7},
    "optim.sparseadam": {"rtol": 1e-5, "atol": 1e-6},   # torch.optim.SparseAdam places eps differently
    # --- positional schemes (issue #4; docs/SCHEMES.md shows the same table) ---
    # ours (float64) vs HF's float32 rope init functions: a few float32 ulps
    "hf.rope_inv_freq": {"rtol": 5e-7, "atol": 0.0},
    "hf.rope_attention_factor": {"rtol": 1e-12, "atol": 0.0},
    # RoPE cos/sin and rotated q/k vs HF (fp32 angles there): |d| <= atol + per_position * max_pos, times max|x|
    "hf.rope_rotated": {"atol": 2e-6, "per_position": 1e-7},
    # ALiBi slopes vs Bloom (float32 pow of a float32 base): relative
    "hf.alibi_slopes": {"rtol": 1e-6, "atol": 0.0},
    # bf16 q/k at position 1e6 vs the float64 rotation of the same bf16 inputs, relative to max|x|
    "rope.bf16_far": {"scale": 2.0 ** -7},
    # fused numba kernels vs the plain NumPy path (kernels sum in float64, the reference in the dtype)
    "kernels.float64": {"rtol": 1e-12, "atol": 1e-12},
    "kernels.float32": {"rtol": 1e-5, "atol": 1e-6},
    "kernels.optim": {"rtol": 1e-5, "atol": 1e-6},
    # the kernels' float64-accumulated sums and float64 optimiser math, rounded to the result dtype,
    # vs their references (tests/kernels/compare.py; forwards are bit-exact and need no entry)
    "kernels.sum.float32": {"rtol": 2e-6, "atol": 2e-6},
    "kernels.sum.float64": {"rtol": 1e-12, "atol": 1e-12},
    # vocab-parallel cross-entropy (float32) vs F.cross_entropy on one process: loss to fp32 rounding,
    # logit / h / tied-weight gradients within 1e-6 absolute
    "dist.loss": {"rtol": 1e-6, "atol": 1e-6},
    "dist.grad": {"rtol": 0.0, "atol": 1e-6},
}
TOL.update({
    # --- Triton kernels (tests/kernels/triton), run through Triton's interpreter on CPU ---
    # fp32 segment sums vs float64 references (torch autograd in float64, kernels.reference)
    "triton.grad.float32": {"rtol": 1e-5, "atol": 1e-6},
    # bf16 / fp16 gradients summed in fp32, rounded once (unit roundoff 2**-8 / 2**-11): max|a - b| <= scale * max|ref|
    "triton.grad.bfloat16": {"scale": 2.0 ** -7},
    "triton.grad.float16": {"scale": 2.0 ** -10},
    # cross-entropy loss / lse / logit gradients in fp32 (online softmax; approximate exp on a GPU) vs torch
    "triton.cross_entropy": {"rtol": 1e-5, "atol": 1e-5},
    # bf16 RoPE at positions near 1e6: angle (rad) of each rotated pair vs the float64 rotation of the same bf16
    # inputs. Bound: bf16 output rounding (2**-8 per component) + fp32 tables and arithmetic (< 2**-20)
    "triton.rope_bf16_angle": {"atol": 2.0 ** -8 + 2.0 ** -20},
})
