"""The layers the guard tests must cover, derived from ``tables.registry`` and the backends' ``__all__``.

A guard table (the cases of a test that must hold every layer: compile, no host sync, backward checks, mixed
dtypes, ...) keeps hand-written cases where a call needs what the registry cannot say, and builds every other
registered scheme from its registry entry with :func:`scheme_kwargs`. A new registry entry is then tested
without editing a list (docs/CONTRIBUTING.md), and ``tests/test_coverage_lists.py`` checks each table against
:func:`public_layers`.

Shapes of the shared context: D = 16 model dim, H = 2 heads, Dh = D // H = 8 head dim, P = 16 positions
(a 4 x 4 patch grid).
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Container, Iterable, Iterator, Mapping
from typing import Any

from tokenpos.tables.registry import BACKENDS, SCHEMES, SHORTCUTS, ShortcutContext, scheme_class

CONTEXT = ShortcutContext(d_model=16, max_seq_len=16, num_heads=2)       # Dh = 8, a 4 x 4 grid
# the base class each backend exports for its layers: a base, not a layer
BASE_CLASSES = {"numpy": "Module", "torch": "TokenposModule"}


def backend_module(backend: str) -> Any:
    """``tokenpos.numpy`` or ``tokenpos.torch``."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    return importlib.import_module(f"tokenpos.{backend}")


def scheme_classes(backend: str, kind: str | None = None) -> dict[str, Any]:
    """Class name -> class of every registered scheme (of ``kind``: "additive", "rotary", "bias", "none") in
    ``backend``, sorted by class name."""
    found = {cls.__name__: cls for cls in (scheme_class(n, backend) for n in SHORTCUTS)
             if kind is None or getattr(cls, "kind", None) == kind}
    return dict(sorted(found.items()))


def scheme_name(class_name: str, backend: str = "numpy") -> str:
    """The registry name of the scheme whose ``backend`` class is called ``class_name`` (KeyError: none is)."""
    for name in SHORTCUTS:
        if scheme_class(name, backend).__name__ == class_name:
            return name
    raise KeyError(f"no registered scheme has a {backend} class called {class_name!r}")


def exported_layers(backend: str) -> dict[str, Any]:
    """Class name -> class of every layer class in ``backend``'s ``__all__`` (a NumPy ``Module`` / a torch
    ``nn.Module``; the base class excluded), each once under its own name (``PositionalEmbedding`` is
    ``LearnedPositionalEmbedding``), sorted."""
    module = backend_module(backend)
    base = getattr(module, BASE_CLASSES[backend])
    root = base if backend == "numpy" else importlib.import_module("torch").nn.Module
    found = {}
    for name in module.__all__:
        obj = getattr(module, name)
        if isinstance(obj, type) and issubclass(obj, root) and obj is not base:
            found[obj.__name__] = obj
    return dict(sorted(found.items()))


def public_layers(backend: str) -> dict[str, Any]:
    """Class name -> class of every public layer of ``backend``: its exported layers and every registered
    scheme class (exported or not: the registry makes it a ``positional=`` shortcut), sorted."""
    return dict(sorted({**exported_layers(backend), **scheme_classes(backend)}.items()))


def scheme_kwargs(class_name: str, context: ShortcutContext = CONTEXT) -> dict[str, Any]:
    """The keyword arguments that build scheme class ``class_name`` (either backend: the entry's arguments are
    plain values) as its shortcut does in a layer of ``context``: the entry's ``args``, and ``seed=0`` for a
    scheme that draws (its entry takes ``rng``), so both backends get the same weights."""
    entry = SCHEMES[scheme_name(class_name)]
    return {**entry.args(context), **({"seed": 0} if "rng" in entry.factory else {})}


def build_scheme_layer(class_name: str, backend: str, context: ShortcutContext = CONTEXT) -> Any:
    """A fresh ``backend`` layer of scheme class ``class_name`` from :func:`scheme_kwargs`."""
    return scheme_classes(backend)[class_name](**scheme_kwargs(class_name, context))


def covered(keys: Iterable[str], prefixes: Mapping[str, str]) -> set[str]:
    """The layers (values of ``prefixes``: case-name prefix -> layer name) that a case of ``keys`` names: a key
    equal to the prefix or starting with prefix + "_" ("rope_default" is a case of "rope"; "rope2d" is not)."""
    keys = list(keys)
    return {layer for prefix, layer in prefixes.items()
            if any(k == prefix or k.startswith(prefix + "_") for k in keys)}


@contextlib.contextmanager
def derived_case(table: str, name: str, hand: Container[str] = ()) -> Iterator[None]:
    """Around building and calling case ``name`` of ``table`` when it is derived from the registry (not one of the
    ``hand``-written cases): an error names the entry and the table where a case with the arguments it needs
    goes, instead of a bare traceback. A hand-written case's errors pass as they are."""
    if name in hand:
        yield
        return
    try:
        yield
    except Exception as err:
        raise AssertionError(
            f"{name}: the case derived from its registry entry fails in {table} ({type(err).__name__}: {err}); "
            f"if it needs arguments or inputs the registry does not give, add a case for it to {table}") from err
