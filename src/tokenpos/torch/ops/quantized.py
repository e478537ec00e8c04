"""``tokenpos::quantized_embedding``: the lookup of an 8-bit table, dequantised inside the gather, as a torch op.

Shapes: q (V, C) int8, or uint8 holding float8 e4m3fn bit patterns with ``float8=True`` (the layers pass
``weight.view(torch.uint8)``: opcheck and other tensor utilities have no CPU kernels for float8 tensors, so the op
never takes one), scale (V,) float16 / bfloat16 / float32 / float64 (one per row), ids (...) int32 / int64 ->
out (..., C) of scale's dtype:

    out = (float(q[ids]) * float(scale[ids])) * multiplier      (float32; float64 for float64 scales; rounded once)

exactly :func:`tokenpos.tables.formulas.quantize.dequantize_rows`. The choice of implementation: on the CPU with
kernels on, the numba kernel (:mod:`tokenpos.kernels.quantized`, every scale dtype) writing into a fresh tensor;
on CUDA the Triton kernel (:mod:`tokenpos.kernels.triton.quantized`; float32 / float16 / bfloat16 scales) when
Triton imports; elsewhere (kernels off, float64 scales on CUDA, meta, under ``torch.func`` transforms) plain torch
ops: a gather of the 8-bit rows and their scales, then the same two products (a temporary of the gathered rows).
No path reads a value on the host.

Inference only: the op has no registered autograd. The 8-bit table is frozen (``weight`` and ``weight_scale``
never require grad in the layers), and the only float input, ``scale``, is a frozen buffer-like parameter; a
differentiable 8-bit table would need a straight-through estimator, which tokenpos does not define.
Ids are checked by the layers; the numba kernel skips a row with a bad id and raises ``KernelBoundError``, torch's
gather raises ``IndexError`` (a device-side assert on CUDA), the Triton kernel reads zeros for it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from tokenpos.kernels.quantized import gather_dequantized
from tokenpos.tables.errors import ConfigError
from tokenpos.torch._checks import transforms_active
from tokenpos.torch.ops._dispatch import cpu_empty, triton_kernels

QUANTIZED_DTYPES = (torch.int8, torch.float8_e4m3fn)           # the layers' 8-bit weight dtypes
SCALE_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_CPU_OUT = {torch.float32: torch.float32, torch.float64: torch.float64, torch.bfloat16: torch.uint16,
            torch.float16: torch.int16}                  # the kernel's view of each output: 16-bit ones as bits


def _check(q: torch.Tensor, scale: torch.Tensor, ids: torch.Tensor, float8: bool) -> None:
    """Shapes and dtypes (never values): the op's one argument check."""
    want = torch.uint8 if float8 else torch.int8
    if q.dim() != 2 or q.dtype != want:
        raise ConfigError(f"q must be a (V, C) {'uint8 table of float8 e4m3fn bits' if float8 else 'int8 table'} "
                          f"(float8={float8}), got {q.dtype} {tuple(q.shape)}")
    if scale.dtype not in SCALE_DTYPES or tuple(scale.shape) != (q.shape[0],):
        raise ConfigError(f"scale must be ({q.shape[0]},) float16 / bfloat16 / float32 / float64, got "
                          f"{scale.dtype} {tuple(scale.shape)}")
    if ids.dtype not in (torch.int32, torch.int64):
        raise ConfigError(f"ids must be int32 or int64, got {ids.dtype}")
    if q.device != scale.device or q.device != ids.device:
        raise ConfigError(f"q, scale and ids must be on one device, got {q.device}, {scale.device}, {ids.device}")


def _triton(q: torch.Tensor, scale: torch.Tensor) -> Any:
    """The Triton module for a CUDA call it takes (float32 / float16 / bfloat16 scales), else None."""
    if not q.is_cuda or transforms_active():
        return None
    tk = triton_kernels(scale)
    if tk is None:
        return None
    import importlib

    return importlib.import_module("tokenpos.kernels.triton.quantized")


def formula(q: torch.Tensor, scale: torch.Tensor, ids: torch.Tensor, multiplier: float, float8: bool) -> torch.Tensor:
    """The op's value in plain torch ops (any device): q (V, C), scale (V,), ids (...) -> (..., C)."""
    ct = torch.float64 if scale.dtype == torch.float64 else torch.float32
    rows = torch.embedding(q, ids)                                                     # (..., C) 8-bit
    rows = rows.view(torch.float8_e4m3fn) if float8 else rows                           # torch's exact decode
    s = torch.embedding(scale.unsqueeze(-1), ids)                                      # (..., 1)
    return ((rows.to(ct) * s.to(ct)) * multiplier).to(scale.dtype)


def quantized_impl(q: torch.Tensor, scale: torch.Tensor, ids: torch.Tensor, multiplier: float,
                   float8: bool) -> torch.Tensor:
    """The implementation (checked arguments): numba on the CPU, Triton on CUDA, else :func:`formula`."""
    from tokenpos._config import kernels_enabled

    if q.is_cpu and kernels_enabled() and not transforms_active():
        shape = (*ids.shape, q.shape[1])
        if scale.dtype == torch.float16:                     # (no NumPy view of fp16 in cpu_empty: its bits)
            out = torch.empty(shape, dtype=scale.dtype)
            out_np = out.view(torch.int16).numpy()
        else:                                                # reused memory for a large output (no page faults)
            out, out_np = cpu_empty(shape, scale.dtype)
        s = scale.detach()
        s = s.view(_CPU_OUT[s.dtype]) if s.dtype in (torch.bfloat16, torch.float16) else s
        gather_dequantized(q.detach().numpy(), s.numpy(), ids.numpy(), multiplier, out_np)
        return out
    tk = _triton(q, scale)
    if tk is not None:
        table = q.view(torch.float8_e4m3fn) if float8 else q
        return tk.quantized_embedding(table, scale, ids, multiplier)  # type: ignore[no-any-return]
    return formula(q, scale, ids, multiplier, float8)


@torch.library.custom_op("tokenpos::quantized_embedding", mutates_args=())
def quantized_embedding(q: torch.Tensor, scale: torch.Tensor, ids: torch.Tensor, multiplier: float,
                        float8: bool) -> torch.Tensor:
    """q (V, C) int8 (or float8 e4m3fn bits as uint8, ``float8``), scale (V,), ids (...) -> (..., C) dequantised
    rows in scale's dtype. See the module doc."""
    _check(q, scale, ids, float8)
    return quantized_impl(q, scale, ids, multiplier, float8)


def quantized_rows(q: torch.Tensor, scale: torch.Tensor, ids: torch.Tensor, multiplier: float,
                   float8: bool) -> torch.Tensor:
    """``tokenpos::quantized_embedding`` as the layers call it (checked arguments), the cheapest way that keeps the
    op's semantics, as ``ops.entry.embed`` reaches the token embedding: the op under ``torch.compile`` tracing (the
    graph keeps it), else its implementation directly (no autograd to register: the table is frozen), skipping the
    dispatcher's Python. q (V, C), scale (V,), ids (...) -> (..., C)."""
    if torch.compiler.is_compiling():
        return quantized_embedding(q, scale, ids, multiplier, float8)  # type: ignore[no-any-return]
    return quantized_impl(q, scale, ids, multiplier, float8)


@quantized_embedding.register_fake
def _(q: torch.Tensor, scale: torch.Tensor, ids: torch.Tensor, multiplier: float, float8: bool) -> torch.Tensor:
    _check(q, scale, ids, float8)
    return scale.new_empty((*ids.shape, q.shape[1]))


def quantized_samples(device: Any = "cpu") -> Iterator[tuple[Any, tuple[Any, ...], dict[str, Any]]]:
    """(op, args, kwargs) for ``opcheck``: int8 and float8 tables, every scale dtype, (B, L) and (N,) int64 / int32
    ids, a strided table, an empty batch."""
    gen = torch.Generator().manual_seed(3)
    V, C = 9, 6
    for qdt in QUANTIZED_DTYPES:
        for sdt in SCALE_DTYPES:
            w = torch.randn(V, 2 * C, generator=gen) * 3
            fp8 = qdt == torch.float8_e4m3fn
            q = (w.to(qdt).view(torch.uint8) if fp8 else w.clamp(-127, 127).round().to(torch.int8)).to(device)
            scale = (torch.rand(V, generator=gen) * 0.1).to(sdt).to(device)
            ids = torch.randint(0, V, (2, 5), generator=gen).to(device)
            yield quantized_embedding, (q[:, :C].contiguous(), scale, ids, 1.5, fp8), {}
            yield quantized_embedding, (q[:, ::2], scale, ids.reshape(-1).int(), 1.0, fp8), {}
            if sdt == torch.float32:
                yield quantized_embedding, (q[:, :C].contiguous(), scale, ids[:, :0], 2.0, fp8), {}
