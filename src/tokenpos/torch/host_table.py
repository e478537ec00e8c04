"""Tables kept in host memory while the model runs on a GPU (``storage="host"``): the machinery shared by the three
torch input tables (``TokenEmbedding``, ``PerLayerEmbedding``, ``HashedNgramEmbedding``), which hold one
:class:`HostTable` each when built with ``storage="host"``.

Where things live. Every tensor of a host-stored layer (the table, an 8-bit table's scales, the hashing buffers)
stays in host memory; ``layer.to("cuda")`` moves only where the outputs go (:attr:`HostTable.device`), while dtype
casts (``.to(torch.bfloat16)``, ``.half()``) still apply to the table, on the host (:meth:`HostTable.apply`). The
table is ordinary (pageable) memory: the device never reads it, the host gathers from it; only the gathered rows are
staged in pinned memory. ``state_dict`` is unchanged (CPU tensors). On a CPU run (outputs on the CPU) a host-stored
layer is the ordinary layer (plus :meth:`prefetch`).

A lookup, ids (...) of N rows of width W -> rows (..., W) on the output device:

1. gather on the host: the layer's own lookup (``layer._lookup``) on the host table and the host ids, so the same op,
   scale, padding row, per-layer view, hashing and 8-bit dequantisation as the device-stored layer, and the same ids
   checks (a bad id raises its typed error here, on the host);
2. the rows are copied into a pinned staging buffer (host to host) and sent to the device with ``non_blocking=True``
   on the layer's own side stream (the ids too, N ints: for the check below); an event is recorded after the copies.
   The pinned block is freed at once: torch's caching host allocator does not reuse it before the copy is done;
3. forward: the current stream waits on that event (a wait on the device, not on the host) and the rows are
   ``record_stream``-ed on it, so the caching allocator keeps them until the consumer is done.

``prefetch(ids)`` does 1-2 early, on the calling thread (the gather is host work, the copy asynchronous): called
once a step's GPU work is launched (the host runs ahead of the GPU), it overlaps that work, and the next step's
``forward`` only does 3. Without a
prefetch, ``forward`` with host ids (as a tokenizer or a data loader gives them) does 1-3 at once; with device ids
and no prefetch it refuses (``ConfigError`` naming ``prefetch``): reading device ids on the host is a host sync, which
the torch layers never make on a device (API.md, "CUDA contract").

Pairing. Prefetches are queued first in, first out; each ``forward`` consumes the oldest. Its inputs (ids, and for
the hashed table ``cu_seqlens`` / ``context``) must be the prefetched ones: shapes (and which are given) are checked
on the host, a typed ``ConfigError`` before anything is consumed; values are compared on the host for host inputs
(the same error) and by one device-side assert (``torch._assert_async``) for device inputs, so a mismatched pairing
fails loudly on the device, as a bad id does, never as silently wrong rows. :meth:`clear` drops what is queued (after
an interrupted step); a move to another output device drops it too.

Freshness. A prefetch records the version counters and addresses of the layer's host tensors; if any changed before
its forward (an optimiser step, ``load_state_dict``, a cast), the rows are gathered again at forward from the
prefetched host ids: the values are always those of the table at forward, exactly. So in training, prefetch the
next step's ids after the host table's ``optimizer.step()`` (it then overlaps whatever GPU work is still queued,
such as the device parameters' optimiser step); a prefetch made before the step is correct but not early. In
inference nothing changes the table, and a prefetch overlaps a whole step. Rows gathered without autograd recording
(a prefetch under ``torch.no_grad()``) are gathered again for a forward that records.

Backward. A host table's gradient is row-sparse on the host (a trainable table built with ``storage="host"`` gets
``sparse=True``; an 8-bit table takes no gradient): the rows' gradient is copied to pinned host memory
(``non_blocking=True``) and the host waits for that copy alone (an event, not a device synchronisation) before the
layer's own CPU backward makes the sparse COO gradient of the gathered rows, for ``torch.optim.SparseAdam`` /
``SGD``. That wait is the one host wait of a host table, and it cannot be avoided: the host must hold the gradient
before it updates the table. A training step with a host table is not CUDA-graph capturable (host work in the
middle).

torch.compile: the host path runs eagerly (``torch.compiler.disable``: host work and stream calls, a graph break);
the rest of a compiled model is compiled as usual.

CUDA calls go through :data:`RUNTIME` (streams, events, pinned allocation), the one seam a test replaces to run
this on a CPU-only build (``tests/torch/fake_cuda.py``). Only CUDA output devices (and the CPU) are supported.

Shapes: ids (...) int, rows (..., W) with W the layer's output width (TokenEmbedding: D; PerLayerEmbedding: (L, P);
HashedNgramEmbedding: E, ids (B, L) or packed (T,) with cu_seqlens (S + 1,) and context (B, C) / (S, C)).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from tokenpos.tables.checks.validation import check_choice
from tokenpos.tables.errors import ConfigError

STORAGES = ("device", "host")


class CudaRuntime:
    """The CUDA calls of a host table, in one place (a test replaces :data:`RUNTIME` on a build without CUDA)."""

    def stream(self, device: torch.device) -> Any:
        """A new side stream on ``device``."""
        return torch.cuda.Stream(device)

    def current_stream(self, device: torch.device) -> Any:
        return torch.cuda.current_stream(device)

    def use_stream(self, stream: Any) -> Any:
        """A context in which ``stream`` is the current stream."""
        return torch.cuda.stream(stream)

    def event(self) -> Any:
        return torch.cuda.Event()

    def pinned_empty(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """An uninitialised host tensor in pinned (page-locked) memory, from torch's caching host allocator."""
        return torch.empty(shape, dtype=dtype, pin_memory=True)

    def record_stream(self, t: torch.Tensor, stream: Any) -> None:
        t.record_stream(stream)


RUNTIME = CudaRuntime()


def host_table(storage: str, device: Any) -> HostTable | None:
    """A layer's constructor plumbing: ``storage`` checked; a :class:`HostTable` whose outputs go to ``device``
    (None: the CPU) for "host", None for "device"."""
    check_choice("storage", storage, STORAGES)
    if storage == "device":
        return None
    return HostTable(_output_device(torch.device("cpu") if device is None else torch.device(device)))


def host_of(layer: Any) -> HostTable:
    """The :class:`HostTable` of a host-stored layer; ConfigError for a device-stored one."""
    host: HostTable | None = layer._host
    if host is None:
        raise ConfigError(f"{type(layer).__name__}: prefetch needs storage='host' (this table is stored on its "
                          "device, where a lookup needs no prefetch)")
    return host


def table_device(host: HostTable | None, device: Any) -> Any:
    """Where a layer builds its tensors: ``device``, or the host for a host-stored layer (the meta device stays:
    a layer built without memory)."""
    if host is None or (device is not None and torch.device(device).type == "meta"):
        return device
    return torch.device("cpu")


class HostStorage:
    """What the three input tables share for ``storage="host"`` (the first base: its ``_apply`` wraps the others',
    such as an 8-bit table's, which keeps float8 bits from a cast): the queue's
    ``prefetch`` / ``clear_prefetch`` and the move that keeps the table on the host. ``self._host``: the layer's
    :class:`HostTable`, or None for a table stored on its device."""

    _host: HostTable | None

    def prefetch(self, ids: Any) -> None:
        """Gather the rows of host ids (...) now and start their copy to the output device; the next ``forward``
        (not served by an older prefetch) returns them, after checking its ids are these. storage="host" only."""
        host_of(self).prefetch(self, {"ids": ids})

    def clear_prefetch(self) -> None:
        """Drop every queued prefetch (after an interrupted step). storage="host" only."""
        host_of(self).clear()

    def _apply(self, fn: Any, recurse: bool = True) -> Any:
        apply = super()._apply  # type: ignore[misc]
        if self._host is None:
            return apply(fn, recurse)
        return self._host.apply(fn, recurse, apply)       # the table stays on the host; the outputs move


def _output_device(device: torch.device) -> torch.device:
    if device.type not in ("cpu", "cuda"):
        raise ConfigError(f"storage='host' sends rows to a CUDA device (or keeps them on the CPU); got device "
                          f"{device}")
    return device


@dataclass
class Prefetched:
    """One gather, queued by ``prefetch`` (or made by ``forward``)."""

    host: dict[str, torch.Tensor | None]       # host copies of the lookup's inputs (ids, cu_seqlens, context)
    sent: dict[str, torch.Tensor | None]       # the same on the output device (the device-side comparison)
    rows: torch.Tensor                         # the rows, on the output device
    event: Any                                 # recorded on the side stream after the copies (None on the CPU)
    key: tuple[tuple[int, int], ...]           # (address, version) of the layer's host tensors at the gather
    grad: bool                                 # gathered with autograd recording


class _Send(torch.autograd.Function):
    """rows (..., W) on the host -> the same on ``device``: staged in pinned memory, ``non_blocking=True`` on the
    current (side) stream. Backward: the gradient back to pinned host memory; the host waits for that copy alone."""

    @staticmethod
    def forward(ctx: Any, rows: torch.Tensor, device: torch.device) -> torch.Tensor:
        return _to_device(rows, device)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        host = RUNTIME.pinned_empty(tuple(grad.shape), grad.dtype)
        host.copy_(grad, non_blocking=True)                                        # (..., W) device -> host
        done = RUNTIME.event()
        done.record(RUNTIME.current_stream(grad.device))
        done.synchronize()                  # the host's one wait: the host table's backward reads these values
        return host, None


def _to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host tensor -> ``device`` through a pinned staging buffer, ``non_blocking=True`` on the current stream."""
    staging = RUNTIME.pinned_empty(tuple(t.shape), t.dtype)
    staging.copy_(t)
    return staging.to(device, non_blocking=True)


def _as_host_tensor(x: Any) -> torch.Tensor:
    """A host copy of a lookup input that the layer has accepted (a tensor, an array, a list)."""
    if isinstance(x, torch.Tensor):
        return x.detach().clone()
    return torch.as_tensor(np.array(x))


def _on_device(x: Any) -> bool:
    return isinstance(x, torch.Tensor) and x.device.type not in ("cpu", "meta")


class HostTable:
    """The host side of a layer built with ``storage="host"``: where its outputs go, the queue of prefetched rows
    and the side stream of each device (see the module doc)."""

    def __init__(self, device: torch.device) -> None:
        self._probe = torch.zeros(0, device=device)            # (0,) float32 where the outputs go: moved by apply
        self.queue: deque[Prefetched] = deque()
        self._streams: dict[torch.device, Any] = {}

    @property
    def device(self) -> torch.device:
        """Where the outputs go: the device the layer was moved to (the model's)."""
        return self._probe.device

    def __len__(self) -> int:
        """How many prefetches are queued."""
        return len(self.queue)

    def __getstate__(self) -> dict[str, Any]:
        """A copy (``copy.deepcopy``, pickling) keeps where the outputs go; not the queue or the streams (CUDA
        streams and events do not copy)."""
        return {"_probe": self._probe}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._probe, self.queue, self._streams = state["_probe"], deque(), {}

    def clear(self) -> None:
        """Drop every queued prefetch."""
        self.queue.clear()

    # -- lookups -----------------------------------------------------------------------------------
    @torch.compiler.disable
    def prefetch(self, layer: nn.Module, inputs: dict[str, Any]) -> None:
        """Gather the rows of ``inputs`` (host ids, as the layer's forward takes them) now and start their copy to
        the output device; the next ``forward`` that is not served by an older prefetch consumes them."""
        name = type(layer).__name__
        for key, x in inputs.items():
            if _on_device(x):
                raise ConfigError(f"{name}.prefetch: {key} must be on the host (as a tokenizer or a data loader "
                                  f"gives them), got a tensor on {x.device}: reading it here would be a host sync")
        self.queue.append(self._gather(layer, inputs))

    @torch.compiler.disable
    def forward(self, layer: Any, inputs: dict[str, Any]) -> torch.Tensor:
        """The layer's output on the output device: the oldest prefetch (checked against ``inputs``), or, with
        none queued, the rows of host ``inputs`` gathered and sent now."""
        name = type(layer).__name__
        if not self.queue:
            if self.device.type == "cpu":
                return layer._lookup(**inputs)                                    # type: ignore[no-any-return]
            given = [k for k, x in inputs.items() if _on_device(x)]
            if given:
                raise ConfigError(f"{name} keeps its table on the host (storage='host'): {given[0]} on "
                                  f"{inputs[given[0]].device} with no prefetched rows would be read on the host "
                                  f"(a host sync); expected host {given[0]}, or layer.prefetch(...) of them first")
            return self._consume(self._gather(layer, inputs, send_inputs=False), {})     # host inputs: none to check
        entry = self.queue[0]
        self._check_pairing(name, entry, inputs)
        self.queue.popleft()
        device_inputs = {k: x for k, x in inputs.items() if _on_device(x)}
        if entry.key != _state_key(layer) or (_records(layer) and not entry.grad):
            entry = self._gather(layer, entry.host, send_inputs=bool(device_inputs))   # stale: gathered again
        return self._consume(entry, device_inputs)

    def _check_pairing(self, name: str, entry: Prefetched, inputs: dict[str, Any]) -> None:
        """Shapes (and which inputs are given) on the host; values of host inputs on the host. Raises ConfigError
        before anything is consumed."""
        for key, x in inputs.items():
            want = entry.host[key]
            if (x is None) != (want is None):
                raise ConfigError(f"{name}.forward: {key} {'not ' if x is None else ''}given, but the prefetched "
                                  f"call (the oldest queued) had {'none' if want is None else key}; forward consumes "
                                  "prefetches in the order they were made (clear_prefetch() drops them)")
            if x is None or want is None:
                continue
            try:
                got = x if isinstance(x, torch.Tensor) else _as_host_tensor(x)
            except (TypeError, ValueError, RuntimeError):
                got = None
            if got is None or got.is_floating_point() or got.is_complex():
                raise ConfigError(f"{name}.forward: {key} are not integer ids like the oldest prefetched {key} "
                                  f"(an integer tensor of shape {tuple(want.shape)}); got {type(x).__name__}")
            if tuple(got.shape) != tuple(want.shape):
                raise ConfigError(f"{name}.forward: {key} of shape {tuple(got.shape)}, but the oldest prefetched "
                                  f"{key} have shape {tuple(want.shape)}; forward consumes prefetches in the order "
                                  "they were made (clear_prefetch() drops them)")
            if not _on_device(got) and not bool((got == want).all()):
                raise ConfigError(f"{name}.forward: {key} differ from the oldest prefetched {key} (same shape "
                                  f"{tuple(want.shape)}); forward consumes prefetches in the order they were made "
                                  "(clear_prefetch() drops them)")

    def _gather(self, layer: Any, inputs: dict[str, Any], *, send_inputs: bool = True) -> Prefetched:
        """Steps 1-2 of the module doc: the layer's own lookup on the host, then the copy to the output device
        (``send_inputs``: the inputs too, for a forward with device inputs to be compared with on the device)."""
        rows = layer._lookup(**inputs)                                            # (..., W) on the host
        host = {k: None if x is None else _as_host_tensor(x) for k, x in inputs.items()}
        key, grad = _state_key(layer), _records(layer)
        if self.device.type == "cpu":
            return Prefetched(host, host, rows, None, key, grad)
        stream = self._stream()
        with RUNTIME.use_stream(stream):
            sent_rows = _Send.apply(rows, self.device) if rows.requires_grad else _to_device(rows, self.device)
            sent = {k: None if t is None or not send_inputs else _to_device(t, self.device) for k, t in host.items()}
            event = RUNTIME.event()
            event.record(stream)
        return Prefetched(host, sent, sent_rows, event, key, grad)

    def _consume(self, entry: Prefetched, device_inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        """Step 3: the current stream waits for the copies; device inputs must equal the prefetched ones (one
        device-side assert each)."""
        if entry.event is not None:
            stream = RUNTIME.current_stream(self.device)
            stream.wait_event(entry.event)
            for t in (entry.rows, *entry.sent.values()):
                if t is not None:
                    RUNTIME.record_stream(t, stream)
        for key, x in device_inputs.items():
            want = entry.sent[key]
            assert want is not None                                               # checked by _check_pairing
            torch._assert_async((x == want).all(), f"{key} differ from the prefetched {key} (storage='host')")
        return entry.rows if torch.is_grad_enabled() else entry.rows.detach()

    def _stream(self) -> Any:
        if self.device not in self._streams:
            self._streams[self.device] = RUNTIME.stream(self.device)
        return self._streams[self.device]

    # -- moves -------------------------------------------------------------------------------------
    def apply(self, fn: Callable[[torch.Tensor], torch.Tensor], recurse: bool,
              module_apply: Callable[..., nn.Module]) -> nn.Module:
        """``nn.Module._apply`` of a host-stored layer: ``fn``'s device decides where the outputs go; its float
        cast (if any) applies to the host tensors, which stay on the host. A new output device drops the queue."""
        probe32, probe64 = fn(self._probe), fn(self._probe.double())     # (0,) tensors: what fn does to a table
        device = _output_device(probe32.device)
        cast = None if (probe32.dtype, probe64.dtype) == (torch.float32, torch.float64) else probe32.dtype

        def keep(t: torch.Tensor) -> torch.Tensor:
            return t.to(cast) if cast is not None and t.is_floating_point() else t

        out = module_apply(fn if device.type == "cpu" else keep, recurse)
        if device != self.device:
            self.queue.clear()
        self._probe = probe32.float()
        return out


def _state_key(layer: nn.Module) -> tuple[tuple[int, int], ...]:
    """(address, version counter) of every tensor of the layer: what its rows depend on."""
    return tuple((t.data_ptr(), t._version) for t in (*layer.parameters(), *layer.buffers()))


def _records(layer: nn.Module) -> bool:
    """Whether a lookup now records autograd (grad mode on and a table that takes gradient)."""
    return torch.is_grad_enabled() and any(p.requires_grad for p in layer.parameters())
