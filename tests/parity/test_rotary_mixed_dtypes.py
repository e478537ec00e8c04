"""Mixed q / k dtypes: each of q and k is rotated as if it were alone, forward and backward, both backends.

Guard (issue 28, item 5): for EVERY rotary class of both backends (discovered: ``kind == "rotary"``
in ``tokenpos.numpy`` / ``tokenpos.torch`` and in ``tables.registry``; a registered class without a case here
takes its registry defaults at positions POS), with RotaryEmbedding's scalings, partial and
interleaved layouts and the Llama 4 setting, and every ordered pair of distinct dtypes among float16,
float32, float64: ``apply(q, k)`` gives for q what ``apply(q, q)`` gives and for k what
``apply(k, k)`` gives (so k is never rotated with tables rounded to q's dtype), and the same for
the gradients (NumPy ``backward``, torch autograd). The float64 reference (the same layer on
float64 inputs) bounds the error by the tensor's own dtype.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pytest
import torch

import tokenpos.numpy as tpn
import tokenpos.torch as tpt
from tests.public_layers import derived_case, public_layers, scheme_classes, scheme_kwargs, scheme_name

POS = np.array([[3, 4, 5, 6], [0, 1, 2, 9]])
POS2D = np.array([[0, 0], [0, 1], [1, 0], [1, 1]])
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4}
# case: (class name, kwargs besides head_dim = 8, positions)
HAND_CASES: dict[str, tuple[str, dict[str, Any], np.ndarray]] = {
    "rope": ("RotaryEmbedding", {}, POS),
    "rope_interleaved_partial": ("RotaryEmbedding", {"interleaved": True, "rotary_dim": 4}, POS),
    "rope_linear": ("RotaryEmbedding", {"scaling": {"rope_type": "linear", "factor": 2.0}}, POS),
    "rope_dynamic": ("RotaryEmbedding", {"max_seq_len": 4, "scaling": {"rope_type": "dynamic", "factor": 2.0}}, POS),
    "rope_yarn": ("RotaryEmbedding", {"scaling": YARN}, POS),
    "rope_longrope": ("RotaryEmbedding", {"max_seq_len": 16, "scaling": {
        "rope_type": "longrope", "short_factor": [1.0, 1.5, 2.0, 2.5], "long_factor": [3.0, 4.0, 5.0, 6.0],
        "original_max_position_embeddings": 4}}, POS),
    "rope_llama3": ("RotaryEmbedding", {"scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                     "high_freq_factor": 4.0,
                                                     "original_max_position_embeddings": 4}}, POS),
    "llama4_irope": ("RotaryEmbedding", {"interleaved": True, "scaling": {
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8}}, POS),
    "xpos": ("XPosRotaryEmbedding", {}, POS),
    "xpos_half": ("XPosRotaryEmbedding", {"interleaved": False, "rotary_dim": 4, "center": 2.0}, POS),
    "mrope": ("MRotaryEmbedding", {"mrope_section": [2, 1, 1]}, np.stack([POS, POS + 1, POS * 2])),
    "mrope_interleaved": ("MRotaryEmbedding", {"mrope_section": [2, 1, 1], "mrope_layout": "interleaved"}, POS),
    "rope2d": ("RotaryEmbedding2D", {}, POS2D),
}
# every rotary class of the registry: its hand-written cases, else its registry defaults (Dh = 8) at POS
CASES = {**{scheme_name(cls): (cls, scheme_kwargs(cls), POS) for cls in scheme_classes("numpy", "rotary")
            if cls not in {c for c, _, _ in HAND_CASES.values()}}, **HAND_CASES}
DTYPES = ("float16", "float32", "float64")
PAIRS = [(a, b) for a, b in itertools.product(DTYPES, DTYPES) if a != b]
EPS = {"float16": 2.0 ** -10, "float32": 2.0 ** -23, "float64": 2.0 ** -52}


def _rotary_classes(module: Any) -> set[str]:
    """Every rotary class of ``module`` (its ``__all__`` and the registry), by class name."""
    return {n for n, cls in public_layers(module.__name__.split(".")[-1]).items()
            if getattr(cls, "kind", None) == "rotary"}


def _layer(module: Any, cls_name: str, kwargs: dict[str, Any]) -> Any:
    """A fresh layer of ``module``'s rotary class ``cls_name`` (exported or registered), head_dim 8."""
    cls = public_layers(module.__name__.split(".")[-1])[cls_name]
    return cls(**{"head_dim": 8, **kwargs})


def test_every_rotary_class_is_covered() -> None:
    covered = {cls for cls, _, _ in CASES.values()}
    assert _rotary_classes(tpn) <= covered, sorted(_rotary_classes(tpn) - covered)
    assert _rotary_classes(tpt) <= covered, sorted(_rotary_classes(tpt) - covered)


def _inputs() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(5)
    return tuple(rng.standard_normal((2, 2, 4, 8)) for _ in range(4))   # type: ignore[return-value]


def _numpy_run(layer: Any, q: np.ndarray, k: np.ndarray, gq: np.ndarray, gk: np.ndarray, pos: np.ndarray
               ) -> tuple[np.ndarray, ...]:
    qo, ko = layer.apply(q, k, positions=pos)
    dq, dk = layer.backward(gq.astype(qo.dtype), gk.astype(ko.dtype))
    return qo, ko, dq, dk


def _torch_run(layer: Any, q: np.ndarray, k: np.ndarray, gq: np.ndarray, gk: np.ndarray, pos: np.ndarray
               ) -> tuple[np.ndarray, ...]:
    tq, tk = (torch.from_numpy(a).requires_grad_() for a in (q, k))
    qo, ko = layer.apply(tq, tk, positions=torch.from_numpy(pos))
    ((qo.double() * torch.from_numpy(gq.astype(qo.detach().numpy().dtype)).double()).sum()
     + (ko.double() * torch.from_numpy(gk.astype(ko.detach().numpy().dtype)).double()).sum()).backward()
    assert tq.grad is not None and tk.grad is not None
    return qo.detach().numpy(), ko.detach().numpy(), tq.grad.numpy(), tk.grad.numpy()


def _f64(a: np.ndarray) -> np.ndarray:
    return np.asarray(a, dtype=np.float64)


@pytest.mark.parametrize("dtypes", PAIRS, ids=[f"q{a}-k{b}" for a, b in PAIRS])
@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_mixed_qk_dtypes_rotate_each_as_if_alone(backend: str, case: str, dtypes: tuple[str, str]) -> None:
    cls_name, kwargs, pos = CASES[case]
    module, run = (tpn, _numpy_run) if backend == "numpy" else (tpt, _torch_run)
    q64, k64, gq, gk = _inputs()
    qd, kd = dtypes
    q, k = q64.astype(qd), k64.astype(kd)
    with derived_case("HAND_CASES of tests/parity/test_rotary_mixed_dtypes.py", case, HAND_CASES):
        mixed = run(_layer(module, cls_name, kwargs), q, k, gq, gk, pos)
    q_alone = run(_layer(module, cls_name, kwargs), q, q.copy(), gq, gq, pos)
    k_alone = run(_layer(module, cls_name, kwargs), k.copy(), k, gk, gk, pos)
    ref = run(_layer(module, cls_name, kwargs), q.astype(np.float64), k.astype(np.float64), gq, gk, pos)
    for i, (what, dtype, alone) in enumerate((("q'", qd, q_alone[0]), ("k'", kd, k_alone[1]),
                                              ("dq", qd, q_alone[2]), ("dk", kd, k_alone[3]))):
        got = mixed[i]
        assert got.dtype == np.dtype(dtype), f"{what} came back as {got.dtype}, expected {dtype}"
        np.testing.assert_array_equal(got, alone, err_msg=f"{what} ({dtype}) differs from the same tensor alone")
        err = np.max(np.abs(_f64(got) - ref[i])) / max(np.max(np.abs(ref[i])), 1e-30)
        assert err <= 8 * EPS[dtype], f"{what} ({dtype}): error {err:.2e} against float64, expected <= 8 eps"
