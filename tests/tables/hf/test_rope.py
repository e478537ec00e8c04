"""tables.hf.rope: every entry of HF's ROPE_INIT_FUNCTIONS (iterated, so a new HF entry fails loudly), p-RoPE,
and the HF config keys that change the rotation (honoured or refused, never ignored)."""

from __future__ import annotations

import numpy as np
import pytest

from tests.tolerances import TOL
from tokenpos.tables import ConfigError, rope_inv_freq
from tokenpos.tables.formulas.rope_scaling import ROPE_INIT_FUNCTIONS
from tokenpos.tables.hf.rope import rope_kwargs_from_hf_config

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from transformers import Gemma3TextConfig, GPTJConfig, GPTNeoXConfig, LlamaConfig  # noqa: E402
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS as HF_INIT  # noqa: E402

HEAD_DIM, MAX_POS = 32, 256
# one small case per HF registry entry; a new HF entry without a case here fails test_every_hf_entry
HF_CASES = {
    "linear": {"rope_type": "linear", "factor": 4.0},
    "dynamic": {"rope_type": "dynamic", "factor": 2.0},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64},
    "longrope": {"rope_type": "longrope", "short_factor": [1.0 + 0.1 * i for i in range(HEAD_DIM // 2)],
                 "long_factor": [1.0 + 0.5 * i for i in range(HEAD_DIM // 2)], "original_max_position_embeddings": 64},
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 64},
    "proportional": {"rope_type": "proportional", "partial_rotary_factor": 0.25, "factor": 2.0},
}


def _hf(params: dict, seq_len: int | None = None) -> tuple[np.ndarray, float]:
    cfg = LlamaConfig(hidden_size=HEAD_DIM * 4, num_attention_heads=4, head_dim=HEAD_DIM,
                      max_position_embeddings=MAX_POS, rope_parameters={"rope_theta": 10000.0, **params})
    inv, factor = HF_INIT[params["rope_type"]](cfg, None, seq_len=seq_len)
    return inv.numpy(), float(factor)


@pytest.mark.parametrize("name", sorted(HF_INIT))
def test_every_hf_entry_is_in_our_registry_and_matches(name: str) -> None:
    assert name in ROPE_INIT_FUNCTIONS, f"HF has rope_type {name!r}; tokenpos.tables.formulas.rope_scaling lacks it"
    assert name in HF_CASES, f"HF has rope_type {name!r}; add a case to HF_CASES"
    for seq_len in (None, 100, 1000):
        inv, factor = rope_inv_freq(HEAD_DIM, scaling=dict(HF_CASES[name]), max_position_embeddings=MAX_POS,
                                    seq_len=seq_len)
        ref_inv, ref_factor = _hf(HF_CASES[name], seq_len)
        np.testing.assert_allclose(inv, ref_inv, **TOL["hf.rope_inv_freq"])
        np.testing.assert_allclose(factor, ref_factor, **TOL["hf.rope_attention_factor"])


@pytest.mark.parametrize("prf", [1.0, 0.5, 0.25, 0.1])
def test_proportional_keeps_full_width_with_zero_frequencies(prf: float) -> None:
    params = {"rope_type": "proportional", "partial_rotary_factor": prf}
    inv, factor = rope_inv_freq(HEAD_DIM, scaling=dict(params))
    assert inv.shape == (HEAD_DIM // 2,) and factor == 1.0
    n = int(prf * HEAD_DIM // 2)
    np.testing.assert_array_equal(inv[n:], 0.0)
    np.testing.assert_allclose(inv[:n], 10000.0 ** (-np.arange(0, 2 * n, 2) / HEAD_DIM), rtol=1e-15)
    np.testing.assert_allclose(inv, _hf(params)[0], **TOL["hf.rope_inv_freq"])


def test_proportional_bad_factor_raises() -> None:
    with pytest.raises(ConfigError, match="'factor'"):
        rope_inv_freq(HEAD_DIM, scaling={"rope_type": "proportional", "factor": 0.0})


def _gemma3(**kw: object) -> Gemma3TextConfig:
    return Gemma3TextConfig(vocab_size=64, hidden_size=64, intermediate_size=64, num_hidden_layers=2,
                            num_attention_heads=2, num_key_value_heads=1, head_dim=32, max_position_embeddings=128,
                            sliding_window=16, layer_types=["sliding_attention", "full_attention"], **kw)


def test_per_layer_type_parameters_need_and_honour_layer_type() -> None:
    cfg = _gemma3()
    with pytest.raises(ConfigError, match="layer_type="):
        rope_kwargs_from_hf_config(cfg)
    with pytest.raises(ConfigError, match="not a key"):
        rope_kwargs_from_hf_config(cfg, layer_type="global")
    full = rope_kwargs_from_hf_config(cfg, layer_type="full_attention")
    sliding = rope_kwargs_from_hf_config(cfg, layer_type="sliding_attention")
    assert full["base"] == cfg.rope_parameters["full_attention"]["rope_theta"]
    assert sliding["base"] == cfg.rope_parameters["sliding_attention"]["rope_theta"]
    assert full["base"] != sliding["base"]


def test_transformers4_gemma3_dict_local_base() -> None:
    d = {"model_type": "gemma3_text", "head_dim": 16, "rope_theta": 1e6, "rope_local_base_freq": 1e4,
         "rope_scaling": {"rope_type": "linear", "factor": 8.0}, "max_position_embeddings": 64}
    with pytest.raises(ConfigError, match="rope_local_base_freq"):
        rope_kwargs_from_hf_config(d)
    assert rope_kwargs_from_hf_config(d, layer_type="sliding_attention")["base"] == 1e4
    full = rope_kwargs_from_hf_config(d, layer_type="full_attention")
    assert full["base"] == 1e6 and full["scaling"] == {"rope_type": "linear", "factor": 8.0}


def test_gptj_rotary_dim_is_interleaved() -> None:
    kw = rope_kwargs_from_hf_config(GPTJConfig(n_embd=64, n_head=4, rotary_dim=8, n_positions=32))
    assert kw["rotary_dim"] == 8 and kw["interleaved"] is True and kw["head_dim"] == 16
    kw = rope_kwargs_from_hf_config({"model_type": "gptj", "n_embd": 64, "hidden_size": 64, "num_attention_heads": 4,
                                     "rotary_dim": None})
    assert kw["rotary_dim"] == 16 and kw["interleaved"] is True


@pytest.mark.parametrize("model_type", ["gptj", "codegen"])
def test_gptj_and_codegen_config_json_dicts_read_like_the_config_objects(model_type: str) -> None:
    """config.json spells n_embd / n_head / n_positions; HF's config classes map them (attribute_map)."""
    from transformers import CodeGenConfig

    d = {"model_type": model_type, "n_embd": 64, "n_head": 4, "rotary_dim": 8, "n_positions": 96}
    cls = GPTJConfig if model_type == "gptj" else CodeGenConfig
    want = rope_kwargs_from_hf_config(cls.from_dict(d))
    assert rope_kwargs_from_hf_config(d) == want
    assert want["head_dim"] == 16 and want["max_seq_len"] == 96 and want["rotary_dim"] == 8


def test_old_neox_dict_rotary_pct_and_base() -> None:
    d = {"model_type": "gpt_neox", "hidden_size": 256, "num_attention_heads": 4, "rotary_pct": 0.25,
         "rotary_emb_base": 20000, "max_position_embeddings": 2048}
    kw = rope_kwargs_from_hf_config(d)
    assert kw["rotary_dim"] == 16 and kw["base"] == 20000.0 and kw["interleaved"] is False
    v5 = GPTNeoXConfig(hidden_size=256, num_attention_heads=4, rotary_pct=0.25, rotary_emb_base=20000)
    kw5 = rope_kwargs_from_hf_config(v5)
    assert kw5["rotary_dim"] == 16 and kw5["base"] == 20000.0


@pytest.mark.parametrize("extra", [{"mrope_section": [2, 3, 3]}, {"rotary_emb_scale_base": 512},
                                   {"rotary_emb_fraction": 0.5}, {"rotary_emb_interleaved": True}])
def test_keys_that_change_the_rotation_are_refused(extra: dict) -> None:
    d = {"hidden_size": 64, "num_attention_heads": 4, **extra}
    with pytest.raises(ConfigError, match=next(iter(extra))):
        rope_kwargs_from_hf_config(d)


def test_disagreeing_spellings_are_refused() -> None:
    d = {"hidden_size": 64, "num_attention_heads": 4, "rotary_pct": 0.25, "partial_rotary_factor": 0.5}
    with pytest.raises(ConfigError, match="differently"):
        rope_kwargs_from_hf_config(d)
    d = {"hidden_size": 64, "num_attention_heads": 4, "rotary_dim": 8, "partial_rotary_factor": 0.25}
    with pytest.raises(ConfigError, match="rotary_dim=8 conflicts"):
        rope_kwargs_from_hf_config(d)


def test_a_config_with_per_layer_values_is_read_per_layer_type() -> None:
    """Gemma 4 keeps head_dim per layer (transformers 5's ``per_layer_config``): ``from_hf_config`` reads the
    given layer type's own value, and without ``layer_type`` the ambiguity is a ConfigError naming ``layer_type=``
    (it was transformers' untyped error)."""
    transformers = pytest.importorskip("transformers")
    from tokenpos.torch import RotaryEmbedding

    config = transformers.Gemma4TextConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                           num_key_value_heads=1, head_dim=16, global_head_dim=32,
                                           intermediate_size=64,
                                           layer_types=["sliding_attention", "full_attention"])
    assert RotaryEmbedding.from_hf_config(config, layer_type="sliding_attention").head_dim == 16
    assert RotaryEmbedding.from_hf_config(config, layer_type="full_attention").head_dim == 32
    with pytest.raises(ConfigError, match="layer_type="):
        RotaryEmbedding.from_hf_config(config)
