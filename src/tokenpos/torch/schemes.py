"""The positional-scheme registry of the torch backend: kind name -> builder(PositionalConfig).

Mirrors ``tokenpos/numpy/schemes.py``. Every scheme object has a ``kind`` class attribute
(docs/DESIGN.md): "additive" (added to the embeddings), "rotary" (rotates q and k), "bias" (added to
attention logits) or "none".

In the torch backend ``cfg.dtype`` is a ``torch.dtype``, ``cfg.device`` the factory device, and
``cfg.rng`` the ``np.random.Generator`` that initialises learned tables (already resolved by
TransformerEmbedding, seeded from torch's generator when no seed was given).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import nn

from tokenpos.tables.positional_config import PositionalConfig
from tokenpos.torch._module import TokenposModule
from tokenpos.torch.alibi import ALiBi
from tokenpos.torch.fire import FIRE
from tokenpos.torch.kerple import KERPLE
from tokenpos.torch.learned import LearnedPositionalEmbedding
from tokenpos.torch.rotary import RotaryEmbedding
from tokenpos.torch.sinusoidal import SinusoidalPositionalEncoding
from tokenpos.torch.t5_bias import T5RelativePositionBias


class NoPositionalEncoding(TokenposModule):
    """NoPE: no positional information at all (causal attention alone carries order)."""

    kind = "none"

    def forward(self, seq_len_or_positions: Any) -> None:  # pragma: no cover - never added
        return None

    def extra_repr(self) -> str:
        return "NoPE"


def _learned(cfg: PositionalConfig) -> nn.Module:
    return LearnedPositionalEmbedding(cfg.max_seq_len, cfg.d_model, init=cfg.init, std=cfg.std,
                                      padding_idx=cfg.position_padding_idx, device=cfg.device, dtype=cfg.dtype,
                                      rng=cfg.rng)


def _sinusoidal(cfg: PositionalConfig) -> nn.Module:
    return SinusoidalPositionalEncoding(cfg.max_seq_len, cfg.d_model, base=cfg.base,
                                        layout=cfg.sinusoidal_layout, device=cfg.device, dtype=cfg.dtype)


def _none(cfg: PositionalConfig) -> nn.Module:
    return NoPositionalEncoding()


# --- attention-level schemes (issue #4): rotary rotates q/k, bias schemes add to the logits ---
def _rope(cfg: PositionalConfig) -> nn.Module:
    return RotaryEmbedding(cfg.resolved_head_dim(), base=cfg.base, max_seq_len=cfg.max_seq_len,
                           scaling=cfg.rope_scaling, interleaved=cfg.rope_interleaved,
                           rotary_dim=cfg.rotary_dim,
                           device=cfg.device)


def _alibi(cfg: PositionalConfig) -> nn.Module:
    return ALiBi(cfg.resolved_num_heads("alibi"), dtype=cfg.dtype, device=cfg.device)


def _t5(cfg: PositionalConfig) -> nn.Module:
    return T5RelativePositionBias(cfg.resolved_num_heads("t5"), bidirectional=cfg.t5_bidirectional,
                                  num_buckets=cfg.t5_num_buckets, max_distance=cfg.t5_max_distance,
                                  init=cfg.init, std=cfg.std, dtype=cfg.dtype, rng=cfg.rng, device=cfg.device)


def _fire(cfg: PositionalConfig) -> nn.Module:
    return FIRE(cfg.resolved_num_heads("fire"), init_L=float(cfg.max_seq_len), dtype=cfg.dtype, rng=cfg.rng,
                device=cfg.device)


def _kerple(cfg: PositionalConfig) -> nn.Module:
    return KERPLE(cfg.resolved_num_heads("kerple"), dtype=cfg.dtype, rng=cfg.rng, device=cfg.device)


POSITIONAL_BUILDERS: dict[str, Callable[[PositionalConfig], nn.Module]] = {
    "learned": _learned,
    "sinusoidal": _sinusoidal,
    "none": _none,
    "rope": _rope,
    "alibi": _alibi,
    "t5": _t5,
    "fire": _fire,
    "kerple": _kerple,
}
