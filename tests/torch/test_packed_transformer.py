"""torch TransformerEmbedding(cu_seqlens=...): a packed row gives, per token, the output and the
gradients of the same documents padded in (N, L), kernels on and off; on (fake) CUDA no host sync."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

import tokenpos
import tokenpos.torch as tpt
from tests.tolerances import TOL
from tests.torch.fake_cuda import cpu_of, no_host_sync, to_fake_cuda
from tests.torch.packed import CU, MASK, T, pad
from tests.torch.test_no_host_sync import fake_cuda_module
from tokenpos.tables import ConfigError

V, D, H, P = 23, 8, 2, 16
CASES = {
    "learned": dict(positional="learned"),
    "sinusoidal": dict(positional="sinusoidal", scale=True),
    "learned-bert": dict(positional="learned", num_token_types=2, norm="layernorm"),
    "rope": dict(positional="rope", num_heads=H, norm="rmsnorm"),
    "alibi": dict(positional="alibi", num_heads=H),
}


def data(seed: int = 0) -> tuple[torch.Tensor, ...]:
    """ids and token types packed (T,) and padded (N, L) (pads: 0), and the (N, L) mask of real tokens."""
    g = torch.Generator().manual_seed(seed)
    ids, tt = torch.randint(1, V, (T,), generator=g), torch.randint(0, 2, (T,), generator=g)
    return ids, tt, pad(ids), pad(tt), MASK


def make(case: str, dtype: torch.dtype) -> Any:
    return tpt.TransformerEmbedding(V, D, P, dtype=dtype, seed=3, **CASES[case])


def call(emb: Any, ids: torch.Tensor, tt: torch.Tensor, **kw: Any) -> torch.Tensor:
    return emb(ids, token_type_ids=tt if emb.num_token_types else None, **kw)


@pytest.mark.parametrize("kernels", [True, False], ids=["kernels-on", "kernels-off"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("case", list(CASES))
def test_packed_equals_padded_per_token_with_equal_gradients(case: str, dtype: torch.dtype, kernels: bool) -> None:
    ids, tt, ids_pad, tt_pad, mask = data()
    tol = TOL["exact"] if dtype == torch.float64 else TOL["forward.float32"]
    grad_tol = TOL["grad.float64"] if dtype == torch.float64 else TOL["grad.float32"]
    with tokenpos.use_kernels(kernels):
        packed, padded = make(case, dtype), make(case, dtype)
        out = call(packed, ids, tt, cu_seqlens=CU)                              # (T, D)
        ref = call(padded, ids_pad, tt_pad)                                     # (N, L, D)
        torch.testing.assert_close(out, ref[mask], **tol)
        torch.testing.assert_close(call(packed, ids[None], tt[None], cu_seqlens=CU.long()), out[None], **tol)
        torch.testing.assert_close(call(packed, ids, tt, cu_seqlens=CU.tolist()), out, **tol)     # host values
        g = torch.randn(out.shape, dtype=dtype, generator=torch.Generator().manual_seed(1))
        g_pad = pad(g)
        (out * g).sum().backward()
        (ref * g_pad).sum().backward()
    grads = dict(padded.named_parameters())
    for name, p in packed.named_parameters():
        if grads[name].grad is None:
            assert p.grad is None, name
            continue
        torch.testing.assert_close(p.grad, grads[name].grad, **grad_tol, msg=name)


def test_packed_equals_the_numpy_layer() -> None:
    import tokenpos.numpy as tpn
    ids, tt, *_ = data()
    ours = make("learned-bert", torch.float64)(ids, token_type_ids=tt, cu_seqlens=CU)
    theirs = tpn.TransformerEmbedding(V, D, P, dtype=np.float64, seed=3, **CASES["learned-bert"])(
        ids.numpy(), token_type_ids=tt.numpy(), cu_seqlens=CU.numpy())
    np.testing.assert_allclose(ours.detach().numpy(), theirs, rtol=0, atol=TOL["parity.f64"]["scale"])


def test_refusals_name_the_value() -> None:
    ids, *_ = data()
    emb = make("learned", torch.float32)
    with pytest.raises(ConfigError, match="positions given together with cu_seqlens"):
        emb(ids, torch.arange(T), cu_seqlens=CU)
    with pytest.raises(ConfigError, match=r"a packed batch is one row.*got shape \(2, 13\)"):
        emb(ids.expand(2, T), cu_seqlens=CU)
    with pytest.raises(tpt.PositionError, match=f"must end at the number of tokens T = {T}, got cu_seqlens"):
        emb(ids, cu_seqlens=CU[:-1])
    for big in (T + 2, 10**8):                       # a value above T inside: refused before any write past T
        with pytest.raises(tpt.PositionError, match=r"cu_seqlens\[2\] ="):
            emb(ids, cu_seqlens=torch.tensor([0, 1, big, T], dtype=torch.int32))


@pytest.mark.parametrize("case", ["learned", "sinusoidal"])
def test_packed_call_on_cuda_makes_no_host_sync(case: str) -> None:
    ids, *_ = data()
    emb = make(case, torch.float32)
    want = emb(ids, cu_seqlens=CU)
    dev = fake_cuda_module(make(case, torch.float32))
    with no_host_sync():
        got = dev(to_fake_cuda(ids), cu_seqlens=to_fake_cuda(CU))
        got.sum().backward()
    torch.testing.assert_close(cpu_of(got.detach()), want.detach(), **TOL["forward.float32"])
    with pytest.raises(ConfigError, match="cu_seqlens is on cpu, but the data is on cuda:0"):
        dev(to_fake_cuda(ids), cu_seqlens=CU)


def test_a_bad_cu_seqlens_on_cuda_fails_a_device_assert() -> None:
    ids, *_ = data()
    dev = fake_cuda_module(make("learned", torch.float32))
    with no_host_sync(), pytest.raises(RuntimeError, match="device-side assert"):
        dev(to_fake_cuda(ids), cu_seqlens=to_fake_cuda(torch.tensor([0, 5, 3, T])))


def test_a_document_longer_than_the_position_table() -> None:
    """Learned positions (P rows): a document of P + 1 tokens is refused with the position and the
    table named, before anything changes; a table that extends (sinusoidal) serves it exactly."""
    ids = torch.randint(1, V, (P + 3,), generator=torch.Generator().manual_seed(0))
    cu = torch.tensor([0, 2, P + 3])                                   # documents of 2 and P + 1 tokens
    emb = make("learned", torch.float32).train()
    before = emb.generator.get_state() if emb.generator is not None else None
    with pytest.raises(tpt.PositionError, match=rf"position {P} at index \({P + 2},\) is out of range \[0, {P}\)"):
        emb(ids, cu_seqlens=cu)
    if before is not None:
        assert torch.equal(emb.generator.get_state(), before)
    sin = make("sinusoidal", torch.float64).eval()
    out = sin(ids, cu_seqlens=cu)
    torch.testing.assert_close(out[2:], sin(ids[2:][None])[0], **TOL["exact"])  # positions 0..P in one document


STARTS = [0, 4, 11, 2]                                                  # where each document starts counting


@pytest.mark.parametrize("case", ["learned", "sinusoidal", "learned-bert"])
def test_document_starts_give_each_document_its_call_at_that_start_pos(case: str) -> None:
    """Documents continuing a KV cache, packed: start_pos (one per document, or one int) shifts each document's
    positions, so each document's rows equal the layer called on it alone with that start_pos; gradients of
    the packed call equal the sum of the separate calls'."""
    ids, tt, *_ = data()
    packed, alone = make(case, torch.float64), make(case, torch.float64)
    bounds = CU.tolist()
    for starts in (STARTS, torch.tensor(STARTS), 3):
        out = call(packed, ids, tt, cu_seqlens=CU, start_pos=starts)
        each = [call(alone, ids[a:b], tt[a:b], start_pos=s) for a, b, s in
                zip(bounds[:-1], bounds[1:], [starts] * 4 if isinstance(starts, int) else list(map(int, starts)),
                    strict=True)]
        torch.testing.assert_close(out, torch.cat(each), **TOL["exact"])
    g = torch.randn(out.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    (out * g).sum().backward()
    sum((e * g[a:b]).sum() for e, a, b in zip(each, bounds[:-1], bounds[1:], strict=True)).backward()
    grads = dict(alone.named_parameters())
    for name, p in packed.named_parameters():
        torch.testing.assert_close(p.grad, grads[name].grad, **TOL["grad.float64"], msg=name)


def test_document_starts_past_the_table_are_refused_and_on_cuda_make_no_host_sync() -> None:
    ids, *_ = data()
    emb = make("learned", torch.float32)
    with pytest.raises(tpt.PositionError, match=rf"position {P} at index \(7,\) is out of range \[0, {P}\)"):
        emb(ids, cu_seqlens=CU, start_pos=[0, P - 4, 0, 0])                  # document 1: 5 tokens from P - 4
    with pytest.raises(ConfigError, match=r"one int per document, shape \(4,\); got shape \(3,\)"):
        emb(ids, cu_seqlens=CU, start_pos=[0, 1, 2])
    want = emb(ids, cu_seqlens=CU, start_pos=STARTS)
    dev = fake_cuda_module(make("learned", torch.float32))
    with no_host_sync():
        got = dev(to_fake_cuda(ids), cu_seqlens=to_fake_cuda(CU), start_pos=to_fake_cuda(torch.tensor(STARTS)))
    torch.testing.assert_close(cpu_of(got.detach()), want.detach(), **TOL["forward.float32"])
