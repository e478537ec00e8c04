"""M-RoPE against HF itself (small configs): Qwen2VLRotaryEmbedding (sections) and Qwen3-VL (interleaved)
cos/sin and rotated q/k, ``get_rope_index`` for text + image/video grids; NumPy <-> torch parity through
the one helper; bf16 at position 1,000,000; a hard-coded wrong pairing is detected."""

from __future__ import annotations

import functools
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from tests.parity.helpers import assert_fn_parity
from tests.tolerances import TOL
from tokenpos.numpy.mrope import MRotaryEmbedding as NpMRope
from tokenpos.tables import ConfigError
from tokenpos.tables.formulas.mrope import mrope_position_ids
from tokenpos.torch.mrope import MRotaryEmbedding

transformers = pytest.importorskip("transformers")
from transformers.models.qwen2_vl import modeling_qwen2_vl as q2  # noqa: E402
from transformers.models.qwen3_vl import modeling_qwen3_vl as q3  # noqa: E402

DH = 32                                                             # F = 16


def _text_config(kind: str, section: list[int]) -> object:
    params = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": section}
    if kind == "qwen2":
        return transformers.Qwen2VLTextConfig(hidden_size=DH * 2, num_attention_heads=2, num_key_value_heads=1,
                                              max_position_embeddings=4096, rope_parameters=params)
    params["mrope_interleaved"] = True
    return transformers.Qwen3VLTextConfig(hidden_size=DH * 2, num_attention_heads=2, num_key_value_heads=1,
                                          head_dim=DH, max_position_embeddings=4096, rope_parameters=params)


def _bound(max_pos: int, scale: float = 1.0) -> float:
    tol = TOL["hf.rope_rotated"]
    return (tol["atol"] + tol["per_position"] * max_pos) * scale


@pytest.mark.parametrize(("kind", "section"), [("qwen2", [4, 6, 6]), ("qwen2", [8, 4, 4]), ("qwen3", [6, 5, 5]),
                                               ("qwen3", [8, 4, 4])])
def test_matches_hf_rotary_module_and_rotation(kind: str, section: list[int]) -> None:
    cfg = _text_config(kind, section)
    hf = (q2.Qwen2VLRotaryEmbedding if kind == "qwen2" else q3.Qwen3VLTextRotaryEmbedding)(cfg)
    g = torch.Generator().manual_seed(0)
    pos = torch.randint(0, 3000, (3, 2, 9), generator=g)
    q, k = torch.randn(2, 2, 9, DH, generator=g), torch.randn(2, 1, 9, DH, generator=g)
    cos_hf, sin_hf = hf(q, pos)
    rope = MRotaryEmbedding.from_hf_config(cfg)
    assert rope.settings.mrope_layout == ("sections" if kind == "qwen2" else "interleaved")
    cos, sin = rope.cos_sin(pos)
    assert float((cos - cos_hf.double()).abs().max()) <= _bound(3000)
    assert float((sin - sin_hf.double()).abs().max()) <= _bound(3000)
    apply = q2.apply_rotary_pos_emb if kind == "qwen2" else q3.apply_rotary_pos_emb
    want_q, want_k = apply(q, k, cos_hf, sin_hf)
    got_q, got_k = rope.apply(q, k, pos)
    scale = float(max(q.abs().max(), k.abs().max()))
    assert float((got_q - want_q).abs().max()) <= _bound(3000, scale)
    assert float((got_k - want_k).abs().max()) <= _bound(3000, scale)
    # the other pairing on the same positions: garbage, not a silent near-match
    other = "interleaved" if kind == "qwen2" else "sections"
    try:
        wrong = MRotaryEmbedding(DH, mrope_section=section, mrope_layout=other)
    except ConfigError:                                          # the section list does not fit the other layout
        return
    assert float((wrong.apply(q, k, pos)[0] - want_q).abs().max()) > 0.1 * scale


@pytest.mark.parametrize("params", [
    {"type": "mrope", "mrope_section": [4, 6, 6]},                          # a hub config.json's rope_scaling
    {"type": "mrope", "rope_type": "default", "mrope_section": [4, 6, 6]},  # what transformers 5 makes of it
    {"rope_type": "mrope", "mrope_section": [4, 6, 6]},
])
def test_legacy_mrope_type_reads_as_default_angles(params: dict) -> None:
    """The legacy type "mrope", under either key, beside rope_type "default" or alone: HF's default angles."""
    cfg = {"model_type": "qwen2_vl", "hidden_size": DH * 2, "num_attention_heads": 2, "num_key_value_heads": 1,
           "max_position_embeddings": 4096, "rope_theta": 10000.0, "rope_scaling": params}
    want = MRotaryEmbedding.from_hf_config(_text_config("qwen2", [4, 6, 6]))
    got = MRotaryEmbedding.from_hf_config(cfg)
    pos = torch.arange(12).expand(3, 1, 12)
    for a, b in zip(got.cos_sin(pos), want.cos_sin(pos), strict=True):
        assert torch.equal(a, b)


def test_text_positions_are_plain_rope() -> None:
    from tokenpos.torch import RotaryEmbedding

    rope = MRotaryEmbedding(DH, mrope_section=[4, 6, 6])
    q = torch.randn(2, 2, 7, DH, dtype=torch.float64)
    pos = torch.tensor([[3, 4, 5, 6, 7, 8, 9]])
    a = rope.apply(q, q, pos)[0]
    b = rope.apply(q, q, torch.stack([pos] * 3))[0]
    c = RotaryEmbedding(DH).apply(q, q, pos)[0]
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    torch.testing.assert_close(a, c, **TOL["forward.float64"])


def _hf_rope_index(kind: str, merge: int, ids: torch.Tensor, types: torch.Tensor, image, video, mask):  # noqa: ANN001
    model = q2.Qwen2VLModel if kind == "qwen2" else q3.Qwen3VLModel
    fake = SimpleNamespace(config=SimpleNamespace(vision_config=SimpleNamespace(spatial_merge_size=merge)))
    fake.get_vision_position_ids = functools.partial(model.get_vision_position_ids, fake)
    return model.get_rope_index(fake, ids, types, image_grid_thw=image, video_grid_thw=video, attention_mask=mask)


@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("kind", ["qwen2", "qwen3"])
def test_position_ids_match_hf_get_rope_index(kind: str, masked: bool) -> None:
    # row 0: 3 text, image (1, 4, 6) / merge 2 -> 6 tokens, 2 text, video (2, 2, 4) -> 4 tokens, 1 text
    # row 1: 1 text, image (1, 2, 2) -> 1 token, 14 text
    # (Qwen3-VL splits the video into frames with t = 1, each its own run: timestamps separate them)
    video_run = [2] * 4 + [0] if kind == "qwen2" else [2] * 2 + [0] + [2] * 2
    types = torch.tensor([[0, 0, 0] + [1] * 6 + [0, 0] + video_run + [0], [0, 1] + [0] * 15])
    ids = torch.arange(types.numel()).reshape(types.shape)
    image = torch.tensor([[1, 4, 6], [1, 2, 2]])
    video = torch.tensor([[2, 2, 4]])
    mask = None
    if masked:
        mask = torch.ones_like(types)
        mask[1, -3:] = 0                                             # right padding
    want, want_delta = _hf_rope_index(kind, 2, ids, types, image, video, mask)
    got, delta = mrope_position_ids(types.numpy(), image.numpy(), video.numpy(), spatial_merge_size=2,
                                    attention_mask=None if mask is None else mask.numpy(),
                                    split_video_frames=kind == "qwen3")
    np.testing.assert_array_equal(got, want.numpy())
    np.testing.assert_array_equal(delta, want_delta.numpy())


def _samples(kind: str) -> list[list[int]]:
    """Four multimodal samples of unequal lengths (token types), for packing: grids in order image (1, 4, 6),
    video (2, 2, 4), image (1, 2, 2) with spatial_merge_size 2 (Qwen3-VL splits the video into frames)."""
    video_run = [2] * 4 + [0] if kind == "qwen2" else [2] * 2 + [0] + [2] * 2
    return [[0, 0, 0] + [1] * 6 + [0, 0], [0] + video_run + [0], [0] * 4, [0, 1, 0, 0]]


@pytest.mark.parametrize("kind", ["qwen2", "qwen3"])
def test_packed_position_ids_equal_hf_get_rope_index_of_the_padded_samples(kind: str) -> None:
    """A packed row of samples (cu_seqlens): each sample counted from 0, the ids of HF's get_rope_index on the
    same samples right-padded in a batch with an attention mask, read at the real tokens; one delta per sample."""
    samples = _samples(kind)
    lengths = [len(s) for s in samples]
    width = max(lengths)
    types = torch.tensor([s + [0] * (width - len(s)) for s in samples])
    mask = (torch.arange(width)[None] < torch.tensor(lengths)[:, None]).long()
    image, video = torch.tensor([[1, 4, 6], [1, 2, 2]]), torch.tensor([[2, 2, 4]])
    want, want_delta = _hf_rope_index(kind, 2, torch.arange(types.numel()).reshape(types.shape), types, image,
                                      video, mask)
    row = np.concatenate([np.asarray(s) for s in samples])
    cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    for packed_types in (row, row[None]):                               # (T,) or (1, T)
        got, delta = mrope_position_ids(packed_types, image.numpy(), video.numpy(), spatial_merge_size=2,
                                        split_video_frames=kind == "qwen3", cu_seqlens=cu)
        assert got.shape == (3, 1, row.size) and delta.shape == (len(samples), 1)
        np.testing.assert_array_equal(got[:, 0], want.numpy()[:, mask.bool().numpy()])
        np.testing.assert_array_equal(delta, want_delta.numpy())


def test_packed_multimodal_rows_rotate_and_attend_as_the_padded_batch() -> None:
    """End to end: M-RoPE at the packed ids (qk_layout "thd", positions (3, 1, T)) then block-diagonal attention
    over the samples equals the padded batch at HF's batch ids, per token, outputs and gradients (float64)."""
    from tokenpos.torch import scaled_dot_product_attention

    samples = _samples("qwen2")
    lengths = [len(s) for s in samples]
    width, total = max(lengths), sum(lengths)
    mask = torch.arange(width)[None] < torch.tensor(lengths)[:, None]                 # (N, L) real tokens
    types = torch.tensor([s + [0] * (width - len(s)) for s in samples])
    grids = {"image_grid_thw": np.array([[1, 4, 6], [1, 2, 2]]), "video_grid_thw": np.array([[2, 2, 4]])}
    cu = torch.tensor([0, *np.cumsum(lengths)], dtype=torch.int64)
    packed_ids, _ = mrope_position_ids(np.concatenate(samples), **grids, spatial_merge_size=2, cu_seqlens=cu.numpy())
    padded_ids, _ = mrope_position_ids(types.numpy(), **grids, spatial_merge_size=2, attention_mask=mask.numpy())
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(total, 2, DH, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(3))
    grad = torch.randn(total, 2, DH, generator=g, dtype=torch.float64)

    def pad(x: torch.Tensor) -> torch.Tensor:                                          # (T, H, Dh) -> (N, H, L, Dh)
        out = x.new_zeros((len(samples), width, *x.shape[1:]))
        out[mask] = x
        return out.transpose(1, 2)

    qp, kp, vp = (pad(x.detach()).requires_grad_() for x in (q, k, v))
    thd = MRotaryEmbedding(DH, mrope_section=[4, 6, 6], qk_layout="thd")
    rq, rk = thd.apply(q, k, torch.from_numpy(packed_ids))
    out = scaled_dot_product_attention(rq, rk, v, cu_seqlens=cu)
    bhld = MRotaryEmbedding(DH, mrope_section=[4, 6, 6])
    rqp, rkp = bhld.apply(qp, kp, torch.from_numpy(padded_ids))
    ref = scaled_dot_product_attention(rqp, rkp, vp, attn_mask=mask[:, None, None, :])
    tol = TOL["forward.float64"]
    torch.testing.assert_close(out, ref.transpose(1, 2)[mask], **tol)
    (out * grad).sum().backward()
    (ref * pad(grad)).sum().backward()
    for x, xp in ((q, qp), (k, kp), (v, vp)):
        torch.testing.assert_close(x.grad, xp.grad.transpose(1, 2)[mask], **tol)


@pytest.mark.parametrize("layout", ["sections", "interleaved"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("qk_layout", ["bhld", "blhd"])
def test_numpy_torch_parity(layout: str, dtype, qk_layout: str) -> None:
    kw = {"mrope_section": [4, 2, 2], "mrope_layout": layout, "qk_layout": qk_layout,
          "scaling": {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 64}}
    np_rope, t_rope = NpMRope(16, **kw), MRotaryEmbedding(16, **kw)
    rng = np.random.default_rng(0)
    shape_q, shape_k = ((2, 3, 5, 16), (2, 1, 5, 16)) if qk_layout == "bhld" else ((2, 5, 3, 16), (2, 5, 1, 16))
    q, k = rng.standard_normal(shape_q).astype(dtype), rng.standard_normal(shape_k).astype(dtype)
    pos = rng.integers(0, 200, (3, 2, 5))
    assert_fn_parity(lambda a, b: np_rope.apply(a, b, pos), np_rope.backward,
                     lambda a, b: t_rope.apply(a, b, torch.from_numpy(pos)), (q, k))


def test_bf16_at_position_one_million_keeps_accurate_angles() -> None:
    rope = MRotaryEmbedding(64, mrope_section=[16, 8, 8])
    g = torch.Generator().manual_seed(1)
    x = torch.randn(1, 2, 4, 64, generator=g).to(torch.bfloat16)
    pos = torch.stack([torch.arange(1_000_000, 1_000_004), torch.full((4,), 999_990), torch.arange(4) + 1_000_100])
    out = rope.apply(x, x, pos[:, None])[0]
    assert out.dtype == torch.bfloat16
    np_rope = NpMRope(64, mrope_section=[16, 8, 8])
    cos, sin = np_rope.cos_sin(pos[:, None].numpy())                   # (1, L, Dh)
    from tokenpos.tables.formulas.rope import rope_rotate

    truth = rope_rotate(x.double().numpy(), cos[:, None], sin[:, None])
    err = float(np.abs(out.double().numpy() - truth).max()) / float(x.abs().max())
    assert err <= TOL["rope.bf16_far"]["scale"]
