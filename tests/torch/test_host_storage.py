"""Tables kept in host memory (``storage="host"``, ``tokenpos.torch.host_table``; issue 51 item 3): each of the three
torch input tables, host-stored, equals the same table stored on the device: forward, gradients (row-sparse on the
host, compared as their dense equivalents), an optimiser step; with and without ``prefetch``.

The device is fake CUDA (``tests/torch/fake_cuda.py``: tensors that say ``cuda:0`` over CPU data, under a detector
that refuses every host sync and every pageable or blocking copy); the host table's CUDA calls (side stream, events,
pinned allocation, ``record_stream``) go to :class:`~tests.torch.fake_cuda.FakeRuntime`, which logs them, so the
order of copies, records and waits is checked, and the bytes that cross are counted. The device-stored twin runs its
own CUDA path there (the Triton kernels, through Triton's interpreter). Upstream gradients hold small integers and
the multipliers are powers of two (sqrt(16), sqrt(4)), so dense and row-sparse sums are exact in float32.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import _disable_current_modes

import tokenpos.torch as tpt
from tests.ngram_cases import tiny_ngram_kwargs
from tests.tolerances import TOL
from tests.torch.fake_cuda import FakeCuda, FakeRuntime, HostSync, cpu_of, no_host_sync, pinned_empty, to_fake_cuda
from tests.torch.test_no_host_sync import fake_cuda_module
from tokenpos.tables.errors import ConfigError, TokenIdError
from tokenpos.torch import host_table

V = 13
CUDA0 = torch.device("cuda", 0)
IDS = torch.tensor([[3, 7, 9, 3, 12], [1, 4, 2, 6, 2]])               # a repeated id, the padding id 2
OTHER = torch.tensor([[5, 5, 8, 0, 11], [10, 4, 1, 6, 9]])

LAYERS: dict[str, Callable[..., Any]] = {
    "token": lambda **kw: tpt.TokenEmbedding(V, 16, seed=0, scale=True, padding_idx=2, **kw),   # multiplier 4
    "per_layer": lambda **kw: tpt.PerLayerEmbedding(V, 3, 4, seed=0, padding_idx=2, **kw),     # multiplier 2
    "ngram": lambda **kw: tpt.HashedNgramEmbedding(**tiny_ngram_kwargs(V), **kw),
}


def calls(name: str, ids: torch.Tensor = IDS) -> list[dict[str, Any]]:
    """The forward inputs tested per layer: ids (B, L); the hashed table also packed with cu_seqlens and a
    context, and a decode step with a context."""
    out: list[dict[str, Any]] = [{"ids": ids}]
    if name == "ngram":
        out.append({"ids": ids.reshape(-1), "cu_seqlens": torch.tensor([0, 4, 4, 10]),
                    "context": torch.tensor([[1, 2], [3, 4], [5, 6]])})
        out.append({"ids": ids[:, 2:], "context": ids[:, :2]})
    return out


def split(inputs: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    return inputs["ids"], {k: v for k, v in inputs.items() if k != "ids"}


def call(layer: Any, inputs: dict[str, Any]) -> torch.Tensor:
    """``layer(ids, **the rest)``."""
    ids, kw = split(inputs)
    return layer(ids, **kw)  # type: ignore[no-any-return]


def prefetch_inputs(layer: Any, inputs: dict[str, Any]) -> None:
    """``layer.prefetch(ids, **the rest)`` under the detector (a prefetch is on the device path: no host sync)."""
    ids, kw = split(inputs)
    with no_host_sync():
        layer.prefetch(ids, **kw)


def on_fake(inputs: dict[str, Any]) -> dict[str, Any]:
    return {k: to_fake_cuda(v) for k, v in inputs.items()}


def pair(name: str, **kw: Any) -> tuple[Any, Any]:
    """(the device-stored layer, the host-stored one) with the same state, both on the CPU."""
    device, host = LAYERS[name](**kw), LAYERS[name](storage="host", **kw)
    host.load_state_dict(device.state_dict())
    return device, host


def to_fake(module: Any) -> Any:
    with _disable_current_modes():
        return fake_cuda_module(module)


def int_grad(shape: tuple[int, ...], seed: int = 0) -> torch.Tensor:
    """An upstream gradient of small integers (exact sums in float32)."""
    return torch.randint(-4, 5, shape, generator=torch.Generator().manual_seed(seed)).float()


def dense(g: torch.Tensor) -> torch.Tensor:
    return g.to_dense() if g.is_sparse else cpu_of(g)


@pytest.fixture
def runtime(monkeypatch: pytest.MonkeyPatch) -> FakeRuntime:
    rt = FakeRuntime()
    monkeypatch.setattr(host_table, "RUNTIME", rt)
    return rt


# ------------------------------------------------------------------------------------------ construction


@pytest.mark.parametrize("name", LAYERS)
def test_a_host_table_lives_on_the_host_and_its_outputs_go_to_the_model_device(name: str, runtime: FakeRuntime
                                                                                ) -> None:
    layer = to_fake(LAYERS[name](storage="host"))
    assert all(type(t) is not FakeCuda and t.device.type == "cpu" for t in (*layer.parameters(), *layer.buffers()))
    assert layer._host.device == torch.device("cuda", 0) and "storage='host'" in repr(layer)
    assert layer.sparse                                                       # a host table's gradient: row-sparse
    with no_host_sync():
        out = layer(**calls(name)[0])
    assert isinstance(out, FakeCuda)
    # a float cast applies to the table, which stays on the host; a move back brings the outputs to the CPU
    layer.to(torch.float64)
    assert layer.weight.dtype == torch.float64 and layer.weight.device.type == "cpu"
    assert layer._host.device.type == "cuda"
    with no_host_sync():
        out = layer(**calls(name)[0])
    assert isinstance(out, FakeCuda) and out.dtype == torch.float64
    layer.half()
    assert layer.weight.dtype == torch.float16
    assert all(t.dtype == torch.int64 for t in layer.buffers())             # integer buffers are not cast
    prefetch_inputs(layer, calls(name)[0])
    layer.cpu()                                                               # another output device: queue dropped
    assert layer._host.device.type == "cpu" and layer.weight.device.type == "cpu" and len(layer._host) == 0
    assert layer(**calls(name)[0]).device.type == "cpu"


@pytest.mark.parametrize("name", LAYERS)
def test_state_dict_is_unchanged_and_round_trips(name: str, runtime: FakeRuntime) -> None:
    device, host = pair(name)
    host = to_fake(host)
    assert host.state_dict().keys() == device.state_dict().keys()
    for k, v in host.state_dict().items():
        assert v.device.type == "cpu" and type(v) is not FakeCuda and torch.equal(v, device.state_dict()[k])
    back = LAYERS[name]()
    back.load_state_dict(host.state_dict())
    assert all(torch.equal(a, b) for a, b in zip(back.state_dict().values(), device.state_dict().values(),
                                                  strict=True))


def test_from_pretrained_takes_storage() -> None:
    w = torch.randn(V, 16, generator=torch.Generator().manual_seed(1))
    layer = tpt.TokenEmbedding.from_pretrained(w, storage="host", freeze=False)
    assert layer._host is not None and layer.sparse and torch.equal(layer.weight, w)
    layer.prefetch(IDS)
    assert torch.equal(layer(IDS), w[IDS])


def test_storage_is_checked_and_prefetch_needs_a_host_table() -> None:
    with pytest.raises(ConfigError, match="storage must be one of 'device', 'host'; got 'disk'"):
        tpt.TokenEmbedding(V, 16, storage="disk")
    with pytest.raises(ConfigError, match="prefetch needs storage='host'"):
        tpt.TokenEmbedding(V, 16).prefetch(IDS)
    with pytest.raises(ConfigError, match="storage='host' sends rows to a CUDA device"):
        tpt.TokenEmbedding(V, 16, storage="host", device="meta")


# ------------------------------------------------------------------------------------------ values


@pytest.mark.parametrize("prefetch", [False, True])
@pytest.mark.parametrize("name", LAYERS)
def test_host_stored_equals_device_stored_forward_and_backward(name: str, prefetch: bool,
                                                               runtime: FakeRuntime) -> None:
    """Forward exactly; the row-sparse host gradient's dense equivalent exactly equals the device-stored layer's
    dense gradient (its CUDA path on fake CUDA); with a prefetch, forward takes device ids (checked on the device),
    without one, host ids."""
    device, host = pair(name)
    device, host = to_fake(device), to_fake(host)
    for k, inputs in enumerate(calls(name)):
        if prefetch:
            prefetch_inputs(host, inputs)
        with no_host_sync():
            got = call(host, on_fake(inputs) if prefetch else inputs)
            want = call(device, on_fake(inputs))
            assert isinstance(got, FakeCuda) and torch.equal(cpu_of(got), cpu_of(want))
            g = to_fake_cuda(int_grad(tuple(got.shape), seed=k))
            got.backward(g)
            want.backward(g)
        assert host.weight.grad.is_sparse and host.weight.grad.device.type == "cpu"
        assert torch.equal(dense(host.weight.grad), dense(device.weight.grad)), (name, k)
    assert len(host._host) == 0


@pytest.mark.parametrize("name", LAYERS)
def test_prefetch_then_forward_equals_forward_in_order(name: str, runtime: FakeRuntime) -> None:
    """Several prefetches queue; each forward consumes the oldest. On a CPU run too (the ordinary layer)."""
    for fake in (False, True):
        device, host = pair(name)
        if fake:
            device, host = to_fake(device), to_fake(host)
        batches = calls(name) + calls(name, OTHER)
        for inputs in batches:
            prefetch_inputs(host, inputs)
        assert len(host._host) == len(batches)
        with torch.no_grad(), no_host_sync():
            for inputs in batches:
                got = call(host, inputs)                                      # host ids: compared on the host
                want = call(device, on_fake(inputs) if fake else inputs)
                assert torch.equal(cpu_of(got), cpu_of(want))
                assert not got.requires_grad
        assert len(host._host) == 0


@pytest.mark.parametrize("weight_dtype", [torch.int8, torch.float8_e4m3fn])
@pytest.mark.parametrize("name", LAYERS)
def test_an_8bit_table_is_gathered_by_its_own_path(name: str, weight_dtype: torch.dtype, runtime: FakeRuntime) -> None:
    """An 8-bit table (``weight_dtype``) host-stored: its own dequantising lookup on the host, the same values as
    the device-stored 8-bit table; it takes no gradient, so no sparse gradient is set up. A float cast of the layer
    reaches the scales (and the output), not the 8-bit table, as on the device."""
    device, host = pair(name, weight_dtype=weight_dtype)
    assert not host.sparse and host.weight.dtype == weight_dtype
    device, host = to_fake(device), to_fake(host)
    for inputs in calls(name):
        prefetch_inputs(host, inputs)
        with no_host_sync():
            got, want = call(host, on_fake(inputs)), call(device, on_fake(inputs))
        assert torch.equal(cpu_of(got), cpu_of(want)) and not got.requires_grad
    host.double()
    assert host.weight.dtype == weight_dtype and host.weight_scale.dtype == torch.float64
    assert host.weight.device.type == "cpu"


def test_the_hashed_table_takes_sparse_gradients() -> None:
    """``sparse=True`` on the device-stored hashed table: the same values, and a row-sparse gradient whose dense
    equivalent is the dense one (the NumPy twin has no ``sparse``: tests/test_signatures.py)."""
    dense_layer = LAYERS["ngram"]()
    sparse_layer = LAYERS["ngram"](sparse=True)
    for k, inputs in enumerate(calls("ngram")):
        ids, kw = split(inputs)
        a, b = dense_layer(ids, **kw), sparse_layer(ids, **kw)
        assert torch.equal(a, b)
        g = int_grad(tuple(a.shape), seed=k)
        a.backward(g)
        b.backward(g)
        assert sparse_layer.weight.grad.is_sparse
        assert torch.equal(sparse_layer.weight.grad.to_dense(), dense_layer.weight.grad)


# ------------------------------------------------------------------------------------------ training


# Adam and SparseAdam place eps differently (dense: sqrt(v) / sqrt(bc2) + eps; sparse: sqrt(v) + eps, the step scaled):
# a tiny eps leaves the same update in both, to float64 rounding
OPTIMISERS = {"SparseAdam": (lambda p: torch.optim.SparseAdam(p, lr=0.1, eps=1e-30),
                             lambda p: torch.optim.Adam(p, lr=0.1, eps=1e-30)),
              "SGD": (lambda p: torch.optim.SGD(p, lr=0.25), lambda p: torch.optim.SGD(p, lr=0.25))}


@pytest.mark.parametrize("optimiser", OPTIMISERS)
@pytest.mark.parametrize("name", LAYERS)
def test_an_optimiser_step_on_the_host_table_equals_the_device_table(name: str, optimiser: str,
                                                                      runtime: FakeRuntime) -> None:
    """Two steps of SparseAdam (SGD) on the host table's row-sparse gradient give exactly what they give on the
    device-stored table with ``sparse=True``, and what Adam (SGD) gives on a dense device table for the touched rows,
    to float64 rounding (sparse SGD adds a repeated row's slices one by one, dense SGD their sum); untouched rows
    stay exactly as they were. The host table's second step reads rows prefetched before the first step's update,
    which the optimiser's in-place write makes stale: gathered again."""
    inputs = calls(name)[0]
    g = int_grad((*IDS.shape, *LAYERS[name]()(IDS).shape[2:])).double()
    sparse_opt, dense_opt = OPTIMISERS[optimiser]
    results = {}
    for kind in ("host", "device sparse", "device dense"):
        f64 = {"dtype": torch.float64}                     # float64: the dense Adam's rounding far below the check
        layer = (LAYERS[name](storage="host", **f64) if kind == "host"
                 else LAYERS[name](sparse=kind == "device sparse", **f64))
        layer = to_fake(layer) if kind == "host" else layer
        opt = dense_opt([layer.weight]) if kind == "device dense" else sparse_opt([layer.weight])
        for step in range(2):
            with no_host_sync():
                out = call(layer, inputs)                 # host, step 1: the prefetch made before the step below
                out.backward((to_fake_cuda(g) if kind == "host" else g) + out.detach())   # reads the values
                if kind == "host" and step == 0:          # too early (the step changes the rows): gathered again
                    layer.prefetch(IDS)
            opt.step()
            opt.zero_grad()
        results[kind] = layer.weight.detach().clone()
    touched = torch.zeros(results["host"].shape[0], dtype=torch.bool)
    rows = (LAYERS[name]().hash_rows(IDS).reshape(-1) if name == "ngram" else IDS.reshape(-1))
    touched[rows] = True
    if name != "ngram":
        touched[2] = False                                                # the padding row takes no gradient
    initial = LAYERS[name](dtype=torch.float64).weight.detach()
    assert torch.equal(results["host"], results["device sparse"])
    torch.testing.assert_close(results["host"][touched], results["device dense"][touched], **TOL["forward.float64"])
    assert torch.equal(results["host"][~touched], initial[~touched])
    assert not torch.equal(results["host"][touched], initial[touched])


@pytest.mark.parametrize("name", LAYERS)
def test_a_prefetch_made_before_the_table_changed_is_gathered_again(name: str, runtime: FakeRuntime) -> None:
    """Rows prefetched before an optimiser step (or under no_grad, for a forward that records) are gathered again
    at forward from the prefetched host ids: the values are the table's at forward, and the gradient flows."""
    device, host = pair(name)
    host = to_fake(host)
    prefetch_inputs(host, {"ids": IDS})
    with torch.no_grad():
        host.weight.add_(1.0)                                             # as an optimiser step would
        device.weight.add_(1.0)
    with no_host_sync():
        got = host(to_fake_cuda(IDS))
        assert torch.equal(cpu_of(got), device(IDS))
        got.backward(to_fake_cuda(int_grad(tuple(got.shape))))            # gathered with autograd: a gradient
    assert host.weight.grad is not None
    host.zero_grad()
    with torch.no_grad():
        prefetch_inputs(host, {"ids": IDS})
    with no_host_sync():
        out = host(IDS)
        out.backward(to_fake_cuda(int_grad(tuple(out.shape))))
    assert host.weight.grad is not None and host.weight.grad.is_sparse


# ------------------------------------------------------------------------------------------ pairing and refusals


@pytest.mark.parametrize("name", LAYERS)
def test_a_mismatched_prefetch_is_loud(name: str, runtime: FakeRuntime) -> None:
    """Host ids that differ, a shape that differs, or a missing argument: a ConfigError before anything is consumed;
    device ids that differ: the device-side assert (never the prefetched rows returned as if they were these)."""
    host = to_fake(LAYERS[name](storage="host"))
    prefetch_inputs(host, {"ids": IDS})
    with pytest.raises(ConfigError, match="ids differ from the oldest prefetched ids"):
        host(OTHER)
    with pytest.raises(ConfigError, match=r"ids of shape \(2, 4\), but the oldest prefetched ids have shape"):
        host(IDS[:, :4])
    with pytest.raises(ConfigError, match="not integer ids"):
        host(IDS.float())
    if name == "ngram":
        with pytest.raises(ConfigError, match="context given, but the prefetched call"):
            host(IDS, context=IDS[:, :2])
    assert len(host._host) == 1                                           # nothing consumed
    with no_host_sync(), pytest.raises(RuntimeError, match="device-side assert triggered: ids differ from"):
        host(to_fake_cuda(OTHER))
    assert len(host._host) == 0
    prefetch_inputs(host, {"ids": IDS})
    host.clear_prefetch()
    assert len(host._host) == 0


def test_device_ids_without_a_prefetch_are_refused_and_prefetch_wants_host_ids(runtime: FakeRuntime) -> None:
    host = to_fake(LAYERS["token"](storage="host"))
    with no_host_sync(), pytest.raises(ConfigError, match=r"ids on cuda:0 with no prefetched rows .*prefetch"):
        host(to_fake_cuda(IDS))
    with pytest.raises(ConfigError, match="must be on the host"):
        host.prefetch(to_fake_cuda(IDS))
    with pytest.raises(TokenIdError):                                      # the layer's own check, at prefetch
        host.prefetch(torch.tensor([[0, V]]))
    assert len(host._host) == 0
    with pytest.raises(ConfigError, match="reads the whole table"):
        host.attend(to_fake_cuda(torch.zeros(2, 16)))


# ------------------------------------------------------------------------------------------ the device path


@pytest.mark.parametrize("name", LAYERS)
def test_a_forward_of_host_ids_without_a_prefetch_sends_only_the_rows(name: str, runtime: FakeRuntime) -> None:
    """Host ids with nothing prefetched: gathered and sent at once; the ids stay on the host (there is nothing on
    the device to compare them with), so the rows are the only bytes that cross."""
    host = to_fake(LAYERS[name](storage="host"))
    for inputs in calls(name):
        with no_host_sync() as mode:
            out = call(host, inputs)
        assert [(d, n) for d, n, _ in mode.copies] == [("h2d", out.numel() * out.element_size())]


@pytest.mark.parametrize("name", LAYERS)
def test_no_host_sync_and_only_the_gathered_rows_cross(name: str, runtime: FakeRuntime) -> None:
    """Under the fake-CUDA detector: prefetch, then forward with device ids and backward, make no host sync and no
    pageable or blocking copy. The copies are pinned and non-blocking: to the device, the gathered rows and the ids
    (on the side stream); back, the rows' gradient. The consuming stream waits on the copies' event (a device
    wait) and record_streams them; the host's one wait is the event after the gradient's copy, in backward."""
    big = {"token": lambda: tpt.TokenEmbedding(1000, 16, seed=0, storage="host"),
           "per_layer": lambda: tpt.PerLayerEmbedding(1000, 3, 4, seed=0, storage="host"),
           "ngram": lambda: tpt.HashedNgramEmbedding(**{**tiny_ngram_kwargs(V), "engram_vocab_size": [997, 991]},
                                                     storage="host")}
    host = to_fake(big[name]())
    table_bytes = host.weight.numel() * host.weight.element_size()
    for inputs in calls(name):
        runtime.log.clear()
        runtime.host_waits.clear()
        with no_host_sync() as mode:
            host.prefetch(inputs["ids"], **split(inputs)[1])
            out = call(host, on_fake(inputs))
            assert runtime.host_waits == []                                    # forward: no host wait
            side = {s for op, *_, s in runtime.log if op == "record"}
            assert len(side) == 1 and side != {"default"}
            sent = [(d, n) for d, n, s in mode.copies]
            given = sum(t.numel() * t.element_size() for t in inputs.values())
            row_bytes = out.numel() * out.element_size()
            assert sent == ([("h2d", row_bytes)] + [("h2d", t.numel() * t.element_size()) for t in inputs.values()])
            assert all(s in side for _, _, s in mode.copies)
            assert row_bytes + given == sum(n for _, n in sent) and row_bytes < table_bytes
            kinds = [op for op, *_ in runtime.log]
            assert kinds.index("record") < kinds.index("wait_event") < kinds.index("record_stream")
            out.backward(to_fake_cuda(int_grad(tuple(out.shape))))
        assert mode.copies[-1][:2] == ("d2h", row_bytes)
        assert len(runtime.host_waits) == 1 and runtime.log[-1][0] == "host_wait"
        host.zero_grad()


def test_the_detector_refuses_pageable_and_blocking_copies() -> None:
    """The fake-CUDA detector allows exactly the copies a host table makes: pinned and non-blocking."""
    pinned = pinned_empty((3,), torch.float32)
    pinned.copy_(torch.arange(3.0))
    with no_host_sync() as mode:
        on = pinned.to(CUDA0, non_blocking=True)
        assert isinstance(on, FakeCuda) and torch.equal(cpu_of(on), torch.arange(3.0))
        back = pinned_empty((3,), torch.float32)
        back.copy_(on, non_blocking=True)
        assert torch.equal(back, torch.arange(3.0))
        with pytest.raises(HostSync):
            torch.arange(3.0).to(CUDA0, non_blocking=True)                  # pageable
        with pytest.raises(HostSync):
            pinned.to(CUDA0)                                                 # blocking
        with pytest.raises(HostSync):
            torch.zeros(3).copy_(on, non_blocking=True)                     # pageable destination
        with pytest.raises(HostSync):
            pinned_empty((3,), torch.float32).copy_(on)                      # blocking
    assert [d for d, _, _ in mode.copies] == ["h2d", "d2h"]


def test_a_module_copy_keeps_the_output_device_not_the_queue(runtime: FakeRuntime) -> None:
    """``copy.deepcopy`` of a used host-stored layer (a queued prefetch, a side stream): the copy sends to the same
    device, with an empty queue and streams of its own (CUDA streams and events do not copy)."""
    host = to_fake(LAYERS["token"](storage="host"))
    prefetch_inputs(host, {"ids": IDS})
    twin = copy.deepcopy(host)
    assert len(twin._host) == 0 and len(host._host) == 1 and twin._host._streams == {}
    assert twin._host.device == host._host.device and twin.weight.device.type == "cpu"
    prefetch_inputs(twin, {"ids": IDS})
    with no_host_sync():
        assert torch.equal(cpu_of(twin(to_fake_cuda(IDS))), cpu_of(host(to_fake_cuda(IDS))))


# ------------------------------------------------------------------------------------------ torch.compile


@pytest.mark.parametrize("name", LAYERS)
def test_torch_compile_runs_the_host_path_eagerly(name: str) -> None:
    """torch.compile of a model holding a host-stored table: the host path is left out of the graph
    (``torch.compiler.disable``), the rest compiled; the same values and gradients as eager, with a prefetch."""
    torch._dynamo.reset()

    class Model(torch.nn.Module):
        def __init__(self, table: Any) -> None:
            super().__init__()
            self.table = table

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            return torch.tanh(self.table(ids)).sum(-1)

    eager = Model(LAYERS[name](storage="host"))
    compiled_model = copy.deepcopy(eager)
    compiled = torch.compile(compiled_model, backend="eager")
    compiled_model.table.prefetch(IDS)
    got, want = compiled(IDS), eager(IDS)
    assert torch.equal(got, want)
    got.sum().backward()
    want.sum().backward()
    assert torch.equal(compiled_model.table.weight.grad.to_dense(), eager.table.weight.grad.to_dense())


# ------------------------------------------------------------------------------------------ real CUDA


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (benchmarks/gpu_check.sh runs it)")
@pytest.mark.parametrize("name", LAYERS)
def test_host_storage_on_real_cuda(name: str) -> None:  # pragma: no cover - GPU only
    """On a GPU: ``.to("cuda")`` keeps the table on the host; prefetch then forward with device ids equals the
    device-stored layer, and neither makes a synchronising CUDA call (sync debug mode "error"); backward gives the
    row-sparse host gradient whose dense equivalent is the device-stored layer's gradient."""
    device, host = pair(name)
    device, host = device.to("cuda"), host.to("cuda")
    assert host.weight.device.type == "cpu" and host._host.device.type == "cuda"
    for k, inputs in enumerate(calls(name)):
        dev_inputs = {key: v.cuda() for key, v in inputs.items()}
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            host.prefetch(inputs["ids"], **split(inputs)[1])
            got, want = call(host, dev_inputs), call(device, dev_inputs)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        assert got.device.type == "cuda" and torch.equal(got, want)
        g = int_grad(tuple(got.shape), seed=k).cuda()
        got.backward(g)
        want.backward(g)
        assert host.weight.grad.is_sparse and host.weight.grad.device.type == "cpu"
        assert torch.equal(host.weight.grad.to_dense(), device.weight.grad.cpu())
