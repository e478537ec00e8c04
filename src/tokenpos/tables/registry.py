"""The positional-scheme registry: one entry per scheme, read by both backends.

Shapes: D d_model, H num_heads, Dh = D // H head dim, F = Dh / 2 rotated pairs, P max_seq_len.

Each :class:`SchemeEntry` names a scheme once: its ``name`` (the class attribute ``name``, which is also
its ``TransformerEmbedding(positional=...)`` shortcut), its ``kind``, its NumPy and torch classes as
import strings (``"tokenpos.numpy.rotary:RotaryEmbedding"``: resolved with importlib only when a scheme
is built, so this module imports no backend and listing the names needs none), whether the shortcut
needs ``num_heads``, a small function from the layer's :class:`ShortcutContext` to the constructor's
arguments, and the factory kwargs the constructors take. Both backends' ``build_shortcut`` call
:func:`build_scheme`; ``tables.checks.embedding`` derives ``POSITIONAL_SHORTCUTS`` and
``HEADED_SHORTCUTS`` from :data:`SCHEMES`.

The shortcuts and their defaults (every other setting: build the scheme object and pass it):

============  ========  ===============================================================================
shortcut      kind      built as
============  ========  ===============================================================================
alibi         bias      ``ALiBi(H)`` (the paper's slopes)
fire          bias      ``FIRE(H, init_L=P)`` (width 32)
kerple        bias      ``KERPLE(H)`` (the log kernel)
learned       additive  ``LearnedPositionalEmbedding(P, D, init, std, padding_idx)`` (the layer's
                        init/std; RoBERTa's padding position with ``position_ids="padding"``)
mrope         rotary    ``MRotaryEmbedding(Dh, mrope_section=mrope_section_for(Dh), max_seq_len=P)``:
                        Qwen2-VL's layout and proportions, [t, h, w] = [F - 2 * (3F // 8), 3F // 8,
                        3F // 8] ([16, 24, 24] for Dh = 128, as Qwen2-VL / Qwen2.5-VL); base 10000
                        (the class default, as "rope"; the Qwen models use 1e6: pass the object)
none          none      ``NoPositionalEncoding()`` (NoPE)
rope          rotary    ``RotaryEmbedding(Dh, max_seq_len=P)`` (base 10000, half layout, all of Dh)
rope2d        rotary    ``RotaryEmbedding2D(Dh)`` (Pixtral's axial layout, base 10000; Dh % 4 == 0,
                        else ConfigError); forward needs (row, col) positions in attention
sincos2d      additive  ``SinCos2DPositionalEncoding(s, s, D)`` with s * s == P: a square patch grid
                        (no CLS row; D % 4 == 0). P not a perfect square: ConfigError naming the
                        object to pass instead (``SinCos2DPositionalEncoding(height, width, D)``)
sinusoidal    additive  ``SinusoidalPositionalEncoding(P, D)`` (base 10000, interleaved)
t5            bias      ``T5RelativePositionBias(H, init, std)`` (bidirectional, 32 buckets,
                        max_distance 128)
xpos          rotary    ``XPosRotaryEmbedding(Dh)`` (base 10000, scale_base 512, interleaved, the
                        scale's center at L // 2 of each call)
============  ========  ===============================================================================

Additive shortcuts are added to the token rows, so they are built with the layer's D; rotary and bias
shortcuts act in attention and use Dh = D // H or H.

How to add a scheme (the files, what goes in each, a worked example, and the tests that find it): docs/CONTRIBUTING.md.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from math import isqrt
from typing import Any

from tokenpos.tables.errors import ConfigError

SCHEME_KINDS = ("additive", "bias", "none", "rotary")
BACKENDS = ("numpy", "torch")
FACTORY_KWARGS = ("device", "dtype", "rng")     # what a backend may pass to build_scheme (device: torch only)


@dataclass(frozen=True)
class ShortcutContext:
    """What a shortcut may read: the layer's settings (checked by ``tables.checks.embedding``).

    ``num_heads`` is None when the layer was given none (allowed only for shortcuts without heads);
    ``position_padding_idx`` is RoBERTa's padding position (``position_ids="padding"``), else None.
    """

    d_model: int
    max_seq_len: int
    num_heads: int | None = None
    init: str = "normal"
    std: float = 0.02
    position_padding_idx: int | None = None


@dataclass(frozen=True)
class SchemeEntry:
    """One positional scheme.

    Attributes:
        name: the class attribute ``name`` of both classes, and the shortcut string.
        kind: "additive", "rotary", "bias" or "none" (both classes' ``kind``).
        numpy_class, torch_class: ``"module:Class"`` import strings.
        needs_heads: the shortcut reads ``num_heads`` (H, or Dh = D // H).
        args: context -> the constructor's keyword arguments (backend-neutral plain values).
        factory: the factory kwargs the constructors take from the layer (of ``FACTORY_KWARGS``;
            "device" reaches the torch class only, as NumPy layers have none).
    """

    name: str
    kind: str
    numpy_class: str
    torch_class: str
    needs_heads: bool
    args: Callable[[ShortcutContext], dict[str, Any]]
    factory: tuple[str, ...]

    def class_path(self, backend: str) -> str:
        """The import string of ``backend``'s class."""
        if backend not in BACKENDS:
            raise ConfigError(f"backend must be one of {BACKENDS}, got {backend!r}")
        return self.numpy_class if backend == "numpy" else self.torch_class


# ----------------------------------------------------------------------------------------------
# Messages (both backends raise these texts)
# ----------------------------------------------------------------------------------------------


def positional_choice_message(value: Any) -> str:
    """``positional must be one of 'alibi', ...; got 'x'``: every registered shortcut, the same text in
    both backends (a NumPy and a torch layer given the same bad value say the same thing)."""
    listed = ", ".join(repr(c) for c in SHORTCUTS)
    shown = repr(value) if isinstance(value, str) else f"{value!r} ({type(value).__name__})"
    return (f"positional must be one of {listed}, None, or a positional-scheme object of the layer's backend "
            f"(class attributes kind in {SCHEME_KINDS} and name); got {shown}")


def needs_heads_message(name: str, d_model: int) -> str:
    """A headed shortcut given no num_heads."""
    return f"positional={name!r} needs num_heads= (a positive divisor of d_model={d_model}); got None"


# ----------------------------------------------------------------------------------------------
# Shortcut defaults (context -> constructor kwargs); documented in the module docstring's table
# ----------------------------------------------------------------------------------------------


def _heads(c: ShortcutContext) -> int:
    """H, checked again here for direct callers of :func:`build_scheme` (None never gets here)."""
    h = c.num_heads
    if h is None or h < 1 or c.d_model % h:
        raise ConfigError(f"num_heads must divide d_model={c.d_model} (head_dim = d_model // num_heads); got {h}")
    return h


def _head_dim(c: ShortcutContext) -> int:
    return c.d_model // _heads(c)


def mrope_section_for(head_dim: int) -> list[int]:
    """Qwen2-VL's M-RoPE split of F = Dh / 2 frequencies, [t, h, w] = [F - 2 * (3F // 8), 3F // 8, 3F // 8]
    (t : h : w = 2 : 3 : 3; [16, 24, 24] for Dh = 128, the Qwen2-VL / Qwen2.5-VL config)."""
    f = head_dim // 2
    hw = 3 * f // 8
    return [f - 2 * hw, hw, hw]


def square_grid_side(max_seq_len: int, d_model: int) -> int:
    """s with s * s == max_seq_len (the sincos2d shortcut's patch grid); else ConfigError."""
    s = isqrt(max_seq_len)
    if s * s != max_seq_len:
        raise ConfigError(
            f"positional='sincos2d' lays max_seq_len patches on a square grid, so max_seq_len must be a perfect "
            f"square (e.g. 196 = 14 x 14); got {max_seq_len}. For another grid pass "
            f"positional=SinCos2DPositionalEncoding(height, width, {d_model}) of the layer's backend")
    return s


def _learned(c: ShortcutContext) -> dict[str, Any]:
    return {"max_seq_len": c.max_seq_len, "d_model": c.d_model, "init": c.init, "std": c.std,
            "padding_idx": c.position_padding_idx}


def _sinusoidal(c: ShortcutContext) -> dict[str, Any]:
    return {"max_seq_len": c.max_seq_len, "d_model": c.d_model}


def _sincos2d(c: ShortcutContext) -> dict[str, Any]:
    s = square_grid_side(c.max_seq_len, c.d_model)
    return {"height": s, "width": s, "d_model": c.d_model}


def _rope(c: ShortcutContext) -> dict[str, Any]:
    return {"head_dim": _head_dim(c), "max_seq_len": c.max_seq_len}


def _mrope(c: ShortcutContext) -> dict[str, Any]:
    dh = _head_dim(c)
    return {"head_dim": dh, "mrope_section": mrope_section_for(dh), "max_seq_len": c.max_seq_len}


def _head_dim_only(c: ShortcutContext) -> dict[str, Any]:
    return {"head_dim": _head_dim(c)}


def _heads_only(c: ShortcutContext) -> dict[str, Any]:
    return {"num_heads": _heads(c)}


def _t5(c: ShortcutContext) -> dict[str, Any]:
    return {"num_heads": _heads(c), "init": c.init, "std": c.std}


def _fire(c: ShortcutContext) -> dict[str, Any]:
    return {"num_heads": _heads(c), "init_L": float(c.max_seq_len)}


def _nothing(c: ShortcutContext) -> dict[str, Any]:
    return {}


def _entry(name: str, kind: str, cls: str, needs_heads: bool, args: Callable[[ShortcutContext], dict[str, Any]],
           factory: tuple[str, ...]) -> SchemeEntry:
    """An entry whose classes live in files of the same name in both backends (``cls`` = "module:Class")."""
    return SchemeEntry(name, kind, f"tokenpos.numpy.{cls}", f"tokenpos.torch.{cls}", needs_heads, args, factory)


SCHEMES: dict[str, SchemeEntry] = {e.name: e for e in (
    _entry("alibi", "bias", "alibi:ALiBi", True, _heads_only, ("device", "dtype")),
    _entry("fire", "bias", "fire:FIRE", True, _fire, ("device", "dtype", "rng")),
    _entry("kerple", "bias", "kerple:KERPLE", True, _heads_only, ("device", "dtype", "rng")),
    _entry("learned", "additive", "learned:LearnedPositionalEmbedding", False, _learned, ("device", "dtype", "rng")),
    _entry("mrope", "rotary", "mrope:MRotaryEmbedding", True, _mrope, ("device",)),
    _entry("none", "none", "schemes:NoPositionalEncoding", False, _nothing, ()),
    _entry("rope", "rotary", "rotary:RotaryEmbedding", True, _rope, ("device",)),
    _entry("rope2d", "rotary", "rope2d:RotaryEmbedding2D", True, _head_dim_only, ("device",)),
    _entry("sincos2d", "additive", "rope2d:SinCos2DPositionalEncoding", False, _sincos2d, ("device", "dtype")),
    _entry("sinusoidal", "additive", "sinusoidal:SinusoidalPositionalEncoding", False, _sinusoidal,
           ("device", "dtype")),
    _entry("t5", "bias", "t5_bias:T5RelativePositionBias", True, _t5, ("device", "dtype", "rng")),
    _entry("xpos", "rotary", "xpos:XPosRotaryEmbedding", True, _head_dim_only, ("device",)),
)}
SHORTCUTS = tuple(sorted(SCHEMES))                      # every scheme's name, also its shortcut string
HEADED = tuple(n for n in SHORTCUTS if SCHEMES[n].needs_heads)


# ----------------------------------------------------------------------------------------------
# Building
# ----------------------------------------------------------------------------------------------


def scheme_entry(name: Any) -> SchemeEntry:
    """The entry of shortcut ``name``; anything else: ConfigError listing the shortcuts."""
    entry = SCHEMES.get(name) if isinstance(name, str) else None
    if entry is None:
        raise ConfigError(positional_choice_message(name))
    return entry


def scheme_class(name: str, backend: str) -> type:
    """``backend``'s class of scheme ``name`` (imports that backend's module)."""
    module, _, cls = scheme_entry(name).class_path(backend).partition(":")
    return getattr(importlib.import_module(module), cls)


def class_names(backend: str) -> list[str]:
    """The class names of every scheme's ``backend`` class, in the registry's order: what a backend's
    package exports by itself (:func:`export`)."""
    return [entry.class_path(backend).partition(":")[2] for entry in SCHEMES.values()]


def export(backend: str, package: str, name: str) -> type:
    """The module ``__getattr__`` of a backend's package (PEP 562): the ``backend`` class named ``name`` of a
    registered scheme that the package does not import by name (a scheme added since: docs/CONTRIBUTING.md),
    imported on first use, so a new scheme needs no line in the package; AttributeError for anything else."""
    for entry in SCHEMES.values():
        module, _, cls = entry.class_path(backend).partition(":")
        if cls == name:
            return getattr(importlib.import_module(module), cls)  # type: ignore[no-any-return]
    raise AttributeError(f"module {package!r} has no attribute {name!r}")


def build_scheme(name: str, backend: str, context: ShortcutContext, **factory: Any) -> Any:
    """The scheme object shortcut ``name`` stands for in ``backend`` ("numpy" | "torch"), with its defaults.

    Args:
        context: the layer's settings.
        factory: the backend's factory kwargs (of ``FACTORY_KWARGS``: NumPy passes dtype and rng, torch also
            device); each constructor receives those its entry lists.

    Raises:
        ConfigError: an unknown name (the message lists the shortcuts), a headed shortcut without
            num_heads, or a default that does not fit the context (e.g. sincos2d with a max_seq_len
            that is not a perfect square; the constructors' own checks).
    """
    entry = scheme_entry(name)
    unknown = sorted(set(factory) - set(FACTORY_KWARGS))
    if unknown:
        raise TypeError(f"build_scheme got unexpected factory kwargs {unknown}; expected some of {FACTORY_KWARGS}")
    if entry.needs_heads and context.num_heads is None:
        raise ConfigError(needs_heads_message(name, context.d_model))
    cls = scheme_class(name, backend)
    kwargs = {k: v for k, v in factory.items() if k in entry.factory}
    return cls(**entry.args(context), **kwargs)
