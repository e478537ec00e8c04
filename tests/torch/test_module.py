"""The torch layers feel like PyTorch: factory kwargs, reset_parameters, extra_repr, buffers, seeds,
state_dict keys and round trips with the NumPy backend, from_pretrained, attend, resize."""

from __future__ import annotations

import inspect
from typing import Any

import numpy as np
import pytest
import torch

import tokenpos.numpy as tpn
import tokenpos.torch as tpt
from tokenpos.tables.formulas.positions import positions_from_padding as np_positions_from_padding
from tokenpos.torch.transformer import positions_from_padding

LAYERS: dict[str, tuple[tuple[Any, ...], dict[str, Any]]] = {
    "TokenEmbedding": ((20, 6), {"padding_idx": 1}),
    "LearnedPositionalEmbedding": ((12, 6), {}),
    "SinusoidalPositionalEncoding": ((12, 6), {}),
    "LayerNorm": ((6,), {}),
    "RMSNorm": ((6,), {}),
    "TransformerEmbedding": ((20, 6, 12), {"num_token_types": 2, "norm": "layernorm"}),
}

STATE_KEYS = {
    "TokenEmbedding": ["weight"],
    "LearnedPositionalEmbedding": ["weight"],
    "SinusoidalPositionalEncoding": [],
    "LayerNorm": ["bias", "weight"],
    "RMSNorm": ["weight"],
    "TransformerEmbedding": ["norm.bias", "norm.weight", "position.weight", "token.weight", "token_type.weight"],
}


@pytest.mark.parametrize("name", sorted(LAYERS))
def test_state_dict_keys_match_numpy_and_docs(name: str) -> None:
    args, kwargs = LAYERS[name]
    t = getattr(tpt, name)(*args, **kwargs)
    n = getattr(tpn, name)(*args, **kwargs)
    assert sorted(t.state_dict()) == sorted(n.state_dict()) == STATE_KEYS[name]
    assert t.training is True and n.training is True


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16, torch.float16, np.float32])
@pytest.mark.parametrize("name", sorted(LAYERS))
def test_factory_kwargs(name: str, dtype: Any) -> None:
    args, kwargs = LAYERS[name]
    layer = getattr(tpt, name)(*args, **kwargs, dtype=dtype, device="cpu")
    want = dtype if isinstance(dtype, torch.dtype) else torch.float32
    for t in list(layer.parameters()) + [b for n, b in layer.named_buffers() if "inv_freq" not in n]:
        assert t.dtype == want and t.device.type == "cpu"
    meta = getattr(tpt, name)(*args, **kwargs, device="meta")
    assert all(p.is_meta for p in meta.parameters())


@pytest.mark.parametrize("name", sorted(LAYERS))
def test_deferred_init_under_a_meta_default_device(name: str) -> None:
    """torchtitan's pattern: build under ``with torch.device("meta")``, then ``to_empty`` and ``reset_parameters``.
    Drawing the init seed from torch's generator made a meta tensor there (``.item()`` failed)."""
    args, kwargs = LAYERS[name]
    torch.manual_seed(0)
    with torch.device("meta"):
        layer = getattr(tpt, name)(*args, **kwargs)
    assert all(p.is_meta for p in layer.parameters())
    layer = layer.to_empty(device="cpu")
    layer.reset_parameters(seed=3)
    want = getattr(tpt, name)(*args, **kwargs, seed=3) if "seed" in _init_args(name) else getattr(tpt, name)(
        *args, **kwargs)
    for key, value in want.state_dict().items():
        assert torch.equal(layer.state_dict()[key], value), key


DEFERRED = {   # layers whose non-persistent tables reset_parameters must rebuild after to_empty
    "T5RelativePositionBias": lambda device: tpt.T5RelativePositionBias(4, num_buckets=8, max_distance=6, seed=0,
                                                                        device=device),
    "TransformerEmbedding-t5": lambda device: tpt.TransformerEmbedding(20, 8, 12, positional="t5", num_heads=2, seed=0,
                                                                       device=device),
    "RotaryEmbedding-dynamic": lambda device: tpt.RotaryEmbedding(8, max_seq_len=32, device=device,
                                                                  scaling={"rope_type": "dynamic", "factor": 2.0}),
    "XPosRotaryEmbedding": lambda device: tpt.XPosRotaryEmbedding(8, device=device),
    "MRotaryEmbedding": lambda device: tpt.MRotaryEmbedding(8, mrope_section=[2, 1, 1], device=device),
    "RotaryEmbedding2D": lambda device: tpt.RotaryEmbedding2D(8, device=device),
}


def test_nope_takes_the_factory_keywords_of_every_layer() -> None:
    assert tpt.NoPositionalEncoding(device="meta", dtype=torch.bfloat16)(4) is None
    assert list(tpn.NoPositionalEncoding(dtype=np.float64).parameters()) == []


@pytest.mark.parametrize("name", sorted(DEFERRED))
def test_every_buffer_is_rebuilt_after_meta_then_to_empty(name: str) -> None:
    """After ``device="meta"``, ``to_empty`` and ``reset_parameters(seed=0)`` every buffer equals a fresh layer's:
    T5's bucket table and dynamic NTK's ``dynamic_len`` were left as uninitialised memory (an IndexError, or a
    rotation silently at another length)."""
    fresh = DEFERRED[name]("cpu")
    layer = DEFERRED[name]("meta").to_empty(device="cpu")
    for buf in layer.buffers():                           # uninitialised memory made explicit: garbage everywhere
        buf.fill_(7 if buf.dtype == torch.int64 else float("nan"))
    layer.reset_parameters(seed=0) if "seed" in str(inspect.signature(layer.reset_parameters)) \
        else layer.reset_parameters()
    want = dict(fresh.named_buffers())
    for key, buf in layer.named_buffers():
        assert torch.equal(buf, want[key]), key
    for key, p in fresh.named_parameters():
        assert torch.equal(dict(layer.named_parameters())[key], p), key


@pytest.mark.parametrize("name", ["XPosRotaryEmbedding", "MRotaryEmbedding", "RotaryEmbedding2D",
                                  "RotaryEmbedding-dynamic"])
@pytest.mark.parametrize("cast", ["float", "half-then-float", "to-float32"])
def test_a_float32_cast_keeps_the_frequencies_float64(name: str, cast: str) -> None:
    """``model.float()`` left xPos, M-RoPE and 2-D RoPE frequencies in float32 (2.7e-4 of |q| at 32k positions):
    every rotary layer's tables come back in float64."""
    layer = DEFERRED[name]("cpu")
    layer = {"float": lambda m: m.float(), "half-then-float": lambda m: m.half().float(),
             "to-float32": lambda m: m.to(torch.float32)}[cast](layer)
    want = dict(DEFERRED[name]("cpu").named_buffers())
    for key, buf in layer.named_buffers():
        assert buf.dtype == want[key].dtype and torch.equal(buf, want[key]), key


def _init_args(name: str) -> set[str]:
    return set(inspect.signature(getattr(tpt, name)).parameters)


def test_reset_parameters_and_seeds_match_numpy() -> None:
    for init in ("normal", "trunc_normal", "xavier_uniform", "standard_normal"):
        t = tpt.TokenEmbedding(30, 5, init=init, padding_idx=2, seed=7)
        n = tpn.TokenEmbedding(30, 5, init=init, padding_idx=2, seed=7)
        assert np.array_equal(t.weight.detach().numpy(), n.weight.data)
    t.reset_parameters(seed=3)
    n.reset_parameters(seed=3)
    assert np.array_equal(t.weight.detach().numpy(), n.weight.data)
    assert not t.weight[2].any()                                       # padding row zeroed
    kw = {"num_token_types": 3, "norm": "layernorm"}
    te, ne = tpt.TransformerEmbedding(30, 5, 9, seed=11, **kw), tpn.TransformerEmbedding(30, 5, 9, seed=11, **kw)
    for k, v in ne.state_dict().items():
        assert np.array_equal(te.state_dict()[k].numpy(), v), k
    rng = np.random.default_rng(5)
    assert np.array_equal(tpt.LearnedPositionalEmbedding(4, 3, rng=rng).weight.detach().numpy(),
                          tpn.LearnedPositionalEmbedding(4, 3, seed=5).weight.data)


def test_torch_manual_seed_and_generator_reproduce() -> None:
    torch.manual_seed(0)
    a = tpt.TransformerEmbedding(30, 5, 9)
    torch.manual_seed(0)
    b = tpt.TransformerEmbedding(30, 5, 9)
    c = tpt.TransformerEmbedding(30, 5, 9)
    assert torch.equal(a.token.weight, b.token.weight)
    assert not torch.equal(a.token.weight, c.token.weight)
    g1, g2 = torch.Generator().manual_seed(4), torch.Generator().manual_seed(4)
    assert torch.equal(tpt.TokenEmbedding(9, 3, generator=g1).weight, tpt.TokenEmbedding(9, 3, generator=g2).weight)
    w = a.token.weight.detach().clone()
    a.reset_parameters()
    assert not torch.equal(w, a.token.weight)


def test_extra_repr() -> None:
    assert repr(tpt.TokenEmbedding(10, 4, padding_idx=0, scale=True)) == \
        "TokenEmbedding(10, 4, padding_idx=0, scale=True, dtype=torch.float32)"
    r = repr(tpt.TransformerEmbedding(10, 4, 8, positional="sinusoidal", dropout=0.1))
    assert r.startswith("TransformerEmbedding(\n  10, 4, max_seq_len=8, positional='sinusoidal', dropout=0.1")
    assert "SinusoidalPositionalEncoding(8, 4, base=10000.0, layout='interleaved')" in r


def test_fixed_tables_are_non_persistent_buffers() -> None:
    layer = tpt.TransformerEmbedding(10, 4, 8, positional="sinusoidal")
    assert "position.table" in dict(layer.named_buffers())
    assert "position.table" not in layer.state_dict()
    assert sorted(layer.state_dict()) == ["token.weight"]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_state_dict_round_trips_both_ways(dtype: Any, tmp_path: Any) -> None:
    kw = {"num_token_types": 2, "norm": "rmsnorm", "dtype": dtype}
    n = tpn.TransformerEmbedding(25, 6, 10, seed=1, **kw)
    t = tpt.TransformerEmbedding(25, 6, 10, seed=2, **kw)
    t.load_state_dict(n.state_dict())                                  # NumPy arrays straight in
    n2 = tpn.TransformerEmbedding(25, 6, 10, seed=3, **kw)
    n2.load_state_dict(t.state_dict())                                 # torch tensors straight in
    for k, v in n.state_dict().items():
        assert t.state_dict()[k].dtype == getattr(torch, np.dtype(dtype).name)
        assert np.array_equal(t.state_dict()[k].numpy(), v) and np.array_equal(n2.state_dict()[k], v)
    t.save(tmp_path / "t.safetensors")                                 # safetensors across backends
    n3 = tpn.TransformerEmbedding(25, 6, 10, seed=4, **kw)
    n3.load(tmp_path / "t.safetensors")
    n3.save(tmp_path / "n.safetensors")
    t2 = tpt.TransformerEmbedding(25, 6, 10, seed=5, **kw)
    t2.load(tmp_path / "n.safetensors")
    assert all(torch.equal(v, t2.state_dict()[k]) for k, v in t.state_dict().items())


def test_from_pretrained() -> None:
    w = torch.randn(7, 3, dtype=torch.float64)
    frozen = tpt.TokenEmbedding.from_pretrained(w, padding_idx=0)
    assert torch.equal(frozen.weight, w) and not frozen.weight.requires_grad and frozen.weight.dtype == torch.float64
    assert frozen.weight.data_ptr() != w.data_ptr()                    # copied
    trainable = tpt.TokenEmbedding.from_pretrained(w.numpy(), freeze=False, dtype=torch.float32)
    assert trainable.weight.requires_grad and trainable.weight.dtype == torch.float32
    out = trainable(torch.tensor([0, 6]))
    out.sum().backward()
    assert trainable.weight.grad[[0, 6]].eq(1).all()
    assert len(list(frozen.parameters())) == 1 and frozen(torch.tensor([1])).requires_grad is False


def test_padding_row_gets_no_lookup_gradient_but_attend_is_dense() -> None:
    layer = tpt.TokenEmbedding(6, 3, padding_idx=2, seed=0)
    layer(torch.tensor([2, 2, 3])).sum().backward()
    assert not layer.weight.grad[2].any() and layer.weight.grad[3].eq(1).all()
    layer.zero_grad()
    h = torch.randn(2, 3)
    logits = layer.attend(h)
    assert torch.allclose(logits, h @ layer.weight.T)
    logits.sum().backward()
    assert layer.weight.grad[2].abs().sum() > 0


def test_sparse_gradient() -> None:
    dense, sparse = tpt.TokenEmbedding(9, 3, seed=0), tpt.TokenEmbedding(9, 3, seed=0, sparse=True)
    ids = torch.tensor([[1, 1, 4]])
    (dense(ids) * 2).sum().backward()
    (sparse(ids) * 2).sum().backward()
    assert sparse.weight.grad.is_sparse
    assert torch.equal(sparse.weight.grad.to_dense(), dense.weight.grad)


def test_resize_matches_numpy() -> None:
    t, n = tpt.TokenEmbedding(10, 4, seed=0, padding_idx=0), tpn.TokenEmbedding(10, 4, seed=0, padding_idx=0)
    t.resize(13, pad_to_multiple_of=8)
    n.resize(13, pad_to_multiple_of=8)
    assert t.vocab_size == 16 and t.weight.shape == (16, 4) and isinstance(t.weight, torch.nn.Parameter)
    assert np.allclose(t.weight.detach().numpy(), n.weight.data, rtol=0, atol=1e-7)
    t.resize(20, init="normal", seed=3)
    n.resize(20, init="normal", seed=3)
    assert np.array_equal(t.weight.detach().numpy()[16:], n.weight.data[16:])
    t.resize(5, allow_shrink=True)
    assert t.weight.shape == (5, 4) and t(torch.tensor([4])).shape == (1, 4)
    with pytest.raises(tpt.TokenIdError):
        t(torch.tensor([5]))


def test_positions_from_padding_matches_tables() -> None:
    ids = torch.tensor([[1, 5, 9, 1, 1], [1, 1, 3, 4, 1]])
    for start in (0, 3):
        got = positions_from_padding(ids, 1, start)
        assert np.array_equal(got.numpy(), np_positions_from_padding(ids.numpy(), 1, start))


def test_numpy_inputs_are_accepted() -> None:
    layer = tpt.TransformerEmbedding(10, 4, 8, seed=0)
    assert torch.equal(layer(np.array([[1, 2]])), layer(torch.tensor([[1, 2]])))
    assert torch.equal(layer(torch.tensor([1, 2], dtype=torch.int32)), layer(torch.tensor([1, 2])))


MIRRORED = sorted(n for n in set(tpn.__all__) - {"Module", "Parameter", "RowSparseGrad", "optim", "functional"}
                  if not n.endswith(("_forward", "_backward")))           # NumPy's own training machinery


@pytest.mark.parametrize("name", MIRRORED)
def test_torch_mirrors_every_numpy_layer_and_its_arguments(name: str) -> None:
    import inspect

    assert hasattr(tpt, name), f"tokenpos.torch lacks {name}"
    np_obj, t_obj = getattr(tpn, name), getattr(tpt, name)
    if inspect.isclass(np_obj) and not issubclass(np_obj, Exception):
        np_params = inspect.signature(np_obj.__init__).parameters
        t_params = inspect.signature(t_obj.__init__).parameters
        assert set(np_params) <= set(t_params), f"{name}: torch lacks {set(np_params) - set(t_params)}"
        for arg, p in np_params.items():
            if arg not in ("self", "dtype"):
                assert t_params[arg].default == p.default, f"{name}({arg}=...) default differs"


def test_resizing_the_token_table_inside_a_transformer_embedding() -> None:
    emb = tpt.TransformerEmbedding(10, 4, 8, seed=0)
    with pytest.raises(tpt.TokenIdError):
        emb(torch.tensor([12]))
    emb.token.resize(13)
    assert emb.vocab_size == 13 and emb(torch.tensor([12])).shape == (1, 4)


def test_small_integer_dtypes_for_ids_and_positions() -> None:
    emb = tpt.TransformerEmbedding(10, 4, 8, seed=0)
    ids = torch.tensor([[1, 2, 3]])
    ref = emb(ids, torch.tensor([0, 2, 4]))
    for dt in (torch.int16, torch.uint8, torch.int32):
        assert torch.equal(emb(ids.to(dt), torch.tensor([0, 2, 4], dtype=dt)), ref)
    sin = tpt.SinusoidalPositionalEncoding(8, 4)
    assert torch.equal(sin(torch.tensor([1, 3], dtype=torch.int16)), sin(torch.tensor([1, 3])))
