"""Reading the RoPE settings of a Hugging Face config (object or ``config.json`` dict).

Rule: a config key that changes the rotation is either honoured or refused with ``ConfigError``;
it is never ignored. Keys read (first match wins where several spell the same thing):

| setting | keys |
| --- | --- |
| head dim Dh | ``head_dim``; else ``hidden_size // num_attention_heads`` (dicts: ``n_embd``, ``n_head``) |
| scaling dict | ``rope_parameters`` (transformers 5; may be keyed by layer type), ``rope_scaling`` (4) |
| base | the dict's ``rope_theta``, ``rope_theta``, ``rotary_emb_base`` (older GPT-NeoX dicts); Gemma 3
  (transformers 4) ``rope_local_base_freq`` for ``layer_type="sliding_attention"`` |
| rotated fraction | the dict's ``partial_rotary_factor``, ``partial_rotary_factor``, ``rotary_pct`` (NeoX) |
| rotary dim R | ``rotary_dim`` (GPT-J, CodeGen: interleaved pairs; None = Dh) |
| layout | GPT-J / CodeGen / Llama 4 interleaved; ``rope_interleave`` (DeepSeek-V3: interleaved weights) |
| ``original_max_position_embeddings`` | top level (Phi-3) wins over the dict's value |

Refused: ``mrope_section`` (M-RoPE: use ``MRotaryEmbedding``), ``rotary_emb_fraction``,
``rotary_emb_interleaved`` and ``rotary_emb_scale_base`` (flash-attention style keys that tokenpos does
not map), and two spellings of the same setting that disagree.

:class:`RopeFromHFConfig` gives both backends' ``RotaryEmbedding`` its ``from_hf_config``. The
model-specific readers (Llama 4, Qwen-VL M-RoPE, Pixtral 2-D RoPE) are in ``tables.hf.models``.
"""

from __future__ import annotations

from typing import Any, TypeVar, cast

from tokenpos.tables.checks.validation import check_bool, check_float, check_positive_int
from tokenpos.tables.errors import ConfigError
from tokenpos.tables.formulas.rope_scaling import FULL_WIDTH_TYPES

INTERLEAVED_MODEL_TYPES = ("gptj", "codegen", "llama4", "llama4_text")   # Llama 4 rotates complex pairs
REFUSED_KEYS = {
    "mrope_section": "M-RoPE (3-D positions): build tokenpos MRotaryEmbedding.from_hf_config instead",
    "rotary_emb_fraction": "not mapped by tokenpos; give partial_rotary_factor instead",
    "rotary_emb_interleaved": "not mapped by tokenpos; build RotaryEmbedding(..., interleaved=True) yourself",
    "rotary_emb_scale_base": "xPos scaling: build tokenpos XPosRotaryEmbedding instead",
}


# config.json spellings that HF's config classes map to the standard names (``attribute_map`` of
# GPT-J, CodeGen, GPT-2): a config object answers the standard name itself, a dict does not
DICT_ALIASES = {"hidden_size": "n_embd", "num_attention_heads": "n_head", "max_position_embeddings": "n_positions",
                "num_hidden_layers": "n_layer"}


def config_get(config: Any, name: str) -> Any:
    """``config[name]`` for a dict (else its ``DICT_ALIASES`` spelling), ``getattr(config, name, None)`` otherwise."""
    if isinstance(config, dict):
        value = config.get(name)
        return config.get(DICT_ALIASES[name]) if value is None and name in DICT_ALIASES else value
    try:
        return getattr(config, name, None)
    except RuntimeError as err:     # transformers' AmbiguousGlobalPerLayerAttributeError (Gemma 4: per layer type)
        raise ConfigError(f"config.{name} differs between the model's layers ({err}); pass layer_type= to read "
                          f"one layer type's value") from err


def first_given(config: Any, *names: str) -> Any:
    """The first of ``config``'s keys ``names`` that is not None (None when none is given).

    The one fallback rule of the config readers: None (or a missing key) means "not given"; any other
    value, falsy ones included (0, "", [], False), is the value given, honoured or refused, never
    replaced by a default (``x or default`` would turn ``attn_scale=0.0`` into 0.1).
    """
    for name in names:
        value = config_get(config, name)
        if value is not None:
            return value
    return None


def scaling_params(config: Any) -> Any:
    """``rope_parameters`` (transformers 5), else ``rope_scaling`` (4), else ``{}``; anything but a dict is refused."""
    params = first_given(config, "rope_parameters", "rope_scaling")
    if params is None:
        return {}
    if not isinstance(params, dict):
        raise ConfigError(f"config.rope_parameters / rope_scaling must be a dict, got {params!r} "
                          f"({type(params).__name__})")
    return params


def _first(config: Any, params: dict[str, Any], dict_key: str, *top_keys: str) -> Any:
    """The value of a setting spelled ``params[dict_key]`` or one of ``top_keys`` (a number > 0; disagreeing
    spellings raise)."""
    found = {f"rope_parameters[{dict_key!r}]": params.pop(dict_key, None)}
    found.update({k: config_get(config, k) for k in top_keys})
    given = {k: check_float(k, v, low=0.0, low_inclusive=False) for k, v in found.items() if v is not None}
    if len(set(given.values())) > 1:
        raise ConfigError(f"the HF config spells one setting differently: {given}; expected equal values")
    return next(iter(given.values()), None)


def hf_head_dim(config: Any) -> int:
    """Dh from ``head_dim`` or ``hidden_size // num_attention_heads``."""
    head_dim = config_get(config, "head_dim")
    if head_dim is not None:
        return check_positive_int("config.head_dim", head_dim)
    hidden, heads = config_get(config, "hidden_size"), config_get(config, "num_attention_heads")
    if hidden is None or heads is None:
        raise ConfigError("the HF config has neither head_dim nor hidden_size and num_attention_heads; "
                          "expected one of them")
    return check_positive_int("config.hidden_size", hidden) // check_positive_int("config.num_attention_heads", heads)


def _layer_params(config: Any, params: dict[str, Any], layer_type: str | None) -> dict[str, Any]:
    """The one scaling dict of ``layer_type`` when ``rope_parameters`` is keyed by layer type."""
    nested = any(isinstance(v, dict) for v in params.values()) and all(
        isinstance(v, dict) or v is None for v in params.values())
    layer_types = config_get(config, "layer_types")
    if layer_types is not None and not isinstance(layer_types, (list, tuple)):
        raise ConfigError(f"config.layer_types must be a list of layer type names, got {layer_types!r}")
    if not nested:
        if layer_type is not None and layer_types is not None and layer_type not in set(layer_types):
            raise ConfigError(f"layer_type={layer_type!r} is not among config.layer_types {sorted(set(layer_types))}")
        return params
    if layer_type is None:
        raise ConfigError(f"rope_parameters are keyed by layer type {sorted(params)}; pass "
                          f"layer_type=<one of them>, e.g. RotaryEmbedding.from_hf_config(config, "
                          f"layer_type={sorted(params)[0]!r})")
    if layer_type not in params:
        raise ConfigError(f"layer_type={layer_type!r} is not a key of rope_parameters; "
                          f"expected one of {sorted(params)}")
    if params[layer_type] is None:
        raise ConfigError(f"layer type {layer_type!r} has no RoPE (rope_parameters[{layer_type!r}] is None)")
    return dict(params[layer_type])


def _layer_type_view(config: Any, layer_type: str | None) -> Any:
    """The config of the layers of ``layer_type`` where the config keeps per-layer values (transformers 5's
    ``per_layer_config`` view, keyed by layer type: Gemma 4's full-attention layers have their own head_dim);
    else ``config`` itself."""
    views = None if layer_type is None or isinstance(config, dict) else getattr(config, "per_layer_config", None)
    if views is None:
        return config
    try:
        return views[layer_type]
    except (KeyError, IndexError, TypeError, ValueError):   # keyed otherwise, or the type's layers differ
        return config


def rope_kwargs_from_hf_config(config: Any, *, layer_type: str | None = None) -> dict[str, Any]:
    """RotaryEmbedding keyword arguments from an HF config object (or its ``config.json`` dict).

    Args:
        config: an HF ``PretrainedConfig`` or a dict.
        layer_type: for configs whose RoPE differs per layer type (Gemma 3 / 4: "sliding_attention",
            "full_attention"), the type to build; required there, checked against ``layer_types``.

    Returns:
        ``{"head_dim", "base", "max_seq_len", "scaling", "rotary_dim", "interleaved"}``.

    Raises:
        ConfigError: a refused key (see the module docstring), a missing or unknown layer type,
            disagreeing spellings of one setting, no head dim.
    """
    config = _layer_type_view(config, layer_type)
    raw = scaling_params(config)
    for key, why in REFUSED_KEYS.items():
        value = config_get(config, key)
        if value is None:
            value = raw.get(key)
            if value is None and layer_type is not None and isinstance(raw.get(layer_type), dict):
                value = raw[layer_type].get(key)
        off = value is None or value is False or (key == "rotary_emb_fraction" and value is not True
                                                  and isinstance(value, (int, float)) and value == 1.0)
        if not off:
            raise ConfigError(f"the HF config sets {key}={value!r}, which changes the rotation: {why}")
    head_dim = hf_head_dim(config)
    params = _layer_params(config, dict(raw), layer_type)
    local_base = config_get(config, "rope_local_base_freq")           # Gemma 3 in transformers 4
    if local_base is not None and layer_type is None:
        raise ConfigError("the HF config sets rope_local_base_freq (a different base for sliding-window layers); "
                          "pass layer_type='sliding_attention' or 'full_attention'")
    if local_base is not None and layer_type == "sliding_attention":
        params, base = {}, check_float("config.rope_local_base_freq", local_base, low=0.0, low_inclusive=False)
    else:
        base = _first(config, params, "rope_theta", "rope_theta", "rotary_emb_base")
    prf = _first(config, params, "partial_rotary_factor", "partial_rotary_factor", "rotary_pct")
    max_len = config_get(config, "max_position_embeddings")
    max_len = 2048 if max_len is None else check_positive_int("config.max_position_embeddings", max_len)
    rope_type = params.get("rope_type", params.get("type", "default"))
    original = config_get(config, "original_max_position_embeddings")
    if original is not None and rope_type in ("yarn", "longrope", "llama3"):
        params["original_max_position_embeddings"] = check_positive_int("config.original_max_position_embeddings",
                                                                        original)
    model_type = config_get(config, "model_type")
    if model_type is not None and not isinstance(model_type, str):
        raise ConfigError(f"config.model_type must be a string, got {model_type!r}")
    explicit_r = config_get(config, "rotary_dim")
    if explicit_r is not None:
        explicit_r = check_positive_int("config.rotary_dim", explicit_r)
    rope_interleave = config_get(config, "rope_interleave")
    interleaved = model_type in INTERLEAVED_MODEL_TYPES or (
        rope_interleave is not None and check_bool("config.rope_interleave", rope_interleave))
    if model_type in INTERLEAVED_MODEL_TYPES or explicit_r is not None:
        if prf is not None and explicit_r is not None and int(head_dim * float(prf)) != int(explicit_r):
            raise ConfigError(f"rotary_dim={explicit_r} conflicts with partial_rotary_factor={prf} "
                              f"(int({head_dim} * {prf}) = {int(head_dim * float(prf))})")
        rotary_dim = int(explicit_r) if explicit_r is not None else head_dim
    elif isinstance(rope_type, str) and rope_type in FULL_WIDTH_TYPES:   # (other types: refused by the layer)
        rotary_dim = head_dim                         # p-RoPE keeps the factor inside its dict
        if prf is not None:
            params["partial_rotary_factor"] = float(prf)
    else:
        rotary_dim = int(head_dim * float(1.0 if prf is None else prf))
    return {"head_dim": head_dim, "base": float(10000.0 if base is None else base), "max_seq_len": int(max_len),
            "scaling": params or None, "rotary_dim": rotary_dim, "interleaved": interleaved}


# ----------------------------------------------------------------------------------------------
# The layers' from_hf_config
# ----------------------------------------------------------------------------------------------


_R = TypeVar("_R", bound="RopeFromHFConfig")


class RopeFromHFConfig:
    """``from_hf_config`` of the RotaryEmbedding layers of both backends (a mixin)."""

    @classmethod
    def from_hf_config(cls: type[_R], config: Any, *, layer_type: str | None = None, **kwargs: Any) -> _R:
        """Build from an HF config (``rope_parameters`` of transformers 5 or ``rope_scaling`` of 4).

        ``layer_type`` picks one entry of per-layer-type parameters (Gemma 3 / 4); see
        ``tokenpos.tables.hf.rope`` for every key read (a key that changes the rotation is
        honoured or refused, never ignored).
        """
        return cast(_R, cast(Any, cls)(**{**rope_kwargs_from_hf_config(config, layer_type=layer_type), **kwargs}))
