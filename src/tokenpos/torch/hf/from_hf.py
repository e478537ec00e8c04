"""``from_hf(model)``: the input embedding block of a Hugging Face model as a TransformerEmbedding.

Supported families (by ``model.config.model_type``):

| family | types | block reproduced |
| --- | --- | --- |
| BERT | bert | word + token type + position (start_pos + arange(L)), LayerNorm, dropout |
| RoBERTa | roberta, xlm-roberta, camembert | the same, positions derived from padding (+ start_pos) |
| GPT-2 | gpt2 | wte + wpe (start_pos + arange(L)), dropout |
| Llama-style causal LMs | llama, mistral, qwen2, qwen3, phi3, gemma, gemma2, granite, granitemoe,
  granitemoeshared | embed_tokens times the model's scale (:data:`LLAMA_SCALES`); ``emb.position`` is a
  ``RotaryEmbedding.from_hf_config(config)`` for the attention (nothing is added to the embeddings) |
| Gemma 3n / Gemma 4 text | gemma3n_text, gemma4_text | embed_tokens times its ``embed_scale``; no position
  scheme (``positional="none"``): their RoPE differs per layer type (:func:`rotary_from_hf`: one per type) |

The token scale is reproduced as the model computes it (``tokenpos.torch.hf.embedding``): Gemma's
``embed_scale`` buffer rounded to the weight dtype, Granite's ``embedding_multiplier`` in float32.

The other input tables of Gemma 3n / Gemma 4 text models: :func:`per_layer_from_hf` (their per-layer table as a
``PerLayerEmbedding``, equal to HF's ``get_per_layer_inputs``) and :func:`rotary_from_hf` (a ``RotaryEmbedding``
per layer type, built from that type's config: Gemma 4's full-attention layers have their own head_dim). The
whole input of such a model is then ``project_per_layer_inputs(emb(ids), per_layer(ids))`` (HF's projection):
HF's forward given ``inputs_embeds=emb(ids), per_layer_inputs=per_layer(ids)`` equals its forward given ``ids``.

``start_pos`` plays the role of HF's ``cache_length`` (``past_key_values_length`` in earlier transformers
releases) / past seen tokens (HF ignores it when ``position_ids`` are given; tokenpos refuses
``positions`` with a nonzero ``start_pos``). Weights are copied with their dtype and device. In eval
mode the output equals HF's block exactly; in training mode dropout uses tokenpos's counter-based mask,
not torch's ``nn.Dropout`` stream.
Transformers is never imported here: the model is read through its config and modules.

Shapes: V vocab, D hidden size, P max_position_embeddings, T type_vocab_size; per-layer table: Vp
``vocab_size_per_layer_input``, L ``num_hidden_layers``, Pl ``hidden_size_per_layer_input``.
"""

from __future__ import annotations

from typing import Any

import torch

from tokenpos.tables.errors import ConfigError
from tokenpos.tables.hf.rope import first_given
from tokenpos.torch.per_layer import PerLayerEmbedding
from tokenpos.torch.rotary import RotaryEmbedding
from tokenpos.torch.transformer import TransformerEmbedding

BERT_TYPES = ("bert",)
ROBERTA_TYPES = ("roberta", "xlm-roberta", "camembert")
GPT2_TYPES = ("gpt2",)
# Llama-style families and how each scales its token rows (tokenpos.torch.hf.embedding.SCALE_KINDS)
LLAMA_SCALES = {"llama": "none", "mistral": "none", "qwen2": "none", "qwen3": "none", "phi3": "none",
                "gemma": "buffer", "gemma2": "buffer", "granite": "multiplier", "granitemoe": "multiplier",
                "granitemoeshared": "multiplier"}
LLAMA_TYPES = tuple(LLAMA_SCALES)
# text models with a per-layer table (and RoPE per layer type): how each maps ids past that table
PER_LAYER_OUT_OF_RANGE = {"gemma3n_text": "zero", "gemma4_text": "raise"}
PER_LAYER_TYPES = tuple(PER_LAYER_OUT_OF_RANGE)
SUPPORTED = BERT_TYPES + ROBERTA_TYPES + GPT2_TYPES + LLAMA_TYPES + PER_LAYER_TYPES
# config keys that would scale the embeddings of a family whose code reads none of them: refused, never ignored
LLAMA_REFUSED = ("embedding_multiplier", "embed_scale", "scale_emb")


def _unsupported(what: str) -> ConfigError:
    return ConfigError(f"from_hf supports the BERT ({', '.join(BERT_TYPES)}), RoBERTa "
                       f"({', '.join(ROBERTA_TYPES)}), GPT-2 ({', '.join(GPT2_TYPES)}) and Llama-style "
                       f"({', '.join(LLAMA_TYPES + PER_LAYER_TYPES)}) families; got {what}")


def _base(model: Any) -> Any:
    """The bare model (BertModel, GPT2Model, ...) inside a task model (BertForX, GPT2LMHeadModel)."""
    base = getattr(model, "base_model", model)
    return model if base is None else base


def from_hf(model: Any, *, freeze: bool = False) -> TransformerEmbedding:
    """A TransformerEmbedding reproducing ``model``'s input embedding block.

    Args:
        model: a Hugging Face model of a supported family (bare or with a head).
        freeze: make every copied table non-trainable.

    Returns:
        A module whose ``forward(ids (B, L), positions=None, *, start_pos=0, token_type_ids=None)``
        equals ``model.embeddings(input_ids, token_type_ids, position_ids, cache_length=start_pos)``
        (BERT/RoBERTa), ``wte(ids) + wpe(start_pos + arange(L))`` (GPT-2) or ``embed_tokens(ids)`` (Llama-style,
        Gemma 3n / 4 text: whose per-layer table is :func:`per_layer_from_hf`). Same training mode as ``model``.
        With ``positions`` given, ``start_pos`` must be 0 (ConfigError otherwise: HF would ignore it).

    Raises:
        ConfigError: a model outside the supported families (the message names them), a
            configuration the block cannot reproduce (relative position embeddings), or a model of a
            supported family without its embedding modules.
    """
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    if model_type not in SUPPORTED:
        got = (f"model_type {model_type!r} ({type(model).__name__})" if config is not None
               else f"a {type(model).__name__} without a .config")
        raise _unsupported(got)
    kind = first_given(config, "position_embedding_type")          # None or missing: absolute (HF's default)
    kind = "absolute" if kind is None else kind
    if kind != "absolute":
        raise ConfigError(f"from_hf reproduces absolute position embeddings only; got "
                          f"position_embedding_type={kind!r}")
    base = _base(model)
    try:
        if model_type in PER_LAYER_TYPES:
            layer = _from_gemma_per_layer(base, config)
        elif model_type in LLAMA_TYPES:
            layer = _from_llama(base, config)
        elif model_type in GPT2_TYPES:
            layer = _from_gpt2(base, config)
        else:
            layer = _from_bert_like(base.embeddings, config, padding=model_type in ROBERTA_TYPES)
    except AttributeError as err:          # a module the family has was removed or set to None
        raise ConfigError(f"from_hf could not read the input embedding of this {model_type!r} model "
                          f"({type(model).__name__}): {err}; expected the family's embedding modules") from err
    if freeze:
        layer.requires_grad_(False)
    return layer.train(bool(getattr(model, "training", False)))


def _copy(layer: TransformerEmbedding, tensors: dict[str, torch.Tensor]) -> TransformerEmbedding:
    layer.load_state_dict({k: v.detach() for k, v in tensors.items()})
    return layer


def _from_bert_like(emb: Any, config: Any, *, padding: bool) -> TransformerEmbedding:
    word, pos, tt, ln = emb.word_embeddings, emb.position_embeddings, emb.token_type_embeddings, emb.LayerNorm
    pad = getattr(emb, "padding_idx", None) if padding else word.padding_idx
    if padding and pad is None:
        raise ConfigError("a RoBERTa-family model needs config.pad_token_id to derive positions; got None")
    w = word.weight
    layer = TransformerEmbedding(
        w.shape[0], w.shape[1], pos.weight.shape[0], positional="learned", padding_idx=pad, init="zeros",
        num_token_types=tt.weight.shape[0], norm="layernorm", norm_eps=ln.eps,
        dropout=float(emb.dropout.p),                                 # what the model's module does
        position_ids="padding" if padding else "default", device=w.device, dtype=w.dtype, seed=0)
    state = {"token.weight": w, "position.weight": pos.weight, "token_type.weight": tt.weight,
             "norm.weight": ln.weight, "norm.bias": ln.bias}
    return _copy(layer, state)


def _from_gpt2(base: Any, config: Any) -> TransformerEmbedding:
    wte, wpe = base.wte.weight, base.wpe.weight
    layer = TransformerEmbedding(
        wte.shape[0], wte.shape[1], wpe.shape[0], positional="learned", init="zeros",
        dropout=float(base.drop.p), device=wte.device, dtype=wte.dtype, seed=0)  # what the model's module does
    return _copy(layer, {"token.weight": wte, "position.weight": wpe})


def _from_gemma_per_layer(base: Any, config: Any) -> TransformerEmbedding:
    """Gemma 3n / 4 text: embed_tokens times its ``embed_scale`` in the weight's dtype; no position scheme (their
    RoPE differs per layer type: :func:`rotary_from_hf`)."""
    from tokenpos.torch.hf.embedding import SharedTokenEmbedding, hf_embedding_scale

    w = base.embed_tokens.weight
    pad = getattr(base.embed_tokens, "padding_idx", None)
    max_len = first_given(config, "max_position_embeddings")
    layer = TransformerEmbedding(w.shape[0], w.shape[1], 512 if max_len is None else int(max_len),
                                 positional="none", padding_idx=pad, init="zeros", device=w.device, dtype=w.dtype,
                                 seed=0)
    layer.token = SharedTokenEmbedding(torch.nn.Parameter(w.detach().clone()),
                                       multiplier=hf_embedding_scale("buffer", base.embed_tokens, config),
                                       padding_idx=pad)
    return layer


def _text_model(model: Any, what: str) -> tuple[Any, Any]:
    """(the config, the bare text model) of a Gemma 3n / Gemma 4 text model; ConfigError for any other."""
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    if model_type not in PER_LAYER_TYPES:
        got = (f"model_type {model_type!r} ({type(model).__name__})" if config is not None
               else f"a {type(model).__name__} without a .config")
        raise ConfigError(f"{what} supports the Gemma 3n / Gemma 4 text models ({', '.join(PER_LAYER_TYPES)}: "
                          f"Gemma3nForCausalLM, Gemma4ForCausalLM, their text models); got {got}")
    return config, _base(model)


def per_layer_from_hf(model: Any, *, freeze: bool = False) -> PerLayerEmbedding:
    """The per-layer table of a Gemma 3n / Gemma 4 text model as a ``PerLayerEmbedding`` (a copy of
    ``embed_tokens_per_layer.weight`` with its dtype and device): ids (B, L) -> (B, L, L_layers, Pl), equal to
    HF's ``get_per_layer_inputs(ids)`` (the rows times HF's ``embed_scale`` rounded to the weight's dtype).
    Gemma 3n's ids past the table read row 0 as HF maps them (``out_of_range="zero"``; a negative id, which HF
    also maps to 0, is refused); Gemma 4's raise ``TokenIdError`` (HF's lookup raises IndexError).

    ``from_hf`` returns the TransformerEmbedding of the token table; this is the second table such a model looks
    ids up in, passed with it to HF's ``project_per_layer_inputs`` (or as ``per_layer_inputs=`` to HF's forward).
    Same training mode as ``model``; ``freeze``: not trainable.

    Raises:
        ConfigError: another family; a model without a per-layer table (Gemma 4 with
            ``hidden_size_per_layer_input`` 0); a table of another shape than (Vp, L * Pl) or whose scale is not
            sqrt(Pl) as HF rounds it.
    """
    config, base = _text_model(model, "per_layer_from_hf")
    emb = getattr(base, "embed_tokens_per_layer", None)
    L, P = getattr(config, "num_hidden_layers", None), getattr(config, "hidden_size_per_layer_input", None)
    if emb is None or not P:
        raise ConfigError(f"this {config.model_type!r} model ({type(model).__name__}) has no per-layer table "
                          f"(hidden_size_per_layer_input={P!r}); expected embed_tokens_per_layer")
    w = emb.weight
    if not (isinstance(L, int) and isinstance(P, int) and w.dim() == 2 and w.shape[1] == L * P):
        raise ConfigError(f"embed_tokens_per_layer has shape {tuple(w.shape)}; expected (vocab_size_per_layer_input, "
                          f"num_hidden_layers * hidden_size_per_layer_input) = (V, {L} * {P})")
    from tokenpos.torch.hf.embedding import hf_embedding_scale

    layer = PerLayerEmbedding(w.shape[0], L, P, padding_idx=getattr(emb, "padding_idx", None),
                              out_of_range=PER_LAYER_OUT_OF_RANGE[config.model_type], init="zeros", device=w.device,
                              dtype=w.dtype, seed=0)
    hf_scale = hf_embedding_scale("buffer", emb, config)
    if hf_scale != layer.multiplier:
        raise ConfigError(f"embed_tokens_per_layer scales its rows by {hf_scale!r}; expected sqrt("
                          f"hidden_size_per_layer_input) = {layer.multiplier!r} in {w.dtype} (PerLayerEmbedding's)")
    layer.load_state_dict({"weight": w.detach()})
    if freeze:
        layer.requires_grad_(False)
    return layer.train(bool(getattr(model, "training", False)))


def rotary_from_hf(model: Any) -> dict[str, RotaryEmbedding]:
    """The RoPE of a Gemma 3n / Gemma 4 text model: {layer type: RotaryEmbedding}, one per entry of
    ``config.layer_types`` ("sliding_attention", "full_attention"), each ``RotaryEmbedding.from_hf_config`` of
    that type's config (``config.per_layer_config[type]``, read by ``from_hf_config``: Gemma 4's full-attention
    layers have their own head_dim), on the model's device. ``rotary[config.layer_types[i]]`` rotates layer i's
    q and k as the model's ``rotary_emb(x, positions, layer_type)`` does (to ``hf.rope_rotated``).

    Raises:
        ConfigError: another family, or a layer type whose RoPE tokenpos does not build (the reason named).
    """
    config, base = _text_model(model, "rotary_from_hf")
    types = getattr(config, "layer_types", None)
    if not isinstance(types, (list, tuple)) or not types:
        raise ConfigError(f"rotary_from_hf needs config.layer_types; got {types!r}")
    device = base.embed_tokens.weight.device
    # from_hf_config reads each type's own view of a per-layer config (Gemma 4's full-attention head_dim)
    return {kind: RotaryEmbedding.from_hf_config(config, layer_type=kind, device=device)
            for kind in dict.fromkeys(types)}


def _from_llama(base: Any, config: Any) -> TransformerEmbedding:
    from tokenpos.torch.hf.embedding import SharedTokenEmbedding, hf_embedding_scale

    kind = LLAMA_SCALES[config.model_type]
    for key in LLAMA_REFUSED if kind == "none" else ():
        value = getattr(config, key, None)
        if value not in (None, 1, 1.0, False):
            raise ConfigError(f"the config sets {key}={value!r}, which scales the embeddings, but a "
                              f"{config.model_type!r} model never reads it; expected it unset")
    w = base.embed_tokens.weight
    rope = RotaryEmbedding.from_hf_config(config, device=w.device)
    pad = getattr(base.embed_tokens, "padding_idx", None)
    layer = TransformerEmbedding(w.shape[0], w.shape[1], rope.max_seq_len, positional=rope, padding_idx=pad,
                                 init="zeros", device=w.device, dtype=w.dtype, seed=0)
    scale = hf_embedding_scale(kind, base.embed_tokens, config)
    if scale != 1.0:                                  # a token table with the model's own multiplier
        layer.token = SharedTokenEmbedding(torch.nn.Parameter(w.detach().clone()), multiplier=scale,
                                           padding_idx=pad)
        return layer
    return _copy(layer, {"token.weight": w})
