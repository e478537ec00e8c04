"""Counter-based dropout in torch ops, bit-identical to :mod:`tokenpos.tables.formulas.dropout`.

The uint64 hash is evaluated in int64: addition, multiplication and xor wrap identically in two's
complement, and a logical right shift is an arithmetic shift followed by a mask. Everything is a
plain tensor op, so it also runs on GPUs and under ``torch.compile``; the seed may be a Python int
or a 0-dim int64 tensor (drawn inside a compiled graph).

    c    = offset + i
    z    = splitmix64(seed_key ^ (c >> 1) * GOLDEN)          (one hash per pair of counters)
    keep = ((z >>> (32 * (c & 1) + 8)) & 0xFFFFFF) >= ceil(p * 2**24)
    out  = x * m,   m = 1 / (1 - p) if keep else 0        (a multiply: NaN stays NaN)

Shapes: any ``shape``; the element with C-order flat index i uses counter ``offset + i``.
"""

from __future__ import annotations

from typing import Any

import torch

from tokenpos.tables.formulas.dropout import GOLDEN, MIX1, MIX2, SEED_MASK, dropout_threshold


def _signed(u: Any) -> int:
    """A uint64 constant as the int64 with the same bits."""
    u = int(u)
    return u - (1 << 64) if u >= (1 << 63) else u


_GOLDEN, _MIX1, _MIX2 = _signed(GOLDEN), _signed(MIX1), _signed(MIX2)


def _shr(z: torch.Tensor, s: int) -> torch.Tensor:
    """Logical right shift of int64 bit patterns."""
    return (z >> s) & ((1 << (64 - s)) - 1)


def _mix(z: torch.Tensor) -> torch.Tensor:
    z = (z ^ _shr(z, 30)) * _MIX1
    z = (z ^ _shr(z, 27)) * _MIX2
    return z ^ _shr(z, 31)


def seed_key_torch(seed: Any, device: Any = None) -> torch.Tensor:
    """0-dim int64 tensor with the bits of ``tables.formulas.dropout.seed_key(seed)``."""
    s = torch.as_tensor(seed, dtype=torch.int64, device=device) & SEED_MASK
    return _mix(s + _GOLDEN)


def dropout_keep_mask_torch(seed: Any, shape: tuple[int, ...], p: float, offset: int = 0,
                            device: Any = None) -> torch.Tensor:
    """Boolean keep mask of ``shape``, equal element for element to ``tables.dropout_keep_mask``."""
    n = 1
    for s in shape:
        n *= int(s)
    key = seed_key_torch(seed, device)
    first, odd = offset >> 1, offset & 1                 # the pairs of counters offset .. offset + n - 1
    # ``+ (key & 0)`` makes the counter data-dependent: inductor (torch 2.13, CPU) otherwise folds
    # ``arange * GOLDEN`` into an index expression that overflows and corrupts the heap.
    j = torch.arange(first, first + (n + odd + 1) // 2, dtype=torch.int64, device=device) + (key & 0)
    z = _mix(key ^ (j * _GOLDEN))
    words = torch.stack([z & 0xFFFFFFFF, _shr(z, 32)], dim=-1).reshape(-1)[odd:odd + n]   # counter order
    return ((words >> 8) >= dropout_threshold(p)).reshape(shape)


def dropout_multiplier_torch(seed: Any, shape: tuple[int, ...], p: float, offset: int = 0,
                             device: Any = None, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``m`` of ``shape``: ``1 / (1 - p)`` where kept, 0 where dropped (``tables.dropout_multiplier``)."""
    keep = dropout_keep_mask_torch(seed, shape, p, offset, device)
    return keep.to(dtype) * (1.0 / (1.0 - p))


def dropout_torch(x: torch.Tensor, p: float, seed: Any, offset: int = 0) -> torch.Tensor:
    """``x * m`` with the counter-based mask: NaN/Inf propagate as in ``torch.nn.Dropout``.

    float16/bfloat16 ``x`` is multiplied in float32 and rounded once; autograd's backward is
    ``grad * m``, the same rule.
    """
    wide = x.dtype if x.dtype in (torch.float32, torch.float64) else torch.float32
    m = dropout_multiplier_torch(seed, tuple(x.shape), p, offset, x.device, wide)
    return (x.to(wide) * m).to(x.dtype)


def draw_seed_torch(generator: torch.Generator | None, device: torch.device | None = None) -> torch.Tensor:
    """A fresh 63-bit dropout seed: a 0-d int64 tensor on ``device`` (None: the CPU).

    On the CPU it is drawn from ``generator`` (None: torch's global CPU generator, so
    ``torch.manual_seed`` reproduces a run). On another device it is drawn THERE, by a device op,
    from ``generator`` (which must live on that device) or, for None, that device's default
    generator (``torch.cuda.manual_seed`` reproduces a run): nothing is copied from the host, so no
    call waits for the device, and under CUDA-graph capture each replay draws a fresh seed (CUDA's
    default generator advances its graph-safe offset per replay)."""
    if device is None or device.type == "cpu":
        return torch.randint(0, SEED_MASK, (), generator=generator, dtype=torch.int64)
    return torch.randint(0, SEED_MASK, (), generator=generator, dtype=torch.int64, device=device)


def generator_device_message(generator_device: torch.device, device: torch.device) -> str:
    """The refusal of a ``generator=`` that lives on another device than the layer drawing seeds from it."""
    return (f"generator is on {generator_device} but the layer is on {device}: dropout seeds are drawn on the "
            f"layer's device; pass a generator on {device} (torch.Generator({str(device)!r})) or generator=None "
            f"(the device's default generator), or set layer.generator = None after moving the layer")
