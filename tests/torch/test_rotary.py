"""tokenpos.torch.RotaryEmbedding: HF parity for every scaling, bf16 far positions, compile, cache, errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.tolerances import TOL
from tokenpos.tables import ConfigError, PositionError, rope_cos_sin, rope_inv_freq, rope_rotate
from tokenpos.torch.rotary import RotaryEmbedding

pytest.importorskip("transformers")
from transformers import LlamaConfig  # noqa: E402
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb  # noqa: E402

DH, MAX = 16, 32
SCALINGS = {
    "default": None,
    "linear": {"rope_type": "linear", "factor": 2.0},
    "dynamic": {"rope_type": "dynamic", "factor": 2.0},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8},
    "longrope": {"rope_type": "longrope", "short_factor": [1.0 + 0.1 * i for i in range(8)],
                 "long_factor": [1.0 + i for i in range(8)], "original_max_position_embeddings": 8},
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8},
}


def hf_rotary(scaling) -> LlamaRotaryEmbedding:
    rope = {"rope_theta": 10000.0, **(scaling or {"rope_type": "default"})}
    cfg = LlamaConfig(hidden_size=4 * DH, num_attention_heads=4, num_key_value_heads=2, head_dim=DH,
                      max_position_embeddings=MAX, rope_parameters=rope)
    return LlamaRotaryEmbedding(cfg)


def assert_hf_close(ours: torch.Tensor, ref: torch.Tensor, x: torch.Tensor, max_pos: int) -> None:
    tol = TOL["hf.rope_rotated"]
    bound = (tol["atol"] + tol["per_position"] * max_pos) * float(x.abs().max())
    assert ours.dtype == ref.dtype and ours.shape == ref.shape
    assert float((ours - ref).abs().max()) <= bound


@pytest.mark.parametrize("name", sorted(SCALINGS))
def test_calls_match_hf_llama_rotary(name: str) -> None:
    """A sequence of calls (prefill, decode steps, a long prompt, a short one): HF's state and numbers."""
    ours, hf = RotaryEmbedding(DH, max_seq_len=MAX, scaling=SCALINGS[name]), hf_rotary(SCALINGS[name])
    gen = torch.Generator().manual_seed(0)
    for pos in (torch.arange(6)[None], torch.tensor([[6]]), torch.arange(40)[None].repeat(2, 1),
                torch.arange(3, 10)[None], torch.tensor([[100, 101]])):
        b, length = pos.shape
        q, k = torch.randn(b, 4, length, DH, generator=gen), torch.randn(b, 2, length, DH, generator=gen)
        cos, sin = hf(q, pos)
        hq, hk = apply_rotary_pos_emb(q, k, cos, sin)
        oq, ok = ours.apply(q, k, pos if b > 1 else pos[0])
        assert_hf_close(oq, hq, q, int(pos.max()))
        assert_hf_close(ok, hk, k, int(pos.max()))


@pytest.mark.parametrize("name", ["default", "yarn", "longrope"])
def test_start_pos_path_equals_positions_path(name: str) -> None:
    rope = RotaryEmbedding(DH, max_seq_len=MAX, scaling=SCALINGS[name])
    x = torch.randn(1, 2, 5, DH, dtype=torch.float64)
    for start in (0, 30, 200):          # inside the cache, growing it, beyond the growth limit
        a = rope.rotate(x, start_pos=start)
        b = rope.rotate(x, torch.arange(start, start + 5))
        torch.testing.assert_close(a, b, rtol=1e-13, atol=1e-13)


def test_matches_tables_in_float64_and_interleaved() -> None:
    rope = RotaryEmbedding(DH, max_seq_len=8, interleaved=True, rotary_dim=10, scaling=SCALINGS["yarn"])
    x = torch.randn(2, 3, 7, DH, dtype=torch.float64)
    pos = np.array([[0, 1, 2, 50, 51, 52, 3], [9, 8, 7, 6, 5, 4, 3]])
    inv, factor = rope_inv_freq(10, scaling=SCALINGS["yarn"])
    cos, sin = rope_cos_sin(pos, inv, attention_factor=factor, interleaved=True)
    ref = rope_rotate(x.numpy(), cos[:, None], sin[:, None], interleaved=True)
    np.testing.assert_allclose(rope.rotate(x, torch.from_numpy(pos)).numpy(), ref, **TOL["forward.float64"])


def test_bf16_at_position_one_million_keeps_accurate_angles() -> None:
    x = torch.randn(1, 2, 4, 64, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    pos = torch.arange(1_000_000, 1_000_004)
    out = RotaryEmbedding(64).rotate(x, pos)
    assert out.dtype == torch.bfloat16
    inv, _ = rope_inv_freq(64)
    cos, sin = rope_cos_sin(pos.numpy(), inv)
    truth = rope_rotate(x.double().numpy(), cos, sin)                # float64 rotation of the same bf16 inputs
    err = float(np.abs(out.double().numpy() - truth).max()) / float(x.abs().max())
    assert err <= TOL["rope.bf16_far"]["scale"]
    # what bf16 angles would give instead: positions rounded to multiples of 4096 there, garbage
    bf16_angles = (pos.to(torch.bfloat16)[:, None] * torch.tensor(inv).to(torch.bfloat16)).double().numpy()
    bad = rope_rotate(x.double().numpy(), *(np.concatenate([f(bf16_angles)] * 2, -1) for f in (np.cos, np.sin)))
    assert float(np.abs(bad - truth).max()) / float(x.abs().max()) > 20 * err


def test_tables_stay_float64_under_dtype_casts() -> None:
    rope = RotaryEmbedding(DH).to(torch.bfloat16)
    assert rope.inv_freq.dtype == torch.float64 and rope.cos_cached.dtype == torch.float64
    assert rope.half().cos_cached.dtype == torch.float64
    assert rope.state_dict() == {} and list(rope.parameters()) == []
    x = torch.randn(1, 1, 3, DH, dtype=torch.float16)
    assert rope.rotate(x).dtype == torch.float16


def test_cache_grows_on_demand_and_rebuilds_on_variant_change() -> None:
    rope = RotaryEmbedding(DH, max_seq_len=8, scaling=SCALINGS["longrope"])
    assert rope.cos_cached.shape == (8, DH // 2) and rope._cache_key[-1] == ("longrope", "short")
    x = torch.randn(1, 1, 4, DH)
    rope.rotate(x, start_pos=10)                                    # needs 14 rows, long factors
    assert rope.cos_cached.shape[0] >= 14 and rope._cache_key[-1] == ("longrope", "long")
    rope.rotate(x)
    assert rope._cache_key[-1] == ("longrope", "short")


@pytest.mark.parametrize("name", ["default", "yarn", "llama3", "longrope"])
def test_compiles_without_graph_breaks(name: str) -> None:
    torch._dynamo.reset()
    rope = RotaryEmbedding(DH, max_seq_len=MAX, scaling=SCALINGS[name])
    q, k = torch.randn(2, 2, 5, DH), torch.randn(2, 2, 5, DH)
    pos = torch.tensor([[0, 1, 2, 3, 4], [40, 41, 42, 43, 44]])

    def fn(q, k, pos):
        a, b = rope.apply(q, k, pos)
        c, d = rope.apply(q, k, start_pos=60)                       # beyond the cache: formula, no mutation
        return a + c, b + d

    compiled = torch.compile(fn, fullgraph=True, backend="eager")
    for got, ref in zip(compiled(q, k, pos), fn(q, k, pos), strict=True):
        torch.testing.assert_close(got, ref, rtol=0, atol=1e-6)


def test_dynamic_compiles_with_tensor_positions_and_shares_the_eager_state() -> None:
    """Dynamic NTK under torch.compile(fullgraph=True) takes the tensor path (state in ``dynamic_len``):
    the eager results, and compiled and eager calls go on from one state (growth, then reset)."""
    torch._dynamo.reset()
    rope, ref = (RotaryEmbedding(DH, max_seq_len=MAX, scaling=SCALINGS["dynamic"]) for _ in range(2))
    compiled = torch.compile(lambda x, p: rope.apply(x, x, p), fullgraph=True, backend="eager")
    q = torch.randn(1, 1, 3, DH)
    for pos, eager_call in ((torch.tensor([0, 1, 70]), False), (torch.tensor([0, 1, 40]), True),
                            (torch.tensor([0, 1, 2]), False), (torch.tensor([0, 1, 90]), True)):
        got = rope.apply(q, q, pos) if eager_call else compiled(q, pos)
        torch.testing.assert_close(got[0], ref.apply(q, q, pos)[0], rtol=1e-6, atol=1e-6)
        assert int(rope.dynamic_len) == ref._rope_state.max_seq_len_cached


def test_from_hf_config_and_errors_match_numpy() -> None:
    cfg = LlamaConfig(hidden_size=64, num_attention_heads=4, max_position_embeddings=64,
                      rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 500000.0})
    rope = RotaryEmbedding.from_hf_config(cfg)
    assert (rope.head_dim, rope.base, rope.scaling["factor"]) == (16, 500000.0, 2.0)
    from tokenpos.numpy.rotary import RotaryEmbedding as NpRotary

    q = torch.zeros(1, 2, 3, 16)
    cases = [((torch.zeros(1, 2, 3, 6), q), {}), ((q, torch.zeros(1, 2, 4, 16)), {}),
             ((q, q), {"positions": torch.arange(4)}), ((q, q), {"positions": torch.tensor([0, -1, 2])}),
             ((q, q), {"positions": torch.tensor([0.0, 1.0, 2.0])})]
    for args, kwargs in cases:
        with pytest.raises((ConfigError, PositionError)) as t_err:
            rope.apply(*args, **kwargs)
        np_kwargs = {k: v.numpy() for k, v in kwargs.items()}
        with pytest.raises((ConfigError, PositionError)) as n_err:
            NpRotary(16).apply(*(a.numpy() for a in args), **np_kwargs)
        assert type(t_err.value) is type(n_err.value)
        assert str(t_err.value) == str(n_err.value).replace("float64", "float32")


def test_module_apply_idiom_still_works() -> None:
    """``nn.Module.apply(fn)`` recurses into children: a model holding the rotary layer must survive it."""
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), RotaryEmbedding(DH))
    seen = []
    assert model.apply(lambda m: seen.append(type(m).__name__)) is model
    assert seen == ["Linear", "RotaryEmbedding", "Sequential"]


def test_alternating_variants_do_not_grow_the_cache() -> None:
    rope = RotaryEmbedding(DH, max_seq_len=8, scaling=SCALINGS["longrope"])
    x = torch.randn(1, 1, 2, DH)
    for _ in range(6):
        rope.rotate(x, start_pos=20)                                # long
        rope.rotate(x)                                              # short
    assert rope.cos_cached.shape[0] == 8
