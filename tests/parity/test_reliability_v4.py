"""Issue 48 (reliability v4), the items on the rotary layers and attention, in both backends.

- (6) The class: a shape error that quotes a shape the caller never passed (an internal (B, H, L, Dh) view, a
  4-D reshape of a (T, H, Dh) row) or is not a tokenpos error at all (NumPy's own reshape ``ValueError``). The
  guard: every registered rotary layer's ``apply``, in every ``qk_layout``, packed and not, with q and k of two
  lengths, raises a ``ConfigError`` quoting both shapes as given; so does ``scaled_dot_product_attention``.
- (7) The class: attention giving a wrong reason for a packed call a rotary layer refuses (M-RoPE's and 2-D
  RoPE's positions are not one index per token). The guard: every registered rotary scheme with ``cu_seqlens``
  in attention either runs (the layers that pack) or raises exactly the layer's own ``apply`` reason.

Shapes: H = 2 heads, Dh = 8, packed rows of T = 6 tokens in documents [0, 2, 6).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from tests.public_layers import build_scheme_layer, scheme_classes, scheme_kwargs
from tokenpos.tables.checks.rope import rotary_packed_message
from tokenpos.tables.errors import ConfigError

BACKENDS = ("numpy", "torch")
ROTARY = list(scheme_classes("numpy", "rotary"))
H, DH = 2, 8
CU = [0, 2, 6]


def _array(backend: str, shape: tuple[int, ...], seed: int = 0) -> Any:
    x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    return x if backend == "numpy" else torch.from_numpy(x)


def _layer(name: str, backend: str, qk_layout: str) -> Any:
    kwargs = {**scheme_kwargs(name), "qk_layout": qk_layout}
    return scheme_classes(backend)[name](**kwargs)


def _shape(layout: str, L: int, batch: int = 1) -> tuple[int, ...]:
    return {"thd": (L, H, DH), "blhd": (batch, L, H, DH), "bhld": (batch, H, L, DH)}[layout]


def test_the_sweep_covers_every_rotary_scheme_in_both_backends() -> None:
    assert set(ROTARY) == set(scheme_classes("torch", "rotary")) and len(ROTARY) >= 4, ROTARY


@pytest.mark.parametrize("layout", ["thd", "blhd", "bhld"])
@pytest.mark.parametrize("name", ROTARY)
@pytest.mark.parametrize("backend", BACKENDS)
def test_packed_q_and_k_of_two_lengths_quote_the_callers_shapes(backend: str, name: str, layout: str) -> None:
    """RotaryEmbedding(8, qk_layout="thd").apply(q (6, 2, 8), k (5, 2, 8), cu_seqlens=[0, 2, 6]) gave NumPy's
    reshape ValueError and, in torch, a ConfigError quoting (6, Hk, 1, 8). A layer that does not pack gives its
    own reason for refusing cu_seqlens."""
    layer = _layer(name, backend, layout)
    q, k = _array(backend, _shape(layout, 6)), _array(backend, _shape(layout, 5), 1)
    with pytest.raises(ConfigError) as err:
        layer.apply(q, k, cu_seqlens=CU)
    msg = str(err.value)
    if getattr(layer, "packs", False):
        assert f"q {tuple(q.shape)} and k {tuple(k.shape)}" in msg, msg
    else:
        assert msg == rotary_packed_message(name), msg


@pytest.mark.parametrize("layout", ["blhd", "bhld"])
@pytest.mark.parametrize("name", ROTARY)
@pytest.mark.parametrize("backend", BACKENDS)
def test_q_and_k_of_two_lengths_quote_the_callers_shapes(backend: str, name: str, layout: str) -> None:
    """Not packed: the length error quoted the (B, H, L, Dh) view of a (B, L, H, Dh) input."""
    layer = _layer(name, backend, layout)
    q, k = _array(backend, _shape(layout, 6, 2)), _array(backend, _shape(layout, 5, 2), 1)
    with pytest.raises(ConfigError) as err:
        layer.apply(q, k)
    msg = str(err.value)
    assert f"q {tuple(q.shape)} and k {tuple(k.shape)}" in msg, msg


def _qkv(backend: str, T: int = 6) -> tuple[Any, Any, Any]:
    return tuple(_array(backend, (T, H, DH), s) for s in range(3))  # type: ignore[return-value]


def _attention(backend: str) -> Any:
    module = __import__(f"tokenpos.{backend}", fromlist=["scaled_dot_product_attention"])
    return module.scaled_dot_product_attention


@pytest.mark.parametrize("name", ROTARY)
@pytest.mark.parametrize("backend", BACKENDS)
def test_packed_attention_gives_the_rotary_layers_own_reason(backend: str, name: str) -> None:
    """scaled_dot_product_attention(..., positional=RotaryEmbedding2D(8), cu_seqlens=cu) said "positions must
    have shape (9, 2)" though no positions were passed: now a result (the layers that pack, and M-RoPE at its
    text positions) or exactly the reason the layer's own packed apply gives."""
    layer = build_scheme_layer(name, backend)
    q, k, v = _qkv(backend)
    try:
        out = _attention(backend)(q, k, v, positional=layer, cu_seqlens=CU)
    except ConfigError as err:
        with pytest.raises(ConfigError) as own:
            _layer(name, backend, "thd").apply(q, k, cu_seqlens=CU)
        assert str(err) == str(own.value) == rotary_packed_message(name)
        assert not layer.takes_token_positions
    else:
        assert tuple(out.shape) == (6, H, DH) and layer.takes_token_positions
    if name == "RotaryEmbedding2D":                    # the case refuses
        assert not layer.takes_token_positions


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("bad", ["k", "v"])
def test_packed_attention_shape_errors_quote_the_callers_shapes(backend: str, bad: str) -> None:
    q, k, v = _qkv(backend)
    args = {"q": q, "k": k, "v": v}
    args[bad] = _array(backend, (5, H, DH), 7)
    with pytest.raises(ConfigError) as err:
        _attention(backend)(args["q"], args["k"], args["v"], cu_seqlens=CU)
    msg = str(err.value)
    assert f"q {tuple(q.shape)}" in msg and f"{bad} (5, {H}, {DH})" in msg, msg


# ----------------------------------------------------------------------------------------------
# (9) h and a table of two dtypes
# ----------------------------------------------------------------------------------------------
# The class: a public method taking h and a weight-bearing layer (or a weight) that lets two dtypes through to
# torch's raw matmul error ("expected m1 and m2 to have the same dtype") or a silent promotion, where ``loss``
# raises DtypeError. The guard finds every such method by its signature (first argument ``h``) on every public
# layer and function of both backends, and tries each with an h of another dtype than the table. The
# vocab-parallel layer's attend / loss / load_full_state_dict run the same at W = 1, 2, 3
# (tests/torch/distributed/test_refusals.py).

V, D = 20, 8


def _h_methods(backend: str) -> list[tuple[str, str]]:
    import inspect

    from tests.public_layers import backend_module, public_layers

    found = []
    for name, cls in public_layers(backend).items():
        for attr in dir(cls):
            fn = getattr(cls, attr, None)
            if attr.startswith("_") or not callable(fn):
                continue
            try:
                params = list(inspect.signature(fn).parameters)
            except (TypeError, ValueError):
                continue
            if params[1:2] == ["h"]:
                found.append((name, attr))
    module = backend_module(backend)
    for attr in module.__all__:
        fn = getattr(module, attr)
        if inspect.isfunction(fn) and list(inspect.signature(fn).parameters)[:2] == ["h", "weight"]:
            found.append(("", attr))
    return sorted(found)


def _call(backend: str, layer: str, method: str, h: Any) -> Any:
    from tests.public_layers import backend_module

    module = backend_module(backend)
    targets = np.array([[1, 2, 3]]) if backend == "numpy" else torch.tensor([[1, 2, 3]])
    if layer == "":
        weight = _array(backend, (V, D), 5)
        return getattr(module, method)(h, weight, targets)
    built = {"TokenEmbedding": lambda: module.TokenEmbedding(V, D, seed=0)}[layer]()
    return getattr(built, method)(h) if method == "attend" else getattr(built, method)(h, targets)


@pytest.mark.parametrize("backend", BACKENDS)
def test_every_h_method_is_tried(backend: str) -> None:
    assert {("TokenEmbedding", "attend"), ("TokenEmbedding", "loss"), ("", "tied_cross_entropy")} == \
        set(_h_methods(backend)), _h_methods(backend)


@pytest.mark.parametrize(("backend", "other"), [("numpy", "float64"), ("numpy", "float16"), ("torch", "float64"),
                                                 ("torch", "float16"), ("torch", "bfloat16")])   # NumPy: no bf16
def test_h_of_another_dtype_than_the_table_is_a_dtype_error(backend: str, other: str) -> None:
    """TokenEmbedding.attend with bf16 h and a float32 table raised torch's own matmul error (NumPy promoted)."""
    from tokenpos.tables.errors import DtypeError

    for layer, method in _h_methods(backend):
        h = _array(backend, (1, 3, D), 2)
        h = h.astype(other) if backend == "numpy" else h.to(getattr(torch, other))
        with pytest.raises(DtypeError, match=f"h {other} and weight float32"):
            _call(backend, layer, method, h)


@pytest.mark.parametrize("backend", BACKENDS)
def test_h_of_the_tables_dtype_still_runs(backend: str) -> None:
    for layer, method in _h_methods(backend):
        out = _call(backend, layer, method, _array(backend, (1, 3, D), 2))
        assert np.isfinite(np.asarray(out.detach() if backend == "torch" else out)).all()


def test_attend_under_autocast_still_casts() -> None:
    """Under ``torch.autocast`` the dtypes differ by design: attend lets autocast cast them (as nn.Linear)."""
    import tokenpos.torch as tpt

    emb = tpt.TokenEmbedding(V, D, seed=0)
    h = torch.randn(1, 3, D, dtype=torch.bfloat16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = emb.attend(h)
    assert out.dtype == torch.bfloat16 and out.shape == (1, 3, V)


# ----------------------------------------------------------------------------------------------
# (4) packed rows under a scaling that follows the batch's longest position
# ----------------------------------------------------------------------------------------------
# What holds (docstrings of RotaryEmbedding.apply and scaled_dot_product_attention, docs/DESIGN.md): a packed row
# equals the same documents padded in a batch, always; it equals each document alone except where a scaling
# depends on the batch's longest position (dynamic NTK, longrope: the frequencies follow the call's largest
# position, as HF's do for a padded batch). Both statements are tested, in both backends.

LENGTH_DEPENDENT = {
    "dynamic": {"rope_type": "dynamic", "factor": 2.0},
    "longrope": {"rope_type": "longrope", "short_factor": [1.0, 1.5, 2.0, 2.5], "long_factor": [3.0, 4.0, 5.0, 6.0],
                 "original_max_position_embeddings": 8},
}
DOCS = (3, 12)                                  # a 3-token document beside a 12-token one, original max 8


def _rope(backend: str, scaling: str) -> Any:
    from tests.public_layers import backend_module

    return backend_module(backend).RotaryEmbedding(8, max_seq_len=8, scaling=LENGTH_DEPENDENT[scaling],
                                                   qk_layout="blhd")


def _np(x: Any) -> np.ndarray:
    return np.asarray(x.detach() if isinstance(x, torch.Tensor) else x, dtype=np.float64)


def _packed_padded_alone(backend: str, scaling: str) -> tuple[np.ndarray, np.ndarray, list[np.ndarray]]:
    """(packed q' (T, H, Dh), padded q' (N, L, H, Dh), each document's q' alone), from the same rows."""
    T, L = sum(DOCS), max(DOCS)
    rows = np.random.default_rng(3).standard_normal((T, H, DH))
    to = (lambda a: a) if backend == "numpy" else torch.from_numpy
    cu = np.concatenate([[0], np.cumsum(DOCS)])
    packed = _rope(backend, scaling).apply(to(rows[None]), to(rows[None]), cu_seqlens=cu)[0][0]
    padded_in = np.zeros((len(DOCS), L, H, DH))
    for d, n in enumerate(DOCS):
        padded_in[d, :n] = rows[cu[d]:cu[d + 1]]
    padded = _rope(backend, scaling).apply(to(padded_in), to(padded_in))[0]
    alone = [_np(_rope(backend, scaling).apply(to(rows[None, cu[d]:cu[d + 1]]), to(rows[None, cu[d]:cu[d + 1]]))[0])[0]
             for d in range(len(DOCS))]
    return _np(packed), _np(padded), alone


@pytest.mark.parametrize("scaling", sorted(LENGTH_DEPENDENT))
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_packed_row_equals_the_padded_batch(backend: str, scaling: str) -> None:
    packed, padded, _ = _packed_padded_alone(backend, scaling)
    cu = np.concatenate([[0], np.cumsum(DOCS)])
    for d, n in enumerate(DOCS):
        np.testing.assert_allclose(packed[cu[d]:cu[d + 1]], padded[d, :n], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("scaling", sorted(LENGTH_DEPENDENT))
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_short_document_packed_beside_a_long_one_differs_from_it_alone(backend: str, scaling: str) -> None:
    """Documented, not a defect: the short document alone stays inside the original 8 positions (no scaling, or
    longrope's short factors); packed, the call's largest position is 11 and both documents get the scaled
    frequencies, exactly as in the padded batch (above). The long document equals itself alone."""
    packed, _, alone = _packed_padded_alone(backend, scaling)
    short = packed[:DOCS[0]]
    assert np.abs(short - alone[0]).max() > 1e-3
    np.testing.assert_allclose(packed[DOCS[0]:], alone[1], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_api_docstrings_state_what_holds(backend: str) -> None:
    """The README promised "the document alone"; the API docstrings and docs/DESIGN.md now state the exception."""
    from pathlib import Path

    import tokenpos
    from tests.public_layers import backend_module

    module = backend_module(backend)
    attention = getattr(module, "scaled_dot_product_attention_forward", module.scaled_dot_product_attention)
    for doc in (module.RotaryEmbedding.apply.__doc__, attention.__doc__):   # NumPy: the forward holds the args
        assert doc is not None and "padded in a batch" in doc and "longest position" in doc, doc
    design = Path(tokenpos.__file__).parents[2] / "docs" / "DESIGN.md"
    if design.is_file():
        assert "not \"equals each document alone\"" in design.read_text()
