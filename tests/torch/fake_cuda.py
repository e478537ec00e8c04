"""A sync detector that needs no GPU: tensors that claim ``cuda:0`` over CPU data, under a dispatch
mode that refuses every host sync a real CUDA run would make.

:class:`FakeCuda` is a wrapper subclass (``torch.Tensor._make_wrapper_subclass``) that reports
``device="cuda:0"`` and holds a CPU tensor. :class:`SyncDetector` is a ``TorchDispatchMode``: every
aten op unwraps its arguments to the CPU tensors, runs, and wraps the tensor results again; factory
calls naming a CUDA device (``torch.randint(..., device="cuda")``, ``torch.arange``) run on the
CPU and are wrapped, so they stay "on the device". So the layers take their CUDA code paths (the
Triton kernels, the device-side seed, the device-side asserts) on a machine without a GPU.

What it refuses (:class:`HostSync`), exactly what blocks the host on CUDA:

- data-dependent scalar reads and shapes of a fake-CUDA tensor: ``aten._local_scalar_dense``
  (``.item()``, ``int(t)``, ``float(t)``, ``bool(t)``), ``aten.is_nonzero``, ``aten.nonzero``,
  ``aten.masked_select``, ``aten.unique*``, ``aten.repeat_interleave`` with a tensor of repeats,
  ``aten.equal``, ``aten.allclose``;
- copies between the host and the device: ``_to_copy`` / ``copy_`` from a CPU tensor to a fake-CUDA
  one, ``.cpu()``, ``.to("cpu")``, ``.numpy()``, ``.tolist()`` of a fake-CUDA one, and a CPU tensor
  of one or more dimensions in an op with fake-CUDA ones (a copy to the device). A 0-d CPU tensor
  is allowed there: CUDA kernels take it as a scalar argument, read from host memory, without
  waiting for the device (autograd makes them, e.g. the zero of ``where``'s backward).

A tokenpos custom op (``tokenpos::embedding_backward``, ``tokenpos::rope``, ...) reached with
fake-CUDA tensors runs its own implementation with them, under the detector, so its CUDA path
(the Triton kernel, or plain torch) is what is checked.

``aten._assert_async`` (a device-side assert on CUDA) is evaluated on the CPU data and raises a
``RuntimeError`` when the condition is false, as a CUDA device assert would (loudly, later).

The Triton kernels run through Triton's interpreter (``TRITON_INTERPRET=1``, tests/conftest.py),
which copies every argument to the host: the detector replaces the interpreter's launch
(``GridExecutor.__call__``) with one that hands it the CPU tensors, with the mode suspended. A
compiled launch reads no tensor values on the host, so nothing real is hidden by that.

Autograd works (the C++ device of a fake-CUDA tensor is the CPU, which the engine knows), so a
training step (forward + backward) runs under the detector too. One artefact: the zero gradient
autograd makes for an unused output of an ``autograd.Function`` is made on that C++ device, a plain
CPU tensor, which the detector then sees mixed with fake-CUDA ones; a case must use every output
that requires grad (on real CUDA that zero is on the device).

Also refused: an op with a boolean-mask index (``x[mask]``, its shape depends on the values), and
host data sent to CUDA by Python code (``cpu_tensor.to("cuda")``, ``torch.tensor(data,
device="cuda")``: :class:`HostToDevice`).

Allowed, because on CUDA they do not block the host: a copy between pinned host memory and the device
with ``non_blocking=True`` (``pinned.to("cuda", non_blocking=True)``; ``pinned.copy_(cuda_tensor,
non_blocking=True)``). Pinned memory cannot be allocated on a CPU-only build: :func:`pinned_empty`
makes a host tensor that this module counts as pinned (a pageable one, or a blocking copy, is still
refused). Each allowed copy is logged in the detector's ``copies`` ("h2d" / "d2h", bytes, the fake stream
it ran on). :class:`FakeRuntime` stands in for ``tokenpos.torch.host_table.CudaRuntime`` (streams, events,
pinned allocation, ``record_stream``): it logs every call, and an event's ``synchronize`` (a host wait) in
``host_waits``, so a test checks the order of copies, records and waits.
"""

from __future__ import annotations

import contextlib
import itertools
import weakref
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from torch._library import custom_ops
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes, _get_current_dispatch_mode_stack
from torch.utils._pytree import tree_map

from tests.triton_mode import ON_CUDA

CUDA = torch.device("cuda", 0)
aten = torch.ops.aten


class HostSync(AssertionError):
    """An op that would block the host (or copy between host and device) on a real CUDA device."""


# data-dependent scalar reads / output shapes: each blocks the host on CUDA
SYNC_OPS = {
    aten._local_scalar_dense.default, aten.is_nonzero.default, aten.nonzero.default, aten.nonzero_static.default,
    aten.masked_select.default, aten._unique.default, aten._unique2.default, aten.unique_dim.default,
    aten.unique_consecutive.default, aten.equal.default, aten.allclose.default, aten.item.default,
    aten.repeat_interleave.Tensor, aten.argwhere.default,
}
MASK_INDEX_OPS = {aten.index.Tensor, aten.index_put.default, aten.index_put_.default, aten._unsafe_index.Tensor}
COPY_OPS = {aten._to_copy.default, aten.copy_.default, aten.to.dtype_layout, aten.to.device, aten.to.other}


class FakeCuda(torch.Tensor):
    """A tensor that says ``cuda:0`` and holds a CPU tensor (``elem``)."""

    elem: torch.Tensor

    @staticmethod
    def __new__(cls, elem: torch.Tensor, requires_grad: bool = False) -> FakeCuda:
        assert elem.device.type == "cpu" and not isinstance(elem, FakeCuda)
        out = torch.Tensor._make_wrapper_subclass(cls, elem.size(), strides=elem.stride(),  # type: ignore[attr-defined]
                                                  storage_offset=elem.storage_offset(), dtype=elem.dtype,
                                                  layout=elem.layout, device="cpu", requires_grad=requires_grad)
        out.elem = elem
        return out  # type: ignore[no-any-return]

    # the C++ device stays "cpu" (autograd's engine and device guards need a device this build has);
    # Python code, the layers' included, sees cuda:0
    @property  # type: ignore[override]
    def device(self) -> torch.device:
        return CUDA

    @property  # type: ignore[override]
    def is_cuda(self) -> bool:
        return True

    @property  # type: ignore[override]
    def is_cpu(self) -> bool:
        return False

    def get_device(self) -> int:  # type: ignore[override]
        return 0

    def data_ptr(self) -> int:  # type: ignore[override]
        """The CPU data's address (a wrapper has no storage of its own: torch would say 0 for every
        fake tensor, so code comparing addresses, "is the output the input?", would be misled)."""
        return self.elem.data_ptr()

    # copies to the host, seen here (the C++ device is the CPU, so torch would make them no-ops)
    def cpu(self, *args: Any, **kwargs: Any) -> torch.Tensor:  # type: ignore[override]
        return _to_host(self, ".cpu()")

    def numpy(self, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        return _to_host(self, ".numpy()").numpy()

    def tolist(self) -> Any:  # type: ignore[override]
        return _to_host(self, ".tolist()").tolist()

    def __array__(self, *args: Any, **kwargs: Any) -> Any:
        return _to_host(self, "numpy.asarray()").numpy()

    def to(self, *args: Any, **kwargs: Any) -> torch.Tensor:  # type: ignore[override]
        copy = kwargs.pop("copy", False)
        device, dtype, _, _ = torch._C._nn._parse_to(*args, **kwargs)
        if device is not None and device.type == "cpu":
            out = _to_host(self, ".to('cpu')")
            return out if dtype is None else out.to(dtype)
        return torch.Tensor.to(self, dtype or self.dtype, copy=copy)

    def __repr__(self) -> str:  # type: ignore[override]
        return f"FakeCuda({self.elem!r})"

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        # outside a SyncDetector (which handles every op itself): run on the CPU data, unchecked
        # (building a layer, moving it, reading results in a test's assertions)
        return _run(func, args, dict(kwargs or {}))


def unavailable() -> str | None:
    """Why fake CUDA tensors cannot run here, or None: Triton is absent (the optional ``gpu`` extra: the CUDA
    code paths launch Triton kernels, which the interpreter runs on the CPU), or Triton compiles for a real
    GPU (tests/triton_mode.py), where the fake tensors' CPU data needs the interpreter."""
    try:
        import triton  # noqa: F401
    except ImportError:
        return "fake CUDA tensors need Triton (the optional gpu extra), which is not installed"
    if ON_CUDA:
        return ("fake CUDA tensors need Triton's interpreter, which is off on this GPU machine "
                "(the real-CUDA tests run instead; TOKENPOS_TRITON_DEVICE=cpu runs these)")
    return None


def _needs_the_interpreter() -> None:
    """Skip the calling test where fake CUDA tensors cannot run (:func:`unavailable` says why)."""
    reason = unavailable()
    if reason is not None:
        pytest.skip(reason)


def to_fake_cuda(t: torch.Tensor) -> FakeCuda:
    """A CPU tensor -> the same values "on cuda:0" (a leaf; requires_grad as ``t``)."""
    _needs_the_interpreter()
    return FakeCuda(t.detach().clone(), requires_grad=t.requires_grad)


def cpu_of(t: torch.Tensor) -> torch.Tensor:
    """The CPU data of a fake CUDA tensor (read outside the detector, or in a test's assertions)."""
    return t.elem if isinstance(t, FakeCuda) else t


# ------------------------------------------------------------------------------------ pinned memory, streams

_PINNED: dict[int, weakref.ref[torch.Tensor]] = {}      # storage address -> a tensor allocated by pinned_empty
_STREAM: list[str] = ["default"]                         # the fake current stream (a stack of names)


def pinned_empty(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A host tensor this module counts as pinned (``torch.empty(..., pin_memory=True)`` needs CUDA)."""
    t = torch.empty(shape, dtype=dtype)
    _PINNED[t.untyped_storage().data_ptr()] = weakref.ref(t)
    return t


def is_pinned(t: torch.Tensor) -> bool:
    """Whether ``t`` lies in a block from :func:`pinned_empty` that is still alive."""
    if isinstance(t, FakeCuda) or t.device.type != "cpu":
        return False
    ref = _PINNED.get(t.untyped_storage().data_ptr())
    owner = None if ref is None else ref()
    return owner is not None and owner.untyped_storage().data_ptr() == t.untyped_storage().data_ptr()


class FakeEvent:
    """``torch.cuda.Event`` for :class:`FakeRuntime`: ``record`` and ``synchronize`` (a host wait) are logged."""

    def __init__(self, runtime: FakeRuntime, number: int) -> None:
        self.runtime, self.number, self.stream = runtime, number, None

    def record(self, stream: FakeStream | None = None) -> None:
        self.stream = (stream or self.runtime.current).name
        self.runtime.log.append(("record", self.number, self.stream))

    def synchronize(self) -> None:
        self.runtime.host_waits.append(self.number)
        self.runtime.log.append(("host_wait", self.number, self.stream))


class FakeStream:
    """``torch.cuda.Stream`` for :class:`FakeRuntime`: waits are logged (the fake device runs in order)."""

    def __init__(self, runtime: FakeRuntime, name: str) -> None:
        self.runtime, self.name = runtime, name

    def wait_event(self, event: FakeEvent) -> None:
        self.runtime.log.append(("wait_event", event.number, self.name))

    def wait_stream(self, other: FakeStream) -> None:
        self.runtime.log.append(("wait_stream", other.name, self.name))


class FakeRuntime:
    """The CUDA runtime of ``tokenpos.torch.host_table`` (its ``RUNTIME``) on a CPU-only build: side streams,
    events, pinned allocation and ``record_stream``, each call logged in ``log``; host waits in ``host_waits``."""

    def __init__(self) -> None:
        self.log: list[tuple[Any, ...]] = []
        self.host_waits: list[int] = []
        self.current = FakeStream(self, "default")
        self._numbers = itertools.count()

    def stream(self, device: torch.device) -> FakeStream:
        assert torch.device(device).type == "cuda", device
        return FakeStream(self, f"side{next(self._numbers)}")

    def current_stream(self, device: torch.device) -> FakeStream:
        assert torch.device(device).type == "cuda", device
        return self.current

    @contextlib.contextmanager
    def use_stream(self, stream: FakeStream) -> Iterator[None]:
        old, self.current = self.current, stream
        _STREAM.append(stream.name)
        try:
            yield
        finally:
            self.current = old
            _STREAM.pop()

    def event(self) -> FakeEvent:
        return FakeEvent(self, next(self._numbers))

    def pinned_empty(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        return pinned_empty(shape, dtype)

    def record_stream(self, t: torch.Tensor, stream: FakeStream) -> None:
        assert isinstance(t, FakeCuda), "record_stream of a tensor that is not on the device"
        self.log.append(("record_stream", tuple(t.shape), stream.name))


def _is_cuda_device(d: Any) -> bool:
    return d is not None and torch.device(d).type == "cuda"


def _wrap(t: Any) -> Any:
    return FakeCuda(t) if isinstance(t, torch.Tensor) and not isinstance(t, FakeCuda) else t


def _names_cuda(args: Any, kwargs: dict[str, Any]) -> bool:
    """Whether an argument names a CUDA device (a factory's ``device=``, ``.to(device)``)."""
    return any(isinstance(a, torch.device) and a.type == "cuda"
               for a in torch.utils._pytree.tree_leaves((args, kwargs))) or _is_cuda_device(kwargs.get("device"))


def _host(a: Any) -> Any:
    """The CPU data of a fake CUDA tensor, the CPU for a CUDA device; anything else as it is."""
    if isinstance(a, torch.device) and a.type == "cuda":
        return torch.device("cpu")
    return cpu_of(a) if isinstance(a, torch.Tensor) else a


def _run(func: Any, args: Any, kwargs: dict[str, Any]) -> Any:
    """``func`` on the CPU data; tensor results "on cuda:0" again. (An aten op naming the CPU as a
    device comes from torch itself, which sees the C++ device: autograd's backward of a dtype cast;
    Python's ``.cpu()`` / ``.to("cpu")`` / ``.numpy()`` are caught by :class:`FakeCuda`'s methods.)"""
    if _is_cuda_device(kwargs.get("device")):
        kwargs["device"] = torch.device("cpu")
    return tree_map(_wrap, func(*tree_map(_host, args), **tree_map(_host, kwargs)))


def _detecting() -> bool:
    """Whether a strict :class:`SyncDetector` is on the dispatch-mode stack."""
    return any(isinstance(m, SyncDetector) and m.strict for m in _get_current_dispatch_mode_stack())


def _to_host(t: FakeCuda, what: str) -> torch.Tensor:
    if _detecting():
        raise HostSync(f"{what} of a CUDA tensor: a copy from the device to the host (a host sync)")
    return t.elem.clone()


class SyncDetector(TorchDispatchMode):
    """Runs fake-CUDA tensors on their CPU data; raises :class:`HostSync` on a host sync (module doc)."""

    def __init__(self, strict: bool = True) -> None:
        super().__init__()
        self.strict = strict                # False: run fake CUDA tensors, refuse nothing (:func:`fake_cuda`)
        self.ops: list[Any] = []            # every op seen (a test may look at what ran)
        self.copies: list[tuple[str, int, str]] = []   # allowed pinned copies: ("h2d" / "d2h", bytes, stream)

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = dict(kwargs or {})
        self.ops.append(func)
        flat = [a for a in torch.utils._pytree.tree_leaves((args, kwargs)) if isinstance(a, torch.Tensor)]
        fake = [a for a in flat if isinstance(a, FakeCuda)]
        plain = [a for a in flat if not isinstance(a, FakeCuda)]
        wants_cuda = _names_cuda(args, kwargs)
        if func is aten._assert_async.default or func is aten._assert_async.msg:
            cond = cpu_of(args[0])
            if not bool(cond):
                raise RuntimeError(f"device-side assert triggered: {args[1] if len(args) > 1 else ''}")
            return None
        pinned = _pinned_copy(func, args, kwargs)
        if pinned is not None:              # non_blocking between pinned host memory and the device: no host wait
            self.copies.append((pinned, _nbytes(args[0]), _STREAM[-1]))
            if func is aten._to_copy.default:
                return _run(func, args, kwargs)
            dst, src = args[0], args[1]
            func(cpu_of(dst), cpu_of(src), *args[2:], **kwargs)
            return dst
        opdef = custom_ops.OPDEFS.get(func._schema.name) if fake else None
        if opdef is not None:                   # a tokenpos op: its CUDA implementation, op by op, checked
            with self:
                return opdef._init_fn(*args, **kwargs)
        if (fake or wants_cuda) and self.strict:
            if func in SYNC_OPS:
                raise HostSync(f"{func} reads a value of a CUDA tensor on the host (a host sync)")
            if func in MASK_INDEX_OPS and any(i is not None and i.dtype == torch.bool for i in args[1]):
                raise HostSync(f"{func} with a boolean mask: its shape depends on the values (a host sync)")
            if func in COPY_OPS and plain:
                raise HostSync(f"{func}: a copy between the host and the device")
            if any(p.dim() for p in plain) and func not in COPY_OPS:
                raise HostSync(f"{func} mixes CPU tensors {[tuple(p.shape) for p in plain]} with CUDA ones "
                               "(a host-to-device copy)")
        if not (fake or wants_cuda):
            return func(*args, **kwargs)
        return _run(func, args, kwargs)


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _pinned_copy(func: Any, args: Any, kwargs: dict[str, Any]) -> str | None:
    """"h2d" / "d2h" for a ``non_blocking=True`` copy between pinned host memory and a fake CUDA tensor
    (``_to_copy`` of a pinned tensor to CUDA, ``copy_`` either way), else None."""
    if func is aten._to_copy.default:
        src = args[0]
        if (not isinstance(src, FakeCuda) and kwargs.get("non_blocking", False)
                and _is_cuda_device(kwargs.get("device")) and is_pinned(src)):
            return "h2d"
    elif func is aten.copy_.default:
        dst, src = args[0], args[1]
        non_blocking = args[2] if len(args) > 2 else kwargs.get("non_blocking", False)
        if non_blocking and isinstance(src, FakeCuda) and not isinstance(dst, FakeCuda) and is_pinned(dst):
            return "d2h"
        if non_blocking and isinstance(dst, FakeCuda) and not isinstance(src, FakeCuda) and is_pinned(src):
            return "h2d"
    return None


@contextlib.contextmanager
def _triton_launch_on_cpu() -> Iterator[None]:
    """Triton's interpreter launch, handed the CPU data of fake CUDA tensors, with the detector suspended."""
    from triton.runtime import interpreter

    original = interpreter.GridExecutor.__call__

    def launch(self: Any, *args: Any, **kwargs: Any) -> Any:
        with _disable_current_modes():
            return original(self, *tree_map(cpu_of, args), **tree_map(cpu_of, kwargs))

    interpreter.GridExecutor.__call__ = launch  # type: ignore[method-assign]
    try:
        yield
    finally:
        interpreter.GridExecutor.__call__ = original  # type: ignore[method-assign]


@contextlib.contextmanager
def _no_cuda_init() -> Iterator[None]:
    """Factory calls naming ``device="cuda"`` first initialise CUDA (``torch.cuda._lazy_init``, which a
    CPU-only build refuses); the detector runs them on the CPU, so that step is skipped."""
    original = torch.cuda._lazy_init
    torch.cuda._lazy_init = lambda: None
    try:
        yield
    finally:
        torch.cuda._lazy_init = original


_TO_DEVICE = {torch.Tensor.to, torch.Tensor.cuda, torch.tensor, torch.as_tensor, torch.asarray,
              torch.Tensor.new_tensor}


class HostToDevice(TorchFunctionMode):
    """Refuses host data going to CUDA: ``cpu_tensor.to("cuda")`` / ``.cuda()``, and
    ``torch.tensor(data, device="cuda")`` and its kin (a CPU build refuses them before any aten op)."""

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func in _TO_DEVICE:
            src = args[0] if args else kwargs.get("data")
            non_blocking = False
            if func is torch.Tensor.to:
                device, _, non_blocking, _ = torch._C._nn._parse_to(*args[1:], **{k: v for k, v in kwargs.items()
                                                                                  if k != "copy"})
            elif func is torch.Tensor.cuda:
                device = CUDA
            elif func is torch.Tensor.new_tensor:
                device, src = kwargs.get("device", args[0].device), args[1] if len(args) > 1 else kwargs.get("data")
            else:
                device = kwargs.get("device")
            if _is_cuda_device(device) and not isinstance(src, FakeCuda):
                if non_blocking and isinstance(src, torch.Tensor) and is_pinned(src):
                    return func(*args, **kwargs)     # an async copy from pinned memory: the detector logs it
                name = getattr(func, "__name__", func)
                raise HostSync(f"{name}: host data copied to {device} (a host-to-device copy)")
        return func(*args, **kwargs)


@contextlib.contextmanager
def no_host_sync() -> Iterator[SyncDetector]:
    """``with no_host_sync() as mode:`` fake-CUDA tensors run; any host sync raises :class:`HostSync`."""
    _needs_the_interpreter()
    with _triton_launch_on_cpu(), _no_cuda_init(), HostToDevice(), SyncDetector() as mode:
        yield mode


@contextlib.contextmanager
def fake_cuda() -> Iterator[SyncDetector]:
    """Fake CUDA tensors run (factories naming "cuda" make them), and nothing is refused: for code
    that may sync (a constructor) but must put its tensors on the device."""
    _needs_the_interpreter()
    with _triton_launch_on_cpu(), _no_cuda_init(), SyncDetector(strict=False) as mode:
        yield mode
