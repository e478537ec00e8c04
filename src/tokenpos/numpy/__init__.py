"""tokenpos.numpy: the NumPy backend. Layers with forward and hand-written backward; trains without torch.

    >>> import numpy as np, tokenpos.numpy as tpn
    >>> emb = tpn.TransformerEmbedding(50000, 768, 1024, seed=0)
    >>> emb(np.array([[101, 2054, 2003, 102], [101, 7592, 1010, 102]])).shape
    (2, 4, 768)
"""

from tokenpos.numpy import optim
from tokenpos.numpy.learned import LearnedPositionalEmbedding, PositionalEmbedding
from tokenpos.numpy.module import Module, Parameter, RowSparseGrad
from tokenpos.numpy.norm import LayerNorm, RMSNorm
from tokenpos.numpy.schemes import NoPositionalEncoding
from tokenpos.numpy.sinusoidal import SinusoidalPositionalEncoding
from tokenpos.numpy.token import TokenEmbedding
from tokenpos.numpy.transformer import EmbeddingLayer, TransformerEmbedding
from tokenpos.tables.errors import ConfigError, PositionError, StateDictError, TokenIdError

__all__ = [
    "ConfigError",
    "EmbeddingLayer",
    "LayerNorm",
    "LearnedPositionalEmbedding",
    "Module",
    "NoPositionalEncoding",
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
    "optim",
]
