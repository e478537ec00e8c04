"""tokenpos's replacements for HF's RoPE helper functions: same arguments, same results (to fp32 rounding).

Each family's attention calls a module-level helper of one of a few calling conventions
(:func:`tokenpos.torch.hf.families.convention_of`); :data:`REPLACEMENTS` maps each convention ("kind") to a
function here that rotates q and k in one ``tokenpos::rope_qk`` pass (GPT-J and Gemma 4 rotate one tensor per
call: ``tokenpos::rope``), through :func:`tokenpos.torch.ops.entry.rotate_qk` / ``rotate``. HF's cos / sin
(B, L, R) hold duplicated halves [c, c]; the op reads the first half (B, L, F), F = R/2, as float32 (float64
for a float64 model: the op never takes low-precision tables). :data:`TABLE_FORMS` names the table layout
each kind reads (the form :class:`tokenpos.torch.hf.exact.ExactAngles` hands them in).

Shapes: B batch, H (Hk) query (key) heads, L length, Dh head dim, R rotary dim, F = R/2.
"""

from __future__ import annotations

from typing import Any

import torch

from tokenpos.tables.errors import ConfigError
from tokenpos.torch.ops.entry import rotate, rotate_qk


def _op_tables(cos: torch.Tensor, sin: torch.Tensor, F: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos / sin (..., >= F) -> their first F entries (..., F), contiguous, float32 or float64."""
    c, s = cos[..., :F], sin[..., :F]
    if c.dtype not in (torch.float32, torch.float64):
        c, s = c.float(), s.float()
    return c.contiguous(), s.contiguous()


def _check_unsqueeze(unsqueeze_dim: int) -> None:
    if unsqueeze_dim not in (1, 2):
        raise ConfigError(f"apply_rotary_pos_emb patched by tokenpos takes unsqueeze_dim 1 (q (B, H, L, Dh)) or 2 "
                          f"(q (B, L, H, Dh)); got {unsqueeze_dim!r}")


def _qk(q: torch.Tensor, k: torch.Tensor, c: torch.Tensor, s: torch.Tensor, interleaved: bool,
        unsqueeze_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """q (B, H, L, Dh), k (B, Hk, L, Dh) (``unsqueeze_dim=2``: (B, L, H, Dh)), c / s (B, L, F) -> (q', k')."""
    _check_unsqueeze(unsqueeze_dim)
    if unsqueeze_dim == 2:
        oq, ok = rotate_qk(q.transpose(1, 2), k.transpose(1, 2), c, s, interleaved)
        return oq.transpose(1, 2), ok.transpose(1, 2)
    return rotate_qk(q, k, c, s, interleaved)


def rope_qk_half(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                 unsqueeze_dim: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """HF's ``apply_rotary_pos_emb``: q (B, H, L, Dh), k (B, Hk, L, Dh) (``unsqueeze_dim=2``: (B, L, H, Dh)),
    cos / sin (B, L, R) = [c, c], R <= Dh (the rest passes) -> (q', k') in one ``tokenpos::rope_qk`` pass."""
    return _qk(q, k, *_op_tables(cos, sin, cos.shape[-1] // 2), False, unsqueeze_dim)


def rope_glm(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
             unsqueeze_dim: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """GLM's ``apply_rotary_pos_emb``: cos / sin (B, L, R) = [c, c] read as c on interleaved pairs of the
    first R entries of q (B, H, L, Dh), k (the rest passes) -> (q', k')."""
    return _qk(q, k, *_op_tables(cos, sin, cos.shape[-1] // 2), True, unsqueeze_dim)


def rope_cohere(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                unsqueeze_dim: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """Cohere's ``apply_rotary_pos_emb``: cos / sin (B, L, Dh) = [c0, c0, c1, c1, ...], interleaved pairs,
    float32 math, results in q's dtype -> (q', k')."""
    return _qk(q, k, *_op_tables(cos[..., 0::2], sin[..., 0::2], cos.shape[-1] // 2), True, unsqueeze_dim)


def rope_x(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, unsqueeze_dim: int = 1) -> torch.Tensor:
    """Gemma 4's ``apply_rotary_pos_emb`` (one tensor per call): x (B, H, L, Dh) (``unsqueeze_dim=2``:
    (B, L, H, Dh)), cos / sin (B, L, R) = [c, c] -> x' in one ``tokenpos::rope`` pass."""
    _check_unsqueeze(unsqueeze_dim)
    c, s = _op_tables(cos, sin, cos.shape[-1] // 2)
    if unsqueeze_dim == 2:
        return rotate(x.transpose(1, 2), c, s, False).transpose(1, 2)
    return rotate(x, c, s, False)


def rope_deinterleave(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                      position_ids: Any = None, unsqueeze_dim: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """DeepSeek's ``apply_rotary_pos_emb_interleave``: the even then the odd entries of q (B, H, L, R), k
    (B, Hk, L, R) rotated as halves by cos / sin (B, L, R) = [c, c] -> (q', k') (position_ids unused, as in HF)."""
    qd = torch.cat([q[..., 0::2], q[..., 1::2]], dim=-1)
    kd = torch.cat([k[..., 0::2], k[..., 1::2]], dim=-1)
    return rope_qk_half(qd, kd, cos, sin, unsqueeze_dim)


def rope_gptj(x: torch.Tensor, sin: torch.Tensor, cos: torch.Tensor) -> torch.Tensor:
    """GPT-J's ``apply_rotary_pos_emb``: x (B, L, H, R), sin / cos (B, L, R/2), interleaved pairs -> (B, L, H, R)."""
    c, s = _op_tables(cos, sin, cos.shape[-1])
    return rotate(x.transpose(1, 2), c, s, True).transpose(1, 2)


def rope_llama4(xq: torch.Tensor, xk: torch.Tensor, freqs_cis: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Llama 4's ``apply_rotary_emb``: xq (B, L, H, Dh), xk (B, L, Hk, Dh), freqs_cis complex (B, L, Dh/2),
    interleaved pairs -> (xq', xk') in one ``tokenpos::rope_qk`` pass."""
    c, s = _op_tables(freqs_cis.real, freqs_cis.imag, freqs_cis.shape[-1])
    oq, ok = rotate_qk(xq.transpose(1, 2), xk.transpose(1, 2), c, s, True)
    return oq.transpose(1, 2), ok.transpose(1, 2)


REPLACEMENTS = {"qk": rope_qk_half, "glm": rope_glm, "cohere": rope_cohere, "x": rope_x,
                "deinterleave": rope_deinterleave, "gptj": rope_gptj, "llama4": rope_llama4}
# the tables each rope kind reads: ExactAngles (tokenpos.torch.hf.exact) hands them in that form
TABLE_FORMS = {"qk": "halves", "glm": "halves", "x": "halves", "deinterleave": "halves", "cohere": "pairs",
               "gptj": "gptj", "llama4": "llama4"}
