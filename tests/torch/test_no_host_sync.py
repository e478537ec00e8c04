"""No host sync on CUDA, checked on the CPU: every public torch layer runs on tensors that claim
``cuda:0`` under a dispatch mode that refuses every host sync (``tests/torch/fake_cuda.py``: any
data-dependent scalar read, ``nonzero`` and its kin, and every host <-> device copy), training
(forward + backward, dropout on) and eval, and gives the CPU layer's results (the Triton kernels run
there through Triton's interpreter; plain torch elsewhere).

With a GPU the same cases also run for real under ``torch.cuda.set_sync_debug_mode("error")``. The cases are
derived: every registered shortcut in ``TransformerEmbedding``, and every registered scheme without a hand-written
case by its registry defaults, called as its kind says (``tests/public_layers.py``; ``tests/test_coverage_lists.py``
checks that every public layer has a case).

Also here: the CUDA error contract (a bad id / position / target fails a device-side assert, not a
silent zero row, and nothing is read), the device-side dropout seed (drawn by a device op, fresh per
call: what makes a CUDA-graph replay draw fresh masks), and the dynamic-NTK state kept on the device.
"""

from __future__ import annotations

import contextlib
import copy
import datetime
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch.utils._python_dispatch import _disable_current_modes

import tokenpos.torch as tpt
from tests.ngram_cases import tiny_ngram_kwargs
from tests.public_layers import build_scheme_layer, covered, derived_case
from tests.torch.distributed.harness import free_port
from tests.torch.fake_cuda import FakeCuda, HostSync, cpu_of, no_host_sync, to_fake_cuda
from tests.triton_mode import ON_CUDA as TRITON_COMPILED
from tokenpos.tables.errors import ConfigError
from tokenpos.tables.registry import SHORTCUTS, scheme_class
from tokenpos.torch.distributed import VocabParallelEmbedding, vocab_parallel_cross_entropy

ON_CUDA = torch.cuda.is_available()
B, H, L, DH, D, V = 2, 2, 5, 8, 8, 13


# ------------------------------------------------------------------------------------------- devices


class Device:
    """How a case puts its modules and tensors on a device: the CPU, fake CUDA, or real CUDA."""

    def __init__(self, kind: str) -> None:
        self.kind = kind

    def t(self, x: torch.Tensor) -> torch.Tensor:
        """An input on the device (a copy to the device: the test's setup, outside the check)."""
        if self.kind == "cpu":
            return x.detach().clone().requires_grad_(x.requires_grad)
        if self.kind == "fake":
            return to_fake_cuda(x)
        with syncs_allowed():
            return x.detach().to("cuda").requires_grad_(x.requires_grad)

    def m(self, module: Any) -> Any:
        """The module on the device (moving it is a copy to the device: outside the detector)."""
        if self.kind == "cpu":
            return module
        if self.kind == "cuda":
            with syncs_allowed():
                return module.to("cuda")
        with _disable_current_modes():
            return fake_cuda_module(module)


def fake_cuda_module(module: Any) -> Any:
    """``module`` with every parameter and buffer a fake CUDA tensor (parameters stay parameters)."""
    old = torch.__future__.get_swap_module_params_on_conversion()
    torch.__future__.set_swap_module_params_on_conversion(True)
    try:
        return module._apply(lambda t: t if isinstance(t, FakeCuda) else to_fake_cuda(t))
    finally:
        torch.__future__.set_swap_module_params_on_conversion(old)


@contextlib.contextmanager
def syncs_allowed() -> Iterator[None]:
    """Real CUDA: the test's own copies between host and device (setup, reading results) are not the
    layers' syncs: ``torch.cuda.set_sync_debug_mode`` is set aside for them."""
    if not torch.cuda.is_available():
        yield
        return
    mode = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("default")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode(mode)


def host(x: Any) -> Any:
    """A result as a CPU tensor, for comparisons outside the detector (and, on real CUDA, outside
    the sync debug mode)."""
    if isinstance(x, torch.Tensor):
        x = cpu_of(x)
        with syncs_allowed():
            return x.detach().cpu()
    return x


# --------------------------------------------------------------------------------------------- cases

Case = Callable[[Device, bool], tuple[list[torch.Tensor], list[torch.Tensor]]]
"""(device, train) -> (outputs, tensors whose gradients are compared)."""


def _randn(*shape: int, seed: int = 0, grad: bool = True) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).requires_grad_(grad)


IDS = torch.tensor([[3, 7, 9, 0, 12], [1, 4, 5, 6, 2]])
POS = torch.tensor([[0, 1, 2, 3, 4], [6, 2, 3, 9, 11]])


def _params(m: Any) -> list[torch.Tensor]:
    return [p for p in m.parameters() if p.requires_grad]


def token_case(dev: Device, train: bool, **kw: Any) -> Any:
    m = dev.m(tpt.TokenEmbedding(V, D, seed=0, **kw).train(train))
    return [m(dev.t(IDS))], _params(m)


def per_layer_case(dev: Device, train: bool, **kw: Any) -> Any:
    m = dev.m(tpt.PerLayerEmbedding(V, 3, 4, seed=0, **kw).train(train))
    ids = IDS + V // 2 if kw.get("out_of_range") == "zero" else IDS           # "zero": some ids past the table
    return [m(dev.t(ids))], _params(m)


def ngram_case(dev: Device, train: bool) -> Any:
    m = dev.m(tpt.HashedNgramEmbedding(**tiny_ngram_kwargs(V)).train(train))
    packed = m(dev.t(IDS.reshape(-1)), cu_seqlens=dev.t(torch.tensor([0, 4, 4, 10])), context=dev.t(POS[:, 1:4].T))
    return [m(dev.t(IDS)), packed, m(dev.t(IDS[:, 2:]), context=dev.t(IDS[:, :2]))], _params(m)


def engram_case(dev: Device, train: bool) -> Any:
    m = dev.m(tpt.EngramMemory(D, hc_mult=2, kernel_size=3, **tiny_ngram_kwargs(V)).train(train))
    cache = m.new_cache(3)                          # packed documents, then one decoding step each, from a cache
    packed = m(dev.t(_randn(10, 2, D, seed=1)), dev.t(IDS.reshape(-1)), cu_seqlens=dev.t(torch.tensor([0, 4, 4, 10])),
               cache=cache)
    step = m(dev.t(_randn(3, 1, 2, D, seed=2)), dev.t(IDS[:, :3].T[:, :1]), cache=cache)
    return [m(dev.t(_randn(2, 5, 2, D)), dev.t(IDS)), packed, step, cache.conv], _params(m)


def learned_case(dev: Device, train: bool) -> Any:
    m = dev.m(tpt.LearnedPositionalEmbedding(16, D, seed=0).train(train))
    return [m(dev.t(POS)), m(L)], _params(m)


def sinusoidal_case(dev: Device, train: bool) -> Any:
    m = dev.m(tpt.SinusoidalPositionalEncoding(8, D).train(train))
    return [m(dev.t(POS)), m(L), m(12)], []                    # positions past the table: the formula


def transformer_case(dev: Device, train: bool, positional: str, given: bool, **kw: Any) -> Any:
    m = tpt.TransformerEmbedding(V, D, 16, positional=positional, num_heads=H, dropout=0.25, seed=0, **kw)
    m = dev.m(m.train(train))
    tt = dev.t(torch.tensor([[0, 1, 1, 0, 0], [1, 1, 0, 0, 1]])) if kw.get("num_token_types") else None
    out = m(dev.t(IDS), dev.t(POS) if given else None, token_type_ids=tt)
    out2 = m(dev.t(IDS[0]), start_pos=3) if not given else out
    return [out, out2], _params(m)


def rotary_case(dev: Device, train: bool, layer: Callable[[], Any], positions: Any = None,
                key_positions: Any = None, steps: tuple[Any, ...] = (), rotate: str = "always") -> Any:
    m = dev.m(layer().train(train))
    q, k = dev.t(_randn(B, H, L, DH, seed=1)), dev.t(_randn(B, 1, L, DH, seed=2))
    kw = {} if key_positions is None else {"key_positions": dev.t(key_positions)}
    outs = list(m.apply(q, k, None if positions is None else dev.t(positions), **kw))
    for step in steps:                                        # more calls on the same layer (a state moves)
        outs += list(m.apply(q, k, dev.t(step)) if isinstance(step, torch.Tensor) else m.apply(q, k, start_pos=step))
    if rotate == "always" or (rotate == "eval" and not train):
        outs.append(m.rotate(q, None if positions is None else dev.t(positions)))
    return outs, [q, k]


def bias_case(dev: Device, train: bool, layer: Callable[[], Any]) -> Any:
    m = dev.m(layer().train(train))
    fn = m.bias if hasattr(m, "bias") and callable(m.bias) else m
    return [fn(3, 5), fn(5, 5)], _params(m)


def attention_case(dev: Device, train: bool, positional: Callable[[], Any] | None, **kw: Any) -> Any:
    m = None if positional is None else dev.m(positional().train(train))
    q, k, v = (dev.t(_randn(B, H, L, DH, seed=s)) for s in (3, 4, 5))
    kw = {name: dev.t(x) if isinstance(x, torch.Tensor) else x for name, x in kw.items()}
    out = tpt.scaled_dot_product_attention(q, k, v, positional=m, **kw)
    return [out], [q, k, v] + ([] if m is None else _params(m))


def norm_case(dev: Device, train: bool, cls: Any) -> Any:
    m = dev.m(cls(D).train(train))
    x = dev.t(_randn(B, L, D, seed=6))
    return [m(x)], [x, *_params(m)]


def none_case(dev: Device, train: bool, layer: Callable[[], Any]) -> Any:
    m = dev.m(layer().train(train))
    assert m(L) is None                                       # NoPE adds nothing
    return [], []


def additive_case(dev: Device, train: bool, layer: Callable[[], Any]) -> Any:
    m = dev.m(layer().train(train))
    return [m(dev.t(POS)), m(L)], _params(m)


def scheme_case(name: str) -> Case:
    """The case of registered scheme ``name`` without a hand-written one: its registry defaults (Dh = 8, H = 2),
    called as its kind says (rotary: q and k at POS, and ``rotate`` where one tensor rotates alone; bias: two
    shapes; additive: rows at POS and for L; none: nothing added)."""
    cls: Any = scheme_class(name, "torch")

    def layer() -> Any:
        return build_scheme_layer(cls.__name__, "torch")

    if cls.kind == "rotary":
        alone = hasattr(cls, "rotate") and not cls.rotates_qk_together
        return lambda d, t: rotary_case(d, t, layer, POS, rotate="always" if alone else "never")
    by_kind = {"bias": bias_case, "additive": additive_case, "none": none_case}
    return lambda d, t: by_kind[cls.kind](d, t, layer)


def sincos2d_case(dev: Device, train: bool) -> Any:
    m = dev.m(tpt.SinCos2DPositionalEncoding(2, 3, D, cls_token=True).train(train))
    return [m(), m(4)], []


def vocab_parallel_case(dev: Device, train: bool, **ce: Any) -> Any:
    emb = dev.m(VocabParallelEmbedding(V, D, seed=0, pad_to_multiple_of=8, padding_idx=2).train(train))
    h = emb(dev.t(IDS))                                                       # (B, L, D)
    logits = emb.attend(h * 1.5)                                              # (B, L, Vp): padding columns -inf
    targets = dev.t(torch.tensor([[1, 12, -100, 3, 0], [5, 5, 7, -100, 11]]))
    loss = vocab_parallel_cross_entropy(logits, targets, vocab_size=V, **ce)
    return [h, logits, loss], _params(emb)


ROPE = {"default": None, "dynamic": {"rope_type": "dynamic", "factor": 2.0},
        "longrope": {"rope_type": "longrope", "short_factor": [1.0, 1.1, 1.2, 1.3],
                     "long_factor": [1.0, 2.0, 3.0, 4.0], "original_max_position_embeddings": 8},
        "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8}}
FAR = torch.tensor([[0, 3, 17, 2, 9], [1, 1, 1, 30, 4]])               # past max_seq_len=8: dynamic grows


def _rope(scaling: str, **kw: Any) -> Callable[[], Any]:
    return lambda: tpt.RotaryEmbedding(DH, max_seq_len=8, scaling=ROPE[scaling], **kw)


HAND_CASES: dict[str, Case] = {
    "token": token_case,
    "token_scaled_padding": lambda d, t: token_case(d, t, scale=True, padding_idx=0),
    "per_layer": per_layer_case,
    "per_layer_zero_padding": lambda d, t: per_layer_case(d, t, out_of_range="zero", padding_idx=0),
    "ngram": ngram_case,
    "engram": engram_case,
    "per_layer_int8_zero": lambda d, t: per_layer_case(d, t, out_of_range="zero", weight_dtype=torch.int8),
    "learned": learned_case,
    "sinusoidal": sinusoidal_case,
    **{f"transformer_{p}_{'positions' if g else 'default'}": (lambda d, t, p=p, g=g: transformer_case(d, t, p, g))
       for p in SHORTCUTS for g in (False, True)},
    "transformer_types_norm": lambda d, t: transformer_case(d, t, "learned", False, num_token_types=2, norm="layernorm",
                                                            scale=True),
    "transformer_rmsnorm_sinusoidal": lambda d, t: transformer_case(d, t, "sinusoidal", True, norm="rmsnorm"),
    "transformer_roberta": lambda d, t: transformer_case(d, t, "learned", False, padding_idx=1,
                                                         position_ids="padding"),
    **{f"rope_{s}": (lambda d, t, s=s: rotary_case(d, t, _rope(s), FAR, steps=(POS, 2)))
       for s in ("default", "longrope", "yarn")},
    "rope_dynamic_growth_and_reset": lambda d, t: rotary_case(
        d, t, _rope("dynamic"), POS, steps=(FAR, POS, 20, torch.tensor([40, 1, 2, 3, 4]), 0, POS)),
    "rope_dynamic_range": lambda d, t: rotary_case(d, t, _rope("dynamic"), None, steps=(12, 0, FAR, 3)),
    "rope_key_positions": lambda d, t: rotary_case(d, t, _rope("dynamic"), POS[0], key_positions=FAR[1]),
    "rope_interleaved_blhd": lambda d, t: rotary_case(d, t, lambda: tpt.RotaryEmbedding(DH, interleaved=True), POS),
    "xpos": lambda d, t: rotary_case(d, t, lambda: tpt.XPosRotaryEmbedding(DH), POS[0], rotate="never"),
    "xpos_same_key_positions": lambda d, t: rotary_case(d, t, lambda: tpt.XPosRotaryEmbedding(DH), POS,
                                                        key_positions=POS, rotate="never"),
    "mrope_key_positions": lambda d, t: rotary_case(d, t, lambda: tpt.MRotaryEmbedding(DH, mrope_section=[2, 1, 1]),
                                                    POS[0], key_positions=FAR[0], rotate="never"),
    "mrope": lambda d, t: rotary_case(d, t, lambda: tpt.MRotaryEmbedding(DH, mrope_section=[2, 1, 1]),
                                      torch.stack([POS, POS + 1, POS * 2])),
    # rope2d's rotate is apply(x, x)[0]: its unused k' makes a CPU zero gradient (fake_cuda.py): eval only
    "rope2d": lambda d, t: rotary_case(d, t, lambda: tpt.RotaryEmbedding2D(DH),
                                       torch.tensor([[0, 0], [0, 1], [1, 0], [1, 1], [2, 3]]), rotate="eval"),
    "rope2d_same_key_positions": lambda d, t: rotary_case(d, t, lambda: tpt.RotaryEmbedding2D(DH),
                                                          torch.tensor([[0, 0], [0, 1], [1, 0], [1, 1], [2, 3]]),
                                                          key_positions=torch.tensor([[0, 0], [0, 1], [1, 0], [1, 1],
                                                                                      [2, 3]]), rotate="never"),
    "alibi": lambda d, t: bias_case(d, t, lambda: tpt.ALiBi(H)),
    "t5": lambda d, t: bias_case(d, t, lambda: tpt.T5RelativePositionBias(H, num_buckets=8, max_distance=16, seed=0)),
    "t5_causal": lambda d, t: bias_case(d, t, lambda: tpt.T5RelativePositionBias(H, bidirectional=False, seed=0)),
    "fire": lambda d, t: bias_case(d, t, lambda: tpt.FIRE(H, width=4, seed=0)),
    "kerple": lambda d, t: bias_case(d, t, lambda: tpt.KERPLE(H, seed=0)),
    "attention_plain": lambda d, t: attention_case(d, t, None),
    "attention_rope": lambda d, t: attention_case(d, t, _rope("default"), positions=POS),
    "attention_rope_dynamic": lambda d, t: attention_case(d, t, _rope("dynamic"), start_pos=9),
    "attention_alibi": lambda d, t: attention_case(d, t, lambda: tpt.ALiBi(H)),
    "attention_t5": lambda d, t: attention_case(d, t, lambda: tpt.T5RelativePositionBias(H, seed=0)),
    "attention_fire_mask": lambda d, t: attention_case(d, t, lambda: tpt.FIRE(H, width=4, seed=0), causal=False,
                                                       attn_mask=torch.ones(L, L, dtype=torch.bool).tril()),
    "attention_kerple": lambda d, t: attention_case(d, t, lambda: tpt.KERPLE(H, seed=0)),
    "attention_temperature": lambda d, t: attention_case(d, t, None, attn_temperature=(4.0, 0.1), start_pos=9),
    "attention_temperature_positions": lambda d, t: attention_case(d, t, None, attn_temperature=(2.0, 0.3),
                                                                   positions=FAR, causal=False),
    "layernorm": lambda d, t: norm_case(d, t, tpt.LayerNorm),
    "rmsnorm": lambda d, t: norm_case(d, t, tpt.RMSNorm),
    "sincos2d": sincos2d_case,
    "vocab_parallel_mean": vocab_parallel_case,
    "vocab_parallel_smoothing_sum": lambda d, t: vocab_parallel_case(d, t, label_smoothing=0.2, reduction="sum"),
    "vocab_parallel_none": lambda d, t: vocab_parallel_case(d, t, reduction="none", label_smoothing=0.1),
}
# the public layers that are not registered schemes: their case names' prefix ("transformer_rope_default" is a
# case of TransformerEmbedding; a registered scheme's cases are named by its scheme name: "rope_default")
LAYER_CASES = {"TokenEmbedding": "token", "PerLayerEmbedding": "per_layer", "TransformerEmbedding": "transformer",
               "LayerNorm": "layernorm", "RMSNorm": "rmsnorm", "HashedNgramEmbedding": "ngram",
               "EngramMemory": "engram"}
# every public layer: the hand-written cases, and every registered scheme without one
CASES: dict[str, Case] = {
    **{name: scheme_case(name) for name in SHORTCUTS if not covered(HAND_CASES, {name: name})}, **HAND_CASES}


@pytest.fixture(scope="module", autouse=True)
def _world_of_one() -> Any:
    """A group of one process (the vocab-parallel cases), torn down after the module: where the
    real-CUDA cases run, NCCL for CUDA tensors (gloo would copy them through the host) and gloo for
    the CPU runs they are compared with; else gloo."""
    if dist.is_initialized():
        yield
        return
    backend = "cpu:gloo,cuda:nccl" if TRITON_COMPILED else "gloo"
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1,
                            timeout=datetime.timedelta(seconds=60))
    try:
        yield
    finally:
        dist.destroy_process_group()


def run(case: Case, dev: Device, train: bool) -> tuple[list[Any], list[Any]]:
    """Outputs and gradients (host tensors) of ``case`` on ``dev``; training: a backward of a loss using
    every output. The same seeds on every device, so the dropout masks agree."""
    torch.manual_seed(0)
    with torch.set_grad_enabled(train):
        outs, leaves = case(dev, train)
        if not train:
            return [host(o) for o in outs], []
        loss = sum((o.float() * o.float()).sum() for o in outs if o.is_floating_point() and o.requires_grad)
        if isinstance(loss, torch.Tensor):
            loss.backward()
        return [host(o) for o in outs], [host(x.grad) for x in leaves]


def assert_same(got: list[Any], want: list[Any]) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        if w is None:
            assert g is None
            continue
        torch.testing.assert_close(g, w, rtol=2e-5, atol=2e-6, equal_nan=True)


@pytest.mark.slow  # every layer on the fake CUDA device
@pytest.mark.parametrize("train", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_layer_runs_on_cuda_without_a_host_sync(name: str, train: bool) -> None:
    """Fake CUDA: no sync (the detector raises on one) and the CPU's results."""
    with derived_case("HAND_CASES of tests/torch/test_no_host_sync.py", name, HAND_CASES):
        want = run(CASES[name], Device("cpu"), train)
        with no_host_sync():
            got = run(CASES[name], Device("fake"), train)
        assert_same(got[0], want[0])
        assert_same(got[1], want[1])


@pytest.mark.skipif(not ON_CUDA, reason="needs CUDA: the same cases under torch.cuda.set_sync_debug_mode('error')")
@pytest.mark.parametrize("train", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_layer_runs_on_real_cuda_without_a_host_sync(name: str, train: bool) -> None:  # pragma: no cover - GPU only
    """Real CUDA: no sync (torch raises on one), and in eval (no dropout: the CUDA generator draws other
    masks than the CPU's) the CPU's results."""
    case = CASES[name]
    run(case, Device("cuda"), train)                          # warm-up: Triton compiles, caches fill
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        got = run(case, Device("cuda"), train)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    if not train:
        for g, w in zip(got[0], run(case, Device("cpu"), train)[0], strict=True):
            torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5, equal_nan=True)


# ------------------------------------------------------------------------------ the detector itself


def test_the_cuda_paths_run_the_triton_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fake CUDA tensors take the layers' CUDA paths: the Triton kernels run (forward and backward)."""
    from triton.runtime import interpreter

    launched: list[str] = []
    original = interpreter.GridExecutor.__call__

    def count(self: Any, *args: Any, **kwargs: Any) -> Any:
        launched.append(self.fn.__name__)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(interpreter.GridExecutor, "__call__", count)
    with no_host_sync():
        run(CASES["transformer_rope_default"], Device("fake"), True)
        run(CASES["rope_default"], Device("fake"), True)
    assert {"_embedding_forward_kernel", "_segment_sum_kernel", "_rope_kernel"} <= set(launched), launched



def test_the_detector_refuses_each_kind_of_sync() -> None:
    x = to_fake_cuda(torch.arange(6))
    for read in (lambda: x.sum().item(), lambda: int(x.max()), lambda: bool(x.any()), lambda: torch.nonzero(x),
                 lambda: x[x > 2], lambda: torch.unique(x), lambda: x.cpu(), lambda: x + torch.arange(6),
                 lambda: torch.arange(3).to("cuda"), lambda: x.tolist(), lambda: torch.tensor([1], device="cuda"),
                 lambda: x.new_tensor([1, 2]), lambda: x.numpy(), lambda: x.to("cpu")):
        with no_host_sync(), pytest.raises(HostSync):
            read()
    with no_host_sync():                                      # what stays on the device passes
        y = torch.randint(0, 9, (3,), device="cuda") + x[:3] * 2
        torch._assert_async((y >= 0).all())
    assert isinstance(y, FakeCuda) and y.device.type == "cuda"


# --------------------------------------------------------------------------------- the error contract


def test_bad_values_fail_a_device_assert_without_a_read() -> None:
    """On CUDA a bad id, position or target fails loudly on the device (never a silent zero row of
    the Triton gather), and nothing is read on the host."""
    emb = fake_cuda_module(tpt.TransformerEmbedding(V, D, 8, positional="learned", seed=0))
    rope = fake_cuda_module(tpt.RotaryEmbedding(DH))
    vp = fake_cuda_module(VocabParallelEmbedding(V, D, seed=0))
    q = to_fake_cuda(torch.randn(1, 1, 3, DH))
    bad_calls = {
        "token ids on cuda:0 out of range: expected every value in [0, 13)":
            lambda: emb(to_fake_cuda(torch.tensor([[1, 13, 2]]))),
        "token ids on cuda:0 out of range: expected every value in [0, 13) ":
            lambda: vp(to_fake_cuda(torch.tensor([-1, 2]))),
        "positions on cuda:0 out of range: expected every value in [0, 8)":
            lambda: emb(to_fake_cuda(torch.tensor([[1, 2, 3]])), to_fake_cuda(torch.tensor([0, 8, 1]))),
        "positions on cuda:0 out of range: expected every value >= 0":
            lambda: rope.apply(q, q, to_fake_cuda(torch.tensor([0, -1, 1]))),
        "targets on cuda:0 out of range: expected every target in [0, 13) or ignore_index=-100":
            lambda: vocab_parallel_cross_entropy(vp.attend(to_fake_cuda(torch.randn(2, D))),
                                                 to_fake_cuda(torch.tensor([1, 13])), vocab_size=V),
    }
    for text, call in bad_calls.items():
        with no_host_sync(), pytest.raises(RuntimeError, match="device-side assert") as info:
            call()
        assert text.strip() in str(info.value), str(info.value)


def test_device_checks_read_the_values_for_the_typed_error() -> None:
    """``set_device_checks(True)``: the CPU's typed error, at the price of a read (a sync)."""
    emb = fake_cuda_module(tpt.TokenEmbedding(V, D, seed=0))
    tpt.set_device_checks(True)
    try:
        with pytest.raises(tpt.TokenIdError, match="token id 13 at index"):
            emb(to_fake_cuda(torch.tensor([1, 13])))
        with no_host_sync(), pytest.raises(HostSync):
            emb(to_fake_cuda(torch.tensor([1, 2])))
    finally:
        tpt.set_device_checks(False)


# ---------------------------------------------------------------------------- the device-side seed


def test_dropout_seed_is_drawn_on_the_device_fresh_per_call() -> None:
    """What a CUDA graph needs: the seed is drawn by a device op (no host-to-device copy), from the
    device's generator, and a new one per call (so each replay of a captured step draws fresh masks)."""
    emb = fake_cuda_module(tpt.TransformerEmbedding(V, D, 8, dropout=0.5, seed=0).train())
    with no_host_sync() as mode:
        seeds = [emb._dropout_seed(0.5, emb.token.weight) for _ in range(3)]
        outs = [emb(to_fake_cuda(IDS)) for _ in range(2)]
    assert all(s.device.type == "cuda" and s.dtype == torch.int64 and s.dim() == 0 for s in seeds)
    assert torch.ops.aten.randint.low_generator in mode.ops               # a device op (a copy would have raised)
    assert len({int(cpu_of(s)) for s in seeds}) == 3
    assert not torch.equal(cpu_of(outs[0]) == 0, cpu_of(outs[1]) == 0)         # fresh masks


def test_a_generator_on_another_device_is_refused_before_anything_changes() -> None:
    emb = fake_cuda_module(tpt.TransformerEmbedding(V, D, 8, dropout=0.5, generator=torch.Generator()))
    state = torch.random.get_rng_state()
    with no_host_sync(), pytest.raises(ConfigError, match="generator is on cpu but the layer is on cuda:0"):
        emb(to_fake_cuda(IDS))
    assert torch.equal(torch.random.get_rng_state(), state)
    with no_host_sync():
        emb.eval()(to_fake_cuda(IDS))                          # no dropout: the generator is not used
        emb.train().generator = None
        emb(to_fake_cuda(IDS))


def test_cpu_dropout_seeds_still_come_from_the_cpu_generator() -> None:
    emb = tpt.TransformerEmbedding(V, D, 8, dropout=0.5, seed=0).train()
    torch.manual_seed(7)
    a = emb(IDS)
    torch.manual_seed(7)
    assert torch.equal(a, emb(IDS))
    g = torch.Generator().manual_seed(3)
    emb.generator = g
    b = emb(IDS)
    emb.generator = torch.Generator().manual_seed(3)
    assert torch.equal(b, emb(IDS))


# ---------------------------------------------------------------------------- dynamic NTK state


def test_dynamic_state_lives_on_the_device_and_moves_with_the_layer() -> None:
    """The device path's state (``dynamic_len``) follows the CPU path's rule (growth, reset), and a
    layer moved between the CPU and the device goes on from where it was."""
    cpu = tpt.RotaryEmbedding(DH, max_seq_len=8, scaling=ROPE["dynamic"])
    fake = fake_cuda_module(copy.deepcopy(cpu))
    q = torch.randn(B, 1, L, DH)
    for pos in (POS, FAR, POS, torch.tensor([20, 1, 2, 3, 4]), torch.tensor([0, 1, 2, 3, 9])):
        want = cpu.apply(q, q, pos)
        with no_host_sync():
            got = fake.apply(to_fake_cuda(q), to_fake_cuda(q), to_fake_cuda(pos))
        assert int(cpu_of(fake.dynamic_len)) == cpu._rope_state.max_seq_len_cached
        torch.testing.assert_close(host(got[0]), want[0], rtol=1e-12, atol=1e-12)
    cpu.apply(q, q, torch.tensor([0, 1, 2, 3, 50]))                        # the CPU grows; the buffer follows
    assert int(cpu.dynamic_len) == 51
    moved = fake_cuda_module(cpu)
    with no_host_sync():
        got = moved.apply(to_fake_cuda(q), to_fake_cuda(q), to_fake_cuda(torch.tensor([0, 1, 2, 3, 10])))
    back = tpt.RotaryEmbedding(DH, max_seq_len=8, scaling=ROPE["dynamic"])
    back.apply(q, q, torch.tensor([0, 1, 2, 3, 50]))
    torch.testing.assert_close(host(got[0]), back.apply(q, q, torch.tensor([0, 1, 2, 3, 10]))[0], rtol=1e-12,
                               atol=1e-12)


def test_dynamic_state_comes_back_to_the_cpu() -> None:
    """The buffer is the one state: an eager CPU call goes on from a state the tensor path left."""
    layer = tpt.RotaryEmbedding(DH, max_seq_len=8, scaling=ROPE["dynamic"])
    layer.dynamic_len.fill_(40)                       # as a compiled call or the device would leave it
    q = torch.randn(1, 1, L, DH)
    got = layer.apply(q, q, torch.arange(L) + 10)      # needs 15: inside 40 (no growth) and past 8 (no reset)
    assert layer._rope_state.max_seq_len_cached == 40
    want = tpt.RotaryEmbedding(DH, max_seq_len=8, scaling=ROPE["dynamic"])
    want.apply(q, q, torch.tensor([0, 1, 2, 3, 39]))
    torch.testing.assert_close(got[0], want.apply(q, q, torch.arange(L) + 10)[0], rtol=0, atol=0)


# ------------------------------------------------------------------------------ CUDA graphs (GPU only)


def _graph_step_parts() -> tuple[Any, Any, torch.Tensor, torch.Tensor]:  # pragma: no cover - GPU only
    torch.manual_seed(0)
    emb = tpt.TransformerEmbedding(V, 4 * DH, 16, positional="learned", dropout=0.5, seed=0, device="cuda").train()
    rope = tpt.RotaryEmbedding(DH, device="cuda")
    wq = torch.randn(4 * DH, 4 * DH, device="cuda", requires_grad=True)
    ids = torch.randint(0, V, (B, L), device="cuda")
    return emb, rope, wq, ids


def _train_step(emb: Any, rope: Any, wq: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:  # pragma: no cover
    """TransformerEmbedding (dropout) -> RoPE -> attention, forward and backward; returns the embedding."""
    x = emb(ids)                                                             # (B, L, 4 Dh)
    q = (x @ wq).view(B, L, 4, DH).transpose(1, 2)                           # (B, 4, L, Dh)
    q, k = rope.apply(q, q)
    tpt.scaled_dot_product_attention(q, k, q).pow(2).sum().backward()
    return x.detach()


@pytest.mark.skipif(not ON_CUDA, reason="needs CUDA")
def test_training_step_replays_in_a_cuda_graph_with_fresh_dropout_masks() -> None:  # pragma: no cover - GPU only
    emb, rope, wq, ids = _graph_step_parts()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):                                            # warm-up (Triton compiles)
        for _ in range(3):
            _train_step(emb, rope, wq, ids)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        x = _train_step(emb, rope, wq, ids)
    masks = []
    for _ in range(3):
        graph.replay()
        torch.cuda.synchronize()
        masks.append((x == 0).clone())
    assert all(0 < m.float().mean() < 1 for m in masks)
    assert not torch.equal(masks[0], masks[1]) and not torch.equal(masks[1], masks[2])


@pytest.mark.skipif(not ON_CUDA, reason="needs CUDA")
def test_training_step_under_reduce_overhead_draws_fresh_dropout_masks() -> None:  # pragma: no cover - GPU only
    emb, rope, wq, ids = _graph_step_parts()
    torch._dynamo.reset()

    def forward(ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = emb(ids)
        q = (x @ wq).view(B, L, 4, DH).transpose(1, 2)
        q, k = rope.apply(q, q)
        return x, tpt.scaled_dot_product_attention(q, k, q).pow(2).sum()

    compiled = torch.compile(forward, mode="reduce-overhead", fullgraph=True)
    masks = []
    for _ in range(5):
        # As a training loop does (optimizer.zero_grad()): gradients start from None each step. Accumulating
        # into last step's .grad reads a graph output that this step's replay overwrote, which cudagraph
        # trees refuse for plain torch too (benchmarks/experiments/exp_gpu_reduce_overhead.py, H100).
        emb.zero_grad(set_to_none=True)
        wq.grad = None
        torch.compiler.cudagraph_mark_step_begin()
        x, loss = compiled(ids)
        loss.backward()
        masks.append((x == 0).detach().clone())
    torch.cuda.synchronize()
    assert all(0 < m.float().mean() < 1 for m in masks)
    assert not torch.equal(masks[-1], masks[-2]) and not torch.equal(masks[-2], masks[-3])


@pytest.mark.parametrize("head_dim", [6, 8, 64, 128])
def test_dynamic_frequencies_by_tensor_ops_match_the_tables(head_dim: int) -> None:
    """The device / compiled path's frequencies are ``tables``' dynamic formula to float64 rounding (the
    eager CPU path uses the tables' values themselves; torch's and NumPy's ``pow`` differ by <= 1 ulp)."""
    from tokenpos.torch._rope_tables import dynamic_inv_freq_torch

    layer = tpt.RotaryEmbedding(head_dim, max_seq_len=32, scaling={"rope_type": "dynamic", "factor": 3.0})
    for n in (32, 33, 50, 1000, 4097, 123457):
        got = dynamic_inv_freq_torch(torch.tensor(n), layer.freqs)
        want = torch.from_numpy(layer.freqs._compute(n)[0])
        torch.testing.assert_close(got, want, rtol=1e-15, atol=0.0)


# ------------------------------------------------------------------ no per-call factory kernels

FACTORY_OPS = {"arange", "zeros", "ones", "full", "fill", "fill_", "scalar_tensor", "zero_", "lift_fresh",
               "lift_fresh_copy", "randint", "random_"}


@pytest.mark.parametrize("start_pos", [0, 5, 37], ids=lambda s: f"start_pos={s}")
def test_transformer_embedding_eval_call_launches_no_factory_kernel(start_pos: int) -> None:
    """Issue 34's budget: a ``TransformerEmbedding`` call without dropout makes no tensor of its own on
    the device per call (no ``arange`` for the default positions, at any ``start_pos``, no ``zeros``
    for the no-dropout seed): what runs is the id check (device-side assert), a view of the shared
    positions and the fused kernel."""
    m = Device("fake").m(tpt.TransformerEmbedding(V, D, 64, seed=0).eval())
    ids = to_fake_cuda(IDS)
    with no_host_sync() as mode, torch.no_grad():
        m(ids, start_pos=start_pos)                                  # warm: the shared arange is built once
        mode.ops.clear()
        m(ids, start_pos=start_pos + 1)                              # the next decode step
        names = [op._schema.name.split("::")[-1] for op in mode.ops]
    made = [n for n in names if n.split(".")[0] in FACTORY_OPS]
    assert not made, f"factory kernels per call: {made} (all ops: {names})"
    assert names[:5] == ["ge", "lt", "bitwise_and", "all", "_assert_async"], names   # the id check


# --------------------------------------------------------------------------------- every op, directly

OP_SAMPLES = list(tpt.ops.samples())


def _fake_arg(a: Any) -> Any:
    if not isinstance(a, torch.Tensor):
        return a
    return to_fake_cuda(a.detach()).requires_grad_(a.requires_grad)


@pytest.mark.slow  # every op sample on the fake CUDA device
@pytest.mark.parametrize("i", range(len(OP_SAMPLES)), ids=lambda i: f"{OP_SAMPLES[i][0]._name}-{i}")
def test_every_op_sample_runs_on_cuda_without_a_host_sync(i: int) -> None:
    """Each ``ops.samples()`` entry (every op, strided and expanded inputs included), called through
    ``torch.ops.tokenpos.*`` on fake CUDA: forward, and backward where a float input requires grad,
    without a host sync and with the CPU's results."""
    op, args, kwargs = OP_SAMPLES[i]

    def run(inputs: tuple[Any, ...]) -> list[torch.Tensor]:
        outs = op(*inputs, **kwargs)
        outs = list(outs) if isinstance(outs, (tuple, list)) else [outs]
        leaves = [a for a in inputs if isinstance(a, torch.Tensor) and a.requires_grad]
        diff = [o for o in outs if o.requires_grad]
        if not leaves or not diff:
            return outs
        grads = torch.autograd.grad(sum((o.float() * o.float()).sum() for o in diff), leaves, allow_unused=True)
        return outs + [g for g in grads if g is not None]

    cpu_args = tuple(a.detach().requires_grad_(a.requires_grad) if isinstance(a, torch.Tensor) else a for a in args)
    want = run(cpu_args)
    with no_host_sync():
        got = run(tuple(_fake_arg(a) for a in args))
    assert_same([host(g) for g in got], [w.detach() for w in want])
