"""``patch(model, angles="exact")``: the model's rotary module(s) rebuilt from tokenpos's float64 angles.

:func:`exact_rotary` builds an :class:`ExactAngles` from the model's config (tokenpos's
``RotaryEmbedding`` / ``MRotaryEmbedding.from_hf_config``) and checks it against HF's rotary module at the
probe positions (:func:`tokenpos.torch.hf.families.probe_rotary`) before anything changes; its ``forward``
hands cos / sin to the patched RoPE function in the form that function reads
(:data:`tokenpos.torch.hf.rope_helpers.TABLE_FORMS`).

Shapes: B batch, L length, Dh head dim, R rotary dim, F = R/2.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn

from tokenpos.tables.errors import ConfigError
from tokenpos.torch.hf.embedding import FollowsDisplaced
from tokenpos.torch.hf.families import Family, probe_rotary
from tokenpos.torch.hf.rope_helpers import TABLE_FORMS


class ExactAngles(FollowsDisplaced):
    """An HF rotary module rebuilt from tokenpos's float64 angles (``patch(angles="exact")``).

    ``forward(x, position_ids, layer_type=None)`` returns the tables in the form ``form`` (the patched
    RoPE function reads them so, :data:`TABLE_FORMS`): "halves": cos, sin (B, L, R) = [c, c]; "pairs":
    (B, L, R) = [c0, c0, c1, c1, ...]; "gptj": sin, cos (B, L, F); "llama4": complex (B, L, F).
    position_ids (B, L), or (3, B, L) for M-RoPE. Tables are float32 (float64 for a float64 ``x``).
    """

    def __init__(self, rotary: dict[str, nn.Module], form: str) -> None:
        super().__init__()
        self.rotary = nn.ModuleDict(rotary)
        self.form = form

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor, layer_type: str | None = None) -> Any:
        from tokenpos.torch.mrope import MRotaryEmbedding

        rot: Any = self.rotary[layer_type or "default"]
        if isinstance(rot, MRotaryEmbedding):
            pos = position_ids.expand(3, -1, -1) if position_ids.ndim == 2 else position_ids
            cos, sin = rot.cos_sin(pos)                               # (B, L, Dh) float64, [c, c]
            c, s = cos[..., : cos.shape[-1] // 2], sin[..., : sin.shape[-1] // 2]
        else:
            cos, sin = rot.cos_sin_positions(position_ids)            # (B, L, R) float64, in the layout
            F = cos.shape[-1] // 2
            c, s = (cos[..., 0::2], sin[..., 0::2]) if rot.interleaved else (cos[..., :F], sin[..., :F])
        dt = torch.float64 if x.dtype == torch.float64 else torch.float32
        c, s = c.to(dt), s.to(dt)                                     # (B, L, F)
        if self.form == "gptj":
            return s.contiguous(), c.contiguous()
        if self.form == "llama4":
            return torch.complex(c, s)
        if self.form == "pairs":
            return c.repeat_interleave(2, dim=-1), s.repeat_interleave(2, dim=-1)
        return torch.cat((c, c), dim=-1), torch.cat((s, s), dim=-1)


EXACT_ATOL = 1e-5     # float32 rounding of HF's angles at the probe's positions (< 30 rad): ~2e-6
# rope_parameters keys HF's rotary modules never read, dropped before tokenpos rebuilds the tables (the probe
# then checks the rebuild): Ministral 3's query scale (its attention applies it, HF's code, still running)
# and its copy of max_position_embeddings (HF's scalings read the config's own)
ROTARY_UNREAD = ("llama_4_scaling_beta", "max_position_embeddings")


def exact_rotary(family: Family, config: Any, hf_rotary: nn.Module, device: torch.device) -> ExactAngles:
    """``hf_rotary`` rebuilt by tokenpos from the config, checked against it at the probe positions
    (:func:`tokenpos.torch.hf.families.probe_rotary`): a config tokenpos reads differently from HF, or
    cannot read, is refused with the reason."""
    from tokenpos.torch.mrope import MRotaryEmbedding
    from tokenpos.torch.rotary import RotaryEmbedding

    forms = {TABLE_FORMS[kind] for _, kind in family.helpers}
    where = f"{type(hf_rotary).__name__} of this {family.model_type!r} model"
    if len(forms) != 1:
        raise ConfigError(f"angles='exact' builds one table form; the RoPE helpers of the {where} read "
                          f"{sorted(forms)}; use angles='hf'")
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    params = getattr(text, "rope_parameters", None)
    if isinstance(params, dict) and set(params) & set(ROTARY_UNREAD):
        text = copy.deepcopy(text)                                # the model's config stays as it is
        text.rope_parameters = {k: v for k, v in params.items() if k not in ROTARY_UNREAD}
    rotary: dict[str, nn.Module]
    try:
        if family.angles == "mrope":
            rotary = {"default": MRotaryEmbedding.from_hf_config(config, device=device)}
        elif family.angles == "layer_types":
            rotary = {t: RotaryEmbedding.from_hf_config(text, layer_type=t, device=device)
                      for t in sorted(set(text.layer_types))}
        else:
            rotary = {"default": RotaryEmbedding.from_hf_config(text, device=device)}
    except ConfigError as err:
        raise ConfigError(f"angles='exact' cannot rebuild the {where} from its config: {err}; angles='hf' "
                          f"patches it with the model's own tables") from err
    new = ExactAngles(rotary, forms.pop())
    for kind, pos, want in probe_rotary(hf_rotary, config):
        got = new(torch.zeros(1, dtype=torch.float32, device=device), pos, kind)
        pairs = zip(got, want, strict=True) if isinstance(want, tuple) else [(got, want)]
        for a, b in pairs:
            if a.shape != b.shape or not torch.allclose(a, b.to(a.dtype), rtol=0.0, atol=EXACT_ATOL):
                what = (f"max difference {(a - b.to(a.dtype)).abs().max().item():.3g}" if a.shape == b.shape
                        else f"shapes {tuple(a.shape)} vs HF's {tuple(b.shape)}")
                raise ConfigError(f"angles='exact' rebuilds the {where} (layer type {kind!r}) differently from HF: "
                                  f"{what} at positions 1..8 (expected <= {EXACT_ATOL}); the config holds a setting "
                                  f"tokenpos's RotaryEmbedding.from_hf_config does not rebuild; use angles='hf'")
    return new
