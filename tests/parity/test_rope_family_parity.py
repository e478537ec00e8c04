"""NumPy <-> torch parity (the one helper) for RotaryEmbedding settings of the 2026 family: p-RoPE, per-layer
parameters, GPT-J / NeoX configs, the (B, L, H, Dh) layout and (1, L) positions. (M-RoPE, xPos, 2-D RoPE and
the Llama 4 temperature have their parity tests next to their HF tests in tests/torch/test_rotary_*.py.)"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.parity.helpers import assert_fn_parity
from tokenpos.numpy.rotary import RotaryEmbedding as NpRotary
from tokenpos.torch.rotary import RotaryEmbedding as TRotary

CONFIGS = {
    "proportional": {"head_dim": 16, "rope_parameters": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                                         "rope_theta": 1e6}},
    "gemma3-sliding": {"head_dim": 16, "layer_types": ["sliding_attention", "full_attention"],
                       "rope_parameters": {"sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
                                           "full_attention": {"rope_type": "linear", "factor": 8.0,
                                                              "rope_theta": 1e6}},
                       "_layer_type": "full_attention"},
    "gptj": {"model_type": "gptj", "hidden_size": 64, "num_attention_heads": 4, "rotary_dim": 8},
    "neox-dict": {"hidden_size": 64, "num_attention_heads": 4, "rotary_pct": 0.5, "rotary_emb_base": 20000},
}


@pytest.mark.parametrize("qk_layout", ["bhld", "blhd"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_config_built_rotary_parity(name: str, dtype, qk_layout: str) -> None:
    cfg = dict(CONFIGS[name])
    layer_type = cfg.pop("_layer_type", None)
    np_rope = NpRotary.from_hf_config(cfg, layer_type=layer_type, qk_layout=qk_layout, max_seq_len=16)
    t_rope = TRotary.from_hf_config(cfg, layer_type=layer_type, qk_layout=qk_layout, max_seq_len=16)
    dh = np_rope.head_dim
    rng = np.random.default_rng(0)
    shape_q, shape_k = ((2, 4, 5, dh), (2, 2, 5, dh)) if qk_layout == "bhld" else ((2, 5, 4, dh), (2, 5, 2, dh))
    q, k = rng.standard_normal(shape_q).astype(dtype), rng.standard_normal(shape_k).astype(dtype)
    pos = np.array([[3, 9, 40, 2, 1]])                                    # (1, L): shared by the batch
    assert_fn_parity(lambda a, b: np_rope.apply(a, b, pos), np_rope.backward,
                     lambda a, b: t_rope.apply(a, b, torch.from_numpy(pos)), (q, k))
