"""torch RotaryEmbedding.apply(q, k, cu_seqlens=...) with qk_layout="thd": HF's rotation at the
position_ids of DataCollatorWithFlattening, the same documents padded, gradients, no host sync on
(fake) CUDA; the layers whose positions are not one index per token refuse cu_seqlens."""

from __future__ import annotations

import importlib
from typing import Any

import numpy as np
import pytest
import torch
from transformers import DataCollatorWithFlattening
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

import tokenpos
import tokenpos.tables
import tokenpos.torch as tpt
from tests.tolerances import TOL
from tests.torch.fake_cuda import cpu_of, no_host_sync, to_fake_cuda
from tests.torch.packed import CU, LENGTHS, MASK, L, T
from tests.torch.packed import pad_heads as padded
from tests.torch.packed import unpad_heads as unpadded
from tests.torch.test_no_host_sync import fake_cuda_module
from tests.torch.test_rotary import DH, MAX, SCALINGS, assert_hf_close, hf_rotary
from tokenpos.tables import ConfigError

HQ, HK = 4, 2


def qk(dtype: torch.dtype = torch.float32, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(T, HQ, DH, generator=g, dtype=dtype), torch.randn(T, HK, DH, generator=g, dtype=dtype)


def flattening_position_ids() -> torch.Tensor:
    """HF's own packing of the documents: (1, T) position_ids restarting per example."""
    docs = [{"input_ids": list(range(1, n + 1))} for n in LENGTHS]
    return DataCollatorWithFlattening(return_position_ids=True)(docs, return_tensors="pt")["position_ids"]


@pytest.mark.parametrize("name", sorted(SCALINGS))
def test_packed_matches_hf_at_the_flattening_collators_position_ids(name: str) -> None:
    pos = flattening_position_ids()                                            # (1, T)
    assert pos.shape == (1, T)
    q, k = qk()
    hq_, hk_ = q.transpose(0, 1)[None], k.transpose(0, 1)[None]                # (1, H, T, Dh), HF's layout
    cos, sin = hf_rotary(SCALINGS[name])(hq_, pos)
    ref_q, ref_k = apply_rotary_pos_emb(hq_, hk_, cos, sin)
    rope = tpt.RotaryEmbedding(DH, max_seq_len=MAX, scaling=SCALINGS[name], qk_layout="thd")
    oq, ok = rope.apply(q, k, cu_seqlens=CU)
    assert oq.shape == q.shape and ok.shape == k.shape
    assert_hf_close(oq, ref_q[0].transpose(0, 1), q, L - 1)
    assert_hf_close(ok, ref_k[0].transpose(0, 1), k, L - 1)


STARTS = {"one int": 6, "per document": torch.tensor([0, 9, 30, 2])}     # flash-attn's seqlen_offsets


def document_rows(x: torch.Tensor) -> list[torch.Tensor]:
    """(T, H, Dh) packed -> each document's (n, H, Dh) rows."""
    return list(torch.split(x, LENGTHS))


@pytest.mark.parametrize("starts", sorted(STARTS))
@pytest.mark.parametrize("name", ["default", "linear", "yarn", "llama3"])
def test_document_starts_are_flash_attn_varlen_seqlen_offsets(name: str, starts: str) -> None:
    """flash-attn's varlen rotary (apply_rotary_emb(x, cos, sin, seqlen_offsets, cu_seqlens)): document d's
    token i is rotated at position seqlen_offsets[d] + i. Reference: HF's own rotation of each document alone
    at those position ids."""
    start = torch.as_tensor(STARTS[starts]).expand(len(LENGTHS))
    q, k = qk()
    rope = tpt.RotaryEmbedding(DH, max_seq_len=MAX, scaling=SCALINGS[name], qk_layout="thd")
    oq, ok = rope.apply(q, k, cu_seqlens=CU, start_pos=STARTS[starts])
    hf = hf_rotary(SCALINGS[name])
    for d, (xq, xk, yq, yk) in enumerate(zip(*map(document_rows, (q, k, oq, ok)), strict=True)):
        hq_, hk_ = xq.transpose(0, 1)[None], xk.transpose(0, 1)[None]              # (1, H, n, Dh)
        pos = (int(start[d]) + torch.arange(xq.shape[0]))[None]
        ref_q, ref_k = apply_rotary_pos_emb(hq_, hk_, *hf(hq_, pos))
        assert_hf_close(yq, ref_q[0].transpose(0, 1), xq, int(pos.max()))
        assert_hf_close(yk, ref_k[0].transpose(0, 1), xk, int(pos.max()))


@pytest.mark.parametrize("kernels", [True, False], ids=["kernels-on", "kernels-off"])
@pytest.mark.parametrize("starts", ["none", *sorted(STARTS)])
@pytest.mark.parametrize("name", ["default", "linear", "dynamic", "yarn", "llama3"])
def test_packed_equals_padded_with_equal_gradients(name: str, starts: str, kernels: bool) -> None:
    """Packed equals the padded batch, outputs and gradients; with start_pos (where each document starts
    counting) the padded rows sit at start_pos[d] + arange(L), pads at 0 so that dynamic NTK reads the same
    largest position; the same when the starts arrive as a list, a NumPy array or a tensor."""
    q, k = (t.requires_grad_() for t in qk(torch.float64))
    qp, kp = (padded(t.detach()).requires_grad_() for t in (q, k))
    start = torch.as_tensor(STARTS.get(starts, 0)).expand(len(LENGTHS))
    with tokenpos.use_kernels(kernels):
        rope = tpt.RotaryEmbedding(DH, max_seq_len=MAX, scaling=SCALINGS[name], qk_layout="thd")
        pad = tpt.RotaryEmbedding(DH, max_seq_len=MAX, scaling=SCALINGS[name])
        if starts == "none":
            oq, ok = rope.apply(q, k, cu_seqlens=CU)
            rq, rk = pad.apply(qp, kp)
        else:
            oq, ok = rope.apply(q, k, cu_seqlens=CU, start_pos=STARTS[starts])
            rq, rk = pad.apply(qp, kp, torch.where(MASK, start[:, None] + torch.arange(L), 0))
        if starts == "per document":
            for other in (start.tolist(), start.numpy()):
                torch.testing.assert_close(rope.apply(q, k, cu_seqlens=CU, start_pos=other)[0], oq, rtol=0, atol=0)
    torch.testing.assert_close(oq, unpadded(rq), **TOL["forward.float64"])
    torch.testing.assert_close(ok, unpadded(rk), **TOL["forward.float64"])
    gq, gk = qk(torch.float64, seed=1)
    (oq * gq).sum().add((ok * gk).sum()).backward()
    (rq * padded(gq)).sum().add((rk * padded(gk)).sum()).backward()
    torch.testing.assert_close(q.grad, unpadded(qp.grad), **TOL["forward.float64"])
    torch.testing.assert_close(k.grad, unpadded(kp.grad), **TOL["forward.float64"])


def test_document_starts_on_cuda_make_no_host_sync() -> None:
    """Per-document starts as a tensor on the device: the positions are made there, nothing read on the host
    (the bound of the positions is then unknown, so the rows come from the formula: the same values)."""
    q, k = qk()
    want = tpt.RotaryEmbedding(DH, qk_layout="thd").apply(q, k, cu_seqlens=CU, start_pos=STARTS["per document"])
    rope = fake_cuda_module(tpt.RotaryEmbedding(DH, qk_layout="thd"))
    with no_host_sync():
        got = rope.apply(to_fake_cuda(q), to_fake_cuda(k), cu_seqlens=to_fake_cuda(CU),
                         start_pos=to_fake_cuda(STARTS["per document"]))
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(cpu_of(a), b, **TOL["forward.float32"])


def test_document_starts_on_another_device_than_the_data_are_refused() -> None:
    q, k = qk()
    rope = fake_cuda_module(tpt.RotaryEmbedding(DH, qk_layout="thd"))
    with pytest.raises(ConfigError, match="start_pos is on cpu, but the data is on cuda:0"):
        rope.apply(to_fake_cuda(q), to_fake_cuda(k), cu_seqlens=to_fake_cuda(CU), start_pos=STARTS["per document"])
    with pytest.raises(ConfigError, match="start_pos is on cuda:0, but the data is on cpu"):   # never copied back
        tpt.RotaryEmbedding(DH, qk_layout="thd").apply(q, k, cu_seqlens=CU,
                                                       start_pos=to_fake_cuda(STARTS["per document"]))


def test_document_starts_of_every_form_compile_into_one_graph() -> None:
    """The README's form, start_pos=[...], failed under torch.compile(fullgraph=True) ("ndarray attribute
    access": the check traced NumPy); a list, a NumPy array, a tensor and a 0-d tensor (one for all) now compile
    and equal eager."""
    q, k = qk()
    rope = tpt.RotaryEmbedding(DH, qk_layout="thd")
    starts = STARTS["per document"]
    want = rope.apply(q, k, cu_seqlens=CU, start_pos=starts)
    fn = torch.compile(lambda a, b, s: rope.apply(a, b, cu_seqlens=CU, start_pos=s), backend="aot_eager",
                       fullgraph=True)
    for form in (starts.tolist(), starts.numpy(), starts):
        for a, b in zip(fn(q, k, form), want, strict=True):
            torch.testing.assert_close(a, b, rtol=0, atol=0)
    one = rope.apply(q, k, cu_seqlens=CU, start_pos=3)
    for got in (rope.apply(q, k, cu_seqlens=CU, start_pos=torch.tensor(3)), fn(q, k, torch.tensor(3))):
        for a, b in zip(got, one, strict=True):
            torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.parametrize("start_pos, error, text", [
    ([1, 2], ConfigError, r"one int per document, shape \(4,\); got shape \(2,\)"),
    (torch.tensor([[0, 1, 2, 3]]), ConfigError, r"one int per document, shape \(4,\); got shape \(1, 4\)"),
    ([0, 1, -2, 3], tokenpos.tables.PositionError, r"start_pos -2 at index \(2,\) is negative"),
    (torch.tensor([0.0, 1.0, 2.0, 3.0]), tokenpos.tables.PositionError, "integers"),
    (-1, ConfigError, "start_pos must be >= 0, got -1"),
])
def test_bad_document_starts_are_refused(start_pos: Any, error: type, text: str) -> None:
    q, k = qk()
    with pytest.raises(error, match=text):
        tpt.RotaryEmbedding(DH, qk_layout="thd").apply(q, k, cu_seqlens=CU, start_pos=start_pos)


def test_xpos_counts_every_packed_document_from_zero() -> None:
    q, k = qk()
    with pytest.raises(ConfigError, match="xPos packs every document from position 0.*got start_pos=3"):
        tpt.XPosRotaryEmbedding(DH, qk_layout="thd").apply(q, k, cu_seqlens=CU, start_pos=3)


@pytest.mark.parametrize("name", ["default", "linear", "yarn", "llama3"])
def test_static_scalings_read_the_cached_rows_so_packed_equals_padded_bit_for_bit(
        name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """flash-attn's rotary cache: a packed call indexes the cached cos / sin rows by position (the
    per-token formula is never computed), and each token gets the very numbers of the padded call."""
    q, k = qk()
    rope = tpt.RotaryEmbedding(DH, max_seq_len=MAX, scaling=SCALINGS[name], qk_layout="thd")

    def no_formula(*args: Any) -> None:
        raise AssertionError("the packed call computed cos / sin per token")
    monkeypatch.setattr(rope, "_formula", no_formula)
    oq, ok = rope.apply(q, k, cu_seqlens=CU)
    rq, rk = tpt.RotaryEmbedding(DH, max_seq_len=MAX, scaling=SCALINGS[name]).apply(padded(q), padded(k))
    torch.testing.assert_close(oq, unpadded(rq), **TOL["exact"])
    torch.testing.assert_close(ok, unpadded(rk), **TOL["exact"])


def test_llama4_style_interleaved_rope_packs_like_padding() -> None:
    """Llama 4 text: interleaved pairs with a llama3 scaling (the RotaryEmbedding settings from_hf builds)."""
    q, k = qk(torch.float64)
    kw = dict(max_seq_len=MAX, scaling=SCALINGS["llama3"], interleaved=True)
    oq, ok = tpt.RotaryEmbedding(DH, qk_layout="thd", **kw).apply(q, k, cu_seqlens=CU)
    rq, rk = tpt.RotaryEmbedding(DH, **kw).apply(padded(q), padded(k))
    torch.testing.assert_close(oq, unpadded(rq), **TOL["forward.float64"])
    torch.testing.assert_close(ok, unpadded(rk), **TOL["forward.float64"])


def test_one_row_in_the_declared_layouts_equals_thd() -> None:
    q, k = qk()
    want = tpt.RotaryEmbedding(DH, qk_layout="thd").apply(q, k, cu_seqlens=CU)
    bhld = tpt.RotaryEmbedding(DH).apply(q.transpose(0, 1)[None], k.transpose(0, 1)[None], cu_seqlens=CU.long())
    blhd = tpt.RotaryEmbedding(DH, qk_layout="blhd").apply(q[None], k[None], cu_seqlens=CU)
    for a, b, c in zip(want, bhld, blhd, strict=True):
        torch.testing.assert_close(b[0].transpose(0, 1), a, **TOL["exact"])
        torch.testing.assert_close(c[0], a, **TOL["exact"])


@pytest.mark.parametrize("cls", [tpt.RotaryEmbedding, tpt.XPosRotaryEmbedding])
def test_packed_call_on_cuda_makes_no_host_sync(cls: type) -> None:
    q, k = qk()
    want = cls(DH, qk_layout="thd").apply(q, k, cu_seqlens=CU)
    rope = fake_cuda_module(cls(DH, qk_layout="thd"))
    with no_host_sync():
        got = rope.apply(to_fake_cuda(q), to_fake_cuda(k), cu_seqlens=to_fake_cuda(CU))
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(cpu_of(a), b, **TOL["forward.float32"])


@pytest.mark.parametrize("kwargs, text", [
    (dict(positions=torch.arange(T)), "positions given together with cu_seqlens"),
    (dict(key_positions=torch.arange(T)), "key_positions given together with cu_seqlens"),
])
def test_positions_with_cu_seqlens_are_refused(kwargs: dict[str, Any], text: str) -> None:
    q, k = qk()
    with pytest.raises(ConfigError, match=text):
        tpt.RotaryEmbedding(DH, qk_layout="thd").apply(q, k, cu_seqlens=CU, **kwargs)


def test_bad_shapes_and_cu_seqlens_are_refused() -> None:
    q, k = qk()
    rope = tpt.RotaryEmbedding(DH, qk_layout="thd")
    with pytest.raises(ConfigError,
                       match=rf"q must have shape \(T, H, 16\) \(qk_layout='thd'\), got \(1, {T}, 4, 16\)"):
        rope.apply(q[None], k[None], cu_seqlens=CU)
    with pytest.raises(ConfigError, match=rf"a packed batch is one row.*got shape \(2, 4, {T}, 16\)"):
        tpt.RotaryEmbedding(DH).apply(torch.randn(2, HQ, T, DH), torch.randn(2, HK, T, DH), cu_seqlens=CU)
    with pytest.raises(ConfigError, match=rf"a packed batch is one row.*got shape \(2, {T}, 4, 16\)"):  # as given
        tpt.RotaryEmbedding(DH, qk_layout="blhd").apply(torch.randn(2, T, HQ, DH), torch.randn(2, T, HK, DH),
                                                        cu_seqlens=CU)
    with pytest.raises(tpt.PositionError, match=f"must end at the number of tokens T = {T}"):
        rope.apply(q, k, cu_seqlens=CU[:-1])
    for big in (T + 2, 10**8):                       # a value above T inside: refused before any write past T
        with pytest.raises(tpt.PositionError, match=r"cu_seqlens\[2\] ="):
            rope.apply(q, k, cu_seqlens=torch.tensor([0, 1, big, T], dtype=torch.int32))


def test_layers_whose_positions_are_not_one_index_per_token_refuse_cu_seqlens() -> None:
    x = torch.randn(T, 2, 8)
    for layer, why in ((tpt.MRotaryEmbedding(8, mrope_section=[2, 1, 1], qk_layout="thd"), "three axes per token"),
                       (tpt.RotaryEmbedding2D(8, qk_layout="thd"), r"a \(row, column\) pair")):
        with pytest.raises(ConfigError, match=f"{type(layer).__name__} does not take cu_seqlens: its positions "
                                              f"are {why}"):
            layer.apply(x, x, None, cu_seqlens=CU)


@pytest.mark.parametrize("center", [None, 3.0])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_packed_xpos_scales_every_document_as_if_run_alone(center: float | None, dtype: torch.dtype) -> None:
    """xPos packs: each document rotated and scaled around its own centre (``center``, or its length // 2,
    the default of a call of that document alone), forward and backward; an empty document too."""
    lengths = [5, 0, 3, 6]
    cu = torch.tensor([0, *np.cumsum(lengths)], dtype=torch.int64)
    n = int(cu[-1])
    g = torch.Generator().manual_seed(4)
    q = torch.randn(n, 4, 8, generator=g, dtype=dtype, requires_grad=True)
    k = torch.randn(n, 2, 8, generator=g, dtype=dtype, requires_grad=True)
    layer = tpt.XPosRotaryEmbedding(8, qk_layout="thd", center=center, dtype=dtype)
    oq, ok = layer.apply(q, k, cu_seqlens=cu)
    (oq.square().sum() + ok.sum()).backward()
    for a, b in zip(cu[:-1].tolist(), cu[1:].tolist(), strict=True):
        qd, kd = q[a:b].detach().requires_grad_(), k[a:b].detach().requires_grad_()
        rq, rk = layer.apply(qd, kd)
        (rq.square().sum() + rk.sum()).backward()
        for got, want in ((oq[a:b], rq), (ok[a:b], rk), (q.grad[a:b], qd.grad), (k.grad[a:b], kd.grad)):
            torch.testing.assert_close(got, want, rtol=0, atol=0)


@pytest.mark.parametrize("layout", ["thd", "blhd"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_packed_call_is_one_op_pass_over_the_cached_table_and_copies_nothing(
        dtype: torch.dtype, layout: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The packed RoPE call hands the op the layer's cached (P, F) cos / sin (no per-call table) and the
    positions (T, 1), with q and k as the (T, H, 1, Dh) views of the token-major rows ((T, H, Dh), or
    (1, T, H, Dh) declared "blhd"; no copy), and the op takes the kernel's in-shape route (not
    :func:`rope_apply`, which copies); the outputs come back contiguous in the declared layout."""
    import tokenpos.torch.rotary as rotary_mod
    rope_ops = importlib.import_module("tokenpos.torch.ops.rope")              # (ops.rope is the op)

    seen: list[tuple[Any, ...]] = []
    real = rotary_mod.ops.rotate_qk

    def spy(*args: Any) -> Any:
        seen.append(args)
        return real(*args)

    def no_copy(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the packed call copied q / k before the kernel")

    monkeypatch.setattr(rotary_mod.ops, "rotate_qk", spy)
    monkeypatch.setattr(rope_ops, "rope_apply", no_copy)
    q, k = qk(dtype)
    if layout == "blhd":
        q, k = q[None], k[None]
    rope = tpt.RotaryEmbedding(DH, max_seq_len=MAX, qk_layout=layout)
    oq, ok = rope.apply(q, k, cu_seqlens=CU)
    (sq, sk, cos, sin, interleaved, pos), = seen
    assert sq.shape == (T, HQ, 1, DH) and sq.data_ptr() == q.data_ptr() and sk.data_ptr() == k.data_ptr()
    assert cos.shape == sin.shape == rope.cos_cached.shape                     # (P, F): the cache, not gathered
    assert cos is rope._cached_as(cos.dtype)[0] and sin is rope._cached_as(cos.dtype)[1]
    assert pos.shape == (T, 1)
    np.testing.assert_array_equal(pos[:, 0].numpy(), tpt.positions_from_cu_seqlens(CU).numpy())
    assert oq.is_contiguous() and ok.is_contiguous() and oq.shape == q.shape and ok.shape == k.shape


def test_the_op_refuses_positions_outside_the_table() -> None:
    """``tokenpos::rope`` / ``rope_qk`` with positions: values outside [0, P) are a PositionError on the
    CPU, a device-side assert on (fake) CUDA with no host sync; bad shapes a ConfigError at the op and
    its fake alike."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    x = torch.randn(1, 2, 4, 8)
    cos, sin = torch.ones(5, 4), torch.zeros(5, 4)
    with pytest.raises(tpt.PositionError, match=r"position 5 at index \(2,\) is out of range \[0, 5\)"):
        torch.ops.tokenpos.rope(x, cos, sin, False, torch.tensor([0, 1, 5, 2]))
    with pytest.raises(tpt.PositionError, match="negative"):
        torch.ops.tokenpos.rope_qk(x, x, cos, sin, False, torch.tensor([[0, -1, 1, 2]]))
    with no_host_sync(), pytest.raises(RuntimeError, match="device-side assert"):
        torch.ops.tokenpos.rope(*(to_fake_cuda(t) for t in (x, cos, sin)), False,
                                to_fake_cuda(torch.tensor([0, 1, 9, 2])))
    for c, s, p, text in ((cos[None], sin[None], torch.zeros(4, dtype=torch.long), r"\(P, R/2\)"),
                          (cos, sin, torch.zeros(2, 4, dtype=torch.long), r"\(4,\), \(1, 4\) or \(1, 4\)")):
        with pytest.raises(ConfigError, match=text):
            torch.ops.tokenpos.rope(x, c, s, False, p)
        with FakeTensorMode() as mode, pytest.raises(ConfigError, match=text):
            torch.ops.tokenpos.rope(*(mode.from_tensor(t) for t in (x, c, s)), False, mode.from_tensor(p))
