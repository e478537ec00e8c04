"""torch scaled_dot_product_attention(..., cu_seqlens=...): per token, outputs and autograd gradients
(q, k, v and the bias parameters) equal the same documents padded in (N, H, L, Dh) for every scheme,
equal the NumPy twin, and make no host sync on (fake) CUDA."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

import tokenpos.numpy as tpn
import tokenpos.torch as tpt
from tests.tolerances import TOL
from tests.torch.fake_cuda import cpu_of, no_host_sync, to_fake_cuda
from tests.torch.packed import CU, MASK, T
from tests.torch.packed import pad_heads as padded
from tests.torch.packed import unpad_heads as real
from tests.torch.test_no_host_sync import fake_cuda_module
from tokenpos.tables import ConfigError

H, DH = 2, 8
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4}
F64 = torch.float64
SCHEMES = {
    "none": lambda be: None,
    "nope": lambda be: be.NoPositionalEncoding(),
    "rope": lambda be: be.RotaryEmbedding(DH, max_seq_len=16, scaling=YARN, rotary_dim=6),
    "alibi": lambda be: be.ALiBi(H, dtype=F64 if be is tpt else np.float64),
    "t5": lambda be: be.T5RelativePositionBias(H, num_buckets=8, max_distance=6, seed=3, bidirectional=False,
                                               dtype=F64 if be is tpt else np.float64),
    "t5-bidirectional": lambda be: be.T5RelativePositionBias(H, num_buckets=8, max_distance=6, seed=3,
                                                             dtype=F64 if be is tpt else np.float64),
    "fire": lambda be: be.FIRE(H, width=4, init_L=3.0, seed=3, dtype=F64 if be is tpt else np.float64),
    "kerple": lambda be: be.KERPLE(H, seed=3, dtype=F64 if be is tpt else np.float64),
    # xPos packs around each document's centre; M-RoPE rotates at the in-document positions
    "xpos": lambda be: be.XPosRotaryEmbedding(DH),
    "mrope": lambda be: be.MRotaryEmbedding(DH, mrope_section=[2, 1, 1]),
}


def data(seed: int = 0, dtype: torch.dtype = F64) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(T, H, DH, generator=g, dtype=dtype) for _ in range(3)]


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
@pytest.mark.parametrize("name", list(SCHEMES))
def test_packed_equals_padded_outputs_and_gradients(name: str, causal: bool) -> None:
    qkv = [x.requires_grad_() for x in data()]
    qkv_pad = [padded(x.detach()).requires_grad_() for x in qkv]
    g = data(seed=1)[0]
    packed, pad = SCHEMES[name](tpt), SCHEMES[name](tpt)
    out = tpt.scaled_dot_product_attention(*qkv, positional=packed, causal=causal, cu_seqlens=CU)
    ref = tpt.scaled_dot_product_attention(*qkv_pad, positional=pad, causal=causal,
                                           attn_mask=MASK[:, None, None, :])
    assert out.shape == (T, H, DH)
    tol = TOL["forward.float64"]
    torch.testing.assert_close(out, real(ref), **tol)
    (out * g).sum().backward()
    (ref * padded(g)).sum().backward()
    for x, xp in zip(qkv, qkv_pad, strict=True):
        torch.testing.assert_close(x.grad, real(xp.grad), **tol)
    want = dict(pad.named_parameters()) if pad is not None else {}
    for key, p in ([] if packed is None else packed.named_parameters()):
        torch.testing.assert_close(p.grad, want[key].grad, **tol, msg=key)


@pytest.mark.parametrize("name", ["rope", "t5", "fire", "kerple"])
def test_packed_equals_the_numpy_twin(name: str) -> None:
    q, k, v = data()
    ours = tpt.scaled_dot_product_attention(q, k, v, positional=SCHEMES[name](tpt), cu_seqlens=CU).detach()
    theirs = tpn.scaled_dot_product_attention(q.numpy(), k.numpy(), v.numpy(), positional=SCHEMES[name](tpn),
                                              cu_seqlens=CU.numpy())
    np.testing.assert_allclose(ours.numpy(), theirs, rtol=0, atol=TOL["parity.f64"]["scale"] * np.abs(theirs).max())


ON_CUDA = {**SCHEMES, "rope": lambda be: be.RotaryEmbedding(DH, max_seq_len=16, scaling=YARN)}   # full rotary_dim


@pytest.mark.parametrize("name", ["rope", "alibi", "t5", "fire"])
def test_packed_attention_on_cuda_makes_no_host_sync(name: str) -> None:
    q, k, v = data(dtype=torch.float32)
    want = tpt.scaled_dot_product_attention(q, k, v, positional=ON_CUDA[name](tpt), cu_seqlens=CU)
    dev = fake_cuda_module(ON_CUDA[name](tpt))
    with no_host_sync():
        got = tpt.scaled_dot_product_attention(*(to_fake_cuda(x) for x in (q, k, v)), positional=dev,
                                               cu_seqlens=to_fake_cuda(CU))
    torch.testing.assert_close(cpu_of(got).to(want.dtype), want, **TOL["forward.float32"])


@pytest.mark.parametrize("kwargs, text", [
    (dict(positions=torch.arange(T)), "positions given together with cu_seqlens"),
    (dict(key_positions=torch.arange(T)), "key_positions given together with cu_seqlens"),
    (dict(start_pos=2), "start_pos=2 given together with cu_seqlens"),
])
def test_positions_with_cu_seqlens_are_refused(kwargs: dict[str, Any], text: str) -> None:
    q, k, v = data()
    with pytest.raises(ConfigError, match=text):
        tpt.scaled_dot_product_attention(q, k, v, positional=SCHEMES["rope"](tpt), cu_seqlens=CU, **kwargs)


def test_bad_shapes_and_cu_seqlens_are_refused() -> None:
    q, k, v = data()
    with pytest.raises(ConfigError, match=r"got q \(12, 2, 8\) and k \(13, 2, 8\)"):
        tpt.scaled_dot_product_attention(q[1:], k, v, cu_seqlens=CU)
    with pytest.raises(tpt.PositionError, match=f"must end at the number of tokens T = {T}"):
        tpt.scaled_dot_product_attention(q, k, v, cu_seqlens=CU[:-1])
    with pytest.raises(ConfigError, match="cu_seqlens is on cpu, but the data is on cuda:0"):
        tpt.scaled_dot_product_attention(*(to_fake_cuda(x) for x in (q, k, v)), cu_seqlens=CU)


def test_llama4_query_temperature_uses_the_in_document_positions() -> None:
    q, k, v = data()
    out = tpt.scaled_dot_product_attention(q, k, v, attn_temperature=(4, 0.1), cu_seqlens=CU)
    ref = tpt.scaled_dot_product_attention(padded(q), padded(k), padded(v), attn_temperature=(4, 0.1),
                                           attn_mask=MASK[:, None, None, :])
    torch.testing.assert_close(out, real(ref), **TOL["forward.float64"])
    theirs = tpn.scaled_dot_product_attention(q.numpy(), k.numpy(), v.numpy(), attn_temperature=(4, 0.1),
                                              cu_seqlens=CU.numpy())
    np.testing.assert_allclose(out.numpy(), theirs, **TOL["forward.float64"])


@pytest.mark.parametrize("name", sorted(SCHEMES))
def test_no_tokens_give_an_empty_output_and_gradients(name: str) -> None:
    """T = 0 (``cu_seqlens`` [0]) and an unpacked L = 0: empty outputs and gradients, as torch's own
    attention gives (an amax over no keys once raised)."""
    x = torch.zeros(0, H, DH, dtype=F64, requires_grad=True)
    out = tpt.scaled_dot_product_attention(x, x, x, positional=SCHEMES[name](tpt), cu_seqlens=torch.tensor([0]))
    assert out.shape == (0, H, DH)
    out.sum().backward()
    assert x.grad is not None and x.grad.shape == (0, H, DH)
    y = torch.zeros(1, H, 0, DH, dtype=F64)
    assert tpt.scaled_dot_product_attention(y, y, y, positional=SCHEMES[name](tpt)).shape == (1, H, 0, DH)
