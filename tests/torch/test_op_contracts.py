"""The contracts every tokenpos op keeps on every implementation (numba, Triton, plain torch, fake / meta):

- gradients: every float input that requires grad gets one (never a silent None), checked against
  finite differences in float64 (RoPE's cos / sin included: learned frequencies);
- arguments: one check (``tables.checks.ops``) for every path, dtype and kernel setting: the same
  exception and message for a bad argument, the same result for a valid edge one;
- strides: the real output's strides equal the fake's on every path (what ``torch.compile`` plans with);
- RoPE on the Triton path: q and k in one launch, forward and backward, the backward's -sin negated
  in the kernel.

The Triton path runs on the CPU through Triton's interpreter (``tests/triton_mode.py``): the ops'
choice of path is pointed at "triton" for CPU tensors (:func:`triton_path`), so the ops' own Triton
branches run as they would on CUDA.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import tokenpos.torch.ops as ops
from tests.tolerances import TOL
from tests.torch.op_inputs import with_inputs
from tokenpos import use_kernels

rope_mod = importlib.import_module("tokenpos.torch.ops.rope")
emb_mod = importlib.import_module("tokenpos.torch.ops.embedding")
ngram_mod = importlib.import_module("tokenpos.torch.ops.ngram")
OPS = torch.ops.tokenpos
SAMPLES = list(ops.samples())


def _outputs(x: Any) -> tuple[torch.Tensor, ...]:
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


def _grad_inputs(args: tuple[Any, ...]) -> list[int]:
    return [j for j, a in enumerate(args) if isinstance(a, torch.Tensor) and a.is_floating_point() and a.requires_grad]


@contextmanager
def triton_path() -> Iterator[Any]:
    """The ops take their CUDA branch (the Triton kernels) for CPU tensors, under the interpreter."""
    triton = pytest.importorskip("triton")                         # noqa: F841 - the optional gpu extra
    from tokenpos.torch.ops._dispatch import triton_kernels

    def path(x: torch.Tensor, y: torch.Tensor | None = None) -> str:
        return "plain" if triton_kernels(*((x,) if y is None else (x, y))) is None else "triton"

    mp = pytest.MonkeyPatch()
    mp.setattr(rope_mod, "_path", path)
    mp.setattr(emb_mod, "_path", path)
    try:
        yield importlib.import_module("tokenpos.kernels.triton")
    finally:
        mp.undo()


# ----------------------------------------------------------------------------------------------
# A. gradients: every float input that requires grad gets a correct one
# ----------------------------------------------------------------------------------------------

GRAD_SAMPLES = [i for i, (_, args, _) in enumerate(SAMPLES) if _grad_inputs(args)]
F64_GRAD_SAMPLES = [i for i in GRAD_SAMPLES if SAMPLES[i][1][0].dtype == torch.float64]


def test_samples_make_every_float_input_require_grad_somewhere() -> None:
    """cos / sin, the embedding's table and the backward op's grad all appear requiring grad."""
    seen = {(op._name, j) for op, args, _ in SAMPLES for j in _grad_inputs(args)}
    assert {("rope", 1), ("rope", 2), ("rope_qk", 2), ("rope_qk", 3), ("embedding", 0), ("embedding", 2),
            ("embedding_backward", 0), ("rope_backward", 1), ("rope_qk_backward", 3)} <= seen


@pytest.mark.parametrize("kernels", [True, False])
@pytest.mark.parametrize("i", GRAD_SAMPLES)
def test_no_float_input_that_requires_grad_gets_none(i: int, kernels: bool) -> None:
    op, args, kwargs = SAMPLES[i]
    idx = _grad_inputs(args)
    with use_kernels(kernels):
        outs = _outputs(op(*args, **kwargs))
        gen = torch.Generator().manual_seed(i)
        loss = sum((o * torch.randn(o.shape, generator=gen, dtype=o.dtype)).sum() for o in outs)
        grads = torch.autograd.grad(loss, [args[j] for j in idx], allow_unused=True)
    missing = [j for j, g in zip(idx, grads, strict=True) if g is None]
    assert not missing, f"{op._name}: inputs {missing} require grad and got None"


@pytest.mark.slow  # gradcheck of every sample (fast: the other contracts of every sample)
@pytest.mark.parametrize("kernels", [True, False])
@pytest.mark.parametrize("i", F64_GRAD_SAMPLES)
def test_gradcheck_every_float64_sample(i: int, kernels: bool) -> None:
    """Finite differences in float64 for every input that requires grad (overlapping expanded inputs
    are cloned: gradcheck perturbs one element at a time). The embedding runs without padding_idx here:
    that row is read by the forward and gets no gradient by design (``F.embedding``'s rule, tested in
    test_ops.py::test_gradients_equal_plain_path)."""
    op, args, _ = SAMPLES[i]
    if op._name == "embedding":
        args = (*args[:-1], -1)
    idx = _grad_inputs(args)
    xs = tuple(args[j].detach().clone().requires_grad_() for j in idx)
    with use_kernels(kernels):
        assert torch.autograd.gradcheck(with_inputs(op, args, idx), xs)


@pytest.mark.slow  # double backward through gradgradcheck, 30-80 s each on busy cores
@pytest.mark.parametrize("kernels", [True, False])
@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("table_batch", [None, 1, 2])
def test_rope_second_derivatives_in_x_cos_and_sin(kernels: bool, interleaved: bool, table_batch: Any) -> None:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 3, 4, 8, dtype=torch.float64, generator=g, requires_grad=True)
    k = torch.randn(2, 1, 4, 8, dtype=torch.float64, generator=g, requires_grad=True)
    shape = (4, 3) if table_batch is None else (table_batch, 4, 3)
    ang = torch.rand(shape, dtype=torch.float64, generator=g)
    c, s = ang.cos().requires_grad_(), ang.sin().requires_grad_()
    with use_kernels(kernels):
        fr = lambda x, c, s: OPS.rope(x, c, s, interleaved) ** 2  # noqa: E731
        fqk = lambda x, k, c, s: [o ** 2 for o in OPS.rope_qk(x, k, c, s, interleaved)]  # noqa: E731
        assert torch.autograd.gradgradcheck(fr, (x, c, s))
        assert torch.autograd.gradgradcheck(fqk, (x, k, c, s))


@pytest.mark.parametrize("kernels", [True, False])
def test_the_layers_route_gives_cos_and_sin_the_ops_gradients(kernels: bool) -> None:
    """``ops.rotate`` / ``rotate_qk`` (eager autograd.Function, not the op's dispatcher): cos / sin get
    gradients when they alone require grad, equal to the op's, and pass gradcheck."""
    g = torch.Generator().manual_seed(2)
    q = torch.randn(2, 3, 5, 8, dtype=torch.float64, generator=g)
    k = torch.randn(2, 1, 5, 8, dtype=torch.float64, generator=g)
    ang = torch.rand(5, 4, dtype=torch.float64, generator=g)
    c, s = ang.cos().requires_grad_(), ang.sin().requires_grad_()
    with use_kernels(kernels):
        assert torch.autograd.gradcheck(lambda c, s: ops.rotate(q, c, s, False), (c, s))
        assert torch.autograd.gradcheck(lambda c, s: ops.rotate_qk(q, k, c, s, True), (c, s))
        via_entry = torch.autograd.grad(sum(o.sum() for o in ops.rotate_qk(q, k, c, s, False)), (c, s))
        via_op = torch.autograd.grad(sum(o.sum() for o in OPS.rope_qk(q, k, c, s, False)), (c, s))
    for a, b in zip(via_entry, via_op, strict=True):
        torch.testing.assert_close(a, b, **TOL["kernels.float64"])


def test_x_alone_saves_no_input_for_backward() -> None:
    """Without learned tables the backward keeps only cos and sin (x is not saved)."""
    x = torch.randn(1, 2, 3, 8, requires_grad=True)
    ang = torch.rand(3, 4)
    for out in (OPS.rope(x, ang.cos(), ang.sin(), False), ops.rotate(x, ang.cos(), ang.sin(), False)):
        saved = [t for t in out.grad_fn.saved_tensors]
        assert len(saved) == 2 and all(t.shape == (3, 4) for t in saved)


# ----------------------------------------------------------------------------------------------
# B. arguments: one check, the same answer on every path
# ----------------------------------------------------------------------------------------------

DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)
PATHS = ("kernels", "plain", "meta", "triton")
B, H, L, DH, F, V, D, P = 2, 3, 5, 8, 3, 7, 4, 6


def _rope_args(dtype: torch.dtype, **over: Any) -> dict[str, Any]:
    g = torch.Generator().manual_seed(0)
    ang = torch.rand(L, F, dtype=torch.float64, generator=g)
    a = {"x": torch.randn(B, H, L, DH, generator=g).to(dtype), "k": torch.randn(B, 1, L, DH, generator=g).to(dtype),
         "cos": ang.cos(), "sin": ang.sin(), "interleaved": False}
    a.update(over)
    return a


def _emb_args(dtype: torch.dtype, **over: Any) -> dict[str, Any]:
    g = torch.Generator().manual_seed(0)
    a = {"weight": torch.randn(V, D, generator=g).to(dtype), "ids": torch.randint(0, V, (B, L), generator=g),
         "table": torch.randn(P, D, generator=g).to(dtype), "pos": torch.arange(L), "scale": 1.5, "p": 0.25,
         "seed": torch.tensor(7), "padding_idx": 2, "grad": torch.randn(B, L, D, generator=g).to(dtype),
         "num_weights": V, "num_positions": P}
    a.update(over)
    return a


def _call(op: str, a: dict[str, Any]) -> Any:
    if op == "rope":
        return OPS.rope(a["x"], a["cos"], a["sin"], a["interleaved"])
    if op == "rope_qk":
        return OPS.rope_qk(a["x"], a["k"], a["cos"], a["sin"], a["interleaved"])
    if op == "embedding":
        return OPS.embedding(a["weight"], a["ids"], a["table"], a["pos"], a["scale"], a["p"], a["seed"],
                             a["padding_idx"])
    return OPS.embedding_backward(a["grad"], a["ids"], a["pos"], a["num_weights"], a["num_positions"], a["scale"],
                                  a["p"], a["seed"], a["padding_idx"])


ROPE_BAD: dict[str, dict[str, Any]] = {
    "cos (1, F)": {"cos": torch.rand(1, F, dtype=torch.float64), "sin": torch.rand(1, F, dtype=torch.float64)},
    "cos of another batch": {"cos": torch.rand(3, L, F, dtype=torch.float64),
                             "sin": torch.rand(3, L, F, dtype=torch.float64)},
    "2F > head_dim": {"cos": torch.rand(L, 5, dtype=torch.float64), "sin": torch.rand(L, 5, dtype=torch.float64)},
    "cos 1-D": {"cos": torch.rand(F, dtype=torch.float64), "sin": torch.rand(F, dtype=torch.float64)},
    "sin of another dtype": {"sin": torch.rand(L, F)},
    "sin of another shape": {"sin": torch.rand(L, F - 1, dtype=torch.float64)},
    "bf16 tables": {"cos": torch.rand(L, F).bfloat16(), "sin": torch.rand(L, F).bfloat16()},
    "x 3-D": {"x": torch.randn(B, L, DH)},
    "x integer": {"x": torch.zeros(B, H, L, DH, dtype=torch.int32)},
}
ROPE_QK_BAD: dict[str, dict[str, Any]] = {
    **ROPE_BAD,
    "k of another length": {"k": torch.randn(B, 1, L + 1, DH)},
    "k of another batch": {"k": torch.randn(1, 1, L, DH)},
    "k integer": {"k": torch.zeros(B, 1, L, DH, dtype=torch.int64)},
    "k too narrow for the rotary dims": {"k": torch.randn(B, 1, L, 4)},
}
EMB_BAD: dict[str, dict[str, Any]] = {
    "p = 1.0": {"p": 1.0}, "p = -0.5": {"p": -0.5}, "p = 1.5": {"p": 1.5}, "p = nan": {"p": math.nan},
    "p = inf": {"p": math.inf},
    "padding_idx = V": {"padding_idx": V}, "padding_idx = -2": {"padding_idx": -2},
    "table without pos": {"pos": None}, "pos without table": {"table": None},
    "table of another width": {"table": torch.randn(P, D + 1)},
    "pos not a trailing part of the ids' shape": {"pos": torch.arange(L + 1)},
    "float pos": {"pos": torch.arange(L).double()},
    "float ids": {"ids": torch.zeros(B, L)},
    "bool ids": {"ids": torch.zeros(B, L, dtype=torch.bool)},
    "weight 1-D": {"weight": torch.randn(V)},
    "int32 seed": {"seed": torch.tensor(7, dtype=torch.int32)},
    "seed of shape (1,)": {"seed": torch.tensor([7])},
}
EMB_BW_BAD: dict[str, dict[str, Any]] = {
    "p = 1.0": {"p": 1.0}, "p = -0.5": {"p": -0.5}, "p = nan": {"p": math.nan},
    "padding_idx = V": {"padding_idx": V},
    "grad of another shape": {"grad": torch.randn(B, L + 1, D)},
    "num_weights < 0": {"num_weights": -1}, "num_positions < 0": {"num_positions": -2},
    "float ids": {"ids": torch.zeros(B, L)},
    "pos not a trailing part of the ids' shape": {"pos": torch.arange(L + 1)},
}
BAD = [(op, name) for op, table in (("rope", ROPE_BAD), ("rope_qk", ROPE_QK_BAD),
                                    ("embedding", EMB_BAD), ("embedding_backward", EMB_BW_BAD))
       for name in table]
BAD_TABLES = {"rope": ROPE_BAD, "rope_qk": ROPE_QK_BAD, "embedding": EMB_BAD, "embedding_backward": EMB_BW_BAD}


def _cast_floats(over: dict[str, Any], dtype: torch.dtype) -> dict[str, Any]:
    """The case's float data inputs (not tables, ids or positions, whose dtype is the point) in the run's dtype."""
    data = ("x", "k", "weight", "table", "grad")
    return {n: (v.to(dtype) if isinstance(v, torch.Tensor) and v.dtype == torch.float32 and n in data else v)
            for n, v in over.items()}


def _on(a: dict[str, Any], device: str) -> dict[str, Any]:
    return {n: (v.to(device) if isinstance(v, torch.Tensor) else v) for n, v in a.items()}


def _run_path(path: str, fn: Callable[[], Any]) -> Any:
    if path == "triton":
        with triton_path():
            return fn()
    with use_kernels(path != "plain"):
        return fn()


def _outcome(op: str, a: dict[str, Any], path: str) -> tuple[type, str]:
    a = _on(a, "meta") if path == "meta" else a
    try:
        _run_path(path, lambda: _call(op, a))
    except Exception as e:                                         # noqa: BLE001 - the outcome is compared
        return type(e), str(e)
    return type(None), "no error"


@pytest.mark.parametrize(("op", "case"), BAD)
def test_bad_arguments_give_one_error_on_every_path_and_dtype(op: str, case: str) -> None:
    """The same exception type and message whether the kernels are on or off, on the Triton path, on
    the meta device (the fake implementation), for every float dtype."""
    build = _rope_args if op in ("rope", "rope_qk") else _emb_args
    outcomes = {}
    for dtype in DTYPES:
        for path in PATHS:
            a = build(dtype, **_cast_floats(BAD_TABLES[op][case], dtype))
            outcomes[(str(dtype), path)] = _outcome(op, a, path)
    first = next(iter(outcomes.values()))
    assert first[0] is not type(None) and issubclass(first[0], ValueError), first
    assert all(o == first for o in outcomes.values()), outcomes


ROPE_EDGE = {
    "cos (1, L, F)": {"cos": torch.rand(1, L, F, dtype=torch.float64), "sin": torch.rand(1, L, F, dtype=torch.float64)},
    "no rotated dims (F = 0)": {"cos": torch.rand(L, 0, dtype=torch.float64),
                                "sin": torch.rand(L, 0, dtype=torch.float64)},
    "float32 tables": {"cos": torch.rand(L, F), "sin": torch.rand(L, F)},
    "2F = head_dim": {"cos": torch.rand(L, DH // 2, dtype=torch.float64),
                      "sin": torch.rand(L, DH // 2, dtype=torch.float64)},
    "k of other heads": {"k": torch.randn(B, 5, L, DH)},
    "empty batch": {"x": torch.randn(0, H, L, DH), "k": torch.randn(0, 1, L, DH),
                    "cos": torch.rand(0, L, F, dtype=torch.float64), "sin": torch.rand(0, L, F, dtype=torch.float64)},
}
EMB_EDGE = {
    "p = 0": {"p": 0.0}, "p just under 1": {"p": 0.999}, "padding_idx = V - 1": {"padding_idx": V - 1},
    "padding_idx = -1": {"padding_idx": -1}, "no table": {"table": None, "pos": None},
    "0-d position": {"pos": torch.tensor(3)}, "(B, L) positions": {"pos": torch.arange(L).expand(B, L)},
    "empty ids": {"ids": torch.zeros(0, L, dtype=torch.int64)},
}
EDGE = [(op, name) for op, table in (("rope", ROPE_EDGE), ("rope_qk", ROPE_EDGE), ("embedding", EMB_EDGE))
        for name in table]


@pytest.mark.parametrize(("op", "case"), EDGE)
@pytest.mark.parametrize("dtype", DTYPES)
def test_valid_edge_arguments_give_one_result_on_every_path(op: str, case: str, dtype: torch.dtype) -> None:
    build, table = (_rope_args, ROPE_EDGE) if op != "embedding" else (_emb_args, EMB_EDGE)
    over = _cast_floats(table[case], dtype)
    if op == "embedding" and "ids" in over:
        over["pos"] = torch.arange(L)
    a = build(dtype, **over)
    ref = _outputs(_run_path("plain", lambda: _call(op, a)))
    paths = ["kernels", "meta"] + (["triton"] if dtype != torch.float64 else [])
    for path in paths:
        got = _outputs(_run_path(path, lambda p=path: _call(op, _on(a, "meta") if p == "meta" else a)))
        for g, r in zip(got, ref, strict=True):
            assert g.shape == r.shape and g.dtype == r.dtype and g.stride() == r.stride(), (path, case)
            if path != "meta":
                tol = TOL["exact"] if dtype in (torch.float32, torch.float64) else TOL["forward.float16"]
                torch.testing.assert_close(g, r, **tol, msg=f"{path}: {case}")


# ----------------------------------------------------------------------------------------------
# C. strides: real == fake on every path
# ----------------------------------------------------------------------------------------------


def _fake_strides(op: Any, args: tuple[Any, ...]) -> list[tuple[int, ...]]:
    with FakeTensorMode() as mode:
        fargs = tuple(mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args)
        return [o.stride() for o in _outputs(op(*fargs))]


TRANSFORM_IMPLS: dict[str, Callable[..., Any]] = {
    "rope": lambda x, c, s, il, pos=None: rope_mod.rotate_impl(x, c, s, il, False, pos),
    "rope_qk": lambda q, k, c, s, il, pos=None: rope_mod.rotate_qk_impl(q, k, c, s, il, False, pos),
    "embedding": emb_mod.forward_impl,
    "ngram_embedding": ngram_mod.formula,
    "rope_backward": lambda x, c, s, il, pos=None: rope_mod.rotate_impl(x, c, s, il, True, pos),
    "rope_qk_backward": lambda q, k, c, s, il, pos=None: rope_mod.rotate_qk_impl(q, k, c, s, il, True, pos),
}
STRIDE_SAMPLES = [i for i, (_, args, _) in enumerate(SAMPLES) if args[0].dtype == torch.float32]


@pytest.mark.parametrize("path", ["kernels", "plain", "triton", "transform"])
@pytest.mark.parametrize("i", STRIDE_SAMPLES)
def test_real_output_strides_equal_the_fake_ones(i: int, path: str) -> None:
    """Every float32 sample (transposed, blhd, expanded and sliced inputs included), through the numba
    kernels, plain torch, the Triton kernels (interpreter) and under ``torch.func`` (plain formula
    inside a transform)."""
    op, args, _ = SAMPLES[i]
    args = tuple(a.detach() if isinstance(a, torch.Tensor) else a for a in args)
    fake = _fake_strides(op, args)
    if path == "transform":                          # the layers' route there: the implementation, plain torch
        if op._name in ("embedding_backward", "ngram_embedding_backward"):   # (never reached under a transform:
            # the formula is differentiated)
            return
        if op._name.startswith("tied_cross_entropy"):   # no torch.func route: refused with a ConfigError
            return
        impl = TRANSFORM_IMPLS[op._name]
        seen: list[tuple[int, ...]] = []

        def f(x: torch.Tensor) -> torch.Tensor:
            outs = _outputs(impl(x, *args[1:]))
            seen.extend(o.stride() for o in outs)
            return sum(o.float().sum() for o in outs)             # type: ignore[return-value]

        torch.func.grad(f)(args[0]) if args[0].is_floating_point() else f(args[0])
        assert seen == fake
        return
    real = [o.stride() for o in _outputs(_run_path(path, lambda: op(*args)))]
    assert real == fake, (op._name, [a.stride() for a in args if isinstance(a, torch.Tensor)])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_triton_rope_outputs_are_contiguous_for_hf_and_blhd_inputs_in_low_precision(dtype: torch.dtype) -> None:
    """The issue's case: q built the HF way (``view(B, L, H, Dh).transpose(1, 2)``) keeps its transposed
    strides in; out must be the fake's contiguous ones, forward and backward, on the Triton path."""
    g = torch.Generator().manual_seed(3)
    hf = torch.randn(1, 8, 4 * 8, generator=g).to(dtype).view(1, 8, 4, 8).transpose(1, 2)   # (1, 4, 8, 8)
    assert hf.stride() == (256, 8, 32, 1)
    ang = torch.rand(8, 4, dtype=torch.float64)
    with triton_path():
        outs = OPS.rope_qk(hf.requires_grad_(), hf.detach(), ang.cos().float(), ang.sin().float(), False)
        grads = torch.autograd.grad(outs[0].float().sum(), hf)
    assert hf.stride() != outs[0].stride()
    for o in (*outs, *grads):
        assert o.is_contiguous()


# ----------------------------------------------------------------------------------------------
# D. RoPE on the Triton path: one launch for q and k, the backward's -sin in the kernel
# ----------------------------------------------------------------------------------------------


@pytest.fixture
def launches(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """The keyword constexprs of every launch of the Triton RoPE kernel (NEG_SIN, INTERLEAVED, ...)."""
    pytest.importorskip("triton")
    tr = importlib.import_module("tokenpos.kernels.triton.rope")
    kernel = tr._rope_kernel
    seen: list[dict[str, Any]] = []

    class Counting:
        def __getitem__(self, grid: Any) -> Callable[..., Any]:
            launch = kernel[grid]

            def run(*args: Any, **kwargs: Any) -> Any:
                seen.append({**kwargs, "H": args[6], "HK": args[7]})
                return launch(*args, **kwargs)
            return run

    monkeypatch.setattr(tr, "_rope_kernel", Counting())
    return seen


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("route", ["op", "entry"])
def test_rope_qk_on_the_triton_path_is_one_launch_and_matches_the_formula(launches, interleaved: bool,
                                                                          route: str) -> None:
    """GQA (Hk != H), strided q: forward one launch, backward one launch with NEG_SIN, results equal to
    plain torch's (forward and the gradients of q, k, cos and sin)."""
    g = torch.Generator().manual_seed(4)
    q = torch.randn(2, 6, 4, 8, generator=g).transpose(1, 2)                   # (B, H, L, Dh) from blhd
    k = torch.randn(2, 2, 6, 8, generator=g)
    ang = torch.rand(6, 3, dtype=torch.float64, generator=g)
    c, s = ang.cos().float(), ang.sin().float()
    fn = OPS.rope_qk if route == "op" else ops.rotate_qk

    def run(path: str) -> list[torch.Tensor]:
        qq, kk = q.clone().requires_grad_(), k.clone().requires_grad_()
        cc, ss = c.clone().requires_grad_(), s.clone().requires_grad_()
        outs = _run_path(path, lambda: fn(qq, kk, cc, ss, interleaved))
        w = [torch.randn(o.shape, generator=torch.Generator().manual_seed(5)) for o in outs]
        before = len(launches)
        grads = _run_path(path, lambda: torch.autograd.grad(sum((o * wi).sum() for o, wi in zip(outs, w, strict=True)),
                                                            (qq, kk, cc, ss)))
        if path == "triton":
            assert len(launches) == before + 1 and launches[-1]["NEG_SIN"] is True
            assert launches[-1]["HK"] == 2 and launches[-1]["H"] == 4
        return [*outs, *grads]

    got = run("triton")
    assert len(launches) == 2 and launches[0]["NEG_SIN"] is False and launches[0]["HK"] == 2
    ref = run("plain")
    for a, b in zip(got, ref, strict=True):
        torch.testing.assert_close(a, b, **TOL["triton.grad.float32"])


def test_the_numba_backward_negates_sin_in_the_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CPU backward passes sign -1 to the compiled pass; no -sin table is built (sin reaches the
    kernel as the very table the forward got)."""
    calls: list[tuple[Any, float]] = []
    real = rope_mod.run_rope

    def spy(q, k, cos, sin, interleaved, sign, *rest):  # type: ignore[no-untyped-def]
        calls.append((sin, sign))
        return real(q, k, cos, sin, interleaved, sign, *rest)

    monkeypatch.setattr(rope_mod, "run_rope", spy)
    x = torch.randn(1, 2, 3, 8, requires_grad=True)
    k = torch.randn(1, 1, 3, 8, requires_grad=True)
    ang = torch.rand(3, 4)
    sin = ang.sin()
    for fn in (OPS.rope_qk, ops.rotate_qk):
        calls.clear()
        outs = fn(x, k, ang.cos(), sin, False)
        torch.autograd.grad(sum((o * torch.randn(o.shape)).sum() for o in outs), (x, k))
        assert [c[1] for c in calls] == [1.0, -1.0]
        assert all(bool((torch.from_numpy(c[0]) == sin).all()) for c in calls)
