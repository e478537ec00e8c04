"""The token embedding of an HF model as a tokenpos ``TokenEmbedding``, its scale as the model computes it.

HF families scale the token rows in three ways; each is reproduced bit for bit (the scale rounded
the way HF rounds it, then one multiply):

| kind | families | HF computes | multiplier here |
| --- | --- | --- | --- |
| "none" | Llama, Mistral, Qwen, Phi-3, ... | ``W[ids]`` | 1.0 |
| "buffer" | Gemma, Gemma 2 / 3 | ``W[ids] * embed_scale.to(W.dtype)`` | that buffer in W's dtype |
| "multiplier" | Granite | ``W[ids] * embedding_multiplier`` (float32 math) | the float in float32 |

(Granite's float math is float64 for a float64 W, and so is the multiplier here.)

Shapes: V vocab, D hidden size, ids (...) -> (..., D).
"""

from __future__ import annotations

from typing import Any, cast

import torch
from torch import nn

from tokenpos.tables.errors import ConfigError
from tokenpos.torch.token import TokenEmbedding

SCALE_KINDS = ("none", "buffer", "multiplier")


def hf_embedding_scale(kind: str, embedding: Any, config: Any) -> float:
    """The row multiplier of an HF model's input ``embedding`` (an ``nn.Embedding``), as the model computes it.

    Raises:
        ConfigError: the module or config lacks what ``kind`` reads.
    """
    w = embedding.weight
    if kind == "buffer":
        buf = getattr(embedding, "embed_scale", None)
        if not isinstance(buf, torch.Tensor):
            raise ConfigError(f"expected a scaled word embedding with an embed_scale buffer; got "
                              f"{type(embedding).__name__}")
        return float(cast(torch.Tensor, buf).to(w.dtype))
    if kind == "multiplier":
        m = getattr(config, "embedding_multiplier", None)
        if m is None:
            raise ConfigError("expected config.embedding_multiplier (Granite); got None")
        return float(torch.tensor(float(m), dtype=torch.float64 if w.dtype == torch.float64 else torch.float32))
    return 1.0


class SharedTokenEmbedding(TokenEmbedding):
    """A ``TokenEmbedding`` over an existing (V, D) Parameter (the same object, not a copy), rows times
    a given float: ids (...) -> (..., D) = W[ids] * multiplier."""

    def __init__(self, weight: nn.Parameter, *, multiplier: float = 1.0, padding_idx: int | None = None) -> None:
        V, D = weight.shape
        super().__init__(V, D, init="zeros", padding_idx=padding_idx, device="meta", dtype=weight.dtype, seed=0)
        self.weight = weight
        self._multiplier = float(multiplier)

    @property
    def multiplier(self) -> float:
        """The float the rows are multiplied by (the model's own embedding scale)."""
        return self._multiplier

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, multiplier={self._multiplier!r}"
