"""What ``patch`` does to a model besides its RoPE: the input embedding's check, the loss head and ``resize``.

:func:`embedding_plan` checks that the model's input embedding is an ``nn.Embedding`` a
:class:`~tokenpos.torch.hf.embedding.SharedTokenEmbedding` reproduces (no hooks, no ``max_norm`` ...) and
reads its row multiplier; :func:`apply_head_and_resize` installs the loss mode
(:mod:`tokenpos.torch.hf.loss`) and the patched model's ``resize_token_embeddings``
(:func:`tokenpos.torch.hf.embedding.resize_patched`); :func:`remove_head_and_resize` takes both away again.

Shapes: V vocab, D hidden size; the input embedding's weight is (V, D).
"""

from __future__ import annotations

import types
from typing import Any

from torch import nn

from tokenpos.tables.errors import ConfigError
from tokenpos.torch.hf.embedding import hf_embedding_scale, resize_patched
from tokenpos.torch.hf.families import Family
from tokenpos.torch.hf.loss import LossPlan, apply_loss, remove_loss


def embedding_plan(model: Any, family: Family) -> tuple[Any, float]:
    """HF's input embedding (an ``nn.Embedding``) and its row multiplier, checked to be what ``family`` says."""
    emb: Any = model.get_input_embeddings()
    if family.embed_scale is None:
        raise ConfigError(f"patch cannot replace the input embedding of this {type(model).__name__}: "
                          f"{family.embed_reason}; pass embedding=False")
    if not isinstance(emb, nn.Embedding) or (family.embed_scale == "none" and type(emb) is not nn.Embedding):
        raise ConfigError(f"patch expects an nn.Embedding ({family.embed_scale!r} scale) as the input embedding of "
                          f"a {type(model).__name__}; got {type(emb).__name__}")
    hooks = [name for name in ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")
             if getattr(emb, name, None)]                             # torch has no public query for hooks
    if hooks:                                  # e.g. enable_input_require_grads (PEFT, gradient checkpointing)
        raise ConfigError(f"the input embedding of this {type(model).__name__} has hooks ({', '.join(hooks)}), "
                          f"which its replacement would not run; patch first and register them afterwards "
                          f"(enable_input_require_grads() after patch), or pass embedding=False")
    for key, off in (("max_norm", None), ("scale_grad_by_freq", False), ("sparse", False)):
        if getattr(emb, key) != off:
            raise ConfigError(f"the input embedding sets {key}={getattr(emb, key)!r}, which TokenEmbedding does "
                              f"not reproduce; expected {off!r}")
    return emb, hf_embedding_scale(family.embed_scale, emb, model.config)


def apply_head_and_resize(model: Any, head_plan: LossPlan | None, embedding: bool) -> None:
    """The loss mode (``loss=True``), and HF's ``resize_token_embeddings`` made to work on the tokenpos embedding."""
    if head_plan is not None:
        apply_loss(model, head_plan)
    if embedding:
        model.resize_token_embeddings = types.MethodType(resize_patched, model)


def remove_head_and_resize(model: Any) -> None:
    """Undo :func:`apply_head_and_resize` (HF's loss, and the class's ``resize_token_embeddings``)."""
    remove_loss(model)
    if "resize_token_embeddings" in vars(model):
        del model.resize_token_embeddings
