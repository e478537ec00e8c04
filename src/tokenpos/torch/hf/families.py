"""Which Hugging Face models ``patch`` can give tokenpos's RoPE: recognised from the model itself, not listed.

A decoder family is patchable when (1) an attention class of its modeling module reads, as a
module-level global, a RoPE helper whose code is HF's code of one of the calling conventions below
(the same bytecode, constants and argument names as the reference helper of the installed
``transformers``, and every global the helper reads, such as ``rotate_half``, the same object or
again the same code: :func:`same_function`), and (2) the tables its rotary module(s) hand that
helper have the layout the convention's replacement reads (checked by one probe call of a copy of
each rotary module at positions 1..8, for each of ``config.layer_types`` where the module takes a
layer type, and on three distinct axes for M-RoPE (an ``mrope_section``): :func:`probe_rotary`).
(1) makes the helper the very function the replacement is tested against (a proof, given the
reference's tests); (2) is a probe, not a proof: it sees the layout the module's code gives every
position, but not a layout that changes with the position (no HF rotary module does). Anything
else is refused with ``ConfigError`` naming the reason (:func:`recognise`), before any change.
``transformers`` is imported only by :func:`recognise` (the reference helpers).

Conventions (rope kind: reference helper in transformers.models.<m>.modeling_<m>; the tables it reads):

- "qk": llama, gpt_neox (partial), phi3, olmo2 ``apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1)``;
  cos, sin (B, L, R) = [c, c] (layout "halves").
- "glm": glm4 ``apply_rotary_pos_emb``: the first half of [c, c] on interleaved pairs, partial ("halves").
- "cohere": cohere2 ``apply_rotary_pos_emb``: float32 math, interleaved pairs; [c0, c0, c1, c1, ...] ("pairs").
- "x": gemma4 ``apply_rotary_pos_emb(x, cos, sin, unsqueeze_dim=1)``, one tensor per call ("halves").
- "deinterleave": deepseek_v3 ``apply_rotary_pos_emb_interleave(q, k, cos, sin, position_ids=None,
  unsqueeze_dim=1)``: the even then the odd entries rotated as halves ("halves").
- "gptj": gptj ``apply_rotary_pos_emb(x, sin, cos)``, once per tensor; sin, cos (B, L, R/2) (no layout read).
- "llama4": llama4 ``apply_rotary_emb(xq, xk, freqs_cis)``; complex (B, L, F) (no layout read).

R is the rotary dim (R < Dh: the rest passes), F = R/2. M-RoPE (Qwen2-VL, Qwen2.5-VL, Qwen3.5) reaches
a "qk" helper with the three axes merged into cos / sin (B, L, Dh): the probe checks the merge keeps
[c, c]. Vision towers (classes named ``*Vision*``) keep HF's RoPE. The input embedding is recognised
the same way: a plain ``nn.Embedding`` (scale "none") or a scaled word embedding whose forward is
Gemma 3's code (``W[ids] * embed_scale.to(W.dtype)``, scale "buffer"). GPT-2, BERT and RoBERTa
(:data:`EMBEDDING_ONLY`) have no RoPE: only their embedding is patched.

``angles`` says how ``patch(angles="exact")`` rebuilds the rotary tables from the config: "rope"
(``RotaryEmbedding.from_hf_config``), "layer_types" (one per ``config.layer_types`` entry: the rotary
module's forward takes a layer type), "mrope" (``MRotaryEmbedding.from_hf_config``: the config or the
rotary module has an ``mrope_section``). ``patch`` checks the rebuilt tables against the model's own at
the probe positions and refuses ``angles="exact"`` where they differ (a setting tokenpos does not rebuild).
"""

from __future__ import annotations

import copy
import dis
import functools
import importlib
import inspect
import types
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from tokenpos.tables.errors import ConfigError

EMBEDDING_ONLY = ("gpt2", "bert", "roberta")
# (reference module, helper name, rope kind, the layout its tables must have)
CONVENTIONS: tuple[tuple[str, str, str, str | None], ...] = (
    ("llama", "apply_rotary_pos_emb", "qk", "halves"),
    ("gpt_neox", "apply_rotary_pos_emb", "qk", "halves"),
    ("phi3", "apply_rotary_pos_emb", "qk", "halves"),
    ("olmo2", "apply_rotary_pos_emb", "qk", "halves"),
    ("glm4", "apply_rotary_pos_emb", "glm", "halves"),
    ("cohere2", "apply_rotary_pos_emb", "cohere", "pairs"),
    ("gemma4", "apply_rotary_pos_emb", "x", "halves"),
    ("deepseek_v3", "apply_rotary_pos_emb_interleave", "deinterleave", "halves"),
    ("gptj", "apply_rotary_pos_emb", "gptj", None),
    ("llama4", "apply_rotary_emb", "llama4", None),
)
SCALED_EMBEDDING = ("gemma3", "Gemma3TextScaledWordEmbedding")
PROBE_POSITIONS = 8


@dataclass(frozen=True)
class Family:
    """What :func:`recognise` found in one model.

    model_type: ``config.model_type``. module: the modeling module of the RoPE attention (None: no RoPE
    recognised). helpers: (global name, rope kind) of each RoPE helper its attention reads. attention:
    the attention classes reading them. rotary: module names of the rotary modules feeding them.
    angles: "rope" | "layer_types" | "mrope" (how ``angles="exact"`` rebuilds them). embed_scale:
    "none" | "buffer" | None (an input embedding ``patch`` cannot reproduce; ``embed_reason`` says why).
    """

    model_type: str
    module: str | None = None
    helpers: tuple[tuple[str, str], ...] = ()
    attention: tuple[type, ...] = ()
    rotary: tuple[str, ...] = ()
    angles: str = "rope"
    embed_scale: str | None = "none"
    embed_reason: str = ""

    @property
    def rope(self) -> str | None:
        """The rope kind of the first helper (None: no RoPE)."""
        return self.helpers[0][1] if self.helpers else None


# ----------------------------------------------------------------------------------------------
# Code identity
# ----------------------------------------------------------------------------------------------


def innermost(fn: Any) -> Any:
    """``fn`` below its ``functools.wraps`` decorators (``__wrapped__``)."""
    while getattr(fn, "__wrapped__", None) is not None:
        fn = fn.__wrapped__
    return fn


def _codes(code: types.CodeType) -> Iterator[types.CodeType]:
    yield code
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            yield from _codes(c)


def global_reads(code: types.CodeType) -> set[str]:
    """The names ``code`` (and the code nested in it) loads as globals."""
    return {i.argval for c in _codes(code) for i in dis.get_instructions(c) if i.opname == "LOAD_GLOBAL"}


def _same_code(a: types.CodeType, b: types.CodeType, top: bool) -> bool:
    keys = ("co_code", "co_names", "co_varnames", "co_freevars", "co_cellvars", "co_argcount",
            "co_posonlyargcount", "co_kwonlyargcount", "co_flags")
    if any(getattr(a, k) != getattr(b, k) for k in keys) or len(a.co_consts) != len(b.co_consts):
        return False
    for i, (x, y) in enumerate(zip(a.co_consts, b.co_consts, strict=True)):
        if isinstance(x, types.CodeType) and isinstance(y, types.CodeType):
            if not _same_code(x, y, False):
                return False
        elif not (top and i == 0 and isinstance(x, str) and isinstance(y, str)) and \
                (type(x) is not type(y) or x != y):               # (a function's docstring may differ)
            return False
    return True


def same_function(a: Any, b: Any, _seen: frozenset[tuple[int, int]] = frozenset()) -> bool:
    """True when the functions ``a`` and ``b`` compute the same thing: the same code (bytecode, names,
    constants but the docstring, arguments, defaults) and every global they read the same object or,
    for functions, again the same function by this test."""
    if a is b:
        return True
    if not isinstance(a, types.FunctionType) or not isinstance(b, types.FunctionType):
        return False
    if (id(a), id(b)) in _seen:
        return True
    if not _same_code(a.__code__, b.__code__, True) or a.__defaults__ != b.__defaults__ or \
            a.__kwdefaults__ != b.__kwdefaults__ or (a.__closure__ is None) != (b.__closure__ is None):
        return False
    seen = _seen | {(id(a), id(b))}
    missing = object()
    for name in global_reads(a.__code__):
        x, y = a.__globals__.get(name, missing), b.__globals__.get(name, missing)
        if x is not y and not same_function(x, y, seen):
            return False
    return True


@functools.cache
def _references() -> tuple[tuple[Any, str, str | None], ...]:
    """(function, rope kind, layout) of each reference helper of the installed transformers."""
    out = []
    for module, name, rope, layout in CONVENTIONS:
        mod = importlib.import_module(f"transformers.models.{module}.modeling_{module}")
        out.append((getattr(mod, name), rope, layout))
    return tuple(out)


def convention_of(fn: Any) -> tuple[str, str | None] | None:
    """(rope kind, layout) of a function that is one of HF's RoPE helpers (:func:`same_function`), else None."""
    if not isinstance(fn, types.FunctionType):
        return None
    for ref, rope, layout in _references():
        if same_function(fn, ref):
            return rope, layout
    return None


# ----------------------------------------------------------------------------------------------
# Recognition
# ----------------------------------------------------------------------------------------------


def _ropeish(name: str) -> bool:
    low = name.lower()
    return "rotary" in low or "rope" in low


def _text_config(config: Any) -> Any:
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def probe_rotary(rotary: nn.Module, config: Any) -> list[tuple[Any, Any, Any]]:
    """[(layer_type, position_ids, output)] of a copy of ``rotary`` (so that a dynamic scaling's state is
    never touched) at positions 1..8: (1, 8) positions, and (3, 1, 8) distinct axes for an M-RoPE module
    (HF's hold an ``mrope_section``); once per ``config.layer_types`` entry when its forward takes
    ``layer_type``."""
    fn = innermost(type(rotary).forward)
    takes_type = "layer_type" in inspect.signature(fn).parameters
    kinds: list[Any] = [None]
    if takes_type:
        layer_types = getattr(_text_config(config), "layer_types", None)
        if not isinstance(layer_types, (list, tuple)) or not layer_types:
            raise ConfigError(f"{type(rotary).__name__} takes a layer type but the config has no layer_types; "
                              f"expected a list of layer type names")
        kinds = sorted(set(layer_types))
    buffers = list(rotary.buffers())
    device = buffers[0].device if buffers else torch.device("cpu")
    if device.type == "meta":
        raise ConfigError(f"{type(rotary).__name__} is on the meta device; patch checks its tables, so load "
                          f"the weights first")
    twin = copy.deepcopy(rotary)
    x = torch.zeros(1, dtype=torch.float32, device=device)
    pos = torch.arange(1, PROBE_POSITIONS + 1, device=device)[None]
    pos3 = torch.stack([pos, 2 * pos + 1, 3 * pos + 2])                  # three distinct M-RoPE axes
    out = []
    with torch.no_grad():
        for kind in kinds:
            args = () if kind is None else (kind,)
            out.append((kind, pos, twin(x, pos, *args)))
            if hasattr(rotary, "mrope_section"):
                out.append((kind, pos3, twin(x, pos3, *args)))
    return out


def _layout_ok(out: Any, layout: str) -> bool:
    if not isinstance(out, tuple) or len(out) != 2 or not all(isinstance(t, torch.Tensor) for t in out):
        return False
    for t in out:
        R = t.shape[-1]
        if R % 2:
            return False
        a, b = (t[..., : R // 2], t[..., R // 2:]) if layout == "halves" else (t[..., 0::2], t[..., 1::2])
        if not torch.equal(a, b):
            return False
    return True


def _embed_scale(model: Any) -> tuple[str | None, str]:
    emb = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    if type(emb) is nn.Embedding:
        return "none", ""
    name = type(emb).__name__
    if isinstance(emb, nn.Embedding) and isinstance(getattr(emb, "embed_scale", None), torch.Tensor):
        module, cls = SCALED_EMBEDDING
        ref = getattr(importlib.import_module(f"transformers.models.{module}.modeling_{module}"), cls)
        if same_function(innermost(type(emb).forward), innermost(ref.forward)):
            return "buffer", ""
        return None, f"its input embedding {name} has an embed_scale but a forward other than {cls}'s"
    return None, f"its input embedding is a {name}, expected an nn.Embedding or a scaled word embedding"


def recognise(model: Any) -> Family:
    """What ``patch`` can replace in ``model`` (see the module docstring), checked; nothing is changed.

    Raises:
        ConfigError: ``model`` is not an ``nn.Module`` with a ``config.model_type``, its attention reads a
            RoPE helper that is none of HF's conventions, its rotary tables lack the layout the helper
            reads, or it has no recognised RoPE helper and is not one of :data:`EMBEDDING_ONLY`.
    """
    config: Any = getattr(model, "config", None)
    model_type: Any = getattr(config, "model_type", None)
    if not isinstance(model, nn.Module) or not isinstance(model_type, str):
        raise ConfigError(f"patch takes a transformers model (an nn.Module with a config.model_type); got a "
                          f"{type(model).__name__} with model_type {model_type!r}")
    embed_scale, embed_reason = _embed_scale(model)
    if model_type in EMBEDDING_ONLY:
        return Family(model_type, embed_scale=embed_scale, embed_reason=embed_reason)
    helpers: dict[str, tuple[str, str | None]] = {}
    attention: list[type] = []
    modules: set[str] = set()
    for cls in dict.fromkeys(type(m) for m in model.modules()):
        if not cls.__module__.startswith("transformers.models.") or "Vision" in cls.__name__ or \
                "forward" not in vars(cls):
            continue
        fn = innermost(cls.forward)
        if not isinstance(fn, types.FunctionType):
            continue
        found = False
        for name in sorted(global_reads(fn.__code__)):
            value = fn.__globals__.get(name)
            if not isinstance(value, types.FunctionType):
                continue
            conv = convention_of(value)
            if conv is not None:
                helpers[name] = conv
                found = True
            elif _ropeish(name):
                raise ConfigError(f"patch recognises no RoPE helper in {cls.__name__}: it calls {name} of "
                                  f"{fn.__module__}, which is none of HF's RoPE conventions (the same code as "
                                  f"llama's, gpt_neox's, glm4's, cohere2's, gemma4's, deepseek_v3's, gptj's or "
                                  f"llama4's); model_type {model_type!r} ({type(model).__name__})")
        if found:
            attention.append(cls)
            modules.add(fn.__module__)
    if not helpers:
        raise ConfigError(f"patch supports decoders whose attention calls one of HF's standard RoPE helpers "
                          f"(Llama's apply_rotary_pos_emb and its kin) and the embedding-only families "
                          f"{list(EMBEDDING_ONLY)}; found neither in model_type {model_type!r} "
                          f"({type(model).__name__})")
    if len(modules) != 1:
        raise ConfigError(f"patch found RoPE attention from several modeling modules {sorted(modules)}; expected one")
    module = modules.pop()
    rotary = [n for n, m in model.named_modules() if type(m).__module__ == module
              and type(m).__name__.endswith("RotaryEmbedding") and "Vision" not in type(m).__name__]
    layouts = {layout for _, layout in helpers.values() if layout is not None}
    if layouts and not rotary:
        raise ConfigError(f"patch found no rotary module of {module} in this {type(model).__name__}, so it cannot "
                          f"check the layout of the tables {sorted(helpers)} read; expected a *RotaryEmbedding")
    angles = "rope"
    for n in rotary:
        rot = model.get_submodule(n)
        for kind, pos, out in probe_rotary(rot, config):
            angles = "layer_types" if kind is not None else angles
            for layout in layouts:
                if not _layout_ok(out, layout):
                    axes = "three distinct M-RoPE axes" if pos.ndim == 3 else "positions 1..8"
                    raise ConfigError(f"{n} ({type(rot).__name__}{'' if kind is None else ', ' + kind}) returns "
                                      f"tables without the {layout!r} layout that {sorted(helpers)} of {module} "
                                      f"read (at {axes}); patch leaves this model to HF")
    params = getattr(_text_config(config), "rope_parameters", None)
    params = getattr(config, "rope_parameters", None) if params is None else params
    if (isinstance(params, dict) and "mrope_section" in params) or \
            any(hasattr(model.get_submodule(n), "mrope_section") for n in rotary):   # (a class default: Qwen3.5)
        angles = "mrope"
    return Family(model_type, module=module, helpers=tuple((k, v[0]) for k, v in sorted(helpers.items())),
                  attention=tuple(attention), rotary=tuple(rotary), angles=angles, embed_scale=embed_scale,
                  embed_reason=embed_reason)
