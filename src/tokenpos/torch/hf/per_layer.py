"""The per-layer table of an HF Gemma 3n / Gemma 4 text model as a tokenpos ``PerLayerEmbedding`` (``patch``).

HF's text model holds ``embed_tokens_per_layer``, a ``*TextScaledWordEmbedding`` of shape (V, L * P) whose
rows it multiplies by ``embed_scale.to(W.dtype)``; ``get_per_layer_inputs`` reshapes them to (..., L, P)
(Gemma 3n maps ids outside the table to 0 first, in its own code, which stays). :func:`per_layer_plan` finds
that module and checks it; :func:`apply_per_layer` puts a :class:`SharedPerLayerEmbedding` over the SAME
Parameter in its place (its (..., L, P) output is what HF's reshape gives, unchanged);
:func:`restore_per_layer` puts HF's module back.

Shapes: V ``vocab_size_per_layer_input``, L ``num_hidden_layers``, P ``hidden_size_per_layer_input``,
ids (...) -> (..., L, P).
"""

from __future__ import annotations

import types
from typing import Any, cast

from torch import nn

from tokenpos.tables.errors import ConfigError
from tokenpos.torch.hf.embedding import FollowsDisplaced, hf_embedding_scale
from tokenpos.torch.per_layer import PerLayerEmbedding

NAME = "embed_tokens_per_layer"
"""The attribute of HF's text model (``Gemma3nTextModel``, ``Gemma4TextModel``) that holds the per-layer table."""


class SharedPerLayerEmbedding(FollowsDisplaced, PerLayerEmbedding):
    """A ``PerLayerEmbedding`` over an existing (V, L * P) Parameter (the same object, not a copy), rows times
    the displaced HF module's own ``embed_scale`` in the weight's dtype of the moment (read again after every
    cast of the model, as ``SharedTokenEmbedding`` does): ids (...) -> (..., L, P)."""

    def __init__(self, weight: nn.Parameter, num_layers: int, dim: int, *, padding_idx: int | None,
                 displaced: nn.Module) -> None:
        super().__init__(int(weight.shape[0]), num_layers, dim, padding_idx=padding_idx, init="zeros",
                         device="meta", dtype=weight.dtype, seed=0)
        self.weight = weight
        self.keep_displaced(displaced)
        self._hf_multiplier = hf_embedding_scale("buffer", displaced, None)

    def _apply(self, fn: Any, recurse: bool = True) -> Any:
        out = super()._apply(fn, recurse)
        if self.displaced is not None and not self.weight.is_meta:
            self._hf_multiplier = hf_embedding_scale("buffer", self.displaced, None)
        return out

    @property
    def multiplier(self) -> float:
        """The float the rows are multiplied by: the HF module's ``embed_scale`` in the weight's dtype."""
        return self._hf_multiplier

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, multiplier={self._hf_multiplier!r}"


def per_layer_plan(model: nn.Module) -> tuple[str, nn.Embedding, int, int] | None:
    """The per-layer table of ``model`` to replace: (its module name, the HF module, L, P), or None when the model
    has none (every family but Gemma 3n and the Gemma 4 models with ``hidden_size_per_layer_input``).

    Raises:
        ConfigError: a per-layer table that is not HF's scaled embedding of shape (V, L * P) with the text
            config's L and P, or one with hooks (which its replacement would not run).
    """
    found = [(n, m) for n, m in model.named_modules() if n.rpartition(".")[2] == NAME]
    if not found:
        return None
    if len(found) > 1:
        raise ConfigError(f"patch found {len(found)} per-layer tables ({', '.join(n for n, _ in found)}) in this "
                          f"{type(model).__name__}; expected one")
    name, emb = found[0]
    config: Any = getattr(model, "config", None)
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    L, P = getattr(text, "num_hidden_layers", None), getattr(text, "hidden_size_per_layer_input", None)
    if not isinstance(emb, nn.Embedding) or not isinstance(emb.weight, nn.Parameter):
        raise ConfigError(f"patch expects HF's scaled word embedding as {name}; got {type(emb).__name__}")
    if not (isinstance(L, int) and isinstance(P, int) and L > 0 and P > 0 and emb.weight.shape[1] == L * P):
        raise ConfigError(f"the per-layer table {name} has shape {tuple(emb.weight.shape)}; expected "
                          f"(vocab_size_per_layer_input, num_hidden_layers * hidden_size_per_layer_input) = "
                          f"(V, {L} * {P}) from the text config")
    hooks = [h for h in ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")
             if getattr(emb, h, None)]
    if hooks:
        raise ConfigError(f"the per-layer table {name} has hooks ({', '.join(hooks)}), which its replacement would "
                          f"not run; patch first and register them afterwards, or pass embedding=False")
    for key, off in (("max_norm", None), ("scale_grad_by_freq", False), ("sparse", False)):
        if getattr(emb, key) != off:
            raise ConfigError(f"the per-layer table {name} sets {key}={getattr(emb, key)!r}, which "
                              f"PerLayerEmbedding does not reproduce; expected {off!r}")
    hf_embedding_scale("buffer", emb, config)                 # raises unless it holds an embed_scale buffer
    return name, emb, L, P


def _put(model: nn.Module, name: str, module: nn.Module) -> None:
    parent, _, leaf = name.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, leaf, module)


def _shared(emb: nn.Embedding, L: int, P: int) -> SharedPerLayerEmbedding:
    return SharedPerLayerEmbedding(cast(nn.Parameter, emb.weight), L, P, padding_idx=emb.padding_idx, displaced=emb)


def _resize_patched(model: Any, *args: Any, **kwargs: Any) -> None:
    """HF's ``_resize_per_layer_embeddings`` (called by ``resize_token_embeddings``) on a patched model: HF's
    method runs on the HF table the tokenpos one displaced, put back for the call; then a new
    :class:`SharedPerLayerEmbedding` over the table HF left in place takes its place (its L and P unchanged)."""
    name = model._tokenpos_per_layer
    shared = model.get_submodule(name)
    _put(model, name, shared.displaced)
    try:
        type(model)._resize_per_layer_embeddings(model, *args, **kwargs)
    finally:
        new = _shared(model.get_submodule(name), shared.num_layers, shared.dim)
        new.train(shared.training)
        _put(model, name, new)


def apply_per_layer(model: nn.Module, plan: tuple[str, nn.Embedding, int, int] | None) -> tuple[str, nn.Module] | None:
    """Put a :class:`SharedPerLayerEmbedding` in place of the planned HF table (and, where HF's model resizes
    it in ``resize_token_embeddings``, make that resize run on HF's table); returns (name, HF module) for
    :func:`restore_per_layer` (None: nothing planned)."""
    if plan is None:
        return None
    name, emb, L, P = plan
    _put(model, name, _shared(emb, L, P))
    if hasattr(type(model), "_resize_per_layer_embeddings"):
        object.__setattr__(model, "_tokenpos_per_layer", name)
        object.__setattr__(model, "_resize_per_layer_embeddings", types.MethodType(_resize_patched, model))
    return name, emb


def restore_per_layer(model: nn.Module, saved: tuple[str, nn.Module] | None) -> None:
    """Put HF's per-layer table back (``saved``: what :func:`apply_per_layer` returned; after a resize, the table
    HF's resize left in place)."""
    if saved is None:
        return
    name, emb = saved
    current = model.get_submodule(name)
    _put(model, name, current.displaced if isinstance(current, SharedPerLayerEmbedding) and
         current.displaced is not None else emb)
    for attr in ("_tokenpos_per_layer", "_resize_per_layer_embeddings"):
        if attr in vars(model):
            object.__delattr__(model, attr)
