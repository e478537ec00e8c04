"""Rotary position embedding (RoPE, Su et al. 2021): frequencies, angles, rotation, layouts.

Shapes: B batch, H heads, L length, Dh head dim, R rotary dim (even, R <= Dh; the first R features
of each head rotate, the rest pass through), F = R / 2 frequencies, P positions, ``...`` any leading.

Layouts of the R rotated features (both rotate pair j by the angle ``pos * inv_freq[j]``):

- ``half`` (HF Llama / GPT-NeoX): pair j is ``(x[j], x[j + F])``; cos/sin are ``cat(c, c)``.
- ``interleaved`` (Meta Llama / GPT-J): pair j is ``(x[2j], x[2j + 1])``; cos/sin repeat each entry twice.
  Rotating pair j equals multiplying the complex number ``x[2j] + i x[2j+1]`` by ``exp(i angle)``.

Like HF, cos and sin are multiplied by the scaling's ``attention_factor`` (YaRN / LongRoPE), so the
map is ``attention_factor * rotation``. Its transpose (the backward) is the same map with ``-sin``.

The rotary layers' input checks and messages (q/k layout, heads, rotary dim, positions) are in
``tables.checks.rope``; reading an HF config is ``tables.hf.rope``.
"""

from __future__ import annotations

import numbers
from typing import Any

import numpy as np

from tokenpos.tables.checks.rope import check_rotary_dim
from tokenpos.tables.checks.validation import check_choice, check_float, check_int, check_positions
from tokenpos.tables.errors import ConfigError
from tokenpos.tables.formulas.rope_scaling import FULL_WIDTH_TYPES, ROPE_INIT_FUNCTIONS, normalize_rope_scaling

LAYOUTS = ("half", "interleaved")


# ----------------------------------------------------------------------------------------------
# Frequencies
# ----------------------------------------------------------------------------------------------


def resolve_rope_base(base: Any, params: dict[str, Any]) -> float:
    """The base: ``rope_theta`` from the scaling dict (transformers 5 keeps it there) or ``base``.

    A dict value wins over the default 10000; two different explicit values raise ``ConfigError``.
    """
    base = check_float("base", base, low=1.0, low_inclusive=False)
    theta = params.get("rope_theta")
    if theta is None:
        return base
    theta = check_float("rope_scaling['rope_theta']", theta, low=1.0, low_inclusive=False)
    if base != 10000.0 and theta != base:
        raise ConfigError(f"base={base} conflicts with rope_scaling['rope_theta']={theta}; give one of them")
    return theta


def rope_inv_freq(head_dim: int, *, base: float = 10000.0, scaling: Any = None,
                  max_position_embeddings: int | None = None, seq_len: int | None = None,
                  partial_rotary_factor: float = 1.0) -> tuple[np.ndarray, float]:
    """Inverse frequencies and attention factor of an HF-style RoPE config, in float64.

    Args:
        head_dim: Dh. The rotary dim is ``R = int(Dh * partial_rotary_factor)`` (as in HF).
        base: the wavelength base ``rope_theta`` (a ``rope_theta`` key in ``scaling`` also works).
        scaling: None / "default", a type name, or an HF dict (``rope_scaling`` of transformers 4 or
            ``rope_parameters`` of transformers 5): ``{"rope_type": "yarn", "factor": 4.0, ...}``.
            Types: default, linear, dynamic, yarn, longrope, llama3, proportional (``formulas/rope_scaling.py``).
        max_position_embeddings: the model's max length (HF ``config.max_position_embeddings``):
            needed by ``dynamic``, and the fallback for ``original_max_position_embeddings``.
        seq_len: the current length (``dynamic`` NTK and ``longrope``'s short/long choice use it).
        partial_rotary_factor: fraction of Dh that rotates (also read from ``scaling``). For
            "proportional" the table keeps Dh / 2 frequencies, the last ones zero (HF's p-RoPE).

    Returns:
        ``(inv_freq, attention_factor)``: inv_freq of shape (F,) = (ceil(R/2),) (proportional:
            (Dh // 2,)), float64; the factor
        HF multiplies cos and sin by (1.0 except for yarn and longrope).

    Raises:
        ConfigError: unknown rope_type, missing or unknown keys, factor < 1, and similar.
    """
    head_dim = check_int("head_dim", head_dim, minimum=1)
    params = normalize_rope_scaling(scaling, max_position_embeddings=max_position_embeddings)
    base = resolve_rope_base(base, params)
    prf = params.get("partial_rotary_factor", partial_rotary_factor)
    prf = check_float("partial_rotary_factor", prf, low=0.0, high=1.0, low_inclusive=False)
    if "partial_rotary_factor" in params and partial_rotary_factor not in (1.0, prf):
        raise ConfigError(f"partial_rotary_factor={partial_rotary_factor} conflicts with "
                          f"rope_scaling['partial_rotary_factor']={prf}; give one of them")
    dim = int(head_dim * prf)
    if params["rope_type"] in FULL_WIDTH_TYPES:    # p-RoPE: R = Dh, zero frequencies past the rotated pairs
        dim, params = head_dim, {**params, "partial_rotary_factor": prf}
    if dim < 1:
        raise ConfigError(f"int(head_dim * partial_rotary_factor) = int({head_dim} * {prf}) = {dim}; expected >= 1")
    if max_position_embeddings is not None:
        max_position_embeddings = check_int("max_position_embeddings", max_position_embeddings, minimum=1)
    if seq_len is not None:
        if isinstance(seq_len, bool) or not isinstance(seq_len, numbers.Integral) or seq_len < 0:
            raise ConfigError(f"seq_len must be an integer >= 0 or None, got {seq_len!r}")
        seq_len = int(seq_len)
    fn = ROPE_INIT_FUNCTIONS[params["rope_type"]]
    inv_freq, attention_factor = fn(params, dim=dim, base=base,
                                    max_position_embeddings=max_position_embeddings, seq_len=seq_len)
    return np.asarray(inv_freq, dtype=np.float64), float(attention_factor)


# ----------------------------------------------------------------------------------------------
# Angles, cos / sin
# ----------------------------------------------------------------------------------------------


def rope_angles(positions: Any, inv_freq: np.ndarray) -> np.ndarray:
    """``positions[..., None] * inv_freq`` in float64: (...,) x (F,) -> (..., F)."""
    pos = check_positions(positions).astype(np.float64)
    return pos[..., None] * np.asarray(inv_freq, dtype=np.float64)


def expand_to_layout(half: np.ndarray, *, interleaved: bool = False) -> np.ndarray:
    """(..., F) -> (..., 2F): ``cat(a, a)`` (half layout) or ``a`` with each entry repeated (interleaved)."""
    if interleaved:
        return np.repeat(half, 2, axis=-1)
    return np.concatenate([half, half], axis=-1)


def rope_cos_sin(positions: Any, inv_freq: np.ndarray, *, attention_factor: float = 1.0,
                 interleaved: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin of the angles, times ``attention_factor``, laid out for R = 2F features.

    Args:
        positions: integer array (...,), e.g. (L,) or (B, L).
        inv_freq: (F,).
    Returns:
        ``(cos, sin)``, each (..., R) float64.
    """
    ang = rope_angles(positions, inv_freq)                      # (..., F)
    cos = expand_to_layout(np.cos(ang), interleaved=interleaved) * attention_factor
    sin = expand_to_layout(np.sin(ang), interleaved=interleaved) * attention_factor
    return cos, sin


# ----------------------------------------------------------------------------------------------
# Rotation (NumPy reference; the NumPy backend uses these directly)
# ----------------------------------------------------------------------------------------------


def rotate_half(x: np.ndarray) -> np.ndarray:
    """HF's ``rotate_half``: ``[x1, x2] -> [-x2, x1]`` on the last axis (..., R)."""
    half = x.shape[-1] // 2
    return np.concatenate([-x[..., half:], x[..., :half]], axis=-1)


def rotate_pairs(x: np.ndarray) -> np.ndarray:
    """Interleaved twin of rotate_half: ``(x0, x1, x2, x3, ...) -> (-x1, x0, -x3, x2, ...)`` on (..., R)."""
    out = np.empty_like(x)
    out[..., 0::2] = -x[..., 1::2]
    out[..., 1::2] = x[..., 0::2]
    return out


def rope_rotate(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, *, interleaved: bool = False) -> np.ndarray:
    """Rotate the first R features of x: ``x * cos + rot(x) * sin``; the rest passes through.

    Args:
        x: (..., Dh).
        cos, sin: (..., R), broadcastable against x[..., :R]. Computed in x's dtype (as HF does).
    Returns:
        (..., Dh), x's dtype.
    """
    r = cos.shape[-1]
    if r % 2 or r > x.shape[-1] or sin.shape[-1] != r:
        raise ConfigError(f"cos and sin must have the same even width R <= Dh = {x.shape[-1]} (the rotated "
                          f"features, in pairs); got {cos.shape[-1]} and {sin.shape[-1]}")
    xr = x[..., :r]
    rot = rotate_pairs(xr) if interleaved else rotate_half(xr)
    out = xr * cos + rot * sin
    if r == x.shape[-1]:
        return out
    return np.concatenate([out, x[..., r:]], axis=-1)


def rope_rotate_backward(grad: np.ndarray, cos: np.ndarray, sin: np.ndarray, *,
                         interleaved: bool = False) -> np.ndarray:
    """Gradient of :func:`rope_rotate` w.r.t. x: the transpose map, i.e. rotation by -angle.

    Args:
        grad: (..., Dh), the gradient of the output.
    Returns:
        (..., Dh).
    """
    return rope_rotate(grad, cos, -sin, interleaved=interleaved)


# ----------------------------------------------------------------------------------------------
# Layout conversion of projection weights
# ----------------------------------------------------------------------------------------------


def qk_permutation(num_heads: int, head_dim: int, *, to: str = "half", rotary_dim: int | None = None) -> np.ndarray:
    """Row order that converts a q/k projection between layouts: ``new = old[perm]``, shape (H * Dh,) int64.

    ``to="half"``: within each head, rotary pair j moves from rows (2j, 2j+1) to rows (j, j + R/2)
    (HF's ``convert_llama_weights_to_hf.permute``); ``to="interleaved"`` is the inverse. Rows R..Dh-1
    of each head (the non-rotated part) stay where they are.
    """
    check_choice("to", to, LAYOUTS)
    num_heads = check_int("num_heads", num_heads, minimum=1)
    r = check_rotary_dim(head_dim, rotary_dim)
    idx = np.arange(num_heads * head_dim, dtype=np.int64).reshape(num_heads, head_dim)
    rot = idx[:, :r]
    if to == "half":   # new row (k, j) of the (2, F) grid reads old row (j, k) of the (F, 2) grid
        rot = rot.reshape(num_heads, r // 2, 2).swapaxes(1, 2)
    else:
        rot = rot.reshape(num_heads, 2, r // 2).swapaxes(1, 2)
    return np.concatenate([rot.reshape(num_heads, r), idx[:, r:]], axis=1).reshape(-1)


def permute_qk_weight(weight: Any, num_heads: int, *, to: str = "half", rotary_dim: int | None = None) -> Any:
    """Reorder the output rows of a q or k projection between the two rotary layouts.

    ``to="half"`` turns Meta/GPT-J (interleaved) weights into HF/NeoX (half) weights, like HF's
    ``convert_llama_weights_to_hf.permute``; ``to="interleaved"`` is its inverse. Attention scores
    are unchanged: q and k get the same permutation inside each head, and rotating in the new
    layout is the old rotation with the features permuted.

    Args:
        weight: (H * Dh, D) weight or (H * Dh,) bias, rows grouped by head: a NumPy array or a
            torch tensor (anything indexable by an int64 array); the result has the same type.
        num_heads: H.
        to: "half" or "interleaved".
        rotary_dim: R (the first R rows of each head are permuted); None = Dh.
    Returns:
        ``weight[perm]``: same shape, dtype and type.
    """
    num_heads = check_int("num_heads", num_heads, minimum=1)
    shape = tuple(int(s) for s in getattr(weight, "shape", np.shape(weight)))
    if len(shape) not in (1, 2) or shape[0] % num_heads:
        raise ConfigError(f"weight must have shape (H * Dh, D) or (H * Dh,) with H={num_heads}, got {shape}")
    if not hasattr(weight, "shape"):
        weight = np.asarray(weight)
    return weight[qk_permutation(num_heads, shape[0] // num_heads, to=to, rotary_dim=rotary_dim)]
