"""The new rotary schemes inside both backends' attention functions: NumPy forward/backward vs torch autograd
through the one parity helper (M-RoPE with 3-D and text positions, 2-D RoPE, xPos), and the typed refusals
(key positions other than the queries', xPos with rotated keys); xPos decoding over a KV cache equals
the full call; attention treats a layer by its ``rotates_qk_together`` attribute, never by its name."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.parity.helpers import assert_fn_parity
from tokenpos.numpy.attention import scaled_dot_product_attention_backward as np_backward
from tokenpos.numpy.attention import scaled_dot_product_attention_forward as np_forward
from tokenpos.numpy.mrope import MRotaryEmbedding as NpMRope
from tokenpos.numpy.rope2d import RotaryEmbedding2D as NpRope2D
from tokenpos.numpy.rotary import RotaryEmbedding as NpRope
from tokenpos.numpy.xpos import XPosRotaryEmbedding as NpXPos
from tokenpos.tables import ConfigError
from tokenpos.torch.attention import scaled_dot_product_attention
from tokenpos.torch.mrope import MRotaryEmbedding
from tokenpos.torch.rope2d import RotaryEmbedding2D
from tokenpos.torch.rotary import RotaryEmbedding as TRope
from tokenpos.torch.xpos import XPosRotaryEmbedding

RNG = np.random.default_rng(0)
CASES = {
    "mrope-3d": (lambda m: m.MRotaryEmbedding(8, mrope_section=[2, 1, 1]), RNG.integers(0, 20, (3, 2, 5))),
    "mrope-text": (lambda m: m.MRotaryEmbedding(8, mrope_section=[2, 1, 1], mrope_layout="interleaved"), None),
    "rope2d": (lambda m: m.RotaryEmbedding2D(8), RNG.integers(0, 6, (5, 2))),
    "xpos": (lambda m: m.XPosRotaryEmbedding(8, scale_base=16.0), np.array([0, 3, 4, 9, 12])),
}


class _NpMods:
    MRotaryEmbedding, RotaryEmbedding2D, XPosRotaryEmbedding = NpMRope, NpRope2D, NpXPos


class _TMods:
    MRotaryEmbedding, RotaryEmbedding2D, XPosRotaryEmbedding = MRotaryEmbedding, RotaryEmbedding2D, XPosRotaryEmbedding


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name", sorted(CASES))
def test_attention_parity(name: str, dtype) -> None:  # noqa: ANN001
    make, pos = CASES[name]
    np_pos, t_pos = pos, None if pos is None else torch.from_numpy(pos)
    np_s, t_s = make(_NpMods), make(_TMods)
    q, k, v = (np.random.default_rng(i).standard_normal((2, 2, 5, 8)).astype(dtype) for i in range(3))
    saved = {}

    def np_call(a, b, c):  # noqa: ANN001, ANN202
        out, saved["cache"] = np_forward(a, b, c, positional=np_s, positions=np_pos, causal=True)
        return out

    assert_fn_parity(np_call, lambda g: np_backward(g, saved["cache"]),
                     lambda a, b, c: scaled_dot_product_attention(a, b, c, positional=t_s, positions=t_pos),
                     (q, k, v))


def test_refusals_are_typed_and_the_same_in_both_backends() -> None:
    q = np.zeros((1, 1, 4, 8))
    qt = torch.zeros(1, 1, 4, 8)
    for np_s, t_s in ((NpXPos(8), XPosRotaryEmbedding(8)),):            # keys rotated earlier: no centre to match
        with pytest.raises(ConfigError, match="XPosRotaryEmbedding with rotate_keys=False: it rotates q and k"):
            np_forward(q, q, q, positional=np_s, rotate_keys=False)
        with pytest.raises(ConfigError, match="XPosRotaryEmbedding with rotate_keys=False: it rotates q and k"):
            scaled_dot_product_attention(qt, qt, qt, positional=t_s, rotate_keys=False)
        with pytest.raises(ConfigError, match="xPos scales q up and k down"):
            t_s.rotate(qt)                                                   # one tensor: q or k?
    with pytest.raises(ConfigError, match="2-D RoPE rotates q and k at the same positions"):
        NpRope2D(8).apply(q, q, np.zeros((4, 2), dtype=np.int64), key_positions=np.ones((4, 2), dtype=np.int64))
    with pytest.raises(ConfigError, match="2-D RoPE rotates q and k at the same positions"):
        RotaryEmbedding2D(8).apply(qt, qt, torch.zeros(4, 2, dtype=torch.long), key_positions=torch.ones(4, 2,
                                                                                                         dtype=torch.long))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_mrope_kv_cache_decoding_parity(dtype) -> None:  # noqa: ANN001
    """Lq < Lk, positions None: the queries sit at the last Lq key positions (text ids on all axes)."""
    np_s = NpMRope(8, mrope_section=[2, 1, 1])
    t_s = MRotaryEmbedding(8, mrope_section=[2, 1, 1])
    rng = np.random.default_rng(3)
    q, k, v = rng.standard_normal((2, 2, 2, 8)).astype(dtype), *(rng.standard_normal((2, 2, 6, 8)).astype(dtype)
                                                                  for _ in range(2))
    saved = {}

    def np_call(a, b, c):  # noqa: ANN001, ANN202
        out, saved["cache"] = np_forward(a, b, c, positional=np_s)
        return out

    assert_fn_parity(np_call, lambda g: np_backward(g, saved["cache"]),
                     lambda a, b, c: scaled_dot_product_attention(a, b, c, positional=t_s), (q, k, v))


@pytest.mark.parametrize("center", [None, 5.0])
@pytest.mark.parametrize("lq", [1, 3])
def test_xpos_kv_cache_decoding_equals_the_full_call(center: float | None, lq: int) -> None:
    """A decode step (the last ``lq`` queries over a cache of every key, before rotation) gives the
    full causal call's last rows, in both backends: q and the cached keys share one scale centre
    (``center``, or the keys' length // 2, the full call's), so only the distance counts; and the
    two backends agree on that path (forward and backward, through the parity helper)."""
    rng = np.random.default_rng(7)
    L = 9
    q, k, v = (rng.standard_normal((2, 2, L, 8)) for _ in range(3))
    np_s, t_s = NpXPos(8, scale_base=16.0, center=center), XPosRotaryEmbedding(8, scale_base=16.0, center=center)
    full, _ = np_forward(q, k, v, positional=np_s)
    step, _ = np_forward(q[:, :, -lq:], k, v, positional=np_s)
    np.testing.assert_allclose(step, full[:, :, -lq:], rtol=1e-12, atol=1e-12)
    qt, kt, vt = (torch.from_numpy(x) for x in (q, k, v))
    t_step = scaled_dot_product_attention(qt[:, :, -lq:], kt, vt, positional=t_s)
    torch.testing.assert_close(t_step, torch.from_numpy(full[:, :, -lq:]), rtol=1e-12, atol=1e-12)
    saved = {}

    def np_call(a, b, c):  # noqa: ANN001, ANN202
        out, saved["cache"] = np_forward(a, b, c, positional=np_s)
        return out

    assert_fn_parity(np_call, lambda g: np_backward(g, saved["cache"]),
                     lambda a, b, c: scaled_dot_product_attention(a, b, c, positional=t_s),
                     (q[:, :, -lq:].astype(np.float32), k.astype(np.float32), v.astype(np.float32)))


def test_xpos_apply_with_key_positions_matches_the_reference_over_the_whole_cache() -> None:
    """``apply(q_new, k_cache, start_pos=P, key_positions=arange(Lk))`` rotates the cache's keys as
    rotary-embedding-torch's ``rotate_queries_and_keys`` rotates the full sequence (its q rows at the
    end too): the reference's centre (the keys' length // 2) for both."""
    ret = pytest.importorskip("rotary_embedding_torch")
    L, lq = 10, 2
    ref = ret.RotaryEmbedding(dim=8, use_xpos=True, xpos_scale_base=16, cache_if_possible=False)
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, 2, L, 8, generator=g, dtype=torch.float64), torch.randn(1, 2, L, 8, generator=g,
                                                                                    dtype=torch.float64)
    want_q, want_k = ref.rotate_queries_and_keys(q, k)
    got_q, got_k = XPosRotaryEmbedding(8, scale_base=16.0).apply(q[:, :, -lq:], k, start_pos=L - lq,
                                                                 key_positions=torch.arange(L))
    torch.testing.assert_close(got_q, want_q[:, :, -lq:], rtol=1e-6, atol=1e-6)   # the reference: float32 angles
    torch.testing.assert_close(got_k, want_k, rtol=1e-6, atol=1e-6)


# -- rotates_qk_together: the attribute, not the scheme's name, decides (a new scheme needs no edit) ----------

def _never_one_tensor(self, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
    raise AssertionError("a layer that rotates q and k together was rotated one tensor at a time")


# (NumPy class, torch class), each pair under one class name (the refusal names the class)
RENAMED_XPOS = tuple(type("RenamedXPos", (base,), {"name": "xpos-variant"}) for base in (NpXPos, XPosRotaryEmbedding))
TOGETHER_ROPE = (type("TogetherRope", (NpRope,), {"name": "rope-together", "rotates_qk_together": True}),
                 type("TogetherRope", (TRope,), {"name": "rope-together", "rotates_qk_together": True,
                                                 "rotate": _never_one_tensor}))   # attention must call apply


def test_the_property_is_false_on_the_base_and_set_by_xpos_alone() -> None:
    from tokenpos.tables.registry import SCHEMES, scheme_class

    together = {name for name, entry in SCHEMES.items() if entry.kind == "rotary" for backend in ("numpy", "torch")
                if scheme_class(name, backend).rotates_qk_together}
    assert together == {"xpos"}


@pytest.mark.parametrize("np_cls, t_cls", [RENAMED_XPOS, TOGETHER_ROPE], ids=["renamed-xpos", "rope-with-the-property"])
def test_a_layer_that_rotates_qk_together_refuses_rotated_keys_whatever_its_name(np_cls, t_cls) -> None:  # noqa: ANN001
    """``rotate_keys=False`` is refused (ConfigError naming the class, the same text in both backends) for
    every layer whose class sets ``rotates_qk_together``, not for the name "xpos" alone; nothing is kept."""
    q = np.random.default_rng(1).standard_normal((1, 2, 4, 8))
    qt = torch.from_numpy(q)
    messages = []
    for call in (lambda: np_forward(q, q, q, positional=np_cls(8), rotate_keys=False),
                 lambda: scaled_dot_product_attention(qt, qt, qt, positional=t_cls(8), rotate_keys=False)):
        with pytest.raises(ConfigError) as err:
            call()
        messages.append(str(err.value))
    assert messages[0] == messages[1]
    assert messages[0].startswith(f"{np_cls.__name__} with rotate_keys=False: it rotates q and k together")


@pytest.mark.parametrize("lq", [1, 3])
def test_a_layer_that_rotates_qk_together_decodes_through_one_apply_whatever_its_name(lq: int) -> None:
    """A decode step over a KV cache (Lq < Lk, no positions) rotates q and the keys in one ``apply`` (keys at
    their positions) for every layer whose class sets ``rotates_qk_together``: a renamed xPos gives the full
    call's last rows in both backends, and RoPE declaring the property gives plain RoPE's result without
    its one-tensor ``rotate`` ever being called."""
    rng = np.random.default_rng(11)
    L = 9
    q, k, v = (rng.standard_normal((2, 2, L, 8)) for _ in range(3))
    qt, kt, vt = (torch.from_numpy(x) for x in (q, k, v))
    full, _ = np_forward(q, k, v, positional=NpXPos(8, scale_base=16.0))
    step, _ = np_forward(q[:, :, -lq:], k, v, positional=RENAMED_XPOS[0](8, scale_base=16.0))
    np.testing.assert_allclose(step, full[:, :, -lq:], rtol=1e-12, atol=1e-12)
    t_step = scaled_dot_product_attention(qt[:, :, -lq:], kt, vt, positional=RENAMED_XPOS[1](8, scale_base=16.0))
    torch.testing.assert_close(t_step, torch.from_numpy(full[:, :, -lq:]), rtol=1e-12, atol=1e-12)
    plain = scaled_dot_product_attention(qt[:, :, -lq:], kt, vt, positional=TRope(8, max_seq_len=16))
    together = scaled_dot_product_attention(qt[:, :, -lq:], kt, vt, positional=TOGETHER_ROPE[1](8, max_seq_len=16))
    torch.testing.assert_close(together, plain, rtol=1e-12, atol=1e-12)
    np_together, _ = np_forward(q[:, :, -lq:], k, v, positional=TOGETHER_ROPE[0](8, max_seq_len=16))
    torch.testing.assert_close(torch.from_numpy(np_together), plain, rtol=1e-12, atol=1e-12)


LAYOUT_CASES = {
    "rope": (lambda m, lay: m.RotaryEmbedding(8, qk_layout=lay), None),
    "xpos": (lambda m, lay: m.XPosRotaryEmbedding(8, scale_base=16.0, qk_layout=lay), np.array([0, 3, 4, 9, 12])),
    "mrope": (lambda m, lay: m.MRotaryEmbedding(8, mrope_section=[2, 1, 1], qk_layout=lay),
              RNG.integers(0, 20, (3, 1, 5))),
}


class _NpAll(_NpMods):
    RotaryEmbedding = NpRope


class _TAll(_TMods):
    RotaryEmbedding = TRope


@pytest.mark.parametrize("layout", ["blhd", "thd"])
@pytest.mark.parametrize("name", sorted(LAYOUT_CASES))
def test_a_layer_of_any_qk_layout_attends_as_the_bhld_one(name: str, layout: str) -> None:
    """The attention functions hand q and k (B, H, L, Dh) to the rotary layer in its own qk_layout (and the
    gradients back): a "blhd" layer read the head axis as positions (silently wrong), a "thd" one was refused
    with a misleading shape error. Both backends, outputs and gradients, equal to the "bhld" layer."""
    make, pos = LAYOUT_CASES[name]
    q, k, v = (np.random.default_rng(i).standard_normal((1, 2, 5, 8)) for i in range(3))
    t_pos = None if pos is None else torch.from_numpy(pos)
    qt, kt, vt = (torch.from_numpy(x).requires_grad_() for x in (q, k, v))
    want = scaled_dot_product_attention(qt, kt, vt, positional=make(_TAll, "bhld"), positions=t_pos)
    g = torch.from_numpy(np.random.default_rng(9).standard_normal(want.shape))
    want_grads = torch.autograd.grad(want, (qt, kt, vt), g)
    got = scaled_dot_product_attention(qt, kt, vt, positional=make(_TAll, layout), positions=t_pos)
    got_grads = torch.autograd.grad(got, (qt, kt, vt), g)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    for a, b in zip(got_grads, want_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)
    out, cache = np_forward(q, k, v, positional=make(_NpAll, layout), positions=pos)
    np.testing.assert_allclose(out, want.detach().numpy(), rtol=0, atol=1e-12)
    for a, b in zip(np_backward(g.numpy(), cache), want_grads, strict=True):
        np.testing.assert_allclose(a, b.numpy(), rtol=0, atol=1e-12)


def test_a_packed_row_attends_with_the_thd_layer_the_readme_builds() -> None:
    q = torch.randn(8, 2, 16, dtype=torch.float64)
    cu = torch.tensor([0, 3, 8])
    for mods, conv in ((_TAll, lambda x: x), (_NpAll, lambda x: x.numpy())):
        attend = scaled_dot_product_attention if mods is _TAll else (lambda *a, **kw: np_forward(*a, **kw)[0])
        want = attend(conv(q), conv(q), conv(q), positional=mods.RotaryEmbedding(16), cu_seqlens=conv(cu))
        got = attend(conv(q), conv(q), conv(q), positional=mods.RotaryEmbedding(16, qk_layout="thd"),
                     cu_seqlens=conv(cu))
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=0, atol=1e-12)


def test_a_thd_layer_in_a_batch_of_several_rows_is_refused() -> None:
    x = torch.randn(2, 2, 5, 8)
    with pytest.raises(ConfigError, match="qk_layout='thd' rotates one packed row .* q has 2 rows"):
        scaled_dot_product_attention(x, x, x, positional=TRope(8, qk_layout="thd"))
    with pytest.raises(ConfigError, match="qk_layout='thd' rotates one packed row"):
        np_forward(x.numpy(), x.numpy(), x.numpy(), positional=NpRope(8, qk_layout="thd"))
