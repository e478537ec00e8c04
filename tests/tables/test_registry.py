"""tables.registry: one entry per positional scheme, the shortcuts' defaults, and build_scheme in both backends."""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import tokenpos.numpy as tpn
from tokenpos.tables.checks.embedding import HEADED_SHORTCUTS, POSITIONAL_SHORTCUTS, SCHEME_KINDS, is_scheme
from tokenpos.tables.errors import ConfigError
from tokenpos.tables.registry import (
    FACTORY_KWARGS,
    SCHEMES,
    ShortcutContext,
    build_scheme,
    mrope_section_for,
    positional_choice_message,
    scheme_class,
)

torch = pytest.importorskip("torch")
tpt = pytest.importorskip("tokenpos.torch")

BACKENDS = ("numpy", "torch")
CONTEXT = ShortcutContext(d_model=16, max_seq_len=16, num_heads=2)       # Dh = 8, a 4 x 4 grid


def factory(backend: str, seed: int = 0) -> dict:
    """What each backend's build_shortcut passes."""
    if backend == "numpy":
        return {"dtype": np.float32, "rng": np.random.default_rng(seed)}
    return {"device": None, "dtype": None, "rng": np.random.default_rng(seed)}


def scheme_classes(package) -> list[type]:
    """Every class defined in a module of ``package`` with class attributes ``kind`` and ``name``."""
    found = {}                                     # class -> None: aliases (PositionalEmbedding) count once
    for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
        module = importlib.import_module(info.name)
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ == module.__name__ and getattr(cls, "kind", None) in SCHEME_KINDS \
                    and isinstance(getattr(cls, "name", None), str):
                found[cls] = None
    return list(found)


# ----------------------------------------------------------------------------------------------
# The entries
# ----------------------------------------------------------------------------------------------


# the schemes registered when this test was written, and whether their shortcut needs num_heads: a new entry adds to
# them (and is checked with them), none of these goes away or changes its heads unnoticed
KNOWN_HEADED = {"alibi": True, "fire": True, "kerple": True, "learned": False, "mrope": True, "none": False,
                "rope": True, "rope2d": True, "sincos2d": False, "sinusoidal": False, "t5": True, "xpos": True}


def test_the_registered_names_are_the_shortcuts():
    assert POSITIONAL_SHORTCUTS == tuple(sorted(SCHEMES))
    assert HEADED_SHORTCUTS == tuple(n for n in sorted(SCHEMES) if SCHEMES[n].needs_heads)
    assert set(KNOWN_HEADED) <= set(SCHEMES), sorted(set(KNOWN_HEADED) - set(SCHEMES))
    assert {n: SCHEMES[n].needs_heads for n in KNOWN_HEADED} == KNOWN_HEADED


@pytest.mark.parametrize("name", sorted(SCHEMES))
def test_each_entry_is_well_formed(name):
    e = SCHEMES[name]
    assert e.name == name and e.kind in SCHEME_KINDS
    assert e.numpy_class.startswith("tokenpos.numpy.") and e.torch_class.startswith("tokenpos.torch.")
    assert e.numpy_class.count(":") == e.torch_class.count(":") == 1
    assert set(e.factory) <= set(FACTORY_KWARGS)


def test_listing_the_names_imports_no_backend():
    code = ("import sys, tokenpos.tables.registry as r, tokenpos.tables.checks.embedding as a; "
            "assert len(a.POSITIONAL_SHORTCUTS) == len(r.SCHEMES); "
            "bad = [m for m in sys.modules if m.split('.')[0] == 'torch' or m.startswith(('tokenpos.numpy', "
            "'tokenpos.torch'))]; assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("package", [tpn, tpt], ids=BACKENDS)
def test_every_scheme_class_of_a_backend_has_an_entry(package):
    backend = package.__name__.split(".")[-1]
    classes = scheme_classes(package)
    assert {c.name for c in classes} >= {"learned", "rope", "alibi", "none"}     # the walk found the schemes
    for cls in classes:
        assert cls.name in SCHEMES, f"{cls.__module__}.{cls.__qualname__} (name {cls.name!r}) has no registry entry"
        registered = scheme_class(cls.name, backend)
        assert issubclass(cls, registered), f"{cls.__qualname__} is not the registered {registered.__qualname__}"


def _name_read(node: ast.expr) -> bool:
    """``x.name`` or ``getattr(x, "name", ...)``: a scheme object's name."""
    if isinstance(node, ast.Attribute):
        return node.attr == "name"
    return isinstance(node, ast.Call) and getattr(node.func, "id", None) == "getattr" and len(node.args) >= 2 \
        and isinstance(node.args[1], ast.Constant) and node.args[1].value == "name"


def _scheme_literals(node: ast.expr) -> set[str]:
    """The registered scheme names a compared operand spells out ("xpos", or ("rope", "xpos"))."""
    items = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else [node]
    return {e.value for e in items if isinstance(e, ast.Constant) and e.value in SCHEMES}


@pytest.mark.slow  # parses every source file
def test_no_code_branches_on_a_scheme_name():
    """What a layer needs from its caller is a class attribute that says it (``kind``, ``packs``,
    ``rotates_qk_together``), never its ``name`` compared with a registered name (the xPos special case of
    the attention functions was one): a new scheme with the same property then needs no edit elsewhere.
    Only the registry spells scheme names."""
    src = Path(tpn.__file__).resolve().parents[1]
    found = []
    for path in sorted(src.rglob("*.py")):
        if path.name == "registry.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Compare):
                operands = [node.left, *node.comparators]
                if any(map(_name_read, operands)) and set().union(*map(_scheme_literals, operands)):
                    found.append(f"{path.relative_to(src)}:{node.lineno}")
    assert not found, f"code that branches on a scheme's name (use a class attribute): {found}"


def _conditions(tree: ast.AST) -> list[ast.expr]:
    """The condition of every if / elif, conditional expression, while and comprehension filter."""
    conds: list[ast.expr] = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.If, ast.IfExp, ast.While)):
            conds.append(node.test)
        elif isinstance(node, ast.comprehension):
            conds.extend(node.ifs)
    return conds


def _scheme_name_read(node: ast.expr) -> bool:
    """``x.name``, ``getattr(x, "name")``, or a variable called ``name`` (the tests' parametrised scheme name)."""
    return _name_read(node) or (isinstance(node, ast.Name) and node.id == "name")


def _branches_on_a_scheme_name(tree: ast.AST) -> list[int]:
    """Lines of the branch conditions that compare a scheme's name with a registered name."""
    lines = []
    for cond in _conditions(tree):
        for node in ast.walk(cond):
            if isinstance(node, ast.Compare):
                operands = [node.left, *node.comparators]
                if any(map(_scheme_name_read, operands)) and set().union(*map(_scheme_literals, operands)):
                    lines.append(node.lineno)
    return lines


@pytest.mark.slow  # parses every test file
def test_no_test_branches_on_a_scheme_name():
    """The tests too: a test that needs what a scheme does reads the property that says it (``kind``,
    ``rotates_qk_together``, its parameters), never ``if name == "xpos"``, so a new scheme with the same
    property is tested without an edit. Only branch conditions are scanned: data keyed by name (a dict of
    cases or constructors, parametrize lists, ``assert layer.name == "xpos"``) is not a branch and stays."""
    root = Path(__file__).resolve().parents[1]
    found = [f"{path.relative_to(root)}:{line}" for path in sorted(root.rglob("*.py"))
             for line in _branches_on_a_scheme_name(ast.parse(path.read_text(), str(path)))]
    assert not found, f"tests that branch on a scheme's name (branch on its property; keep data in a table): {found}"


@pytest.mark.parametrize(("snippet", "flagged"), [
    ('at = {} if name == "xpos" else {}', True),
    ('if layer.name in ("rope", "xpos"):\n    pass', True),
    ('[x for x in xs if getattr(x, "name", None) != "t5"]', True),
    ('while name == "alibi":\n    break', True),
    ('CASES = {"xpos": 1}', False),
    ('assert layer.name == "xpos"', False),
    ('if op == "rope":\n    pass', False),
])
def test_the_test_scan_finds_each_form_of_branch_and_no_table(snippet: str, flagged: bool):
    assert bool(_branches_on_a_scheme_name(ast.parse(snippet))) == flagged


@pytest.mark.parametrize("name", sorted(SCHEMES))
def test_numpy_and_torch_classes_share_name_and_kind_with_the_entry(name):
    np_cls, t_cls = scheme_class(name, "numpy"), scheme_class(name, "torch")
    assert (np_cls.name, np_cls.kind) == (t_cls.name, t_cls.kind) == (name, SCHEMES[name].kind)
    assert np_cls.__name__ == t_cls.__name__
    assert np_cls.__module__.startswith("tokenpos.numpy.") and t_cls.__module__.startswith("tokenpos.torch.")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", sorted(SCHEMES))
def test_the_constructors_take_the_entrys_arguments_and_factory_kwargs(name, backend):
    params = inspect.signature(scheme_class(name, backend).__init__).parameters
    factory_kwargs = set(SCHEMES[name].factory) - ({"device"} if backend == "numpy" else set())
    wanted = set(SCHEMES[name].args(CONTEXT)) | factory_kwargs
    assert wanted <= set(params), f"{name} ({backend}) takes no {sorted(wanted - set(params))}"


# ----------------------------------------------------------------------------------------------
# Building
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", sorted(SCHEMES))
def test_every_shortcut_builds_in_both_backends(name, backend):
    scheme = build_scheme(name, backend, CONTEXT, **factory(backend))
    assert is_scheme(scheme) and isinstance(scheme, scheme_class(name, backend))
    assert (type(scheme).name, type(scheme).kind) == (name, SCHEMES[name].kind)
    if SCHEMES[name].kind == "additive":
        assert scheme.d_model == CONTEXT.d_model                 # added to the token rows


@pytest.mark.parametrize("name", sorted(SCHEMES))
def test_the_torch_shortcuts_follow_device_and_dtype(name):
    scheme = build_scheme(name, "torch", CONTEXT, device="meta", dtype=torch.float64, rng=np.random.default_rng(0))
    for t in [*scheme.parameters(), *scheme.buffers()]:
        assert t.device.type == "meta", name
    for p in scheme.parameters():
        assert p.dtype == torch.float64, name


@pytest.mark.parametrize("backend", BACKENDS)
def test_build_scheme_refuses_bad_calls(backend):
    first, last = sorted(SCHEMES)[0], sorted(SCHEMES)[-1]
    with pytest.raises(ConfigError, match=rf"positional must be one of '{first}', .*'{last}', None, .*; got 'rotary'"):
        build_scheme("rotary", backend, CONTEXT)
    with pytest.raises(ConfigError, match=r"positional='mrope' needs num_heads= \(a positive divisor of d_model=16\)"):
        build_scheme("mrope", backend, ShortcutContext(d_model=16, max_seq_len=16))
    with pytest.raises(ConfigError, match=r"num_heads must divide d_model=16 .*; got 3"):
        build_scheme("rope", backend, ShortcutContext(d_model=16, max_seq_len=16, num_heads=3))
    with pytest.raises(TypeError, match=r"unexpected factory kwargs \['generator'\]"):
        build_scheme("alibi", backend, CONTEXT, generator=None)
    with pytest.raises(ConfigError, match=r"backend must be one of \('numpy', 'torch'\), got 'jax'"):
        build_scheme("alibi", "jax", CONTEXT)


def test_the_choice_message_lists_every_registered_shortcut():
    message = positional_choice_message("x")
    listed = message.split("one of ", 1)[1].split(", None,", 1)[0]
    assert listed == ", ".join(repr(n) for n in sorted(SCHEMES))


# ----------------------------------------------------------------------------------------------
# The defaults of the new shortcuts
# ----------------------------------------------------------------------------------------------


def test_mrope_section_follows_qwen2_vl():
    assert mrope_section_for(128) == [16, 24, 24]                  # Qwen2-VL / Qwen2.5-VL
    assert mrope_section_for(8) == [2, 1, 1]
    for dh in range(2, 258, 2):
        t, h, w = mrope_section_for(dh)
        assert t + h + w == dh // 2 and h == w and min(t, h) >= 0


@pytest.mark.parametrize("backend", BACKENDS)
def test_rotary_shortcuts_use_head_dim_d_model_over_num_heads(backend):
    ctx = ShortcutContext(d_model=256, max_seq_len=64, num_heads=2)
    mrope = build_scheme("mrope", backend, ctx)
    assert mrope.head_dim == 128 and mrope.settings.mrope_section == [16, 24, 24]
    assert mrope.settings.mrope_layout == "sections" and mrope.max_seq_len == 64
    rope = build_scheme("rope", backend, ctx)
    assert (rope.head_dim, rope.max_seq_len) == (128, 64)
    assert build_scheme("rope2d", backend, ctx).head_dim == 128
    xpos = build_scheme("xpos", backend, ctx)
    assert (xpos.head_dim, xpos.rotary_dim, xpos.scale_base, xpos.interleaved) == (128, 128, 512.0, True)


@pytest.mark.parametrize("backend", BACKENDS)
def test_rope2d_needs_a_head_dim_divisible_by_4(backend):
    with pytest.raises(ConfigError, match=r"2-D RoPE needs head_dim divisible by 4.*got 6"):
        build_scheme("rope2d", backend, ShortcutContext(d_model=12, max_seq_len=16, num_heads=2))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(("max_seq_len", "side"), [(1, 1), (16, 4), (196, 14), (576, 24)])
def test_sincos2d_lays_a_square_grid(backend, max_seq_len, side):
    table = build_scheme("sincos2d", backend, ShortcutContext(d_model=8, max_seq_len=max_seq_len))
    assert (table.height, table.width, table.d_model, table.cls_token) == (side, side, 8, False)


@pytest.mark.parametrize("module", [tpn, tpt], ids=BACKENDS)
@pytest.mark.parametrize("max_seq_len", [2, 15, 512])
def test_sincos2d_refuses_a_max_seq_len_that_is_not_a_square(module, max_seq_len):
    with pytest.raises(ConfigError, match=rf"positional='sincos2d' lays max_seq_len patches on a square grid, so "
                                          rf"max_seq_len must be a perfect square .*; got {max_seq_len}\. For another "
                                          rf"grid pass positional=SinCos2DPositionalEncoding\(height, width, 8\)"):
        module.TransformerEmbedding(10, 8, max_seq_len, positional="sincos2d")


@pytest.mark.parametrize("module", [tpn, tpt], ids=BACKENDS)
def test_sincos2d_needs_a_d_model_divisible_by_4(module):
    with pytest.raises(ConfigError, match=r"needs d_model divisible by 4, got 6"):
        module.TransformerEmbedding(10, 6, 16, positional="sincos2d")
