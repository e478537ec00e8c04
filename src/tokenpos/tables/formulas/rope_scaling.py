"""RoPE frequency scalings: a registry from HF's ``rope_type`` strings to pure float64 formulas.

Each entry mirrors one function of HF transformers' ``modeling_rope_utils.ROPE_INIT_FUNCTIONS``
(transformers 5.x) and gives its numbers, computed in float64 instead of float32:

    default   theta_i = base ** (-2i / R)
    linear    theta_i / factor                                   (position interpolation)
    dynamic   NTK: base' = base * (factor * S / M - (factor - 1)) ** (R / (R - 2)), S = max(seq_len, M)
    yarn      blend of theta_i and theta_i / factor by a linear ramp over dims, plus an attention factor
    longrope  theta_i / short_factor_i (seq_len <= original max) or / long_factor_i, plus an attention factor
    llama3    theta_i / factor for long wavelengths, unchanged for short ones, smooth in between
    proportional  p-RoPE (Gemma 4): base ** (-2i / Dh) for the first int(p * Dh // 2) pairs, 0 for the
              rest (they pass through), all / factor; p = partial_rotary_factor, R = Dh always

Shapes: R rotary dim (R = int(head_dim * partial_rotary_factor)), F = ceil(R / 2) frequencies.

Every function has the signature ``fn(params, *, dim, base, max_position_embeddings, seq_len)`` and
returns ``(inv_freq (F,) float64, attention_factor float)``. ``params`` is the normalised dict from
:func:`normalize_rope_scaling`; the values each formula reads are checked with ``tables.checks.rope_scaling``.
HF only warns about an invalid config; here it raises ``ConfigError``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from tokenpos.tables.checks.rope_scaling import check_longrope_factors, check_scaling_number, scaling_key_message
from tokenpos.tables.errors import ConfigError

RopeFn = Callable[..., tuple[np.ndarray, float]]

# Keys accepted in every scaling dict (HF stores the base and partial factor inside rope_parameters).
COMMON_KEYS = frozenset({"rope_type", "type", "rope_theta", "partial_rotary_factor"})
# rope_type -> (required keys, optional keys), as HF's ``_validate_<type>_rope_parameters``.
SCALING_KEYS: dict[str, tuple[frozenset[str], frozenset[str]]] = {
    "default": (frozenset(), frozenset()),
    "linear": (frozenset({"factor"}), frozenset()),
    "dynamic": (frozenset({"factor"}), frozenset()),
    "yarn": (frozenset({"factor", "original_max_position_embeddings"}),
             frozenset({"attention_factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim", "truncate"})),
    "longrope": (frozenset({"short_factor", "long_factor", "original_max_position_embeddings"}),
                 frozenset({"attention_factor", "factor"})),
    "llama3": (frozenset({"factor", "original_max_position_embeddings", "low_freq_factor", "high_freq_factor"}),
               frozenset()),
    "proportional": (frozenset(), frozenset({"factor"})),
}
# Types whose ``original_max_position_embeddings`` HF fills from ``max_position_embeddings``.
_FILL_ORIGINAL = ("yarn", "longrope", "llama3")


# ----------------------------------------------------------------------------------------------
# The scaling dict: the keys of each type (the checks of their values: tables.checks.rope_scaling)
# ----------------------------------------------------------------------------------------------


def normalize_rope_scaling(scaling: Any, *, max_position_embeddings: int | None = None) -> dict[str, Any]:
    """Check an HF-style scaling config and return a new dict with a canonical ``rope_type``.

    Args:
        scaling: None (= "default"), a type name ("linear", ...), or a dict with HF keys
            (``rope_type`` or the older ``type``, ``factor``, ``original_max_position_embeddings``, ...).
        max_position_embeddings: fills ``original_max_position_embeddings`` for yarn/longrope/llama3
            when the dict lacks it, as HF's ``standardize_rope_params`` does.

    Raises:
        ConfigError: unknown type, unknown or missing keys, a factor < 1, and the other checks below.
    """
    if scaling is None:
        return {"rope_type": "default"}
    if isinstance(scaling, str):
        scaling = {"rope_type": scaling}
    if not isinstance(scaling, Mapping):
        raise ConfigError(f"rope_scaling must be None, a rope_type string or a dict, got {type(scaling).__name__}")
    params = dict(scaling)
    rope_type, legacy = params.pop("rope_type", None), params.pop("type", None)
    if rope_type is not None and legacy is not None and rope_type != legacy:
        raise ConfigError(f"rope_scaling spells the type twice, rope_type={rope_type!r} and type={legacy!r}; "
                          f"expected one of them (or equal values)")
    rope_type = legacy if rope_type is None else rope_type     # None / absent: the other spelling, then "default"
    rope_type = "default" if rope_type is None else rope_type
    if not isinstance(rope_type, str) or rope_type not in ROPE_INIT_FUNCTIONS:
        listed = ", ".join(repr(k) for k in ROPE_INIT_FUNCTIONS)
        raise ConfigError(f"rope_scaling['rope_type'] is {rope_type!r}; expected one of {listed}")
    required, optional = SCALING_KEYS[rope_type]
    unknown = sorted(set(params) - required - optional - COMMON_KEYS)
    if unknown:
        allowed = sorted(required | optional | (COMMON_KEYS - {"type"}))
        raise ConfigError(f"rope_scaling has unknown keys {unknown} for rope_type {rope_type!r}; expected keys "
                          f"among {allowed}")
    if rope_type in _FILL_ORIGINAL and params.get("original_max_position_embeddings") is None \
            and max_position_embeddings is not None:
        params["original_max_position_embeddings"] = int(max_position_embeddings)
    missing = sorted(k for k in required if k not in params)
    if missing:
        raise ConfigError(f"rope_scaling for rope_type {rope_type!r} is missing required keys {missing}; "
                          f"got keys {sorted(params)}")
    params["rope_type"] = rope_type
    return params


def freeze_rope_scaling(params: Mapping[str, Any]) -> tuple[tuple[str, Any], ...]:
    """A hashable, order-independent key for a normalised scaling dict (lists become tuples)."""
    return tuple(sorted((k, tuple(v) if isinstance(v, (list, tuple)) else v) for k, v in params.items()))


# ----------------------------------------------------------------------------------------------
# The formulas
# ----------------------------------------------------------------------------------------------


def _optional(params: Mapping[str, Any], key: str) -> Any:
    return params.get(key)


def _default_inv_freq(dim: int, base: float) -> np.ndarray:
    """``base ** (-2i / R)`` for 2i in arange(0, R, 2): shape (F,), float64."""
    return 1.0 / np.power(base, np.arange(0, dim, 2, dtype=np.float64) / dim)


def _original_max(rope_type: str, params: Mapping[str, Any]) -> float:
    return check_scaling_number(rope_type, params, "original_max_position_embeddings", minimum=1)


def _factor_or_length_ratio(rope_type: str, params: Mapping[str, Any], original: float,
                            max_position_embeddings: int | None) -> float:
    """``factor``, or as HF does when it is missing/None (DeepSeek-V3, Phi-3 configs) the ratio of
    ``max_position_embeddings`` to ``original_max_position_embeddings``."""
    if params.get("factor") is not None:
        return check_scaling_number(rope_type, params, "factor", minimum=1.0)
    if max_position_embeddings is None:
        raise ConfigError(f"rope_scaling['factor'] for rope_type {rope_type!r} is missing or None and "
                          f"max_position_embeddings is None; expected a factor >= 1 or both lengths")
    return float(max_position_embeddings) / original


def _compute_default(params: Mapping[str, Any], *, dim: int, base: float,
                     max_position_embeddings: int | None, seq_len: int | None) -> tuple[np.ndarray, float]:
    return _default_inv_freq(dim, base), 1.0


def _compute_linear(params: Mapping[str, Any], *, dim: int, base: float,
                    max_position_embeddings: int | None, seq_len: int | None) -> tuple[np.ndarray, float]:
    factor = check_scaling_number("linear", params, "factor", minimum=1.0)
    return _default_inv_freq(dim, base) / factor, 1.0


def _compute_dynamic(params: Mapping[str, Any], *, dim: int, base: float,
                     max_position_embeddings: int | None, seq_len: int | None) -> tuple[np.ndarray, float]:
    factor = check_scaling_number("dynamic", params, "factor", minimum=1.0)
    if max_position_embeddings is None:
        raise ConfigError("rope_type 'dynamic' needs max_position_embeddings (the length the model was trained on); "
                          "got None")
    if dim <= 2:
        raise ConfigError(f"rope_type 'dynamic' needs a rotary dim > 2, got {dim}")
    m = float(max_position_embeddings)
    s = m if seq_len is None else max(float(seq_len), m)
    base = base * ((factor * s / m) - (factor - 1.0)) ** (dim / (dim - 2))
    return _default_inv_freq(dim, base), 1.0


def yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    """YaRN's ``0.1 * mscale * ln(scale) + 1`` (1 for scale <= 1)."""
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def _compute_yarn(params: Mapping[str, Any], *, dim: int, base: float,
                  max_position_embeddings: int | None, seq_len: int | None) -> tuple[np.ndarray, float]:
    original = _original_max("yarn", params)
    factor = _factor_or_length_ratio("yarn", params, original, max_position_embeddings)
    attention_factor = _optional(params, "attention_factor")
    mscale, mscale_all_dim = _optional(params, "mscale"), _optional(params, "mscale_all_dim")
    for key in ("mscale", "mscale_all_dim", "beta_fast", "beta_slow"):
        if params.get(key) is not None:
            check_scaling_number("yarn", params, key, minimum=0.0, strict=key.startswith("beta"))
    if attention_factor is None:
        if mscale and mscale_all_dim:          # as HF: mscale 0 (DeepSeek's "off") keeps YaRN's own factor
            attention_factor = yarn_mscale(factor, float(mscale)) / yarn_mscale(factor, float(mscale_all_dim))
        else:
            attention_factor = yarn_mscale(factor)
    else:
        attention_factor = check_scaling_number("yarn", params, "attention_factor", minimum=0.0)
    beta_fast = 32.0 if params.get("beta_fast") is None else float(params["beta_fast"])   # checked > 0 above
    beta_slow = 1.0 if params.get("beta_slow") is None else float(params["beta_slow"])
    if beta_fast < beta_slow:
        raise ConfigError(scaling_key_message("yarn", "beta_fast", beta_fast, f"a value >= beta_slow ({beta_slow:g})"))
    truncate = params.get("truncate", True)
    if not isinstance(truncate, (bool, np.bool_)):
        raise ConfigError(scaling_key_message("yarn", "truncate", truncate, "True or False"))

    def correction_dim(num_rotations: float) -> float:
        # the dimension whose wavelength fits num_rotations times into the original length
        return (dim * math.log(original / (num_rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # HF: prevent a division by zero
    ramp = np.clip((np.arange(len(range(0, dim, 2)), dtype=np.float64) - low) / (high - low), 0.0, 1.0)   # (F,)
    extrapolation = 1.0 - ramp                                # 1 = keep theta_i, 0 = interpolate
    pos_freqs = np.power(base, np.arange(0, dim, 2, dtype=np.float64) / dim)
    inv_freq = (1.0 / (factor * pos_freqs)) * (1.0 - extrapolation) + (1.0 / pos_freqs) * extrapolation
    return inv_freq, float(attention_factor)


def _compute_longrope(params: Mapping[str, Any], *, dim: int, base: float,
                      max_position_embeddings: int | None, seq_len: int | None) -> tuple[np.ndarray, float]:
    original = _original_max("longrope", params)
    n = len(range(0, dim, 2))
    long_factor = check_longrope_factors(params, "long_factor", n)
    short_factor = check_longrope_factors(params, "short_factor", n)
    factor = _factor_or_length_ratio("longrope", params, original, max_position_embeddings)
    attention_factor = params.get("attention_factor")
    if attention_factor is None:
        attention_factor = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
    else:
        attention_factor = check_scaling_number("longrope", params, "attention_factor", minimum=0.0)
    ext = long_factor if seq_len and seq_len > original else short_factor
    inv_freq = 1.0 / (ext * np.power(base, np.arange(0, dim, 2, dtype=np.float64) / dim))
    return inv_freq, float(attention_factor)


def _compute_llama3(params: Mapping[str, Any], *, dim: int, base: float,
                    max_position_embeddings: int | None, seq_len: int | None) -> tuple[np.ndarray, float]:
    factor = check_scaling_number("llama3", params, "factor", minimum=1.0)
    low_freq_factor = check_scaling_number("llama3", params, "low_freq_factor", minimum=0.0, strict=True)
    high_freq_factor = check_scaling_number("llama3", params, "high_freq_factor", minimum=0.0, strict=True)
    if high_freq_factor < low_freq_factor:
        raise ConfigError(scaling_key_message("llama3", "high_freq_factor", params["high_freq_factor"],
                                              f"a value >= low_freq_factor ({low_freq_factor:g})"))
    old_context_len = _original_max("llama3", params)
    inv_freq = _default_inv_freq(dim, base)
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    inv_freq_llama = np.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    is_medium = ~(wavelen < high_freq_wavelen) & ~(wavelen > low_freq_wavelen)
    if high_freq_factor == low_freq_factor:     # Llama 4 Scout: the smoothing band is empty (as HF and Meta)
        if is_medium.any():                     # a wavelength exactly on the edge: Meta asserts, HF gives NaN
            raise ConfigError(scaling_key_message("llama3", "high_freq_factor", params["high_freq_factor"],
                                                  "a value > low_freq_factor when a wavelength equals "
                                                  f"original_max_position_embeddings / low_freq_factor "
                                                  f"({low_freq_wavelen:g})"))
        return inv_freq_llama, 1.0
    smooth = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed = (1 - smooth) * inv_freq_llama / factor + smooth * inv_freq_llama
    return np.where(is_medium, smoothed, inv_freq_llama), 1.0


def _compute_proportional(params: Mapping[str, Any], *, dim: int, base: float,
                          max_position_embeddings: int | None, seq_len: int | None) -> tuple[np.ndarray, float]:
    """p-RoPE: ``dim`` is the whole head dim Dh; ``params['partial_rotary_factor']`` (default 1) picks the
    rotated pairs. The exponent divides by Dh (not by the rotated width), as HF does."""
    factor = 1.0
    if "factor" in params:
        factor = check_scaling_number("proportional", params, "factor", minimum=0.0, strict=True)
    proportion = float(params.get("partial_rotary_factor", 1.0))
    rope_angles = int(proportion * dim // 2)
    rotated = 1.0 / np.power(base, np.arange(0, 2 * rope_angles, 2, dtype=np.float64) / dim)
    inv_freq = np.concatenate([rotated, np.zeros(dim // 2 - rope_angles)])      # (Dh // 2,)
    return inv_freq / factor, 1.0


ROPE_INIT_FUNCTIONS: dict[str, RopeFn] = {
    "default": _compute_default,
    "linear": _compute_linear,
    "dynamic": _compute_dynamic,
    "yarn": _compute_yarn,
    "longrope": _compute_longrope,
    "llama3": _compute_llama3,
    "proportional": _compute_proportional,
}
# Types whose partial_rotary_factor selects frequencies inside a full-width (R = Dh) rotation.
FULL_WIDTH_TYPES = frozenset({"proportional"})
# Types whose frequencies depend on the length a call needs (``tables.formulas.rope_state.rope_variant`` picks them).
LENGTH_DEPENDENT_TYPES = ("dynamic", "longrope")
