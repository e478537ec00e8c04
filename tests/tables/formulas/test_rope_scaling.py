"""tables.formulas.rope_scaling / rope_inv_freq: every HF scaling against HF's own ROPE_INIT_FUNCTIONS, and validation.

HF references are built from small LlamaConfigs (no downloads). HF computes in float32, we in
float64: the difference is a few float32 ulps ("hf.rope_inv_freq").
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from tests.tolerances import TOL
from tokenpos.tables import ConfigError, rope_inv_freq
from tokenpos.tables.formulas.rope_scaling import ROPE_INIT_FUNCTIONS

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from transformers import LlamaConfig  # noqa: E402
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS as HF_INIT  # noqa: E402
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding  # noqa: E402

HEAD_DIM, MAX_POS = 64, 4096
SHORT = [1.0 + 0.05 * i for i in range(HEAD_DIM // 2)]
LONG = [1.0 + 0.4 * i for i in range(HEAD_DIM // 2)]

CASES = {
    "default": {"rope_type": "default"},
    "default-500k": {"rope_type": "default", "rope_theta": 500000.0},
    "linear": {"rope_type": "linear", "factor": 4.0},
    "linear-int": {"rope_type": "linear", "factor": 8},
    "dynamic": {"rope_type": "dynamic", "factor": 2.0},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024},
    "yarn-deepseek": {"rope_type": "yarn", "factor": 40.0, "original_max_position_embeddings": 4096,
                      "mscale": 1.0, "mscale_all_dim": 0.707, "beta_fast": 32, "beta_slow": 1},
    "yarn-no-truncate": {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 512,
                         "truncate": False, "beta_fast": 16.0, "beta_slow": 2.0},
    "yarn-attention-factor": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024,
                              "attention_factor": 1.25},
    "longrope": {"rope_type": "longrope", "short_factor": SHORT, "long_factor": LONG,
                 "original_max_position_embeddings": 1024},
    "longrope-factor": {"rope_type": "longrope", "short_factor": SHORT, "long_factor": LONG,
                        "original_max_position_embeddings": 1024, "factor": 3.0},
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 1024, "rope_theta": 500000.0},
    "legacy-type-key": {"type": "linear", "factor": 2.0},
    # Llama 4 Scout: low_freq_factor == high_freq_factor, an empty smoothing band (HF and Meta accept it)
    "llama3-scout": {"rope_type": "llama3", "factor": 16.0, "low_freq_factor": 1.0, "high_freq_factor": 1.0,
                     "original_max_position_embeddings": 8192, "rope_theta": 500000.0},
}


def hf_params(params: dict, *, seq_len: int | None = None, head_dim: int = HEAD_DIM,
              max_pos: int = MAX_POS, partial: float | None = None) -> tuple[np.ndarray, float]:
    rope = {"rope_theta": 10000.0, **params}
    extra = {} if partial is None else {"partial_rotary_factor": partial}
    cfg = LlamaConfig(hidden_size=head_dim * 4, num_attention_heads=4, head_dim=head_dim,
                      max_position_embeddings=max_pos, rope_parameters=rope, **extra)
    rope_type = cfg.rope_parameters["rope_type"]
    if rope_type == "default":
        inv, factor = LlamaRotaryEmbedding.compute_default_rope_parameters(cfg)
    else:
        inv, factor = HF_INIT[rope_type](cfg, None, seq_len=seq_len)
    return inv.numpy(), float(factor)


def assert_hf(ours: tuple[np.ndarray, float], ref: tuple[np.ndarray, float]) -> None:
    np.testing.assert_allclose(ours[0], ref[0], **TOL["hf.rope_inv_freq"])
    np.testing.assert_allclose(ours[1], ref[1], **TOL["hf.rope_attention_factor"])
    assert ours[0].dtype == np.float64


@pytest.mark.parametrize("name", sorted(CASES))
def test_matches_hf(name: str) -> None:
    params = CASES[name]
    ours = rope_inv_freq(HEAD_DIM, scaling=dict(params), max_position_embeddings=MAX_POS)
    assert_hf(ours, hf_params(params))


@pytest.mark.parametrize("seq_len", [None, 100, 4096, 4097, 10000, 50000])
def test_dynamic_depends_on_seq_len_like_hf(seq_len: int | None) -> None:
    params = CASES["dynamic"]
    ours = rope_inv_freq(HEAD_DIM, scaling=dict(params), max_position_embeddings=MAX_POS, seq_len=seq_len)
    assert_hf(ours, hf_params(params, seq_len=seq_len))


@pytest.mark.parametrize("seq_len", [None, 1, 1024, 1025, 8000])
def test_longrope_short_long_switch_like_hf(seq_len: int | None) -> None:
    params = CASES["longrope"]
    ours = rope_inv_freq(HEAD_DIM, scaling=dict(params), max_position_embeddings=MAX_POS, seq_len=seq_len)
    assert_hf(ours, hf_params(params, seq_len=seq_len))
    short = seq_len is None or seq_len <= 1024
    default = rope_inv_freq(HEAD_DIM)[0]
    np.testing.assert_allclose(ours[0], default / np.array(SHORT if short else LONG), rtol=1e-15)


@pytest.mark.parametrize("name", ["default", "linear", "yarn", "llama3", "dynamic"])
def test_partial_rotary_matches_hf(name: str) -> None:
    params = CASES[name]
    ours = rope_inv_freq(HEAD_DIM, scaling=dict(params), max_position_embeddings=MAX_POS, partial_rotary_factor=0.5)
    assert ours[0].shape == (HEAD_DIM // 4,)
    if name != "default":   # Llama's default function ignores partial_rotary_factor; the others apply it
        assert_hf(ours, hf_params(params, partial=0.5))


def test_relations() -> None:
    default, _ = rope_inv_freq(HEAD_DIM)
    np.testing.assert_allclose(rope_inv_freq(HEAD_DIM, scaling={"rope_type": "linear", "factor": 4.0})[0],
                               default / 4.0, rtol=1e-15)
    dyn, _ = rope_inv_freq(HEAD_DIM, scaling={"rope_type": "dynamic", "factor": 2.0},
                           max_position_embeddings=MAX_POS, seq_len=MAX_POS)
    np.testing.assert_allclose(dyn, default, rtol=1e-15)           # no change up to the trained length
    np.testing.assert_allclose(default, 10000.0 ** (-np.arange(0, HEAD_DIM, 2) / HEAD_DIM), rtol=1e-15)
    yarn, factor = rope_inv_freq(HEAD_DIM, scaling=CASES["yarn"])
    assert factor == pytest.approx(0.1 * math.log(4.0) + 1.0)
    assert yarn[0] == default[0] and yarn[-1] == pytest.approx(default[-1] / 4.0)   # extrapolate / interpolate
    l3, _ = rope_inv_freq(HEAD_DIM, scaling=CASES["llama3"])
    d5, _ = rope_inv_freq(HEAD_DIM, base=500000.0)
    assert l3[0] == d5[0] and l3[-1] == pytest.approx(d5[-1] / 8.0)


def test_rope_theta_in_dict_and_registry() -> None:
    assert set(ROPE_INIT_FUNCTIONS) == {"default", "linear", "dynamic", "yarn", "longrope", "llama3", "proportional"}
    a = rope_inv_freq(HEAD_DIM, scaling={"rope_type": "default", "rope_theta": 500000.0})[0]
    np.testing.assert_array_equal(a, rope_inv_freq(HEAD_DIM, base=500000.0)[0])
    np.testing.assert_array_equal(rope_inv_freq(HEAD_DIM, scaling="default")[0], rope_inv_freq(HEAD_DIM)[0])


BAD = [
    ({"rope_type": "ntk-by-parts"}, "rope_type"),
    ({"rope_type": "linear"}, "missing required keys ['factor']"),
    ({"rope_type": "linear", "factor": 0.5}, "'factor'"),
    ({"rope_type": "linear", "factor": "2"}, "'factor'"),
    ({"rope_type": "linear", "factor": 2.0, "low_freq_factor": 1.0}, "unknown keys ['low_freq_factor']"),
    ({"rope_type": "dynamic", "factor": 0.9}, "'factor'"),
    ({"rope_type": "yarn", "factor": 4.0}, "original_max_position_embeddings"),
    ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64, "beta_fast": 1, "beta_slow": 8},
     "beta_fast"),
    ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64, "attention_factor": -1.0},
     "attention_factor"),
    ({"rope_type": "longrope", "short_factor": [1.0] * 3, "long_factor": [1.0] * 32,
      "original_max_position_embeddings": 64}, "short_factor"),
    ({"rope_type": "longrope", "short_factor": SHORT, "long_factor": LONG, "original_max_position_embeddings": 64,
      "factor": 0.5}, "'factor'"),
    ({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 4.0, "high_freq_factor": 1.0,
      "original_max_position_embeddings": 64}, "high_freq_factor"),
    ({"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 64}, "missing required keys"),
    # an empty band with a wavelength (2 pi, the first pair) exactly on its edge: Meta asserts, HF gives NaN
    ({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 64 / (2 * math.pi),
      "high_freq_factor": 64 / (2 * math.pi), "original_max_position_embeddings": 64}, "wavelength equals"),
]


@pytest.mark.parametrize(("params", "needle"), BAD)
def test_invalid_config_raises_config_error(params: dict, needle: str) -> None:
    with pytest.raises(ConfigError, match=None) as info:
        rope_inv_freq(HEAD_DIM, scaling=params)
    assert needle in str(info.value)
    assert isinstance(info.value, ValueError)


def test_other_invalid_arguments() -> None:
    with pytest.raises(ConfigError, match="max_position_embeddings"):
        rope_inv_freq(HEAD_DIM, scaling={"rope_type": "dynamic", "factor": 2.0})
    with pytest.raises(ConfigError, match="conflicts"):
        rope_inv_freq(HEAD_DIM, base=500000.0, scaling={"rope_type": "default", "rope_theta": 10000.0})
    with pytest.raises(ConfigError, match="rope_scaling must be"):
        rope_inv_freq(HEAD_DIM, scaling=3)
    with pytest.raises(ConfigError, match="partial_rotary_factor"):
        rope_inv_freq(HEAD_DIM, partial_rotary_factor=1.5)
    with pytest.raises(ConfigError, match="seq_len"):
        rope_inv_freq(HEAD_DIM, seq_len=2.5)


def test_a_negative_seq_len_is_refused() -> None:
    with pytest.raises(ConfigError, match="seq_len must be an integer >= 0 or None, got -5"):
        rope_inv_freq(HEAD_DIM, scaling={"rope_type": "dynamic", "factor": 2.0}, max_position_embeddings=64,
                      seq_len=-5)


def test_rope_rotate_refuses_tables_that_do_not_fit_x() -> None:
    """An odd width (from an odd head_dim) or one wider than x was broadcast, silently widening x."""
    from tokenpos.tables import rope_cos_sin, rope_rotate

    cos, sin = rope_cos_sin(np.arange(4), rope_inv_freq(1)[0])                 # (4, 2) for a head_dim of 1
    with pytest.raises(ConfigError, match=r"even width R <= Dh = 1 .*got 2 and 2"):
        rope_rotate(np.ones((4, 1)), cos, sin)
    with pytest.raises(ConfigError, match="got 3 and 3"):
        rope_rotate(np.ones((4, 8)), np.ones((4, 3)), np.ones((4, 3)))
