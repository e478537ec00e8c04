"""torch.compile(fullgraph=True, dynamic=True) of every public torch layer: no graph break on a valid
call, whatever the shapes, and the eager results.

Each layer is compiled once (``torch._dynamo.reset()`` first) with symbolic sizes from the start, then
called with three shapes, with and without positions where the layer takes them. The table is derived: every
registered shortcut in ``TransformerEmbedding``, and every registered scheme class without a hand-written
case by its registry defaults, called as its kind says (``tests/public_layers.py``;
``tests/test_coverage_lists.py`` checks that every public layer has a case). A Python comparison
of symbolic sizes that dynamo cannot trace (``tuple(pos.shape) in (...)``) raises ``Unsupported``
under ``fullgraph=True`` (and silently falls back to eager without it): this is the guard of that
class. The eager backend traces exactly what inductor would get, at a fraction of the cost.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

import tokenpos.torch as tpt
from tests.ngram_cases import tiny_ngram_kwargs
from tests.public_layers import build_scheme_layer, covered, derived_case, public_layers, scheme_classes
from tokenpos.tables.registry import SHORTCUTS

pytestmark = pytest.mark.slow   # torch.compile with dynamic shapes

SHAPES = ((2, 3), (3, 5), (1, 7))                                # (B, L): three shapes, one with B = 1
H, DH, D, V = 2, 8, 8, 50


def _ids(B: int, L: int) -> torch.Tensor:
    return (torch.arange(B * L).reshape(B, L) * 7) % V


def _q(B: int, L: int, heads: int = H, seed: int = 0) -> torch.Tensor:
    return torch.randn(B, heads, L, DH, generator=torch.Generator().manual_seed(seed + B * 10 + L))


ROPE = {"default": None, "dynamic": {"rope_type": "dynamic", "factor": 2.0},
        "longrope": {"rope_type": "longrope", "short_factor": [1.0, 1.1, 1.2, 1.3],
                     "long_factor": [1.0, 2.0, 3.0, 4.0], "original_max_position_embeddings": 4},
        "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4}}

# name -> (the layer, the inputs of a call at shape (B, L), with positions or without, the call)
Make = Callable[[int, int, bool], tuple[Any, ...]]
Call = Callable[..., Any]


def _qk(B: int, L: int, pos: Any) -> tuple[Any, ...]:
    return _q(B, L), _q(B, L, 1, 1), pos


def _rotate(m: Any, q: torch.Tensor, k: torch.Tensor, pos: Any) -> Any:
    return m.apply(q, k, pos)


def _transformer(m: Any, ids: torch.Tensor, pos: Any, pos_bl: Any) -> Any:
    if pos is None:
        return m(ids), m(ids[0], start_pos=1)
    return m(ids, pos), m(ids[0], pos), m(ids, pos_bl)


def _attention(m: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pos: Any) -> Any:
    return tpt.scaled_dot_product_attention(q, k, v, positional=m, positions=pos)


def _bias(m: Any, a: int, b: int) -> Any:
    return m.bias(a, b)


def _call(m: Any, x: Any) -> Any:
    return m(x)


# a registered scheme without a hand-written case: (the inputs of a call at (B, L), the call) by its kind
BY_KIND: dict[str, tuple[Make, Call]] = {
    "additive": (lambda B, L, p: (torch.arange(L).expand(B, L) + 1 if p else L,), _call),
    "rotary": (lambda B, L, p: _qk(B, L, torch.arange(L).expand(B, L) * 2 if p else None), _rotate),
    "bias": (lambda B, L, p: (L, L + B), _bias),
    "none": (lambda B, L, p: (L,), _call),
}


def _registered(name: str) -> tuple[Callable[[], Any], Make, Call]:
    """The case of registered scheme class ``name``: its registry defaults (Dh = 8, H = 2), called by its kind."""
    return (lambda: build_scheme_layer(name, "torch"), *BY_KIND[scheme_classes("torch")[name].kind])


HAND_LAYERS: dict[str, tuple[Callable[[], Any], Make, Call]] = {
    "TokenEmbedding": (lambda: tpt.TokenEmbedding(V, D, seed=0, scale=True, padding_idx=0),
                       lambda B, L, p: (_ids(B, L),), lambda m, ids: m(ids)),
    "PerLayerEmbedding": (lambda: tpt.PerLayerEmbedding(V, 3, 4, seed=0, padding_idx=0),
                          lambda B, L, p: (_ids(B, L),), lambda m, ids: m(ids)),
    "PerLayerEmbedding_zero": (lambda: tpt.PerLayerEmbedding(V // 2, 3, 4, seed=0, out_of_range="zero"),
                               lambda B, L, p: (_ids(B, L),), lambda m, ids: m(ids)),
    "PerLayerEmbedding_int8": (lambda: tpt.PerLayerEmbedding(V, 3, 4, seed=0, weight_dtype=torch.int8),
                               lambda B, L, p: (_ids(B, L),), lambda m, ids: m(ids)),
    "HashedNgramEmbedding": (lambda: tpt.HashedNgramEmbedding(**tiny_ngram_kwargs(V)),
                             lambda B, L, p: (_ids(B, L),), lambda m, ids: m(ids)),
    "EngramMemory": (lambda: tpt.EngramMemory(D, hc_mult=2, kernel_size=2, **tiny_ngram_kwargs(V)),
                     lambda B, L, p: (torch.ones(B, L, 2, D), _ids(B, L)), lambda m, h, ids: m(h, ids)),
    "LearnedPositionalEmbedding": (lambda: tpt.LearnedPositionalEmbedding(16, D, seed=0),
                                   lambda B, L, p: (torch.arange(L).expand(B, L) + 1 if p else L,),
                                   lambda m, x: m(x)),
    "SinusoidalPositionalEncoding": (lambda: tpt.SinusoidalPositionalEncoding(16, D),
                                     lambda B, L, p: (torch.arange(L).expand(B, L) * 3 if p else L,),
                                     lambda m, x: m(x)),
    "SinCos2DPositionalEncoding": (lambda: tpt.SinCos2DPositionalEncoding(2, 3, D),
                                   lambda B, L, p: (torch.arange(L) % 6 if p else None,), lambda m, x: m(x)),
    "NoPositionalEncoding": (lambda: tpt.NoPositionalEncoding(), lambda B, L, p: (L,), lambda m, x: m(x)),
    **{f"TransformerEmbedding_{s}": (
        lambda s=s: tpt.TransformerEmbedding(V, D, 16, positional=s, num_heads=H, seed=0),
        lambda B, L, p: (_ids(B, L), torch.arange(L) + 2 if p else None,
                         torch.arange(L).expand(B, L).contiguous() if p else None),
        _transformer)
       for s in SHORTCUTS},
    "TransformerEmbedding_types_norm": (
        lambda: tpt.TransformerEmbedding(V, D, 16, num_token_types=2, norm="rmsnorm", seed=0),
        lambda B, L, p: (_ids(B, L), torch.arange(L) if p else None, _ids(B, L) % 2),
        lambda m, ids, pos, tt: m(ids, pos, token_type_ids=tt)),
    "TransformerEmbedding_roberta": (
        lambda: tpt.TransformerEmbedding(V, D, 16, padding_idx=1, position_ids="padding", seed=0),
        lambda B, L, p: (_ids(B, L), torch.arange(L) + 2 if p else None), lambda m, ids, pos: m(ids, pos)),
    **{f"RotaryEmbedding_{s}": (
        lambda s=s: tpt.RotaryEmbedding(DH, max_seq_len=8, scaling=ROPE[s]),
        lambda B, L, p: _qk(B, L, torch.arange(L).expand(B, L) * 2 if p else None),
        lambda m, q, k, pos: (*m.apply(q, k, pos), m.rotate(q, pos)))
       for s in ("default", "dynamic", "longrope", "yarn")},
    "XPosRotaryEmbedding": (lambda: tpt.XPosRotaryEmbedding(DH),
                            lambda B, L, p: _qk(B, L, torch.arange(L) if p else None), _rotate),
    "MRotaryEmbedding": (lambda: tpt.MRotaryEmbedding(DH, mrope_section=[2, 1, 1]),
                         lambda B, L, p: _qk(B, L, torch.arange(L).expand(3, B, L) if p else None), _rotate),
    # 2-D RoPE always takes positions: its "default" call gives the (B, N, 2) form
    "RotaryEmbedding2D": (lambda: tpt.RotaryEmbedding2D(DH),
                          lambda B, L, p: _qk(B, L, torch.stack([torch.arange(L) // 2, torch.arange(L) % 2], -1)
                                              if p else torch.stack([torch.arange(L) % 2, torch.arange(L)], -1)
                                              .expand(B, L, 2)), _rotate),
    "ALiBi": (lambda: tpt.ALiBi(H), lambda B, L, p: (L, L + B), lambda m, a, b: m.bias(a, b)),
    "T5RelativePositionBias": (lambda: tpt.T5RelativePositionBias(H, num_buckets=8, max_distance=16, seed=0),
                               lambda B, L, p: (L, L + B), lambda m, a, b: m(a, b)),
    "FIRE": (lambda: tpt.FIRE(H, width=4, seed=0), lambda B, L, p: (L, L + B), lambda m, a, b: m.bias(a, b)),
    "KERPLE": (lambda: tpt.KERPLE(H, seed=0), lambda B, L, p: (L, L + B), lambda m, a, b: m.bias(a, b)),
    "LayerNorm": (lambda: tpt.LayerNorm(D), lambda B, L, p: (_q(B, L)[:, 0],), lambda m, x: m(x)),
    "RMSNorm": (lambda: tpt.RMSNorm(D), lambda B, L, p: (_q(B, L)[:, 0],), lambda m, x: m(x)),
    **{f"scaled_dot_product_attention_{name}": (
        factory, lambda B, L, p: (_q(B, L), _q(B, L, seed=1), _q(B, L, seed=2), torch.arange(L) if p else None),
        _attention)
       for name, factory in (("none", lambda: None), ("rope", lambda: tpt.RotaryEmbedding(DH)),
                             ("alibi", lambda: tpt.ALiBi(H)), ("t5", lambda: tpt.T5RelativePositionBias(H, seed=0)))},
}
# every public layer (a case named "<Class>" or "<Class>_<variant>"): the hand-written cases, and every registered
# scheme class without one
LAYERS = {**{name: _registered(name) for name in scheme_classes("torch")
             if name not in covered(HAND_LAYERS, {n: n for n in public_layers("torch")})}, **HAND_LAYERS}


def _flat(x: Any) -> list[torch.Tensor]:
    if isinstance(x, torch.Tensor):
        return [x]
    if x is None:
        return []
    return [t for item in x for t in _flat(item)]


@pytest.mark.parametrize("positions", [False, True], ids=["default_positions", "given_positions"])
@pytest.mark.parametrize("name", sorted(LAYERS))
def test_layer_compiles_whole_with_dynamic_shapes(name: str, positions: bool) -> None:
    with derived_case("HAND_LAYERS of tests/torch/test_compile_dynamic.py", name, HAND_LAYERS):
        _compiles_whole(*LAYERS[name], positions)


def _compiles_whole(factory: Callable[[], Any], make: Make, call: Call, positions: bool) -> None:
    layer, eager_layer = factory(), factory()
    for m in (layer, eager_layer):
        if m is not None:
            m.eval()
    torch._dynamo.reset()
    compiled = torch.compile(lambda *args: call(layer, *args), fullgraph=True, dynamic=True, backend="eager")
    for B, L in SHAPES:
        args = make(B, L, positions)
        got, want = _flat(compiled(*args)), _flat(call(eager_layer, *args))
        assert len(got) == len(want)
        if not want:                                              # NoPositionalEncoding: None, as eager
            assert compiled(*args) is None and call(eager_layer, *args) is None
        for g, w in zip(got, want, strict=True):
            torch.testing.assert_close(g, w, rtol=1e-12 if w.dtype == torch.float64 else 1e-6, atol=1e-7)


def test_the_value_checks_trace_under_fullgraph_compile() -> None:
    """The boundary's helpers that decide whether values can be read (and, off the CPU, put a
    device-side assert instead) trace under ``torch.compile(fullgraph=True)``: a torch._C query
    that dynamo cannot trace (``is_functorch_wrapped_tensor``, seen on an H200 in a compiled CUDA
    training step) is never reached while compiling."""
    from tokenpos.torch import _checks

    def f(t: torch.Tensor) -> torch.Tensor:
        _checks._assert_on_device(t, 10, "token ids")
        return t + int(_checks.is_wrapped(t)) + int(_checks.values_readable(t))

    torch._dynamo.reset()
    ids = torch.tensor([1, 2, 9])
    torch.testing.assert_close(torch.compile(f, fullgraph=True)(ids), ids)


def test_the_no_dropout_seed_is_made_in_the_graph_not_read_from_its_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without dropout the fused op still takes a seed: eager calls share one cached zero per device,
    a compiled call makes its zero in the graph. Dynamo traces through ``functools.lru_cache``
    without honouring it, and warns that it does (seen in a compiled CUDA training step on an H100),
    so a traced call must not reach the cache."""
    from tokenpos.torch.ops import entry

    def refuse(device: torch.device) -> torch.Tensor:
        raise AssertionError("the cached zero seed was reached while compiling")

    layer = tpt.TransformerEmbedding(50, 8, 16, positional="learned", seed=0).eval()
    ids = torch.tensor([[1, 2, 3]])
    want = layer(ids)
    monkeypatch.setattr(entry, "_zero", refuse)
    torch._dynamo.reset()
    got = torch.compile(layer, fullgraph=True, backend="eager")(ids)
    torch.testing.assert_close(got, want, rtol=0.0, atol=0.0)
