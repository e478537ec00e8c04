"""Both backends share constructor arguments (shared/API.md): every constructor keyword of a torch layer is
accepted by its NumPy twin, but ``device`` (issue 48, item 8: NumPy's rotary layers refused ``dtype=``).

Registry-driven (``tests/public_layers.py``): every public layer of the torch backend with a twin of the same
name in NumPy; a new layer is compared without editing a list. Exceptions, each with its reason:
"""

from __future__ import annotations

import inspect

import numpy as np
import pytest

from tests.public_layers import public_layers, scheme_classes, scheme_kwargs
from tokenpos.tables.errors import ConfigError

#: torch keyword -> why its NumPy twin has none (every layer)
TORCH_ONLY = {
    "device": "NumPy arrays live in host memory: there is nothing to place",
    "generator": "a torch.Generator for the initial draw; the NumPy twin takes rng= (a NumPy Generator) and seed=",
    "storage": "where a torch table is kept while the model runs on a device (host memory or the device); NumPy "
               "arrays are always in host memory",
}
#: (layer, keyword) -> why that NumPy twin has none
LAYER_EXCEPTIONS: dict[tuple[str, str], str] = {
    ("TokenEmbedding", "sparse"): "torch's sparse gradients (nn.Embedding's sparse=True); NumPy has no sparse arrays",
    ("PerLayerEmbedding", "sparse"): "as TokenEmbedding's",
    ("HashedNgramEmbedding", "sparse"): "as TokenEmbedding's",
}

TORCH, NUMPY = public_layers("torch"), public_layers("numpy")
TWINS = sorted(set(TORCH) & set(NUMPY))


def _keywords(cls: type) -> dict[str, inspect.Parameter]:
    params = inspect.signature(cls.__init__).parameters
    return {n: p for n, p in params.items() if n != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}


def test_the_rotary_layers_of_item_8_are_compared() -> None:
    assert {"RotaryEmbedding", "XPosRotaryEmbedding", "MRotaryEmbedding", "RotaryEmbedding2D"} <= set(TWINS)


@pytest.mark.parametrize("name", TWINS)
def test_every_torch_constructor_keyword_is_accepted_by_the_numpy_twin(name: str) -> None:
    torch_kw, numpy_kw = _keywords(TORCH[name]), _keywords(NUMPY[name])
    missing = sorted(k for k in torch_kw if k not in numpy_kw and k not in TORCH_ONLY
                     and (name, k) not in LAYER_EXCEPTIONS)
    assert not missing, f"{name}: the NumPy twin does not take {missing}"
    # the same positional order for the arguments both take positionally
    positional = [k for k, p in torch_kw.items() if p.kind == p.POSITIONAL_OR_KEYWORD]
    assert positional == [k for k, p in numpy_kw.items() if p.kind == p.POSITIONAL_OR_KEYWORD], name


SCHEME_TWINS = [n for n in TWINS if n in scheme_classes("numpy") and "dtype" in _keywords(TORCH[n])]


@pytest.mark.parametrize("name", SCHEME_TWINS)
def test_dtype_means_the_same_in_both_twins(name: str) -> None:
    """A float ``dtype=`` is taken by both twins; an integer one is refused by both (ConfigError) or ignored by both
    (a layer that holds no table: NoPE). Schemes, built from their registry entry (the token tables' dtype is
    tested with those layers)."""
    refused = []
    for cls in (TORCH[name], NUMPY[name]):
        cls(**scheme_kwargs(name), dtype=np.float64)
        try:
            cls(**scheme_kwargs(name), dtype=np.int32)
        except ConfigError as e:
            assert "dtype" in str(e), str(e)
            refused.append(True)
        else:
            refused.append(False)
    who = "torch" if refused[0] else "numpy"
    assert refused[0] == refused[1], f"{name}: an integer dtype refused by {who} only"
