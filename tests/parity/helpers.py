"""One parity helper: run a NumPy layer and its torch twin on the same inputs, compare everything.

The tinygrad ``helper_test_op`` idea: build both layers, give them the same state (through
``state_dict``, in the direction asked for, so loading across backends is tested too), run the same
method on the same inputs, compare the outputs, then push the same random upstream gradient through
NumPy's hand-written backward and torch's autograd and compare every parameter gradient and every
float-input gradient. After that, each case is one line:

    assert_parity("TokenEmbedding", (50, 8), {"padding_idx": 0}, args=(ids,))
    assert_parity("RotaryEmbedding", (16,), {}, args=(q, k), method="apply", backward="apply_backward")

Outputs may be a tuple (``apply -> (q, k)``); the NumPy backward then receives one upstream gradient
per output, positionally, and returns the input gradients (an array, a tuple, or None). For plain
functions use :func:`assert_fn_parity` with callables.

Comparison: ``max|a - b| <= scale * max(max|ref|, tiny)`` with ``scale`` from tests/tolerances.py
("parity.f32" / "parity.f64" by dtype), i.e. relative to the output's scale (shared/API.md).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

import tokenpos.numpy as tpn
import tokenpos.torch as tpt
from tests.tolerances import TOL

_TINY = 1e-30


@dataclass
class ParityReport:
    """The measured errors (relative to scale), keyed "out0", "grad:<param>", "dinput0", ..."""

    errors: dict[str, float] = field(default_factory=dict)
    np_outputs: tuple[np.ndarray, ...] = ()

    @property
    def worst(self) -> float:
        return max(self.errors.values(), default=0.0)


def _as_tuple(x: Any) -> tuple[Any, ...]:
    if x is None:
        return ()
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


def _np(x: Any) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        if x.is_sparse:
            x = x.to_dense()
        return x.detach().cpu().to(torch.float64 if x.is_floating_point() else x.dtype).numpy()
    return np.asarray(x)


def rel_err(got: Any, ref: Any) -> float:
    """``max|got - ref| / max(max|ref|, tiny)`` in float64; shapes must match exactly."""
    g, r = _np(got).astype(np.float64), _np(ref).astype(np.float64)
    assert g.shape == r.shape, f"shape {g.shape} != {r.shape}"
    if r.size == 0:
        return 0.0
    return float(np.max(np.abs(g - r)) / max(float(np.max(np.abs(r))), _TINY))


def _scale_for(dtype: Any) -> float:
    name = str(dtype).replace("torch.", "")
    return TOL["parity.f64" if name == "float64" else "parity.f32"]["scale"]


def _to_torch_args(args: Sequence[Any], device: Any = None) -> tuple[list[Any], list[torch.Tensor]]:
    """NumPy float arrays become leaf tensors requiring grad; int arrays become int tensors; rest as is."""
    out, floats = [], []
    for a in args:
        if isinstance(a, np.ndarray):
            t = torch.from_numpy(a.copy()).to(device)
            if t.is_floating_point():
                t.requires_grad_(True)
                floats.append(t)
            out.append(t)
        else:
            out.append(a)
    return out, floats


def _upstream(outputs: tuple[np.ndarray, ...], seed: int) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(seed)
    return tuple(rng.standard_normal(o.shape).astype(o.dtype) for o in outputs)


def compare(errors: dict[str, float], key: str, got: Any, ref: Any, scale: float) -> None:
    err = rel_err(got, ref)
    errors[key] = err
    assert err <= scale, f"{key}: relative error {err:.3g} > {scale:.3g}"


def assert_fn_parity(np_call: Callable[..., Any], np_backward: Callable[..., Any] | None,
                     torch_call: Callable[..., Any], args: Sequence[Any], *,
                     np_params: dict[str, Any] | None = None, torch_params: dict[str, torch.nn.Parameter] | None = None,
                     grad_seed: int = 0, scale: float | None = None) -> ParityReport:
    """The core: ``np_call(*args)`` vs ``torch_call(*torch_args)``, then gradients.

    Args:
        np_call / torch_call: run the NumPy / torch side on the (converted) arguments.
        np_backward: called with the upstream gradients (one per output); returns the float-input
            gradients (array, tuple, or None). None skips the gradient checks.
        np_params / torch_params: name -> NumPy Parameter / torch Parameter, compared by name.
    """
    report = ParityReport()
    np_out = tuple(_np(o) for o in _as_tuple(np_call(*args)))
    t_args, t_floats = _to_torch_args(args)
    t_out = _as_tuple(torch_call(*t_args))
    assert len(np_out) == len(t_out), f"NumPy gave {len(np_out)} outputs, torch {len(t_out)}"
    scale = _scale_for(np_out[0].dtype) if scale is None else scale
    report.np_outputs = np_out
    for i, (a, b) in enumerate(zip(t_out, np_out, strict=True)):
        assert str(a.dtype).replace("torch.", "") == str(b.dtype), f"out{i} dtype {a.dtype} != {b.dtype}"
        compare(report.errors, f"out{i}", a, b, scale)
    if np_backward is None:
        return report
    grads = _upstream(np_out, grad_seed)
    np_dinputs = _as_tuple(np_backward(*grads))
    diff_outs = [(o, torch.from_numpy(g)) for o, g in zip(t_out, grads, strict=True) if o.requires_grad]
    if diff_outs:
        torch.autograd.backward([o for o, _ in diff_outs], [g for _, g in diff_outs])
    for name, p in (np_params or {}).items():
        tp = (torch_params or {})[name]
        if p.grad is None:
            assert tp.grad is None or not torch.any(_dense(tp.grad)), f"torch grad of {name} is non-zero"
            continue
        assert tp.grad is not None, f"torch parameter {name} received no gradient"
        compare(report.errors, f"grad:{name}", _dense(tp.grad), p.grad, _scale_for(p.grad.dtype))
    np_dinputs = tuple(d for d in np_dinputs if d is not None)
    assert len(np_dinputs) == len(t_floats), (
        f"NumPy returned {len(np_dinputs)} input gradients for {len(t_floats)} float inputs")
    for i, (d, t) in enumerate(zip(np_dinputs, t_floats, strict=True)):
        assert t.grad is not None, f"float input {i} received no torch gradient"
        compare(report.errors, f"dinput{i}", t.grad, d, _scale_for(d.dtype))
    return report


def _dense(g: torch.Tensor) -> torch.Tensor:
    return g.to_dense() if g.is_sparse else g


def _make(module: Any, name: str, ctor_args: Sequence[Any], kw: dict[str, Any], seed: int) -> Any:
    cls = getattr(module, name)
    try:
        return cls(*ctor_args, **kw, seed=seed)
    except TypeError:  # a layer without random init (norms, fixed tables) takes no seed
        return cls(*ctor_args, **kw)


def _perturb(named: Any, seed: int) -> None:
    """Move every parameter off its init (norm weights off 1, padding rows off 0) so loading matters."""
    rng = np.random.default_rng(seed)
    for _, p in named:
        if isinstance(p, torch.Tensor):
            with torch.no_grad():
                p.add_(torch.from_numpy(0.1 * rng.standard_normal(tuple(p.shape))).to(p.dtype))
        else:
            p.data += (0.1 * rng.standard_normal(p.data.shape)).astype(p.data.dtype)


def build_pair(name: str, ctor_args: Sequence[Any] = (), ctor_kwargs: dict[str, Any] | None = None, *,
               load_from: str = "numpy", seed: int = 0) -> tuple[Any, torch.nn.Module]:
    """The NumPy and torch layers called ``name`` with the same state.

    The source layer (``load_from``: "numpy" or "torch") is perturbed off its init, then its
    ``state_dict`` is loaded into the other backend's layer. The two start from different seeds,
    so a state_dict that failed to load shows up as a mismatch.
    """
    kw = dict(ctor_kwargs or {})
    np_layer = _make(tpn, name, ctor_args, kw, seed)
    t_layer = _make(tpt, name, ctor_args, kw, seed + 1)
    if load_from == "numpy":
        _perturb(np_layer.named_parameters(), seed + 2)
        t_layer.load_state_dict(np_layer.state_dict())
    elif load_from == "torch":
        _perturb(t_layer.named_parameters(), seed + 2)
        np_layer.load_state_dict(t_layer.state_dict())
    else:
        raise ValueError(f"load_from must be 'numpy' or 'torch', got {load_from!r}")
    return np_layer, t_layer


def assert_parity(name: str, ctor_args: Sequence[Any] = (), ctor_kwargs: dict[str, Any] | None = None, *,
                  args: Sequence[Any] = (), kwargs: dict[str, Any] | None = None, method: str = "forward",
                  backward: str | None = "backward", load_from: str = "numpy", train: bool = True,
                  prepare: Callable[[Any, torch.nn.Module], None] | None = None,
                  grad_seed: int = 0) -> ParityReport:
    """Build the pair, then :func:`assert_fn_parity` on ``method`` (and ``backward``) with ``args``.

    ``kwargs`` go to both methods unchanged (e.g. ``start_pos=3``); array-valued kwargs are converted
    for torch. ``prepare(np_layer, torch_layer)`` may adjust both before the call (e.g. fix a dropout
    seed). ``train=False`` puts both in eval mode.
    """
    np_layer, t_layer = build_pair(name, ctor_args, ctor_kwargs, load_from=load_from)
    np_layer.train(train)
    t_layer.train(train)
    if prepare is not None:
        prepare(np_layer, t_layer)
    kw = dict(kwargs or {})
    t_kw = {k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v for k, v in kw.items()}
    np_bwd = getattr(np_layer, backward) if backward else None
    return assert_fn_parity(
        lambda *a: getattr(np_layer, method)(*a, **kw), np_bwd,
        lambda *a: getattr(t_layer, method)(*a, **t_kw), args,
        np_params=dict(np_layer.named_parameters()), torch_params=dict(t_layer.named_parameters()),
        grad_seed=grad_seed)
