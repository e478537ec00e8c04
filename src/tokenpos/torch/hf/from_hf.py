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

The token scale is reproduced as the model computes it (``tokenpos.torch.hf.embedding``): Gemma's
``embed_scale`` buffer rounded to the weight dtype, Granite's ``embedding_multiplier`` in float32.

``start_pos`` plays the role of HF's ``cache_length`` (``past_key_values_length`` in earlier transformers
releases) / past seen tokens (HF ignores it when ``position_ids`` are given; tokenpos refuses
``positions`` with a nonzero ``start_pos``). Weights are copied with their dtype and device. In eval
mode the output equals HF's block exactly; in training mode dropout uses tokenpos's counter-based mask,
not torch's ``nn.Dropout`` stream.
Transformers is never imported here: the model is read through its config and modules.

Shapes: V vocab, D hidden size, P max_position_embeddings, T type_vocab_size.
"""

from __future__ import annotations

from typing import Any

import torch

from tokenpos.tables.errors import ConfigError
from tokenpos.tables.hf.rope import first_given
from tokenpos.torch.transformer import TransformerEmbedding

BERT_TYPES = ("bert",)
ROBERTA_TYPES = ("roberta", "xlm-roberta", "camembert")
GPT2_TYPES = ("gpt2",)
# Llama-style families and how each scales its token rows (tokenpos.torch.hf.embedding.SCALE_KINDS)
LLAMA_SCALES = {"llama": "none", "mistral": "none", "qwen2": "none", "qwen3": "none", "phi3": "none",
                "gemma": "buffer", "gemma2": "buffer", "granite": "multiplier", "granitemoe": "multiplier",
                "granitemoeshared": "multiplier"}
LLAMA_TYPES = tuple(LLAMA_SCALES)
SUPPORTED = BERT_TYPES + ROBERTA_TYPES + GPT2_TYPES + LLAMA_TYPES
# config keys that would scale the embeddings of a family whose code reads none of them: refused, never ignored
LLAMA_REFUSED = ("embedding_multiplier", "embed_scale", "scale_emb")


def _unsupported(what: str) -> ConfigError:
    return ConfigError(f"from_hf supports the BERT ({', '.join(BERT_TYPES)}), RoBERTa "
                       f"({', '.join(ROBERTA_TYPES)}), GPT-2 ({', '.join(GPT2_TYPES)}) and Llama-style "
                       f"({', '.join(LLAMA_TYPES)}) families; got {what}")


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
        (BERT/RoBERTa) or ``wte(ids) + wpe(start_pos + arange(L))`` (GPT-2). Same training mode as ``model``.
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
        if model_type in LLAMA_TYPES:
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


def _from_llama(base: Any, config: Any) -> TransformerEmbedding:
    from tokenpos.torch.hf.embedding import SharedTokenEmbedding, hf_embedding_scale
    from tokenpos.torch.rotary import RotaryEmbedding

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
