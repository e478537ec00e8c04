"""Reading the model-specific position settings of Hugging Face configs: Llama 4, Qwen-VL (M-RoPE), Pixtral (2-D RoPE).

Each function takes an HF config object (or its ``config.json`` dict where noted) and returns the
keyword arguments of the tokenpos layer or option it feeds; the settings every RoPE model shares are
read by :func:`tokenpos.tables.hf.rope.rope_kwargs_from_hf_config`. As there, a key that changes the
result is honoured or refused with ``ConfigError``, never ignored.
"""

from __future__ import annotations

from typing import Any

from tokenpos.tables.errors import ConfigError
from tokenpos.tables.formulas.llama4 import llama4_rope_layers
from tokenpos.tables.hf.rope import config_get, hf_head_dim, rope_kwargs_from_hf_config

# ----------------------------------------------------------------------------------------------
# Llama 4 (iRoPE): NoPE layers and the attention temperature
# ----------------------------------------------------------------------------------------------


def llama4_kwargs_from_hf_config(config: Any) -> dict[str, Any]:
    """``{"rope_layers": [...], "attn_temperature": (floor_scale, attn_scale) | None}`` from a Llama4TextConfig."""
    get = (lambda k: config.get(k)) if isinstance(config, dict) else (lambda k: getattr(config, k, None))
    layers = llama4_rope_layers(int(get("num_hidden_layers") or 0), no_rope_layers=get("no_rope_layers"),
                                interval=get("no_rope_layer_interval") or 4)
    tuning = get("attn_temperature_tuning")
    temp = (float(get("floor_scale") or 8192), float(get("attn_scale") or 0.1)) if tuning in (None, True) else None
    return {"rope_layers": layers, "attn_temperature": temp}


# ----------------------------------------------------------------------------------------------
# Qwen2-VL / Qwen2.5-VL / Qwen3-VL: M-RoPE
# ----------------------------------------------------------------------------------------------


QWEN3_VL_TYPES = ("qwen3_vl", "qwen3_vl_text", "qwen3_vl_moe", "qwen3_vl_moe_text")
MROPE_KEYS = ("mrope_section", "mrope_interleaved")


def mrope_kwargs_from_hf_config(config: Any) -> dict[str, Any]:
    """MRotaryEmbedding keyword arguments from a Qwen2-VL / Qwen2.5-VL / Qwen3-VL config (or its text config).

    Reads ``mrope_section`` (HF's defaults when absent: [16, 24, 24] Qwen2-VL, [24, 20, 20] Qwen3-VL) and
    the layout (interleaved for Qwen3-VL model types or ``mrope_interleaved: true``); the rest as
    :func:`tokenpos.tables.hf.rope.rope_kwargs_from_hf_config`. The legacy rope_type "mrope" is
    "default".
    """
    text = config_get(config, "text_config") or config
    params = dict(config_get(text, "rope_parameters") or config_get(text, "rope_scaling") or {})
    model_type = config_get(text, "model_type") or config_get(config, "model_type") or ""
    qwen3 = model_type in QWEN3_VL_TYPES
    section = params.pop("mrope_section", None) or ([24, 20, 20] if qwen3 else [16, 24, 24])
    layout = "interleaved" if qwen3 or params.pop("mrope_interleaved", False) else "sections"
    params.pop("mrope_interleaved", None)
    if params.get("rope_type", params.get("type")) == "mrope":
        params.pop("type", None)
        params["rope_type"] = "default"
    plain = {"head_dim": hf_head_dim(text), "max_position_embeddings": config_get(text, "max_position_embeddings"),
             "rope_parameters": params, "rope_theta": config_get(text, "rope_theta"),
             "partial_rotary_factor": config_get(text, "partial_rotary_factor")}
    kw = rope_kwargs_from_hf_config({k: v for k, v in plain.items() if v is not None})
    kw.pop("interleaved")
    if kw.pop("rotary_dim") != kw["head_dim"]:
        raise ConfigError("M-RoPE with a partial rotary factor is not supported; expected the whole head to rotate")
    return {**kw, "mrope_section": list(section), "mrope_layout": layout}


# ----------------------------------------------------------------------------------------------
# Pixtral: axial 2-D RoPE
# ----------------------------------------------------------------------------------------------


def rope2d_args_from_hf_config(config: Any) -> tuple[int, float]:
    """``(head_dim, base)`` of an HF ``PixtralVisionConfig`` (``rope_parameters`` of type "axial")."""
    params = dict(getattr(config, "rope_parameters", None) or {})
    if params.get("rope_type", "axial") != "axial" or set(params) - {"rope_type", "rope_theta"}:
        raise ConfigError(f"2-D RoPE reads rope_parameters {{'rope_type': 'axial', 'rope_theta'}}, got {params}")
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return int(head_dim), float(params.get("rope_theta", 10000.0))
