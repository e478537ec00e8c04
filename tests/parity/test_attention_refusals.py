"""Both backends' attention refuses what it would ignore or misread, with the same typed error and text: an
integer or complex mask (HF's 0/1 attention_mask was added to the logits, masking nothing), a scale that is not
a finite number > 0, and positions a bias scheme (or no scheme) does not read unless they say what it measures
(a KV cache with gaps was measured as contiguous, silently)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

import tokenpos.numpy as tpn
import tokenpos.torch as tpt
from tokenpos.tables import ConfigError, DtypeError

RNG = np.random.default_rng(0)
Q = RNG.standard_normal((1, 2, 2, 4))
KV = RNG.standard_normal((1, 2, 4, 4))
SCHEMES = {"none": lambda m: None, "alibi": lambda m: m.ALiBi(2), "t5": lambda m: m.T5RelativePositionBias(2, seed=0),
           "fire": lambda m: m.FIRE(2, seed=0)}


def _both(kwargs: dict[str, Any], scheme: str = "alibi") -> list[Any]:
    """The call in each backend: its output, or the error it raised."""
    results = []
    for mod, conv in ((tpn, np.asarray), (tpt, torch.as_tensor)):
        kw = {k: conv(v) if isinstance(v, np.ndarray) else v for k, v in kwargs.items()}
        try:
            out = mod.scaled_dot_product_attention(conv(Q), conv(KV), conv(KV), positional=SCHEMES[scheme](mod), **kw)
            results.append(out.detach().numpy() if isinstance(out, torch.Tensor) else out)
        except (ConfigError, DtypeError) as err:
            results.append(err)
    return results


@pytest.mark.parametrize("kwargs, error, text", [
    ({"attn_mask": np.tril(np.ones((2, 4), np.int64), 2)}, DtypeError,
     r"attn_mask must be bool \(True = attend\) or additive floats, got dtype int64; for a 0/1 mask"),
    ({"attn_mask": np.ones((2, 4), np.uint8)}, DtypeError, "got dtype uint8"),
    ({"attn_mask": np.ones((2, 4), np.complex64)}, DtypeError, "got dtype complex64"),
    ({"scale": float("nan")}, ConfigError, "scale must be a finite number, got nan"),
    ({"scale": float("inf")}, ConfigError, "scale must be a finite number, got inf"),
    ({"scale": "2"}, ConfigError, "scale must be a finite number, got '2'"),
    ({"scale": True}, ConfigError, "scale must be a finite number, got True"),
    ({"scale": 0.0}, ConfigError, "scale must be > 0.0, got 0.0"),
    ({"key_positions": np.array([0, 50, 51, 52])}, ConfigError,
     r"key_positions \[0, 50, 51, 52\] given, but ALiBi reads no positions: query i sits at key index Lk - Lq \+ i "
     r"= 2 \+ i of keys 0 .. 3"),
    ({"positions": np.array([7, 8])}, ConfigError, r"positions \[7, 8\] given, but ALiBi reads no positions"),
    ({"start_pos": 100}, ConfigError, "start_pos 100 given, but ALiBi reads no positions"),
    ({"start_pos": 0}, ConfigError, "start_pos 0 given, but ALiBi reads no positions"),
])
def test_refused_in_both_backends_with_one_text(kwargs: dict[str, Any], error: type, text: str) -> None:
    results = _both(kwargs)
    for got in results:
        assert isinstance(got, error), got
    assert str(results[0]) == str(results[1])
    with pytest.raises(error, match=text):
        raise results[0]


@pytest.mark.parametrize("scheme", sorted(SCHEMES))
def test_positions_that_say_what_the_scheme_measures_are_accepted(scheme: str) -> None:
    """Query i at key Lk - Lq + i of keys 0 .. Lk - 1, said explicitly: the same output as saying nothing."""
    want = _both({}, scheme)
    for kwargs in ({"positions": np.array([2, 3]), "key_positions": np.arange(4)}, {"start_pos": 2},
                   {"key_positions": np.arange(4)[None]}, {"positions": np.array([[2, 3]]), "start_pos": 0}):
        for got, ref in zip(_both(kwargs, scheme), want, strict=True):
            np.testing.assert_array_equal(got, ref)
    none = _both({"key_positions": np.array([1, 2, 3, 4])}, "none")[0]
    assert "there is no positional scheme" in str(none)


def test_the_torch_function_takes_a_numpy_mask() -> None:
    """A NumPy mask in the torch function raised AttributeError ('numpy.ndarray' has no 'to')."""
    mask = np.tril(np.ones((2, 4), bool), 2)
    a = tpt.scaled_dot_product_attention(torch.as_tensor(Q), torch.as_tensor(KV), torch.as_tensor(KV), attn_mask=mask,
                                         causal=False)
    b = tpt.scaled_dot_product_attention(torch.as_tensor(Q), torch.as_tensor(KV), torch.as_tensor(KV),
                                         attn_mask=torch.as_tensor(mask), causal=False)
    assert torch.equal(a, b)
