"""One small instance of every public NumPy layer, for the guard tests that must cover them all.

``build(name)`` makes a fresh ``tokenpos.numpy`` layer of ``SPECS[name]`` (``build(name, "torch")`` its
torch twin, same arguments). ``SPECS`` is derived: every registered scheme class takes its registry defaults
(``tests/public_layers.py``) unless ``HAND_SPECS`` pins its arguments, and every other layer has its hand-written
entry. :func:`public_layer_classes` discovers the public ``Module`` classes (``__all__`` and the registry), so a
guard test iterating over ``SPECS`` fails loudly when a layer that is not a scheme is added without an entry in
``HAND_SPECS``.
"""

from __future__ import annotations

from typing import Any

import tokenpos.numpy as tpn
from tests.ngram_cases import tiny_ngram_kwargs
from tests.public_layers import derived_case, public_layers, scheme_classes, scheme_kwargs

# name: (constructor args, keyword args); the same in both backends. Every layer that is not a registered scheme
# has its entry here; the schemes here keep the small settings the guards were written with, and a registered
# scheme that is not here takes its registry defaults (tests/public_layers.py: Dh = 8, H = 2, D = 16, P = 16).
HAND_SPECS: dict[str, tuple[tuple[Any, ...], dict[str, Any]]] = {
    "TokenEmbedding": ((20, 8), {"seed": 0}),
    "PerLayerEmbedding": ((20, 2, 4), {"padding_idx": 0, "seed": 0}),
    "HashedNgramEmbedding": ((), tiny_ngram_kwargs(20)),
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
SPECS: dict[str, tuple[tuple[Any, ...], dict[str, Any]]] = {
    **{name: ((), scheme_kwargs(name)) for name in scheme_classes("numpy")}, **HAND_SPECS}


def build(name: str, backend: str = "numpy") -> Any:
    """A fresh layer ``name`` of ``backend`` ("numpy" | "torch") with the arguments of ``SPECS``."""
    args, kwargs = SPECS[name]
    with derived_case("HAND_SPECS of tests/numpy/layers.py", name, HAND_SPECS):
        return layer_class(name, backend)(*args, **kwargs)


def layer_class(name: str, backend: str = "numpy") -> type:
    """``backend``'s public class ``name``: an exported name (aliases included) or a registered scheme class."""
    if backend == "numpy":
        module: Any = tpn
    else:
        import tokenpos.torch as module
    cls = getattr(module, name, None)
    return cls if isinstance(cls, type) else public_layers(backend)[name]


def public_layer_classes() -> set[str]:
    """The names of every public ``tokenpos.numpy`` class deriving from ``Module`` (Module itself excluded): the
    exported ones (aliases such as ``PositionalEmbedding`` by their exported name) and every registered scheme
    class."""
    out = set(scheme_classes("numpy"))
    for name in tpn.__all__:
        obj = getattr(tpn, name)
        if isinstance(obj, type) and issubclass(obj, tpn.Module) and obj is not tpn.Module:
            out.add(name)
    return out
