"""A copy of an attention class's ``forward`` that reads some module globals under other names (``patch``).

``patch`` gives tokenpos's RoPE to ONE model: each of its attention modules gets its own ``forward``, the
class's code (decorators included) whose innermost code reads the replaced helper (``apply_rotary_pos_emb``
...) under another name, ``_tokenpos_<replacement>`` (:func:`with_global`), bound in the modeling module to
tokenpos's function (:func:`bind_aliases`). Every other name it reads from the live module, so a later swap
of e.g. ``eager_attention_forward`` reaches the patched model as it reaches others; HF's functions in the
modeling module are never changed, so another model of the family keeps them, and deleting the instance
``forward`` attributes restores the class's code. (Liger-Kernel swaps the module's function for the whole
process instead; in bf16, where the two rotations round differently, that changes the outputs of every
model of the family.)
"""

from __future__ import annotations

import dis
import types
from typing import Any

from tokenpos.torch.hf.families import global_reads, innermost


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


def with_global(fn: Any, values: dict[str, Any]) -> Any:
    """A copy of the function ``fn`` whose innermost function (below ``functools.wraps`` decorators,
    ``__wrapped__``) reads each global ``name`` of ``values`` as :func:`_alias` of its value; every
    decorator layer is copied with its closure pointing at the copy below it. None when a layer does
    not hold the one below in its closure (a decorator this cannot copy), the innermost code reads
    none of the names, or reads one otherwise than as a global.

    The copy runs with the modeling module's own globals (the same dict, not a copy), so it sees every
    later change of them, as the class's forward does, but for the replaced names: those it reads under
    the aliases, which the caller binds in the module (:func:`bind_aliases`) when it applies the patch;
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
        below = with_global(inner, values)
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


def bind_aliases(fn: Any, values: dict[str, Any]) -> None:
    """Bind :func:`_alias` of each value in the globals of ``fn``'s innermost function (the modeling
    module): new private names only, the same tokenpos function for every model that reads them."""
    scope = innermost(fn).__globals__
    for value in values.values():
        scope[_alias(value)] = value

