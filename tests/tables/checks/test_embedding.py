"""tables.checks.embedding: TransformerEmbedding's shared argument checks (shortcuts, scheme objects, num_heads)."""

from __future__ import annotations

import re

import numpy as np
import pytest

import tokenpos.numpy as tpn
from tokenpos.numpy.module import Module
from tokenpos.numpy.schemes import build_shortcut
from tokenpos.tables.checks.embedding import (
    HEADED_SHORTCUTS,
    POSITIONAL_SHORTCUTS,
    SCHEME_KINDS,
    check_embedding_args,
    check_num_heads,
    check_positional,
    is_scheme,
)
from tokenpos.tables.errors import ConfigError
from tokenpos.tables.registry import SCHEMES


def args(**kw):
    base = dict(positional="learned", d_model=8, max_seq_len=16, dropout=0.0, num_token_types=0,
                position_ids="default", padding_idx=None, num_heads=None, scale=False, backend="numpy",
                scheme_base=Module)
    return check_embedding_args(**{**base, **kw})


@pytest.mark.parametrize("name", POSITIONAL_SHORTCUTS)
def test_every_shortcut_builds_a_scheme_whose_name_is_the_shortcut(name):
    scheme = build_shortcut(name, d_model=8, max_seq_len=16, num_heads=2, position_padding_idx=None,
                            init="normal", std=0.02, dtype=np.float32, rng=np.random.default_rng(0))
    assert is_scheme(scheme)
    assert type(scheme).name == name and type(scheme).kind in SCHEME_KINDS


def test_kind_is_the_category_and_name_the_registry_string():
    """The classes of the first schemes, pinned (every registered class against its own entry, a new one
    included: ``tests/tables/test_registry.py::test_numpy_and_torch_classes_share_name_and_kind_with_the_entry``)."""
    expected = {tpn.LearnedPositionalEmbedding: ("additive", "learned"),
                tpn.SinusoidalPositionalEncoding: ("additive", "sinusoidal"),
                tpn.SinCos2DPositionalEncoding: ("additive", "sincos2d"),
                tpn.RotaryEmbedding: ("rotary", "rope"), tpn.MRotaryEmbedding: ("rotary", "mrope"),
                tpn.RotaryEmbedding2D: ("rotary", "rope2d"), tpn.XPosRotaryEmbedding: ("rotary", "xpos"),
                tpn.ALiBi: ("bias", "alibi"), tpn.T5RelativePositionBias: ("bias", "t5"),
                tpn.FIRE: ("bias", "fire"), tpn.KERPLE: ("bias", "kerple"),
                tpn.NoPositionalEncoding: ("none", "none")}
    for cls, (kind, name) in expected.items():
        assert (cls.kind, cls.name) == (kind, name), cls


def test_none_means_the_none_shortcut():
    assert args(positional=None).positional == "none"


@pytest.mark.parametrize("bad", ["Learned", "rotary", 3, 1.5, object(), {"kind": "rope"}, np.zeros(3)])
def test_anything_but_a_shortcut_or_a_scheme_is_a_config_error_listing_the_choices(bad):
    listed = re.escape(", ".join(repr(n) for n in sorted(SCHEMES)))        # every registered shortcut, in order
    with pytest.raises(ConfigError, match=rf"positional must be one of {listed}, None, "
                                          r"or a positional-scheme object of the layer's backend.*; got"):
        args(positional=bad)


def test_a_scheme_object_is_kept_and_named_by_its_class():
    rope = tpn.RotaryEmbedding(4)
    a = args(positional=rope)
    assert a.scheme is rope and a.positional == "rope"


def test_a_scheme_of_the_other_backend_is_a_config_error():
    class ForeignRope:                     # stands for tokenpos.torch.RotaryEmbedding (not a NumPy Module)
        kind, name = "rotary", "rope"

    with pytest.raises(ConfigError, match=r"does not belong to the numpy backend; expected an instance from "
                                          r"tokenpos\.numpy"):
        check_positional(ForeignRope(), backend="numpy", scheme_base=Module)


def test_a_scheme_of_the_torch_backend_given_to_the_numpy_layer_is_a_config_error():
    tpt = pytest.importorskip("tokenpos.torch")
    with pytest.raises(ConfigError, match=r"tokenpos\.torch\..*RotaryEmbedding does not belong to the numpy backend"):
        tpn.TransformerEmbedding(10, 8, positional=tpt.RotaryEmbedding(4))


@pytest.mark.parametrize("shortcut", HEADED_SHORTCUTS)
def test_num_heads_zero_is_a_config_error_not_a_zero_division(shortcut):
    with pytest.raises(ConfigError, match=r"num_heads must be >= 1, got 0"):
        tpn.TransformerEmbedding(10, 8, positional=shortcut, num_heads=0)


@pytest.mark.parametrize("shortcut", HEADED_SHORTCUTS)
def test_headed_shortcuts_need_num_heads_dividing_d_model(shortcut):
    with pytest.raises(ConfigError, match=rf"positional='{shortcut}' needs num_heads="):
        args(positional=shortcut)
    with pytest.raises(ConfigError, match=r"num_heads must divide d_model=8 .*; got 3"):
        args(positional=shortcut, num_heads=3)
    assert args(positional=shortcut, num_heads=4).num_heads == 4


def test_num_heads_must_agree_with_a_scheme_objects_heads():
    with pytest.raises(ConfigError, match=r"num_heads=2 disagrees with the positional scheme's num_heads=4"):
        check_num_heads(2, 8, tpn.ALiBi(4))
    assert check_num_heads(4, 8, tpn.ALiBi(4)) == 4


def test_an_additive_scheme_of_another_width_is_a_config_error():
    with pytest.raises(ConfigError, match=r"d_model=6, expected the embedding's d_model=8"):
        args(positional=tpn.SinusoidalPositionalEncoding(16, 6))


@pytest.mark.parametrize("bad", ["yes", 1, 1.0, None])
def test_scale_must_be_a_bool(bad):
    with pytest.raises(ConfigError, match=r"scale must be True or False, got"):
        args(scale=bad)


def test_padding_positions_need_padding_idx():
    with pytest.raises(ConfigError, match=r"position_ids='padding' .* needs padding_idx"):
        args(position_ids="padding")
