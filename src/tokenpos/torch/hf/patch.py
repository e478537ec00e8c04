"""``patch(model)``: tokenpos's RoPE op and token embedding inside a loaded Hugging Face model.

What a model needs is recognised from the model itself (:func:`tokenpos.torch.hf.families.recognise`:
its attention's RoPE helper is HF's code of one of a few calling conventions, its rotary tables have
the layout that helper reads). This module plans and applies the patch, reports it (:class:`PatchReport`)
and undoes it (:func:`unpatch`); the pieces it puts in place live by concept:

- RoPE: the module-level function the family's attention calls (``apply_rotary_pos_emb`` /
  ``apply_rotary_emb``) becomes a tokenpos one (:mod:`tokenpos.torch.hf.rope_helpers`: one
  ``tokenpos::rope_qk`` pass). The function is replaced for THIS model only: each of its attention modules
  gets its own ``forward``, the class's code reading that one name under another
  (:mod:`tokenpos.torch.hf.rebind`).
  HF's functions in the modeling module are never changed, so another model of the family keeps them, and
  :func:`unpatch` (which deletes those instance ``forward`` attributes) restores bit-identical outputs
  whatever else is patched.
- ``angles="exact"``: the model's rotary module(s) become :class:`~tokenpos.torch.hf.exact.ExactAngles`,
  cos / sin from tokenpos's float64 angles of the config, handed to the patched function in HF's form.
- Embedding: the input embedding becomes a :class:`~tokenpos.torch.hf.embedding.SharedTokenEmbedding`
  (a ``TokenEmbedding``) holding the SAME weight Parameter (tied heads stay tied), its rows multiplied
  by the module's own scale as HF computes it (a scale HF applies outside the module, Granite's
  ``embedding_multiplier``, stays HF's own code); checked by :func:`tokenpos.torch.hf.wiring.embedding_plan`.
  Gemma 3n / 4's per-layer table: :mod:`tokenpos.torch.hf.per_layer`.
- ``loss=True`` and ``resize_token_embeddings``: :mod:`tokenpos.torch.hf.wiring`.

Every check runs before anything changes; a refused call leaves the model as it was.
Shapes: B batch, H (Hk) query (key) heads, L length, Dh head dim, R rotary dim, F = R/2.
"""

from __future__ import annotations

import types
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from tokenpos.tables.errors import ConfigError
from tokenpos.torch.hf.embedding import SharedTokenEmbedding
from tokenpos.torch.hf.exact import EXACT_ATOL, ROTARY_UNREAD, ExactAngles, exact_rotary
from tokenpos.torch.hf.families import recognise
from tokenpos.torch.hf.loss import loss_plan
from tokenpos.torch.hf.per_layer import apply_per_layer, per_layer_plan, restore_per_layer
from tokenpos.torch.hf.rebind import bind_aliases, with_global
from tokenpos.torch.hf.rope_helpers import (
    REPLACEMENTS,
    TABLE_FORMS,
    rope_cohere,
    rope_deinterleave,
    rope_glm,
    rope_gptj,
    rope_llama4,
    rope_qk_half,
    rope_x,
)
from tokenpos.torch.hf.wiring import apply_head_and_resize, embedding_plan, remove_head_and_resize

# patch, unpatch and PatchReport are this module's own; the rest is re-exported from where it now lives
# (tokenpos.torch.hf.rope_helpers, .exact), importable here as before
__all__ = ["ANGLES", "EXACT_ATOL", "REPLACEMENTS", "ROTARY_UNREAD", "TABLE_FORMS", "ExactAngles", "PatchReport",
           "patch", "rope_cohere", "rope_deinterleave", "rope_glm", "rope_gptj", "rope_llama4", "rope_qk_half",
           "rope_x", "unpatch"]

ANGLES = ("hf", "exact")
_STATE = "_tokenpos_patch"


@dataclass(frozen=True)
class PatchReport:
    """What :func:`patch` replaced.

    model_type: ``config.model_type``. rope_function: the replaced function's qualified name (None:
    RoPE untouched). rope_layers: attention modules of the model that call it. angles: "hf" / "exact"
    (None: RoPE untouched). rotary_modules: modules replaced by :class:`ExactAngles`. embedding: the
    replaced input embedding's module name (None: untouched). embedding_scale: its row multiplier.
    per_layer: the replaced per-layer table (Gemma 3n / 4 ``embed_tokens_per_layer``; None: none or untouched).
    loss: the output head whose logits the tied loss stands in for in training (``loss=True``; None: HF's loss).
    """

    model_type: str
    rope_function: str | None
    rope_layers: int
    angles: str | None
    rotary_modules: tuple[str, ...]
    embedding: str | None
    embedding_scale: float | None
    per_layer: str | None = None
    loss: str | None = None


def _set_module(model: nn.Module, name: str, module: nn.Module) -> None:
    parent, _, leaf = name.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, leaf, module)


def patch(model: Any, *, rope: bool = True, embedding: bool = True, angles: str = "hf",
          loss: bool = False) -> PatchReport:
    """Put tokenpos's RoPE op and token embedding inside a loaded HF ``model``, in place.

    Args:
        model: a ``transformers`` model (bare or with a head) whose attention calls one of HF's RoPE helpers,
            or a GPT-2 / BERT / RoBERTa (embedding): :func:`tokenpos.torch.hf.families.recognise`.
        rope: replace the family's RoPE function (families with RoPE).
        embedding: replace the input embedding by a ``SharedTokenEmbedding`` over the same weight (and a
            Gemma 3n / 4 per-layer table by a ``SharedPerLayerEmbedding``, :mod:`tokenpos.torch.hf.per_layer`).
        angles: "hf" (the model's own cos / sin: logits equal HF's to fp32 rounding) or "exact"
            (tokenpos's float64 angles from the config; needs ``rope=True``).
        loss: a ``*ForCausalLM``'s forward in training mode given ``labels`` computes HF's loss from the final
            hidden states and the head's weight with the tied loss, never the (B, L, V) logits, and returns
            ``logits=None``; in eval mode or without labels it is HF's forward (:mod:`tokenpos.torch.hf.loss`).

    Returns:
        A :class:`PatchReport`. :func:`unpatch` restores the model.

    Raises:
        ConfigError: a model not recognised (the message says why and names the model), a model
            already patched, a bad ``angles``, ``angles="exact"`` on a config tokenpos does not rebuild
            as HF does, or modules that are not what the recognition found; with ``loss=True``, a model whose
            head and loss the tied loss does not reproduce (:func:`tokenpos.torch.hf.loss.loss_plan`). The model
            is then unchanged.
    """
    if getattr(model, _STATE, None) is not None:
        raise ConfigError(f"this {type(model).__name__} is already patched; call unpatch(model) first")
    if angles not in ANGLES:
        raise ConfigError(f"angles must be one of {list(ANGLES)}, got {angles!r}")
    family = recognise(model)                             # what the model's own code calls, checked
    config: Any = model.config
    model_type = family.model_type
    hf: Any = model
    do_rope = bool(rope) and family.rope is not None
    if angles == "exact" and not do_rope:
        raise ConfigError("angles='exact' replaces the tables the patched RoPE function reads; it needs rope=True "
                          "and a family with RoPE")
    names = {m: n for n, m in model.named_modules()}
    # -- plan (every check before any change) ---------------------------------------------------
    module_name = family.module
    values = {name: REPLACEMENTS[kind] for name, kind in family.helpers}
    rotaries: list[str] = list(family.rotary)
    if angles == "exact" and not rotaries:             # nothing would read tokenpos's angles: HF's would stay
        raise ConfigError(f"angles='exact' replaces the model's rotary module, and {type(model).__name__} has none "
                          f"(its attention makes cos / sin itself); use angles='hf'")
    forwards: dict[nn.Module, Any] = {}                  # attention module -> its forward with tokenpos's RoPE
    layers = 0
    if do_rope:
        attention = [m for m in names if type(m) in family.attention]
        layers = sum(1 for m in attention if getattr(m, "use_rope", True))
        by_class: dict[type, Any] = {}
        for m in attention:
            cls = type(m)
            if cls not in by_class:
                by_class[cls] = with_global(cls.forward, values)
            if by_class[cls] is None or "forward" in vars(m):
                raise ConfigError(f"patch cannot give {names[m]} ({cls.__name__}) tokenpos's RoPE: expected its "
                                  f"class's forward, calling {sorted(values)} of {module_name}"
                                  + ("; it has a forward of its own (hooks?)" if "forward" in vars(m) else ""))
            forwards[m] = by_class[cls]
    emb_plan = embedding_plan(model, family) if embedding else None
    table_plan = per_layer_plan(model) if embedding else None          # Gemma 3n / 4 per-layer inputs
    head_plan = loss_plan(model) if loss else None
    exact: dict[str, ExactAngles] = {}
    if angles == "exact":
        for n in rotaries:
            rot = model.get_submodule(n)
            buffers = list(rot.buffers())
            exact[n] = exact_rotary(family, config, rot, buffers[0].device if buffers else torch.device("cpu"))
    # -- apply ------------------------------------------------------------------------------------
    state: dict[str, Any] = {"rope": [], "rotary": {}, "embedding": None}
    if do_rope:
        for fn in dict.fromkeys(forwards.values()):
            bind_aliases(fn, values)
        for m, fn in forwards.items():
            m.forward = types.MethodType(fn, m)
            state["rope"].append(m)
        for n, new in exact.items():
            state["rotary"][n] = model.get_submodule(n)
            new.keep_displaced(state["rotary"][n])                   # casts of the model reach it, for unpatch
            _set_module(model, n, new)
    scale = None
    if emb_plan is not None:
        emb, scale = emb_plan
        state["embedding"] = emb
        hf.set_input_embeddings(SharedTokenEmbedding(emb.weight, multiplier=scale, padding_idx=emb.padding_idx,
                                                     displaced=emb, scale_kind=str(family.embed_scale),
                                                     config=model.config))
    state["per_layer"] = apply_per_layer(model, table_plan)
    apply_head_and_resize(model, head_plan, emb_plan is not None)
    object.__setattr__(model, _STATE, state)
    function = ", ".join(f"{module_name}.{n}" for n in sorted(values)) if do_rope else None
    return PatchReport(model_type=model_type, rope_function=function,
                       rope_layers=layers, angles=angles if do_rope else None, rotary_modules=tuple(exact),
                       embedding=names[emb_plan[0]] if emb_plan is not None else None, embedding_scale=scale,
                       loss=head_plan.head if head_plan is not None else None,
                       per_layer=table_plan[0] if table_plan is not None else None)


def unpatch(model: Any) -> None:
    """Undo :func:`patch`: the original embedding and rotary modules go back in place, and the attention
    modules run their class's forward again. Outputs are then bit-identical to before.

    Raises:
        ConfigError: ``model`` is not patched.
    """
    state = getattr(model, _STATE, None)
    if state is None:
        raise ConfigError(f"this {type(model).__name__} is not patched; nothing to unpatch")
    if state["embedding"] is not None:
        model.set_input_embeddings(state["embedding"])
    for n, old in state["rotary"].items():
        _set_module(model, n, old)
    for m in state["rope"]:
        del m.forward                                      # the class's own forward again
    restore_per_layer(model, state.get("per_layer"))
    remove_head_and_resize(model)
    object.__delattr__(model, _STATE)
