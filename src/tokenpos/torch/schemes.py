"""Positional schemes of the torch backend: the string shortcuts and the checks of a scheme object.

Every scheme is an object (``nn.Module``) with two class attributes: ``kind``, its category
("additive": added to the embeddings; "rotary": rotates q and k; "bias": added to attention logits;
"none"), and ``name``, its registry string ("learned", "sinusoidal", "rope", "alibi", "t5", "none").
Its settings travel with the object:

    TransformerEmbedding(V, D, positional=RotaryEmbedding(64, scaling={"rope_type": "yarn", ...}))
    TransformerEmbedding(V, D, positional="rope", num_heads=12)            # shortcut, default settings

Mirrors ``tokenpos/numpy/schemes.py``. A NumPy scheme object given to a torch layer is refused.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from torch import nn

from tokenpos.tables.errors import ConfigError
from tokenpos.tables.validation import check_choice, check_positive_int
from tokenpos.torch._module import TokenposModule
from tokenpos.torch.alibi import ALiBi
from tokenpos.torch.learned import LearnedPositionalEmbedding
from tokenpos.torch.rotary import RotaryEmbedding
from tokenpos.torch.sinusoidal import SinusoidalPositionalEncoding
from tokenpos.torch.t5_bias import T5RelativePositionBias

KINDS = ("additive", "rotary", "bias", "none")


class NoPositionalEncoding(TokenposModule):
    """NoPE: no positional information at all (causal attention alone carries order)."""

    kind = "none"
    name = "none"

    def __init__(self, *, seed: int | None = None, rng: np.random.Generator | None = None) -> None:
        super().__init__()

    def reset_parameters(self, *, seed: int | None = None, rng: np.random.Generator | None = None) -> None:
        """Nothing to reset (seed / rng accepted like every scheme's)."""

    def forward(self, seq_len_or_positions: Any) -> None:
        return None

    def extra_repr(self) -> str:
        return "NoPE"


def _heads(name: str, num_heads: Any) -> int:
    if num_heads is None:
        raise ConfigError(f"positional={name!r} needs num_heads=; got None")
    return check_positive_int("num_heads", num_heads)


def _rope(d_model: int, max_seq_len: int, num_heads: Any, f: dict[str, Any]) -> nn.Module:
    heads = _heads("rope", num_heads)
    if d_model % heads:
        raise ConfigError(f"positional='rope' needs d_model divisible by num_heads, got d_model={d_model}, "
                          f"num_heads={heads}; pass a RotaryEmbedding(head_dim, ...) instance instead")
    return RotaryEmbedding(d_model // heads, max_seq_len=max_seq_len, device=f["device"])


SHORTCUTS: dict[str, Callable[[int, int, Any, dict[str, Any]], nn.Module]] = {
    "learned": lambda d, L, h, f: LearnedPositionalEmbedding(L, d, init=f["init"], std=f["std"],
                                                              padding_idx=f["position_padding_idx"],
                                                              device=f["device"], dtype=f["dtype"], rng=f["rng"]),
    "sinusoidal": lambda d, L, h, f: SinusoidalPositionalEncoding(L, d, device=f["device"], dtype=f["dtype"]),
    "rope": _rope,
    "alibi": lambda d, L, h, f: ALiBi(_heads("alibi", h), device=f["device"], dtype=f["dtype"]),
    "t5": lambda d, L, h, f: T5RelativePositionBias(_heads("t5", h), init=f["init"], std=f["std"],
                                                   device=f["device"], dtype=f["dtype"], rng=f["rng"]),
    "none": lambda d, L, h, f: NoPositionalEncoding(),
}


def check_scheme(scheme: Any, d_model: int) -> nn.Module:
    """A torch scheme object that fits a d_model-wide embedding; ConfigError otherwise."""
    module = type(scheme).__module__
    if not isinstance(scheme, nn.Module) or getattr(scheme, "kind", None) not in KINDS:
        backend = " (a NumPy scheme: use its tokenpos.torch twin)" if module.startswith("tokenpos.numpy") else ""
        raise ConfigError(f"positional must be one of {sorted(SHORTCUTS)}, None, or a tokenpos.torch scheme "
                          f"object; got {type(scheme).__module__}.{type(scheme).__name__}{backend}")
    width = getattr(scheme, "d_model", d_model)
    if scheme.kind == "additive" and width != d_model:
        raise ConfigError(f"positional scheme {type(scheme).__name__} has d_model={width}, expected {d_model} "
                          f"(the token table's width)")
    return scheme


def build_positional(positional: Any, *, d_model: int, max_seq_len: int, num_heads: Any = None,
                     init: str = "normal", std: float = 0.02, position_padding_idx: int | None = None,
                     device: Any = None, dtype: Any = None, rng: np.random.Generator | None = None) -> nn.Module:
    """A string shortcut (or None for "none") built with default settings, or a scheme object checked."""
    if positional is None or isinstance(positional, str):
        name = check_choice("positional", "none" if positional is None else positional, tuple(sorted(SHORTCUTS)))
        factory = {"init": init, "std": std, "position_padding_idx": position_padding_idx, "device": device,
                   "dtype": dtype, "rng": rng}
        return SHORTCUTS[name](d_model, max_seq_len, num_heads, factory)
    return check_scheme(positional, d_model)
