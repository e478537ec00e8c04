"""Config readers honour or refuse a falsy value; they never replace it with a default.

Guard (issue 28, item 4): ``get(k) or default`` turned Llama 4's ``attn_scale=0.0`` into 0.1,
``floor_scale=0`` into 8192 and ``no_rope_layer_interval=0`` into 4. Two tests close the class:

- a static scan of ``src/tokenpos`` for ``<lookup>(...) or ...`` (``get``, ``config_get``, ``getattr``,
  ``pop``, ``first_given``) where a config value is read; the one rule, None = not given, lives in
  ``tables.hf.rope.first_given``;
- every key each config reader knows (discovered from the reader's source: every string literal it
  looks up; every key of ``SCALING_KEYS``) gets each falsy value (0, 0.0, False, "", [], None): None
  must give what the missing key gives; any other value must raise ConfigError naming the key, or be
  one of the listed valid values whose effect is checked (``HONOURED``).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import tokenpos
import tokenpos.numpy as tpn
from tokenpos.tables.errors import ConfigError
from tokenpos.tables.formulas.rope_scaling import COMMON_KEYS, SCALING_KEYS
from tokenpos.tables.formulas.rope_state import rotary_frequencies
from tokenpos.tables.hf import models, rope
from tokenpos.tables.hf.models import llama4_kwargs_from_hf_config

SRC = Path(tokenpos.__file__).resolve().parent
FALSY: list[Any] = [0, 0.0, False, "", [], None]
LOOKUP_OR = re.compile(r"\b(get|config_get|getattr|pop|first_given|_first)\([^()]*(\([^()]*\)[^()]*)*\)\s+or\b")
# ``lookup(...) or`` uses that are not config values (reviewed): (file, a piece of the line) -> why
NOT_CONFIG = {
    ("tables/checkpoint.py", 'getattr(exc, "strerror", None) or'): "an exception's strerror, then its text",
    ("numpy/rotary.py", "snap.halves.get(dtype) or"): "a cache dict lookup (a miss is None), not a setting",
    ("cli/plot.py", "PLOTS.get(args.kind) or"): "a registry lookup of plot functions",
    ("analysis/report.py", 'getattr(r, "note", "") or'): "a benchmark row's optional note",
    ("analysis/extrapolate/render.py", '.get("note") or'): "a result row's optional note",
    ("analysis/extrapolate/plot.py", '.get(f"{key}_ci") or'): "optional lists of a results document",
    ("analysis/extrapolate/plot.py", 'data.get("task_results") or'): "optional lists of a results document",
    ("analysis/extrapolate/plot.py", '.get("task") or'): "optional parts of a results document",
}


def _allowed(rel: str, line: str) -> bool:
    return any(rel == f and piece in line for f, piece in NOT_CONFIG)


def test_no_config_reader_uses_lookup_or_default() -> None:
    found = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if LOOKUP_OR.search(line.split("#")[0]) and not _allowed(rel, line):
                found.append(f"{rel}:{n}: {line.strip()}")
    assert not found, "a config value read with `lookup(...) or default` (use first_given / `is None`):\n" + \
        "\n".join(found)


def test_the_scan_finds_the_old_pattern() -> None:
    assert LOOKUP_OR.search('interval=get("no_rope_layer_interval") or 4')
    assert LOOKUP_OR.search('float(params.get("beta_fast") or 32)')
    assert LOOKUP_OR.search('config_get(config, "rope_parameters") or config_get(config, "rope_scaling") or {}')
    assert not LOOKUP_OR.search('x = 4 if get("no_rope_layer_interval") is None else 3')


# ----------------------------------------------------------------------------------------------
# The readers, a valid base config each, and the keys they know
# ----------------------------------------------------------------------------------------------

YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8}


class _Layer:
    """What a layer built from a config computes: its settings, inverse frequencies and attention factor."""

    def __init__(self, layer: Any) -> None:
        self.layer = layer
        self.key = (type(layer).__name__, layer.extra_repr(), np.asarray(layer.inv_freq).tobytes(),
                    getattr(layer, "attention_factor", None))

    def __repr__(self) -> str:
        return repr(self.key)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Layer) and self.key == other.key

    __hash__ = None   # type: ignore[assignment]


def _from_config(cls: Any) -> Callable[[dict], _Layer]:
    return lambda config: _Layer(cls.from_hf_config(config))


# a reader, and what users call: the layers' from_hf_config (the reader, then the constructor's checks)
READERS: dict[str, tuple[Callable[[dict], Any], dict[str, Any]]] = {
    "llama4": (llama4_kwargs_from_hf_config, {"num_hidden_layers": 4}),
    "rope": (_from_config(tpn.RotaryEmbedding), {"head_dim": 8, "max_position_embeddings": 32,
                                                 "rope_theta": 100.0}),
    "rope[yarn]": (_from_config(tpn.RotaryEmbedding), {"head_dim": 8, "rope_parameters": dict(YARN)}),
    "rope[hidden]": (_from_config(tpn.RotaryEmbedding), {"hidden_size": 16, "num_attention_heads": 2}),
    "mrope": (_from_config(tpn.MRotaryEmbedding), {"head_dim": 8, "rope_parameters": {"mrope_section": [2, 1, 1]}}),
    "rope2d": (_from_config(tpn.RotaryEmbedding2D), {"head_dim": 8, "rope_parameters": {"rope_type": "axial",
                                                                                       "rope_theta": 100.0}}),
}
# the keys each reader function looks up (nested ones as "rope_parameters.<key>")
KEYS = {
    "llama4": ["num_hidden_layers", "no_rope_layers", "no_rope_layer_interval", "attn_temperature_tuning",
               "floor_scale", "attn_scale"],
    "rope": ["head_dim", "rope_parameters", "rope_scaling", "rope_theta", "rotary_emb_base",
             "partial_rotary_factor", "rotary_pct", "max_position_embeddings", "model_type", "rotary_dim",
             "rope_interleave", "rope_local_base_freq", "layer_types", "mrope_section", "rotary_emb_fraction",
             "rotary_emb_interleaved", "rotary_emb_scale_base", "rope_parameters.rope_theta",
             "rope_parameters.partial_rotary_factor", "rope_parameters.mrope_section"],
    "rope[yarn]": ["original_max_position_embeddings", "rope_parameters.factor"],
    "rope[hidden]": ["hidden_size", "num_attention_heads"],
    "mrope": ["text_config", "model_type", "rope_parameters.mrope_section", "rope_parameters.mrope_interleaved",
              "rope_parameters.type", "rope_parameters.rope_type", "max_position_embeddings", "rope_theta",
              "partial_rotary_factor", "head_dim"],
    "rope2d": ["rope_parameters", "rope_parameters.rope_type", "rope_parameters.rope_theta", "head_dim"],
}


def _looked_up(module: Any) -> set[str]:
    """Every string literal passed to a lookup call in ``module``'s source (what the readers read)."""
    tree = ast.parse(Path(module.__file__).read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            fn = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            first = {"get": 0, "pop": 0, "config_get": 1, "getattr": 1, "first_given": 1, "_first": 2}.get(fn)
            if first is not None:                       # the key arguments, not a default value
                args = node.args[first:] if fn in ("first_given", "_first") else node.args[first:first + 1]
                names |= {a.value for a in args if isinstance(a, ast.Constant) and isinstance(a.value, str)}
    return names


def test_every_key_the_readers_look_up_is_fed_falsy_values() -> None:
    fed = {k.split(".")[-1] for keys in KEYS.values() for k in keys}
    internal = {"rope_type", "type", "rope_theta", "rope_parameters", "rope_scaling",
                "interleaved", "rotary_dim"}                         # kwargs dict entries, not config keys
    # per_layer_config: read from config objects only (transformers 5's per-layer view; a dict has none), and a
    # falsy one (None, {}) is "no view": the config itself (test_rope.py's per-layer test reads a real one)
    read = (_looked_up(rope) | _looked_up(models) | set(rope.REFUSED_KEYS)) - {"text_config", "per_layer_config"} \
        - internal
    assert read <= fed | internal, f"keys read but not fed falsy values here: {sorted(read - fed)}"


def _with(config: dict[str, Any], key: str, value: Any) -> dict[str, Any]:
    out = {k: dict(v) if isinstance(v, dict) else v for k, v in config.items()}
    if "." in key:
        outer, inner = key.split(".")
        out.setdefault(outer, {})
        out[outer][inner] = value
    else:
        out[key] = value
    return out


def _without(config: dict[str, Any], key: str) -> dict[str, Any]:
    out = {k: dict(v) if isinstance(v, dict) else v for k, v in config.items()}
    if "." in key:
        outer, inner = key.split(".")
        out.get(outer, {}).pop(inner, None)
    else:
        out.pop(key, None)
    return out


def _outcome(fn: Callable[[Any], Any], config: Any) -> Any:
    try:
        return fn(config)
    except ConfigError as exc:
        return ConfigError(str(exc))


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, ConfigError) or isinstance(b, ConfigError):
        return isinstance(a, ConfigError) and isinstance(b, ConfigError)
    return repr(a) == repr(b)    # _Layer: settings, frequencies and factor; dicts: every entry


# (reader, key): {repr(value): check(result, absent result) -> bool} for the falsy values that are valid
HONOURED: dict[tuple[str, str], dict[str, Callable[[Any, Any], bool]]] = {
    ("llama4", "attn_scale"): {"0": lambda r, a: r["attn_temperature"] == (8192.0, 0.0),
                               "0.0": lambda r, a: r["attn_temperature"] == (8192.0, 0.0)},
    ("llama4", "attn_temperature_tuning"): {"False": lambda r, a: r["attn_temperature"] is None},
    ("rope", "rope_interleave"): {"False": lambda r, a: r.layer.interleaved is False},
    ("rope", "rotary_emb_interleaved"): {"False": lambda r, a: r == a},          # False: not interleaved
    ("rope", "mrope_section"): {"False": lambda r, a: r == a},                    # False: no M-RoPE
    ("rope", "rotary_emb_fraction"): {"False": lambda r, a: r == a},
    ("rope", "rotary_emb_scale_base"): {"False": lambda r, a: r == a},
    ("rope", "model_type"): {"''": lambda r, a: r == a},                          # no special model type
    ("mrope", "model_type"): {"''": lambda r, a: r == a},
    ("mrope", "rope_parameters.mrope_interleaved"): {"False": lambda r, a: r.layer.settings.mrope_layout == "sections"},
    ("rope", "layer_types"): {"[]": lambda r, a: r == a},                         # read with layer_type only
}
# HF: a yarn / longrope factor of None is max_position_embeddings / original_max_position_embeddings
NONE_MEANS: dict[tuple[str, str], Callable[[Any], bool]] = {
    ("rope[yarn]", "rope_parameters.factor"): lambda r: r.layer.freqs.params.get("factor") is None
    and r.layer.attention_factor > 1.0,
}
CASES = [(reader, key, value) for reader, keys in KEYS.items() for key in keys for value in FALSY]


@pytest.mark.parametrize(("reader", "key", "value"), CASES, ids=[f"{r}-{k}-{v!r}" for r, k, v in CASES])
def test_a_falsy_value_is_honoured_or_refused(reader: str, key: str, value: Any) -> None:
    fn, base = READERS[reader]
    got = _outcome(fn, _with(base, key, value))
    absent = _outcome(fn, _without(base, key))
    if value is None and (reader, key) in NONE_MEANS:        # a documented HF meaning of None
        assert NONE_MEANS[reader, key](got), f"{key}=None gave {got!r}"
        return
    check = HONOURED.get((reader, key), {}).get(repr(value))
    _judge(got, absent, key, value, check)
    if value is not None and check is None:
        assert key.split(".")[-1] in str(got) or repr(value) in str(got), f"the message must name the key: {got}"


def _judge(got: Any, absent: Any, key: str, value: Any, check: Callable[[Any, Any], bool] | None) -> None:
    """None is "not given": as if missing, or refused; a listed valid value is honoured as ``check`` says;
    any other falsy value is refused (ConfigError)."""
    if value is None:
        assert _same(got, absent) or isinstance(got, ConfigError), \
            f"{key}=None gave {got!r}, the missing key gives {absent!r}"
        return
    if check is not None:
        assert not isinstance(got, ConfigError), f"{key}={value!r} is valid, got {got}"
        assert check(got, absent), f"{key}={value!r} was not honoured: {got!r}"
        return
    assert isinstance(got, ConfigError), f"{key}={value!r} must be refused, got {got!r} (missing key: {absent!r})"


# ----------------------------------------------------------------------------------------------
# rope_scaling dicts: every key of every rope_type
# ----------------------------------------------------------------------------------------------

SCALING_BASES = {
    "default": {"rope_type": "default"},
    "linear": {"rope_type": "linear", "factor": 2.0},
    "dynamic": {"rope_type": "dynamic", "factor": 2.0},
    "yarn": dict(YARN),
    "longrope": {"rope_type": "longrope", "short_factor": [1.0, 1.5, 2.0, 2.5], "long_factor": [3.0, 4.0, 5.0, 6.0],
                 "original_max_position_embeddings": 8},
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8},
    "proportional": {"rope_type": "proportional", "factor": 2.0},
}
SCALING_HONOURED: dict[tuple[str, str], dict[str, Callable[[Any, Any], bool]]] = {
    ("yarn", "attention_factor"): {"0": lambda f, a: f.attention_factor == 0.0,
                                   "0.0": lambda f, a: f.attention_factor == 0.0},
    ("longrope", "attention_factor"): {"0": lambda f, a: f.attention_factor == 0.0,
                                       "0.0": lambda f, a: f.attention_factor == 0.0},
    ("yarn", "truncate"): {"False": lambda f, a: f.params["truncate"] is False},
    # HF: ``if mscale and mscale_all_dim`` -- 0 is DeepSeek's "off": YaRN's own factor
    ("yarn", "mscale"): {"0": lambda f, a: f.attention_factor == a.attention_factor,
                         "0.0": lambda f, a: f.attention_factor == a.attention_factor},
    ("yarn", "mscale_all_dim"): {"0": lambda f, a: f.attention_factor == a.attention_factor,
                                 "0.0": lambda f, a: f.attention_factor == a.attention_factor},
}
SCALING_CASES = [(t, k, v) for t, (req, opt) in SCALING_KEYS.items() for k in sorted(req | opt | COMMON_KEYS)
                 for v in FALSY]


def _freqs(scaling: dict[str, Any]) -> Any:
    return rotary_frequencies(8, 32, False, base=100.0, scaling=scaling, rotary_dim=None)[3]


def test_every_rope_type_has_a_base() -> None:
    assert set(SCALING_BASES) == set(SCALING_KEYS)


@pytest.mark.parametrize(("rope_type", "key", "value"), SCALING_CASES,
                         ids=[f"{t}-{k}-{v!r}" for t, k, v in SCALING_CASES])
def test_a_falsy_scaling_value_is_honoured_or_refused(rope_type: str, key: str, value: Any) -> None:
    base = SCALING_BASES[rope_type]
    got = _outcome(_freqs, {**base, key: value})
    absent = _outcome(_freqs, {k: v for k, v in base.items() if k != key} if key != "rope_type" else
                      {**{k: v for k, v in base.items() if k != "rope_type"}, "type": rope_type})
    if value is None and key == "factor" and rope_type in ("yarn", "longrope"):   # HF: None = the length ratio
        assert not isinstance(got, ConfigError) and got.attention_factor >= 1.0
        return
    _judge(got, absent, key, value, SCALING_HONOURED.get((rope_type, key), {}).get(repr(value)))


def test_llama4_reader_honours_the_issue_values() -> None:
    base = {"num_hidden_layers": 4}
    assert llama4_kwargs_from_hf_config({**base, "attn_scale": 0.0})["attn_temperature"] == (8192.0, 0.0)
    for key, value in (("floor_scale", 0), ("no_rope_layer_interval", 0)):
        with pytest.raises(ConfigError, match=f"{key} must be .*got 0"):
            llama4_kwargs_from_hf_config({**base, key: value})
    assert np.array_equal(llama4_kwargs_from_hf_config(base)["rope_layers"], [True, True, True, False])
