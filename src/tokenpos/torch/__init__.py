"""tokenpos.torch: the PyTorch backend. ``nn.Module``s with the names, arguments, semantics and
state_dict keys of ``tokenpos.numpy``, built on the same ``tokenpos.tables``.

    >>> import torch, tokenpos.torch as tpt
    >>> emb = tpt.TransformerEmbedding(50000, 768, 1024)
    >>> emb(torch.tensor([[101, 2054, 2003, 102], [101, 7592, 1010, 102]])).shape
    torch.Size([2, 4, 768])

Id/position value checks read CPU tensors in eager mode (a typed error); on other devices they are
one device-side assert each, with no host sync (``set_device_checks(True)`` reads the values there
instead, for the typed error; see ``tokenpos.torch._checks``). The fused computations are the custom
ops of ``tokenpos.torch.ops``.
"""

from typing import Any

from tokenpos._config import device_checks_enabled, set_device_checks
from tokenpos.tables.errors import ConfigError, DtypeError, PositionError, StateDictError, TokenIdError
from tokenpos.tables.registry import class_names, export
from tokenpos.torch import ops
from tokenpos.torch._dropout import dropout_keep_mask_torch
from tokenpos.torch._module import TokenposModule
from tokenpos.torch.alibi import ALiBi
from tokenpos.torch.attention import scaled_dot_product_attention
from tokenpos.torch.engram import EngramCache, EngramMemory
from tokenpos.torch.fire import FIRE
from tokenpos.torch.hf import from_hf
from tokenpos.torch.kerple import KERPLE
from tokenpos.torch.learned import LearnedPositionalEmbedding, PositionalEmbedding
from tokenpos.torch.mrope import MRotaryEmbedding
from tokenpos.torch.ngram import HashedNgramEmbedding
from tokenpos.torch.norm import LayerNorm, RMSNorm
from tokenpos.torch.packing import cu_seqlens_from_positions, positions_from_cu_seqlens
from tokenpos.torch.per_layer import PerLayerEmbedding
from tokenpos.torch.rope2d import RotaryEmbedding2D, SinCos2DPositionalEncoding
from tokenpos.torch.rotary import RotaryEmbedding
from tokenpos.torch.schemes import NoPositionalEncoding
from tokenpos.torch.sinusoidal import SinusoidalPositionalEncoding
from tokenpos.torch.t5_bias import T5RelativePositionBias
from tokenpos.torch.tied_loss import tied_cross_entropy
from tokenpos.torch.token import TokenEmbedding
from tokenpos.torch.transformer import EmbeddingLayer, TransformerEmbedding
from tokenpos.torch.xpos import XPosRotaryEmbedding

__all__ = [
    "EngramCache",
    "EngramMemory",
    "FIRE",
    "HashedNgramEmbedding",
    "KERPLE",
    "DtypeError",
    "MRotaryEmbedding",
    "RotaryEmbedding2D",
    "SinCos2DPositionalEncoding",
    "XPosRotaryEmbedding",
    "ALiBi",
    "ConfigError",
    "EmbeddingLayer",
    "LayerNorm",
    "LearnedPositionalEmbedding",
    "NoPositionalEncoding",
    "PerLayerEmbedding",
    "PositionError",
    "PositionalEmbedding",
    "RMSNorm",
    "RotaryEmbedding",
    "SinusoidalPositionalEncoding",
    "StateDictError",
    "T5RelativePositionBias",
    "TokenEmbedding",
    "TokenIdError",
    "TokenposModule",
    "TransformerEmbedding",
    "cu_seqlens_from_positions",
    "device_checks_enabled",
    "dropout_keep_mask_torch",
    "from_hf",
    "ops",
    "positions_from_cu_seqlens",
    "scaled_dot_product_attention",
    "set_device_checks",
    "tied_cross_entropy",
]
__all__ += [name for name in class_names("torch") if name not in __all__]   # schemes added since (registry)


def __getattr__(name: str) -> Any:
    """A registered scheme's class that this file does not import by name: from the registry, on first use."""
    return export("torch", __name__, name)
