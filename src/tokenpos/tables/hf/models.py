"""Reading the model-specific position settings of Hugging Face configs: Llama 4, Qwen-VL (M-RoPE), Pixtral (2-D RoPE).

Each function takes an HF config object (or its ``config.json`` dict where noted) and returns the
keyword arguments of the tokenpos layer or option it feeds; the settings every RoPE model shares are
read by :func:`tokenpos.tables.hf.rope.rope_kwargs_from_hf_config`. As there, a key that changes the
result is honoured or refused with ``ConfigError``, never ignored.
"""

from __future__ import annotations

from typing import Any

from tokenpos.tables.checks.attention import check_temperature
from tokenpos.tables.checks.validation import check_bool, check_float, check_int
from tokenpos.tables.errors import ConfigError
from tokenpos.tables.formulas.llama4 import llama4_rope_layers
from tokenpos.tables.hf.rope import config_get, first_given, hf_head_dim, rope_kwargs_from_hf_config, scaling_params

# HF Llama4TextConfig's defaults, used only when a key is absent or None (never for a falsy value)
LLAMA4_DEFAULTS = {"no_rope_layer_interval": 4, "attn_temperature_tuning": True, "floor_scale": 8192.0,
                   "attn_scale": 0.1}

# ----------------------------------------------------------------------------------------------
# Llama 4 (iRoPE): NoPE layers and the attention temperature
# ----------------------------------------------------------------------------------------------


def llama4_kwargs_from_hf_config(config: Any) -> dict[str, Any]:
    """``{"rope_layers": [...], "attn_temperature": (floor_scale, attn_scale) | None}`` from a Llama4TextConfig.

    A key that is absent or None takes HF's default (``LLAMA4_DEFAULTS``); any other value is honoured
    (``attn_scale=0.0``: a temperature of 1) or refused with ConfigError (``floor_scale=0``,
    ``no_rope_layer_interval=0``, ``no_rope_layers=[]``, a non-bool ``attn_temperature_tuning``).
    """
    def get(key: str) -> Any:
        value = config_get(config, key)
        return LLAMA4_DEFAULTS.get(key) if value is None else value

    num_layers = check_int("config.num_hidden_layers", get("num_hidden_layers"), minimum=1)
    no_rope = get("no_rope_layers")
    if no_rope is not None and (not isinstance(no_rope, (list, tuple)) or len(no_rope) != num_layers):
        raise ConfigError(f"config.no_rope_layers must be {num_layers} flags of 0/1 (1 = RoPE), got {no_rope!r}")
    interval = check_int("config.no_rope_layer_interval", get("no_rope_layer_interval"), minimum=1)
    layers = llama4_rope_layers(num_layers, no_rope_layers=no_rope, interval=interval)
    tuning = check_bool("config.attn_temperature_tuning", get("attn_temperature_tuning"))
    floor_scale = check_float("config.floor_scale", get("floor_scale"), low=0.0, low_inclusive=False)
    attn_scale = check_float("config.attn_scale", get("attn_scale"))
    temp = check_temperature((floor_scale, attn_scale)) if tuning else None
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
    :func:`tokenpos.tables.hf.rope.rope_kwargs_from_hf_config`. The legacy type "mrope" (as
    ``rope_type`` or ``type``; a hub ``config.json``'s ``"rope_scaling": {"type": "mrope", ...}``) is
    "default", as HF reads it.
    """
    text = config_get(config, "text_config")
    if text is None:
        text = config
    elif not isinstance(text, dict) and not hasattr(text, "__dict__"):
        raise ConfigError(f"config.text_config must be a config or a dict, got {text!r}")
    params = dict(scaling_params(text))
    model_type = first_given(text, "model_type")
    model_type = first_given(config, "model_type") if model_type is None else model_type
    if model_type is not None and not isinstance(model_type, str):
        raise ConfigError(f"config.model_type must be a string, got {model_type!r}")
    qwen3 = model_type in QWEN3_VL_TYPES
    section = params.pop("mrope_section", None)
    if section is None:                                     # HF's defaults when absent
        section = [24, 20, 20] if qwen3 else [16, 24, 24]
    flag = params.pop("mrope_interleaved", None)
    interleaved = flag is not None and check_bool("rope_parameters['mrope_interleaved']", flag)
    layout = "interleaved" if qwen3 or interleaved else "sections"
    for key in ("rope_type", "type"):   # "mrope" under either name: the legacy marker of default angles
        if params.get(key) == "mrope":      # (transformers 5 keeps type "mrope" beside rope_type "default")
            del params[key]
    plain = {"head_dim": hf_head_dim(text), "max_position_embeddings": config_get(text, "max_position_embeddings"),
             "rope_parameters": params, "rope_theta": config_get(text, "rope_theta"),
             "partial_rotary_factor": config_get(text, "partial_rotary_factor")}
    kw = rope_kwargs_from_hf_config({k: v for k, v in plain.items() if v is not None})
    kw.pop("interleaved")
    if kw.pop("rotary_dim") != kw["head_dim"]:
        raise ConfigError("M-RoPE with a partial rotary factor is not supported; expected the whole head to rotate")
    return {**kw, "mrope_section": list(section) if isinstance(section, (list, tuple)) else section,
            "mrope_layout": layout}


# ----------------------------------------------------------------------------------------------
# Pixtral: axial 2-D RoPE
# ----------------------------------------------------------------------------------------------


def rope2d_args_from_hf_config(config: Any) -> tuple[int, float]:
    """``(head_dim, base)`` of an HF ``PixtralVisionConfig`` (``rope_parameters`` of type "axial")."""
    params = dict(scaling_params(config))
    if params.get("rope_type", "axial") not in ("axial", None) or set(params) - {"rope_type", "rope_theta"}:
        raise ConfigError(f"2-D RoPE reads rope_parameters {{'rope_type': 'axial', 'rope_theta'}}, got {params}")
    theta = params.get("rope_theta")
    base = 10000.0 if theta is None else check_float("rope_parameters['rope_theta']", theta, low=0.0,
                                                     low_inclusive=False)
    return hf_head_dim(config), base
