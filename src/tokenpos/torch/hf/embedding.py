"""The token embedding of an HF model as a tokenpos ``TokenEmbedding``, its scale as the model computes it.

HF families scale the token rows in three ways; each is reproduced bit for bit (the scale rounded
the way HF rounds it, then one multiply):

| kind | families | HF computes | multiplier here |
| --- | --- | --- | --- |
| "none" | Llama, Mistral, Qwen, Phi-3, ... | ``W[ids]`` | 1.0 |
| "buffer" | Gemma, Gemma 2 / 3 | ``W[ids] * embed_scale.to(W.dtype)`` | that buffer in W's dtype |
| "multiplier" | Granite | ``W[ids] * embedding_multiplier`` (float32 math) | the float in float32 |

(Granite's float math is float64 for a float64 W, and so is the multiplier here.)

:func:`resize_patched` is a patched model's ``resize_token_embeddings``: HF's own method, run on the HF
embedding the tokenpos one displaced (HF's method takes only an ``nn.Embedding``).

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


class FollowsDisplaced(nn.Module):
    """A module that ``patch`` put in place of an HF one (``displaced``, kept outside the module tree so that
    ``state_dict`` and ``named_modules`` are the model's own): every cast or move of the model
    (``.to(dtype)``, ``.half()``, ``.cuda()``: ``_apply``) reaches the displaced module too, so ``unpatch`` puts
    back a module in the state the model's own would be in."""

    displaced: nn.Module | None = None

    def keep_displaced(self, module: nn.Module) -> None:
        object.__setattr__(self, "displaced", module)                 # not a submodule: no state_dict keys

    def _apply(self, fn: Any, recurse: bool = True) -> Any:
        out = super()._apply(fn, recurse)
        if self.displaced is not None:
            self.displaced._apply(fn, recurse)
        return out


class SharedTokenEmbedding(FollowsDisplaced, TokenEmbedding):
    """A ``TokenEmbedding`` over an existing (V, D) Parameter (the same object, not a copy), rows times
    a given float: ids (...) -> (..., D) = W[ids] * multiplier.

    With ``displaced`` (the HF embedding it replaces) and ``scale_kind`` / ``config``, the multiplier is the
    model's own scale for the weight's dtype of the moment (:func:`hf_embedding_scale`), computed again after
    every cast: Gemma's ``embed_scale.to(W.dtype)`` rounds differently in bf16 than in float32."""

    def __init__(self, weight: nn.Parameter, *, multiplier: float = 1.0, padding_idx: int | None = None,
                 displaced: nn.Module | None = None, scale_kind: str = "none", config: Any = None) -> None:
        V, D = weight.shape
        super().__init__(V, D, init="zeros", padding_idx=padding_idx, device="meta", dtype=weight.dtype, seed=0)
        self.weight = weight
        self._multiplier = float(multiplier)
        self._scale = (scale_kind, config)
        if displaced is not None:
            self.keep_displaced(displaced)

    def _apply(self, fn: Any, recurse: bool = True) -> Any:
        out = super()._apply(fn, recurse)
        if self.displaced is not None and self._scale[0] != "none" and not self.weight.is_meta:
            self._multiplier = hf_embedding_scale(self._scale[0], self.displaced, self._scale[1])
        return out

    @property
    def multiplier(self) -> float:
        """The float the rows are multiplied by (the model's own embedding scale)."""
        return self._multiplier

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, multiplier={self._multiplier!r}"


def resize_patched(model: Any, new_num_tokens: int | None = None, pad_to_multiple_of: int | None = None,
                   mean_resizing: bool = True) -> SharedTokenEmbedding:
    """HF's ``resize_token_embeddings`` on a patched model (``patch`` installs it as the model's method).

    HF's own method runs on the HF embedding the tokenpos one displaced, put back for the call: it resizes
    that module's weight in place (the same Parameter object, so the tokenpos embedding, the tied head and an
    optimiser's reference all see it), draws the new rows as HF does (``mean_resizing``, ``_init_weights``)
    and ties the head again. Then a new :class:`SharedTokenEmbedding` over the resized weight takes its place
    (the vocabulary size, the padding row and the scale as HF left them). Returns it (HF returns the input
    embedding module). Raises what HF's method raises; the tokenpos embedding is back in place either way.
    """
    shared = model.get_input_embeddings()
    if not isinstance(shared, SharedTokenEmbedding) or shared.displaced is None:
        raise ConfigError(f"resize_token_embeddings of a patched model expects its SharedTokenEmbedding with the "
                          f"displaced HF embedding; got {type(shared).__name__}")
    hf: Any = shared.displaced
    model.set_input_embeddings(hf)
    try:
        type(model).resize_token_embeddings(model, new_num_tokens, pad_to_multiple_of, mean_resizing)
    finally:
        kind, config = shared._scale
        new = SharedTokenEmbedding(hf.weight, multiplier=shared.multiplier, padding_idx=hf.padding_idx,
                                   displaced=hf, scale_kind=kind, config=config)
        new.train(shared.training)
        model.set_input_embeddings(new)
    return new
