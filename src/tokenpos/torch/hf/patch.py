"""``patch(model)``: tokenpos's RoPE op and token embedding inside a loaded Hugging Face model.

What a model needs is recognised from the model itself (:func:`tokenpos.torch.hf.families.recognise`:
its attention's RoPE helper is HF's code of one of a few calling conventions, its rotary tables have
the layout that helper reads); this module holds the replacements, which follow those conventions exactly:

- RoPE: the module-level function the family's attention calls (``apply_rotary_pos_emb`` /
  ``apply_rotary_emb``) becomes a tokenpos one that rotates q and k in one ``tokenpos::rope_qk``
  pass (GPT-J rotates one tensor per call: ``tokenpos::rope``), through
  :func:`tokenpos.torch.ops.entry.rotate_qk`. HF's cos / sin (B, L, R) hold duplicated halves [c, c];
  the op reads the first half (B, L, F), F = R/2, as float32 (float64 for a float64 model: the op
  never takes low-precision tables). The function is replaced for THIS model only: each of its
  attention modules gets its own ``forward``, the class's code (decorators included) whose innermost
  code reads that one name under another, ``_tokenpos_<replacement>``, bound in the modeling module to
  tokenpos's function; every other name it reads from the live module (:func:`_with_global`), so a
  later swap of e.g. ``eager_attention_forward`` reaches the patched model as it reaches others. HF's
  functions in the modeling module are never changed, so another model of the family keeps them, and
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

import copy
import dis
import types
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from tokenpos.tables.errors import ConfigError
from tokenpos.torch.hf.embedding import FollowsDisplaced, SharedTokenEmbedding, hf_embedding_scale, resize_patched
from tokenpos.torch.hf.families import Family, global_reads, innermost, probe_rotary, recognise
from tokenpos.torch.hf.loss import LossPlan, apply_loss, loss_plan, remove_loss
from tokenpos.torch.hf.per_layer import apply_per_layer, per_layer_plan, restore_per_layer
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


# ----------------------------------------------------------------------------------------------
# The replacements: HF's RoPE functions, same arguments, same results (to fp32 rounding)
# ----------------------------------------------------------------------------------------------


def _op_tables(cos: torch.Tensor, sin: torch.Tensor, F: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos / sin (..., >= F) -> their first F entries (..., F), contiguous, float32 or float64."""
    c, s = cos[..., :F], sin[..., :F]
    if c.dtype not in (torch.float32, torch.float64):
        c, s = c.float(), s.float()
    return c.contiguous(), s.contiguous()


def _check_unsqueeze(unsqueeze_dim: int) -> None:
    if unsqueeze_dim not in (1, 2):
        raise ConfigError(f"apply_rotary_pos_emb patched by tokenpos takes unsqueeze_dim 1 (q (B, H, L, Dh)) or 2 "
                          f"(q (B, L, H, Dh)); got {unsqueeze_dim!r}")


def _qk(q: torch.Tensor, k: torch.Tensor, c: torch.Tensor, s: torch.Tensor, interleaved: bool,
        unsqueeze_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """q (B, H, L, Dh), k (B, Hk, L, Dh) (``unsqueeze_dim=2``: (B, L, H, Dh)), c / s (B, L, F) -> (q', k')."""
    _check_unsqueeze(unsqueeze_dim)
    if unsqueeze_dim == 2:
        oq, ok = rotate_qk(q.transpose(1, 2), k.transpose(1, 2), c, s, interleaved)
        return oq.transpose(1, 2), ok.transpose(1, 2)
    return rotate_qk(q, k, c, s, interleaved)


def rope_qk_half(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                 unsqueeze_dim: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """HF's ``apply_rotary_pos_emb``: q (B, H, L, Dh), k (B, Hk, L, Dh) (``unsqueeze_dim=2``: (B, L, H, Dh)),
    cos / sin (B, L, R) = [c, c], R <= Dh (the rest passes) -> (q', k') in one ``tokenpos::rope_qk`` pass."""
    return _qk(q, k, *_op_tables(cos, sin, cos.shape[-1] // 2), False, unsqueeze_dim)


def rope_glm(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
             unsqueeze_dim: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """GLM's ``apply_rotary_pos_emb``: cos / sin (B, L, R) = [c, c] read as c on interleaved pairs of the
    first R entries of q (B, H, L, Dh), k (the rest passes) -> (q', k')."""
    return _qk(q, k, *_op_tables(cos, sin, cos.shape[-1] // 2), True, unsqueeze_dim)


def rope_cohere(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                unsqueeze_dim: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """Cohere's ``apply_rotary_pos_emb``: cos / sin (B, L, Dh) = [c0, c0, c1, c1, ...], interleaved pairs,
    float32 math, results in q's dtype -> (q', k')."""
    return _qk(q, k, *_op_tables(cos[..., 0::2], sin[..., 0::2], cos.shape[-1] // 2), True, unsqueeze_dim)


def rope_x(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, unsqueeze_dim: int = 1) -> torch.Tensor:
    """Gemma 4's ``apply_rotary_pos_emb`` (one tensor per call): x (B, H, L, Dh) (``unsqueeze_dim=2``:
    (B, L, H, Dh)), cos / sin (B, L, R) = [c, c] -> x' in one ``tokenpos::rope`` pass."""
    _check_unsqueeze(unsqueeze_dim)
    c, s = _op_tables(cos, sin, cos.shape[-1] // 2)
    if unsqueeze_dim == 2:
        return rotate(x.transpose(1, 2), c, s, False).transpose(1, 2)
    return rotate(x, c, s, False)


def rope_deinterleave(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                      position_ids: Any = None, unsqueeze_dim: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """DeepSeek's ``apply_rotary_pos_emb_interleave``: the even then the odd entries of q (B, H, L, R), k
    (B, Hk, L, R) rotated as halves by cos / sin (B, L, R) = [c, c] -> (q', k') (position_ids unused, as in HF)."""
    qd = torch.cat([q[..., 0::2], q[..., 1::2]], dim=-1)
    kd = torch.cat([k[..., 0::2], k[..., 1::2]], dim=-1)
    return rope_qk_half(qd, kd, cos, sin, unsqueeze_dim)


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


REPLACEMENTS = {"qk": rope_qk_half, "glm": rope_glm, "cohere": rope_cohere, "x": rope_x,
                "deinterleave": rope_deinterleave, "gptj": rope_gptj, "llama4": rope_llama4}
# the tables each rope kind reads: ExactAngles hands them in that form
TABLE_FORMS = {"qk": "halves", "glm": "halves", "x": "halves", "deinterleave": "halves", "cohere": "pairs",
               "gptj": "gptj", "llama4": "llama4"}


class ExactAngles(FollowsDisplaced):
    """An HF rotary module rebuilt from tokenpos's float64 angles (``patch(angles="exact")``).

    ``forward(x, position_ids, layer_type=None)`` returns the tables in the form ``form`` (the patched
    RoPE function reads them so, :data:`TABLE_FORMS`): "halves": cos, sin (B, L, R) = [c, c]; "pairs":
    (B, L, R) = [c0, c0, c1, c1, ...]; "gptj": sin, cos (B, L, F); "llama4": complex (B, L, F).
    position_ids (B, L), or (3, B, L) for M-RoPE. Tables are float32 (float64 for a float64 ``x``).
    """

    def __init__(self, rotary: dict[str, nn.Module], form: str) -> None:
        super().__init__()
        self.rotary = nn.ModuleDict(rotary)
        self.form = form

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor, layer_type: str | None = None) -> Any:
        from tokenpos.torch.mrope import MRotaryEmbedding

        rot: Any = self.rotary[layer_type or "default"]
        if isinstance(rot, MRotaryEmbedding):
            pos = position_ids.expand(3, -1, -1) if position_ids.ndim == 2 else position_ids
            cos, sin = rot.cos_sin(pos)                               # (B, L, Dh) float64, [c, c]
            c, s = cos[..., : cos.shape[-1] // 2], sin[..., : sin.shape[-1] // 2]
        else:
            cos, sin = rot.cos_sin_positions(position_ids)            # (B, L, R) float64, in the layout
            F = cos.shape[-1] // 2
            c, s = (cos[..., 0::2], sin[..., 0::2]) if rot.interleaved else (cos[..., :F], sin[..., :F])
        dt = torch.float64 if x.dtype == torch.float64 else torch.float32
        c, s = c.to(dt), s.to(dt)                                     # (B, L, F)
        if self.form == "gptj":
            return s.contiguous(), c.contiguous()
        if self.form == "llama4":
            return torch.complex(c, s)
        if self.form == "pairs":
            return c.repeat_interleave(2, dim=-1), s.repeat_interleave(2, dim=-1)
        return torch.cat((c, c), dim=-1), torch.cat((s, s), dim=-1)


EXACT_ATOL = 1e-5     # float32 rounding of HF's angles at the probe's positions (< 30 rad): ~2e-6
# rope_parameters keys HF's rotary modules never read, dropped before tokenpos rebuilds the tables (the probe
# then checks the rebuild): Ministral 3's query scale (its attention applies it, HF's code, still running)
# and its copy of max_position_embeddings (HF's scalings read the config's own)
ROTARY_UNREAD = ("llama_4_scaling_beta", "max_position_embeddings")


def _exact_rotary(family: Family, config: Any, hf_rotary: nn.Module, device: torch.device) -> ExactAngles:
    """``hf_rotary`` rebuilt by tokenpos from the config, checked against it at the probe positions
    (:func:`tokenpos.torch.hf.families.probe_rotary`): a config tokenpos reads differently from HF, or
    cannot read, is refused with the reason."""
    from tokenpos.torch.mrope import MRotaryEmbedding
    from tokenpos.torch.rotary import RotaryEmbedding

    forms = {TABLE_FORMS[kind] for _, kind in family.helpers}
    where = f"{type(hf_rotary).__name__} of this {family.model_type!r} model"
    if len(forms) != 1:
        raise ConfigError(f"angles='exact' builds one table form; the RoPE helpers of the {where} read "
                          f"{sorted(forms)}; use angles='hf'")
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    params = getattr(text, "rope_parameters", None)
    if isinstance(params, dict) and set(params) & set(ROTARY_UNREAD):
        text = copy.deepcopy(text)                                # the model's config stays as it is
        text.rope_parameters = {k: v for k, v in params.items() if k not in ROTARY_UNREAD}
    rotary: dict[str, nn.Module]
    try:
        if family.angles == "mrope":
            rotary = {"default": MRotaryEmbedding.from_hf_config(config, device=device)}
        elif family.angles == "layer_types":
            rotary = {t: RotaryEmbedding.from_hf_config(text, layer_type=t, device=device)
                      for t in sorted(set(text.layer_types))}
        else:
            rotary = {"default": RotaryEmbedding.from_hf_config(text, device=device)}
    except ConfigError as err:
        raise ConfigError(f"angles='exact' cannot rebuild the {where} from its config: {err}; angles='hf' "
                          f"patches it with the model's own tables") from err
    new = ExactAngles(rotary, forms.pop())
    for kind, pos, want in probe_rotary(hf_rotary, config):
        got = new(torch.zeros(1, dtype=torch.float32, device=device), pos, kind)
        pairs = zip(got, want, strict=True) if isinstance(want, tuple) else [(got, want)]
        for a, b in pairs:
            if a.shape != b.shape or not torch.allclose(a, b.to(a.dtype), rtol=0.0, atol=EXACT_ATOL):
                what = (f"max difference {(a - b.to(a.dtype)).abs().max().item():.3g}" if a.shape == b.shape
                        else f"shapes {tuple(a.shape)} vs HF's {tuple(b.shape)}")
                raise ConfigError(f"angles='exact' rebuilds the {where} (layer type {kind!r}) differently from HF: "
                                  f"{what} at positions 1..8 (expected <= {EXACT_ATOL}); the config holds a setting "
                                  f"tokenpos's RotaryEmbedding.from_hf_config does not rebuild; use angles='hf'")
    return new


# ----------------------------------------------------------------------------------------------
# patch / unpatch
# ----------------------------------------------------------------------------------------------


def _embedding_plan(model: Any, family: Family) -> tuple[Any, float]:
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


def _alias(value: Any) -> str:
    """The global name under which a patched forward reads the tokenpos function ``value``."""
    return f"_tokenpos_{value.__name__}"


def _renamed(code: types.CodeType, renames: dict[str, str]) -> types.CodeType | None:
    """``code`` (and the code nested in it) loading the global ``new`` where it loaded ``old``
    (``renames``: old -> new); None when an old name is also read otherwise (an attribute, an import)."""
    for ins in dis.get_instructions(code):
        if ins.opcode in dis.hasname and ins.argval in renames and ins.opname != "LOAD_GLOBAL":
            return None
    consts: list[Any] = []
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            c = _renamed(c, renames)
            if c is None:
                return None
        consts.append(c)
    return code.replace(co_names=tuple(renames.get(n, n) for n in code.co_names), co_consts=tuple(consts))


def _with_global(fn: Any, values: dict[str, Any]) -> Any:
    """A copy of the function ``fn`` whose innermost function (below ``functools.wraps`` decorators,
    ``__wrapped__``) reads each global ``name`` of ``values`` as :func:`_alias` of its value; every
    decorator layer is copied with its closure pointing at the copy below it. None when a layer does
    not hold the one below in its closure (a decorator this cannot copy), the innermost code reads
    none of the names, or reads one otherwise than as a global.

    The copy runs with the modeling module's own globals (the same dict, not a copy), so it sees every
    later change of them, as the class's forward does, but for the replaced names: those it reads under
    the aliases, which the caller binds in the module (:func:`_bind_aliases`) when it applies the patch;
    HF's functions stay in place for every other model. (Not a copied globals dict: it froze every name
    at patch time. Not a dict subclass forwarding misses to the module: CPython takes a non-dict
    globals' slow path, but ``torch.compile`` reads globals with ``in`` and C-level lookups.) A pickled
    patched model loads with its class's forwards (HF's RoPE; unpatch, save, patch again)."""
    inner = getattr(fn, "__wrapped__", None)
    if inner is None:
        if not isinstance(fn, types.FunctionType) or not set(values) & global_reads(fn.__code__):
            return None
        code = _renamed(fn.__code__, {name: _alias(v) for name, v in values.items()})
        if code is None:
            return None
        new = types.FunctionType(code, fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)
    else:
        below = _with_global(inner, values)
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


def _bind_aliases(fn: Any, values: dict[str, Any]) -> None:
    """Bind :func:`_alias` of each value in the globals of ``fn``'s innermost function (the modeling
    module): new private names only, the same tokenpos function for every model that reads them."""
    scope = innermost(fn).__globals__
    for value in values.values():
        scope[_alias(value)] = value


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
    forwards: dict[nn.Module, Any] = {}                  # attention module -> its forward with tokenpos's RoPE
    layers = 0
    if do_rope:
        attention = [m for m in names if type(m) in family.attention]
        layers = sum(1 for m in attention if getattr(m, "use_rope", True))
        by_class: dict[type, Any] = {}
        for m in attention:
            cls = type(m)
            if cls not in by_class:
                by_class[cls] = _with_global(cls.forward, values)
            if by_class[cls] is None or "forward" in vars(m):
                raise ConfigError(f"patch cannot give {names[m]} ({cls.__name__}) tokenpos's RoPE: expected its "
                                  f"class's forward, calling {sorted(values)} of {module_name}"
                                  + ("; it has a forward of its own (hooks?)" if "forward" in vars(m) else ""))
            forwards[m] = by_class[cls]
    emb_plan = _embedding_plan(model, family) if embedding else None
    table_plan = per_layer_plan(model) if embedding else None          # Gemma 3n / 4 per-layer inputs
    head_plan = loss_plan(model) if loss else None
    exact: dict[str, ExactAngles] = {}
    if angles == "exact":
        for n in rotaries:
            rot = model.get_submodule(n)
            buffers = list(rot.buffers())
            exact[n] = _exact_rotary(family, config, rot, buffers[0].device if buffers else torch.device("cpu"))
    # -- apply ------------------------------------------------------------------------------------
    state: dict[str, Any] = {"rope": [], "rotary": {}, "embedding": None}
    if do_rope:
        for fn in dict.fromkeys(forwards.values()):
            _bind_aliases(fn, values)
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
    _apply_head_and_resize(model, head_plan, emb_plan is not None)
    object.__setattr__(model, _STATE, state)
    function = ", ".join(f"{module_name}.{n}" for n in sorted(values)) if do_rope else None
    return PatchReport(model_type=model_type, rope_function=function,
                       rope_layers=layers, angles=angles if do_rope else None, rotary_modules=tuple(exact),
                       embedding=names[emb_plan[0]] if emb_plan is not None else None, embedding_scale=scale,
                       loss=head_plan.head if head_plan is not None else None,
                       per_layer=table_plan[0] if table_plan is not None else None)


def _apply_head_and_resize(model: Any, head_plan: LossPlan | None, embedding: bool) -> None:
    """The loss mode (``loss=True``), and HF's ``resize_token_embeddings`` made to work on the tokenpos embedding."""
    if head_plan is not None:
        apply_loss(model, head_plan)
    if embedding:
        model.resize_token_embeddings = types.MethodType(resize_patched, model)


def _remove_head_and_resize(model: Any) -> None:
    remove_loss(model)
    if "resize_token_embeddings" in vars(model):
        del model.resize_token_embeddings


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
    _remove_head_and_resize(model)
    object.__delattr__(model, _STATE)
