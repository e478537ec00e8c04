"""``patch(model)``: tokenpos's RoPE op and token embedding inside a loaded Hugging Face model.

What each family needs is one table (:data:`tokenpos.torch.hf.families.FAMILIES`); this module
holds the replacements, which follow HF's calling conventions exactly:

- RoPE: the module-level function the family's attention calls (``apply_rotary_pos_emb`` /
  ``apply_rotary_emb``) becomes a tokenpos one that rotates q and k in one ``tokenpos::rope_qk``
  pass (GPT-J rotates one tensor per call: ``tokenpos::rope``), through
  :func:`tokenpos.torch.ops.entry.rotate_qk`. HF's cos / sin (B, L, R) hold duplicated halves [c, c];
  the op reads the first half (B, L, F), F = R/2, as float32 (float64 for a float64 model: the op
  never takes low-precision tables). The function is replaced for THIS model only: each of its
  attention modules gets its own ``forward``, the class's code (decorators included) run with the
  modeling module's globals but for that one name (:func:`_with_global`). The modeling module is
  never changed, so another model of the family in the process keeps HF's function, and
  :func:`unpatch` (which deletes those instance ``forward`` attributes) restores bit-identical
  outputs whatever else is patched. (Liger-Kernel swaps the module's function for the whole
  process instead; in bf16, where the two rotations round differently, that changes the outputs
  of every model of the family.)
- ``angles="exact"``: the model's rotary module(s) become :class:`ExactAngles`, cos / sin from
  tokenpos's float64 angles of the config, handed to the patched function in HF's form.
- Embedding: the input embedding becomes a :class:`~tokenpos.torch.hf.embedding.SharedTokenEmbedding`
  (a ``TokenEmbedding``) holding the SAME weight Parameter (tied heads stay tied), its rows multiplied
  by the module's own scale as HF computes it (a scale HF applies outside the module, Granite's
  ``embedding_multiplier``, stays HF's own code).

Every check runs before anything changes; a refused call leaves the model as it was.
Shapes: B batch, H (Hk) query (key) heads, L length, Dh head dim, R rotary dim, F = R/2.
"""

from __future__ import annotations

import importlib
import types
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from tokenpos.tables.errors import ConfigError
from tokenpos.torch.hf.embedding import FollowsDisplaced, SharedTokenEmbedding, hf_embedding_scale
from tokenpos.torch.hf.families import FAMILIES, Family
from tokenpos.torch.ops.entry import rotate, rotate_qk

ANGLES = ("hf", "exact")
_STATE = "_tokenpos_patch"


@dataclass(frozen=True)
class PatchReport:
    """What :func:`patch` replaced.

    model_type: ``config.model_type``. rope_function: the replaced function's qualified name (None:
    RoPE untouched). rope_layers: attention modules of the model that call it. angles: "hf" / "exact"
    (None: RoPE untouched). rotary_modules: modules replaced by :class:`ExactAngles`. embedding: the
    replaced input embedding's module name (None: untouched). embedding_scale: its row multiplier.
    """

    model_type: str
    rope_function: str | None
    rope_layers: int
    angles: str | None
    rotary_modules: tuple[str, ...]
    embedding: str | None
    embedding_scale: float | None


# ----------------------------------------------------------------------------------------------
# The replacements: HF's RoPE functions, same arguments, same results (to fp32 rounding)
# ----------------------------------------------------------------------------------------------


def _op_tables(cos: torch.Tensor, sin: torch.Tensor, F: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos / sin (..., >= F) -> their first F entries (..., F), contiguous, float32 or float64."""
    c, s = cos[..., :F], sin[..., :F]
    if c.dtype not in (torch.float32, torch.float64):
        c, s = c.float(), s.float()
    return c.contiguous(), s.contiguous()


def rope_qk_half(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                 unsqueeze_dim: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """HF's ``apply_rotary_pos_emb``: q (B, H, L, Dh), k (B, Hk, L, Dh) (``unsqueeze_dim=2``: (B, L, H, Dh)),
    cos / sin (B, L, R) = [c, c], R <= Dh (the rest passes) -> (q', k') in one ``tokenpos::rope_qk`` pass."""
    if unsqueeze_dim not in (1, 2):
        raise ConfigError(f"apply_rotary_pos_emb patched by tokenpos takes unsqueeze_dim 1 (q (B, H, L, Dh)) or 2 "
                          f"(q (B, L, H, Dh)); got {unsqueeze_dim!r}")
    c, s = _op_tables(cos, sin, cos.shape[-1] // 2)                  # (B, L, F)
    if unsqueeze_dim == 2:
        oq, ok = rotate_qk(q.transpose(1, 2), k.transpose(1, 2), c, s, False)
        return oq.transpose(1, 2), ok.transpose(1, 2)
    return rotate_qk(q, k, c, s, False)


def rope_gptj(x: torch.Tensor, sin: torch.Tensor, cos: torch.Tensor) -> torch.Tensor:
    """GPT-J's ``apply_rotary_pos_emb``: x (B, L, H, R), sin / cos (B, L, R/2), interleaved pairs -> (B, L, H, R)."""
    c, s = _op_tables(cos, sin, cos.shape[-1])
    return rotate(x.transpose(1, 2), c, s, True).transpose(1, 2)


def rope_llama4(xq: torch.Tensor, xk: torch.Tensor, freqs_cis: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Llama 4's ``apply_rotary_emb``: xq (B, L, H, Dh), xk (B, L, Hk, Dh), freqs_cis complex (B, L, Dh/2),
    interleaved pairs -> (xq', xk') in one ``tokenpos::rope_qk`` pass."""
    c, s = _op_tables(freqs_cis.real, freqs_cis.imag, freqs_cis.shape[-1])
    oq, ok = rotate_qk(xq.transpose(1, 2), xk.transpose(1, 2), c, s, True)
    return oq.transpose(1, 2), ok.transpose(1, 2)


REPLACEMENTS = {"qk": rope_qk_half, "gptj": rope_gptj, "llama4": rope_llama4}


class ExactAngles(FollowsDisplaced):
    """An HF rotary module rebuilt from tokenpos's float64 angles (``patch(angles="exact")``).

    ``forward(x, position_ids, layer_type=None)`` returns what the family's RoPE function reads:
    "qk": cos, sin (B, L, R) = [c, c]; "gptj": sin, cos (B, L, F); "llama4": complex (B, L, F).
    position_ids (B, L), or (3, B, L) for M-RoPE. Tables are float32 (float64 for a float64 ``x``).
    """

    def __init__(self, rotary: dict[str, nn.Module], rope: str) -> None:
        super().__init__()
        self.rotary = nn.ModuleDict(rotary)
        self.rope = rope

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor, layer_type: str | None = None) -> Any:
        from tokenpos.torch.mrope import MRotaryEmbedding

        rot: Any = self.rotary[layer_type or "default"]
        if isinstance(rot, MRotaryEmbedding):
            pos = position_ids.expand(3, -1, -1) if position_ids.ndim == 2 else position_ids
            cos, sin = rot.cos_sin(pos)                               # (B, L, Dh) float64, [c, c]
        else:
            cos, sin = rot.cos_sin_positions(position_ids)            # (B, L, R) float64, in the layout
        dt = torch.float64 if x.dtype == torch.float64 else torch.float32
        cos, sin = cos.to(dt), sin.to(dt)
        if self.rope == "gptj":
            return sin[..., ::2].contiguous(), cos[..., ::2].contiguous()
        if self.rope == "llama4":
            return torch.complex(cos[..., ::2], sin[..., ::2])
        return cos, sin


def _exact_rotary(family: Family, config: Any, device: torch.device) -> ExactAngles:
    from tokenpos.torch.mrope import MRotaryEmbedding
    from tokenpos.torch.rotary import RotaryEmbedding

    rotary: dict[str, nn.Module]
    if family.angles == "mrope":
        rotary = {"default": MRotaryEmbedding.from_hf_config(config, device=device)}
    elif family.angles == "layer_types":
        rotary = {t: RotaryEmbedding.from_hf_config(config, layer_type=t, device=device)
                  for t in sorted(set(config.layer_types))}
    else:
        rotary = {"default": RotaryEmbedding.from_hf_config(config, device=device)}
    return ExactAngles(rotary, str(family.rope))


# ----------------------------------------------------------------------------------------------
# patch / unpatch
# ----------------------------------------------------------------------------------------------


def _unsupported(model: Any, model_type: Any) -> ConfigError:
    rope = sorted(k for k, f in FAMILIES.items() if f.rope)
    emb = sorted(k for k, f in FAMILIES.items() if not f.rope)
    return ConfigError(f"patch supports the model types {rope} (RoPE and embedding) and {emb} (embedding); "
                       f"got model_type {model_type!r} ({type(model).__name__})")


def _embedding_plan(model: Any, family: Family) -> tuple[Any, float]:
    """HF's input embedding (an ``nn.Embedding``) and its row multiplier, checked to be what ``family`` says."""
    emb: Any = model.get_input_embeddings()
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


def _with_global(fn: Any, name: str, value: Any) -> Any:
    """A copy of the function ``fn`` whose innermost function (below ``functools.wraps`` decorators,
    ``__wrapped__``) reads the global ``name`` as ``value``; every decorator layer is copied with its
    closure pointing at the copy below it. None when a layer does not hold the one below in its
    closure (a decorator this cannot copy) or the innermost code does not read ``name``. The globals
    are a copy made now: a later change to the modeling module's globals is not seen through it, and
    a pickled patched model loads with its class's forwards (HF's RoPE; unpatch, save, patch again)."""
    inner = getattr(fn, "__wrapped__", None)
    if inner is None:
        if not isinstance(fn, types.FunctionType) or name not in fn.__code__.co_names:
            return None
        scope = dict(fn.__globals__)
        scope[name] = value
        new = types.FunctionType(fn.__code__, scope, fn.__name__, fn.__defaults__, fn.__closure__)
    else:
        below = _with_global(inner, name, value)
        cells = fn.__closure__ or ()
        if below is None or not isinstance(fn, types.FunctionType) or \
                sum(c.cell_contents is inner for c in cells) != 1:
            return None
        closure = tuple(types.CellType(below) if c.cell_contents is inner else c for c in cells)
        new = types.FunctionType(fn.__code__, fn.__globals__, fn.__name__, fn.__defaults__, closure)
        new.__wrapped__ = below                                   # type: ignore[attr-defined]
    new.__kwdefaults__ = fn.__kwdefaults__
    new.__qualname__, new.__doc__, new.__module__ = fn.__qualname__, fn.__doc__, fn.__module__
    return new


def _set_module(model: nn.Module, name: str, module: nn.Module) -> None:
    parent, _, leaf = name.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, leaf, module)


def patch(model: Any, *, rope: bool = True, embedding: bool = True, angles: str = "hf") -> PatchReport:
    """Put tokenpos's RoPE op and token embedding inside a loaded HF ``model``, in place.

    Args:
        model: a ``transformers`` model of a family in :data:`FAMILIES` (bare or with a head).
        rope: replace the family's RoPE function (families with RoPE).
        embedding: replace the input embedding by a ``SharedTokenEmbedding`` over the same weight.
        angles: "hf" (the model's own cos / sin: logits equal HF's to fp32 rounding) or "exact"
            (tokenpos's float64 angles from the config; needs ``rope=True``).

    Returns:
        A :class:`PatchReport`. :func:`unpatch` restores the model.

    Raises:
        ConfigError: an unsupported family (the message names the supported ones and the model
            given), a model already patched, a bad ``angles``, or modules that are not what the
            family's record says. The model is then unchanged.
    """
    config: Any = getattr(model, "config", None)
    model_type: Any = getattr(config, "model_type", None)
    family = FAMILIES.get(model_type) if isinstance(model_type, str) else None
    if family is None or not isinstance(model, nn.Module):
        raise _unsupported(model, model_type)
    hf: Any = model
    if getattr(model, _STATE, None) is not None:
        raise ConfigError(f"this {type(model).__name__} is already patched; call unpatch(model) first")
    if angles not in ANGLES:
        raise ConfigError(f"angles must be one of {list(ANGLES)}, got {angles!r}")
    do_rope = bool(rope) and family.rope is not None
    if angles == "exact" and not do_rope:
        raise ConfigError("angles='exact' replaces the tables the patched RoPE function reads; it needs rope=True "
                          "and a family with RoPE")
    names = {m: n for n, m in model.named_modules()}
    # -- plan (every check before any change) ---------------------------------------------------
    module_name = f"transformers.models.{family.module}.modeling_{family.module}"
    rotaries: list[str] = []
    forwards: dict[nn.Module, Any] = {}                  # attention module -> its forward with tokenpos's RoPE
    layers = 0
    if do_rope:
        importlib.import_module(module_name)
        rotaries = [n for m, n in names.items() if type(m).__name__ == family.rotary_class
                    and type(m).__module__ == module_name]
        attention = [m for m in names if type(m).__module__ == module_name and type(m).__name__.endswith("Attention")
                     and "Vision" not in type(m).__name__]
        layers = sum(1 for m in attention if getattr(m, "use_rope", True))
        if not rotaries or not layers:
            raise ConfigError(f"patch found no {family.rotary_class} or attention module of {module_name} in this "
                              f"{type(model).__name__}; expected the family's own modules")
        by_class: dict[type, Any] = {}
        for m in attention:
            cls = type(m)
            if cls not in by_class:
                by_class[cls] = _with_global(cls.forward, family.function, REPLACEMENTS[str(family.rope)])
            if by_class[cls] is None or "forward" in vars(m):
                raise ConfigError(f"patch cannot give {names[m]} ({cls.__name__}) tokenpos's RoPE: expected its "
                                  f"class's forward, calling {family.function} of {module_name}"
                                  + ("; it has a forward of its own (hooks?)" if "forward" in vars(m) else ""))
            forwards[m] = by_class[cls]
    emb_plan = _embedding_plan(model, family) if embedding else None
    exact: dict[str, ExactAngles] = {}
    if angles == "exact":
        text = config.get_text_config() if hasattr(config, "get_text_config") else config
        cfg = config if family.angles == "mrope" else text
        for n in rotaries:
            buffers = list(model.get_submodule(n).buffers())
            exact[n] = _exact_rotary(family, cfg, buffers[0].device if buffers else torch.device("cpu"))
    # -- apply ------------------------------------------------------------------------------------
    state: dict[str, Any] = {"rope": [], "rotary": {}, "embedding": None}
    if do_rope:
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
                                                     displaced=emb, scale_kind=family.embed_scale,
                                                     config=model.config))
    object.__setattr__(model, _STATE, state)
    return PatchReport(model_type=model_type, rope_function=f"{module_name}.{family.function}" if do_rope else None,
                       rope_layers=layers, angles=angles if do_rope else None, rotary_modules=tuple(exact),
                       embedding=names[emb_plan[0]] if emb_plan is not None else None, embedding_scale=scale)


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
    object.__delattr__(model, _STATE)
