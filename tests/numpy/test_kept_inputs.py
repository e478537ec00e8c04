"""Refilling an input buffer between forward and backward never changes a gradient, for EVERY NumPy pair.

Guard (issue 28, item 2; docs/DESIGN.md "Inputs kept for backward are copied"): every forward/backward
pair of the NumPy backend -- the functional pairs, the attention functions, and every public layer
with a backward -- is run twice from the same state: once plainly, once with every array input
refilled in place with other (valid) values after the forward. The gradients (returned input
gradients and every parameter's ``.grad``) must be identical. The pairs are discovered from the
package (``*_forward`` names, classes with ``backward`` / ``apply_backward`` / ``attend_backward``), so
a new pair without a case here fails ``test_every_pair_is_covered``.

What is refilled: the caller's batch inputs (ids, positions, token types, x, h, q, k, v, masks).
Float tables handed to the functional pairs (weights, cos/sin) are kept by reference by design
(DESIGN: the layers replace them, never write into them) and are not refilled here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import tokenpos.numpy as tpn
from tests.numpy.layers import SPECS, build, layer_class, public_layer_classes
from tokenpos.numpy import functional as F

RNG_SEED = 7
BACKWARD_METHODS = {"backward": ("forward", "backward"), "apply_backward": ("apply_forward", "apply_backward"),
                    "attend_backward": ("attend", "attend_backward")}


def _refill(arrays: list[np.ndarray]) -> None:
    """Write other valid values into each array, in place (ints reflected inside their range)."""
    rng = np.random.default_rng(99)
    for a in arrays:
        before = a.copy()
        if np.issubdtype(a.dtype, np.integer):
            a[...] = a.min() + a.max() - a
        elif a.dtype == np.bool_:
            a[...] = ~a
            a[..., 0] = True                     # keep every row attending somewhere
        else:
            a[...] = rng.standard_normal(a.shape).astype(a.dtype)
        assert not np.array_equal(a, before), "the refill must change the buffer"


def _floats(*shape: int, dtype: Any = np.float64) -> np.ndarray:
    return np.random.default_rng(RNG_SEED + len(shape) + shape[-1]).standard_normal(shape).astype(dtype)


def _grads(returned: Any, *layers: Any) -> list[np.ndarray]:
    out: list[np.ndarray] = []
    stack = [returned]
    while stack:
        x = stack.pop(0)
        if isinstance(x, (tuple, list)):
            stack[:0] = list(x)
        elif x is not None:
            out.append(np.array(x, copy=True))
    for layer in layers:
        for _, p in layer.named_parameters():
            out.append(None if p.grad is None else p.grad.copy())   # type: ignore[arg-type]
    return out


# ----------------------------------------------------------------------------------------------
# Functional pairs: each case is ``run(refill) -> gradients``
# ----------------------------------------------------------------------------------------------

IDS = np.array([[1, 4, 4, 7], [0, 2, 9, 3]])
POS = np.array([0, 1, 2, 3])


def _embedding(refill: bool) -> list[np.ndarray]:
    w, table = _floats(10, 6), _floats(8, 6)
    ids, pos = IDS.copy(), POS.copy()
    out, cache = F.embedding_forward(w, ids, scale=2.0, table=table, pos=pos, p=0.25, seed=3, table_grad=True,
                                     padding_idx=0)
    if refill:
        _refill([ids, pos])
    return _grads(F.embedding_backward(_floats(*out.shape), cache))


def _cos_sin(length: int = 4, half: int = 3) -> tuple[np.ndarray, np.ndarray]:
    ang = np.arange(length)[:, None] * 0.3 * (1 + np.arange(half))
    return np.cos(ang), np.sin(ang)


def _rope(refill: bool) -> list[np.ndarray]:
    x = _floats(2, 2, 4, 6)
    out, cache = F.rope_forward(x, *_cos_sin(), interleaved=False)
    if refill:
        _refill([x])
    return _grads(F.rope_backward(_floats(*out.shape), cache))


def _rope_qk(refill: bool) -> list[np.ndarray]:
    q, k = _floats(2, 2, 4, 6), _floats(2, 1, 4, 6)
    qo, ko, cache = F.rope_qk_forward(q, k, *_cos_sin(), interleaved=True)
    if refill:
        _refill([q, k])
    return _grads(F.rope_qk_backward(_floats(*qo.shape), _floats(*ko.shape), cache))


def _layernorm(refill: bool) -> list[np.ndarray]:
    x = _floats(3, 5)
    out, cache = F.layernorm_forward(x, _floats(5) + 1, _floats(5), 1e-5)
    if refill:
        _refill([x])
    return _grads(F.layernorm_backward(_floats(*out.shape), cache))


def _rmsnorm(refill: bool) -> list[np.ndarray]:
    x = _floats(3, 5)
    out, cache = F.rmsnorm_forward(x, _floats(5) + 1, 1e-6)
    if refill:
        _refill([x])
    return _grads(F.rmsnorm_backward(_floats(*out.shape), cache))


def _dropout(refill: bool) -> list[np.ndarray]:
    x = _floats(3, 5)
    out, cache = F.dropout_forward(x, p=0.3, seed=11)
    if refill:
        _refill([x])
    return _grads(F.dropout_backward(_floats(*out.shape), cache))


def _attend(refill: bool) -> list[np.ndarray]:
    h, w = _floats(2, 3, 6), _floats(10, 6)
    out, cache = F.attend_forward(h, w)
    if refill:
        _refill([h])
    return _grads(F.attend_backward(_floats(*out.shape), cache))


def _tied_loss(refill: bool) -> list[np.ndarray]:
    """The recomputing route (the forward keeps h and the targets; with_grad=False)."""
    h, w, t = _floats(2, 3, 6), _floats(10, 6), np.array([[1, 4, 9], [0, 2, 7]])
    loss, cache = F.tied_cross_entropy_forward(h, w, t, reduction="none", label_smoothing=0.1, chunk_size=2)
    if refill:
        _refill([h, t])
    return _grads(F.tied_cross_entropy_backward(_floats(*loss.shape), cache))


def _attention(positional: Callable[[], Any] | None, *, positions: bool = True, mask: bool = True,
               temperature: bool = False, rotate_keys: bool = True) -> Callable[[bool], list[np.ndarray]]:
    def run(refill: bool) -> list[np.ndarray]:
        scheme = None if positional is None else positional()
        q, k, v = _floats(2, 2, 3, 8), _floats(2, 2, 5, 8, dtype=np.float64) * 0.5, _floats(2, 2, 5, 8) * 2
        kwargs: dict[str, Any] = {"positional": scheme, "rotate_keys": rotate_keys}
        arrays = [q, k, v]
        if positions:              # key positions only where a rotary scheme reads them (else they are refused)
            kwargs["positions"] = np.array([3, 4, 5])
            arrays.append(kwargs["positions"])
            if scheme is not None:
                kwargs["key_positions"] = np.array([1, 2, 3, 4, 5])
                arrays.append(kwargs["key_positions"])
        if mask:
            kwargs["attn_mask"] = np.ones((2, 1, 3, 5), dtype=bool)
            kwargs["attn_mask"][0, 0, 1, 2] = False
            arrays.append(kwargs["attn_mask"])
        if temperature:
            kwargs["attn_temperature"] = (2.0, 0.5)
        out, cache = tpn.scaled_dot_product_attention_forward(q, k, v, causal=False, **kwargs)
        if refill:
            _refill(arrays)
        return _grads(tpn.scaled_dot_product_attention_backward(_floats(*out.shape), cache),
                      *([scheme] if isinstance(scheme, tpn.Module) else []))
    return run


FUNCTIONAL_CASES: dict[str, Callable[[bool], list[np.ndarray]]] = {
    "functional.embedding_forward": _embedding,
    "functional.rope_forward": _rope,
    "functional.rope_qk_forward": _rope_qk,
    "functional.layernorm_forward": _layernorm,
    "functional.rmsnorm_forward": _rmsnorm,
    "functional.dropout_forward": _dropout,
    "functional.attend_forward": _attend,
    "functional.tied_cross_entropy_forward": _tied_loss,
    "scaled_dot_product_attention_forward": _attention(None, positions=False),
    "scaled_dot_product_attention_forward[rope]": _attention(lambda: tpn.RotaryEmbedding(8)),
    "scaled_dot_product_attention_forward[rope, rotate_keys=False]": _attention(lambda: tpn.RotaryEmbedding(8),
                                                                                       rotate_keys=False),
    "scaled_dot_product_attention_forward[mrope]": _attention(lambda: tpn.MRotaryEmbedding(8, mrope_section=[2, 1, 1])),
    "scaled_dot_product_attention_forward[t5]": _attention(lambda: build("T5RelativePositionBias"), positions=False),
    "scaled_dot_product_attention_forward[fire]": _attention(lambda: build("FIRE"), positions=False),
    "scaled_dot_product_attention_forward[kerple]": _attention(lambda: build("KERPLE"), positions=False),
    "scaled_dot_product_attention_forward[alibi]": _attention(lambda: build("ALiBi"), positions=False),
    "scaled_dot_product_attention_forward[llama4 temperature]": _attention(None, temperature=True),
}


# ----------------------------------------------------------------------------------------------
# Layers: every public class with a backward; ``(make inputs, forward, backward)``
# ----------------------------------------------------------------------------------------------


def _rotary_inputs(name: str) -> tuple[list[np.ndarray], dict[str, Any]]:
    q, k = _floats(2, 2, 4, 8), _floats(2, 1, 4, 8)
    if name == "RotaryEmbedding2D":
        pos = np.array([[0, 0], [0, 1], [1, 0], [1, 1]])
        return [q, k, pos], {"positions": pos}
    pos = np.array([[2, 3, 4, 5], [0, 1, 2, 3]])
    if name == "MRotaryEmbedding":
        pos3 = np.stack([pos, pos + 1, pos * 2])                              # (3, B, L)
        return [q, k, pos3], {"positions": pos3}
    if name == "RotaryEmbedding":
        kpos = np.array([[1, 2, 3, 4], [5, 6, 7, 8]])
        return [q, k, pos, kpos], {"positions": pos, "key_positions": kpos}
    return [q, k, pos], {"positions": pos}


def _layer_case(name: str, method: str) -> Callable[[bool], list[np.ndarray]]:
    fwd_name, bwd_name = BACKWARD_METHODS[method]

    def run(refill: bool) -> list[np.ndarray]:
        layer = build(name)
        kind = getattr(layer, "kind", None)
        if kind == "rotary":
            arrays, kw = _rotary_inputs(name)
            q, k = arrays[0], arrays[1]
            if method == "apply_backward":
                qo, ko, cache = layer.apply_forward(q, k, **kw)
                if refill:
                    _refill(arrays)
                return _grads(layer.apply_backward(_floats(*qo.shape), _floats(*ko.shape), cache))
            qo, ko = layer.apply(q, k, **kw)
            if refill:
                _refill(arrays)
            return _grads(layer.backward(_floats(*qo.shape), _floats(*ko.shape)))
        if kind == "bias":
            out = layer.bias(3, 5)
            return _grads(layer.backward(_floats(*out.shape)), layer)           # no array input to refill
        if name in ("TransformerEmbedding", "EmbeddingLayer"):
            ids, pos, tt = IDS.copy() + 1, POS.copy() + 2, np.array([[0, 1, 1, 0], [1, 1, 0, 0]])
            kw = {"token_type_ids": tt} if name == "TransformerEmbedding" else {}
            arrays = [ids, pos, *kw.values()]
            out = layer.forward(ids, pos, **kw)
        elif name in ("LayerNorm", "RMSNorm"):
            x = _floats(3, 8, dtype=np.float32)
            arrays, out = [x], layer.forward(x)
        elif name == "TokenEmbedding" and method == "attend_backward":
            h = _floats(2, 3, 8, dtype=np.float32)
            arrays, out = [h], layer.attend(h)
        elif name == "TokenEmbedding":
            ids = IDS.copy() + 1
            arrays, out = [ids], layer.forward(ids)
        else:                                                                  # position tables: positions in
            pos = np.array([[0, 3, 3, 5], [1, 2, 4, 6]])
            arrays, out = [pos], layer.forward(pos)
        if refill:
            _refill(arrays)
        return _grads(getattr(layer, bwd_name)(_floats(*out.shape, dtype=out.dtype)), layer)
    return run


def _layer_pairs() -> dict[str, Callable[[bool], list[np.ndarray]]]:
    cases = {}
    for name in sorted(SPECS):
        cls = type(build(name))
        for method in BACKWARD_METHODS:
            if hasattr(cls, method):
                cases[f"{name}.{method}"] = _layer_case(name, method)
    return cases


LAYER_CASES = _layer_pairs()
# fixed tables and slopes: their backward returns None and they have no parameter (nothing to compare)
FIXED = {"ALiBi.backward", "SinusoidalPositionalEncoding.backward", "SinCos2DPositionalEncoding.backward"}
CASES = {**FUNCTIONAL_CASES, **LAYER_CASES}


def _discovered_pairs() -> set[str]:
    found = {f"functional.{n}" for n in F.__all__ if n.endswith("_forward") and n[:-8] + "_backward" in F.__all__}
    found |= {n for n in tpn.__all__ if n.endswith("_forward") and n[:-8] + "_backward" in tpn.__all__}
    for name in public_layer_classes():
        cls = layer_class(name)
        found |= {f"{name}.{m}" for m in BACKWARD_METHODS if hasattr(cls, m)}
    return found


def test_every_pair_is_covered() -> None:
    assert public_layer_classes() == set(SPECS), "add the new layer to tests/numpy/layers.py HAND_SPECS"
    covered = {c.split("[")[0] for c in CASES}
    missing = _discovered_pairs() - covered
    assert not missing, f"forward/backward pairs without a refill case here: {sorted(missing)}"


@pytest.mark.parametrize("case", sorted(CASES))
def test_refilling_inputs_after_forward_does_not_change_gradients(case: str, kernel_mode: bool) -> None:
    plain, refilled = CASES[case](False), CASES[case](True)
    assert plain or case in FIXED, "the case must produce gradients"
    assert len(plain) == len(refilled)
    for i, (a, b) in enumerate(zip(plain, refilled, strict=True)):
        if a is None:
            assert b is None
            continue
        np.testing.assert_array_equal(a, b, err_msg=f"{case}: gradient {i} moved when the inputs were refilled")
