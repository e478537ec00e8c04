"""One small instance of every public NumPy layer, for the guard tests that must cover them all.

``build(name)`` makes a fresh ``tokenpos.numpy`` layer of ``SPECS[name]`` (``build(name, "torch")`` its
torch twin, same arguments). :func:`public_layer_classes` discovers the public ``Module`` classes, so
a guard test iterating over ``SPECS`` fails loudly when a layer is added without an entry here.
"""

from __future__ import annotations

from typing import Any

import tokenpos.numpy as tpn

# name: (constructor args, keyword args); the same in both backends
SPECS: dict[str, tuple[tuple[Any, ...], dict[str, Any]]] = {
    "TokenEmbedding": ((20, 8), {"seed": 0}),
    "LearnedPositionalEmbedding": ((16, 8), {"seed": 0}),
    "PositionalEmbedding": ((16, 8), {"seed": 0}),
    "SinusoidalPositionalEncoding": ((16, 8), {}),
    "SinCos2DPositionalEncoding": ((4, 4, 8), {}),
    "LayerNorm": ((8,), {}),
    "RMSNorm": ((8,), {}),
    "ALiBi": ((2,), {}),
    "FIRE": ((2,), {"width": 4, "seed": 0}),
    "KERPLE": ((2,), {"seed": 0}),
    "T5RelativePositionBias": ((2,), {"num_buckets": 8, "max_distance": 16, "seed": 0}),
    "RotaryEmbedding": ((8,), {"max_seq_len": 16}),
    "XPosRotaryEmbedding": ((8,), {}),
    "MRotaryEmbedding": ((8,), {"mrope_section": [2, 1, 1]}),
    "RotaryEmbedding2D": ((8,), {}),
    "NoPositionalEncoding": ((), {}),
    "TransformerEmbedding": ((20, 8, 16), {"num_token_types": 2, "norm": "layernorm", "seed": 0}),
    "EmbeddingLayer": ((20, 8, 16), {"positional": "t5", "num_heads": 2, "norm": "rmsnorm", "seed": 0}),
}


def build(name: str, backend: str = "numpy") -> Any:
    """A fresh layer ``name`` of ``backend`` ("numpy" | "torch") with the arguments of ``SPECS``."""
    if backend == "numpy":
        module: Any = tpn
    else:
        import tokenpos.torch as module
    args, kwargs = SPECS[name]
    return getattr(module, name)(*args, **kwargs)


def public_layer_classes() -> set[str]:
    """The names of every public ``tokenpos.numpy`` class deriving from ``Module`` (Module itself excluded)."""
    out = set()
    for name in tpn.__all__:
        obj = getattr(tpn, name)
        if isinstance(obj, type) and issubclass(obj, tpn.Module) and obj is not tpn.Module:
            out.add(name)
    return out
