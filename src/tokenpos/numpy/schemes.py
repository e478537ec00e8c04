"""The positional-scheme registry of the NumPy backend: kind name -> builder(PositionalConfig).

Every scheme object has a ``kind`` class attribute (docs/DESIGN.md): "additive" (added to the
embeddings), "rotary" (rotates q and k), "bias" (added to attention logits) or "none".
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tokenpos.numpy.alibi import ALiBi
from tokenpos.numpy.fire import FIRE
from tokenpos.numpy.kerple import KERPLE
from tokenpos.numpy.learned import LearnedPositionalEmbedding
from tokenpos.numpy.module import Module
from tokenpos.numpy.rotary import RotaryEmbedding
from tokenpos.numpy.sinusoidal import SinusoidalPositionalEncoding
from tokenpos.numpy.t5_bias import T5RelativePositionBias
from tokenpos.tables.positional_config import PositionalConfig


class NoPositionalEncoding(Module):
    """NoPE: no positional information at all (causal attention alone carries order)."""

    kind = "none"

    def forward(self, seq_len_or_positions: Any) -> None:  # pragma: no cover - never added
        return None

    def extra_repr(self) -> str:
        return "NoPE"


def _learned(cfg: PositionalConfig) -> Module:
    return LearnedPositionalEmbedding(cfg.max_seq_len, cfg.d_model, init=cfg.init, std=cfg.std,
                                      padding_idx=cfg.position_padding_idx, dtype=cfg.dtype, rng=cfg.rng)


def _sinusoidal(cfg: PositionalConfig) -> Module:
    return SinusoidalPositionalEncoding(cfg.max_seq_len, cfg.d_model, base=cfg.base,
                                        layout=cfg.sinusoidal_layout, dtype=cfg.dtype)


def _none(cfg: PositionalConfig) -> Module:
    return NoPositionalEncoding()


# --- attention-level schemes (issue #4): rotary rotates q/k, bias schemes add to the logits ---
def _rope(cfg: PositionalConfig) -> Module:
    return RotaryEmbedding(cfg.resolved_head_dim(), base=cfg.base, max_seq_len=cfg.max_seq_len,
                           scaling=cfg.rope_scaling, interleaved=cfg.rope_interleaved,
                           rotary_dim=cfg.rotary_dim)


def _alibi(cfg: PositionalConfig) -> Module:
    return ALiBi(cfg.resolved_num_heads("alibi"), dtype=cfg.dtype)


def _t5(cfg: PositionalConfig) -> Module:
    return T5RelativePositionBias(cfg.resolved_num_heads("t5"), bidirectional=cfg.t5_bidirectional,
                                  num_buckets=cfg.t5_num_buckets, max_distance=cfg.t5_max_distance,
                                  init=cfg.init, std=cfg.std, dtype=cfg.dtype, rng=cfg.rng)


def _fire(cfg: PositionalConfig) -> Module:
    return FIRE(cfg.resolved_num_heads("fire"), init_L=float(cfg.max_seq_len), dtype=cfg.dtype, rng=cfg.rng)


def _kerple(cfg: PositionalConfig) -> Module:
    return KERPLE(cfg.resolved_num_heads("kerple"), dtype=cfg.dtype, rng=cfg.rng)


POSITIONAL_BUILDERS: dict[str, Callable[[PositionalConfig], Module]] = {
    "learned": _learned,
    "sinusoidal": _sinusoidal,
    "none": _none,
    "rope": _rope,
    "alibi": _alibi,
    "t5": _t5,
    "fire": _fire,
    "kerple": _kerple,
}
