"""tokenpos.numpy: the NumPy backend. Layers with forward and hand-written backward; trains without torch.

Every layer computation is a forward/backward function pair in ``tokenpos.numpy.functional``.

    >>> import numpy as np, tokenpos.numpy as tpn
    >>> emb = tpn.TransformerEmbedding(50000, 768, 1024, seed=0)
    >>> emb(np.array([[101, 2054, 2003, 102], [101, 7592, 1010, 102]])).shape
    (2, 4, 768)
"""

from typing import Any

from tokenpos.numpy import functional, optim
from tokenpos.numpy.alibi import ALiBi
from tokenpos.numpy.attention import (
    scaled_dot_product_attention,
    scaled_dot_product_attention_backward,
    scaled_dot_product_attention_forward,
)
from tokenpos.numpy.fire import FIRE
from tokenpos.numpy.kerple import KERPLE
from tokenpos.numpy.learned import LearnedPositionalEmbedding, PositionalEmbedding
from tokenpos.numpy.module import Module, Parameter, RowSparseGrad
from tokenpos.numpy.mrope import MRotaryEmbedding
from tokenpos.numpy.ngram import HashedNgramEmbedding
from tokenpos.numpy.norm import LayerNorm, RMSNorm
from tokenpos.numpy.per_layer import PerLayerEmbedding
from tokenpos.numpy.rope2d import RotaryEmbedding2D, SinCos2DPositionalEncoding
from tokenpos.numpy.rotary import RotaryEmbedding
from tokenpos.numpy.schemes import NoPositionalEncoding
from tokenpos.numpy.sinusoidal import SinusoidalPositionalEncoding
from tokenpos.numpy.t5_bias import T5RelativePositionBias
from tokenpos.numpy.tied_loss import tied_cross_entropy
from tokenpos.numpy.token import TokenEmbedding
from tokenpos.numpy.transformer import EmbeddingLayer, TransformerEmbedding
from tokenpos.numpy.xpos import XPosRotaryEmbedding
from tokenpos.tables.errors import ConfigError, DtypeError, PositionError, StateDictError, TokenIdError
from tokenpos.tables.formulas.packing import cu_seqlens_from_positions, positions_from_cu_seqlens
from tokenpos.tables.registry import class_names, export

__all__ = [
    "FIRE",
    "HashedNgramEmbedding",
    "KERPLE",
    "DtypeError",
    "MRotaryEmbedding",
    "RotaryEmbedding2D",
    "SinCos2DPositionalEncoding",
    "XPosRotaryEmbedding",
    "ALiBi",
    "RotaryEmbedding",
    "T5RelativePositionBias",
    "scaled_dot_product_attention",
    "scaled_dot_product_attention_backward",
    "scaled_dot_product_attention_forward",
    "ConfigError",
    "EmbeddingLayer",
    "LayerNorm",
    "LearnedPositionalEmbedding",
    "Module",
    "NoPositionalEncoding",
    "PerLayerEmbedding",
    "Parameter",
    "PositionError",
    "PositionalEmbedding",
    "RMSNorm",
    "RowSparseGrad",
    "SinusoidalPositionalEncoding",
    "StateDictError",
    "TokenEmbedding",
    "TokenIdError",
    "TransformerEmbedding",
    "cu_seqlens_from_positions",
    "positions_from_cu_seqlens",
    "functional",
    "optim",
    "tied_cross_entropy",
]
__all__ += [name for name in class_names("numpy") if name not in __all__]   # schemes added since (registry)


def __getattr__(name: str) -> Any:
    """A registered scheme's class that this file does not import by name: from the registry, on first use."""
    return export("numpy", __name__, name)
