"""tables.checks.attention: what enters scaled_dot_product_attention (scheme object, mask and bias shapes)."""

from __future__ import annotations

import pytest

from tokenpos.tables import ConfigError
from tokenpos.tables.checks.attention import check_bias_shape, check_mask_shape, check_scheme


class _Scheme:
    def __init__(self, kind):
        self.kind = kind


def test_a_scheme_name_string_is_refused_and_points_to_emb_position():
    for name in ("rope", "alibi", "none", "t5"):
        with pytest.raises(ConfigError, match=r"got the string '.*'; pass the scheme object.*emb\.position"):
            check_scheme(name)


def test_objects_without_a_valid_kind_are_refused():
    with pytest.raises(ConfigError, match="positional-scheme object"):
        check_scheme(object())
    with pytest.raises(ConfigError, match="positional-scheme object"):
        check_scheme(_Scheme("rotary-ish"))
    assert check_scheme(None) == "none"
    assert [check_scheme(_Scheme(k)) for k in ("additive", "rotary", "bias", "none")] == [
        "additive", "rotary", "bias", "none"]


@pytest.mark.parametrize("shape", [(3, 4), (2, 2, 4, 4, 1), (2, 3, 4, 4), (5, 1, 1, 1)])
def test_mask_shapes_that_do_not_broadcast_to_the_logits_are_refused(shape):
    with pytest.raises(ConfigError, match=r"attn_mask has shape .* does not broadcast to .*\(2, 2, 4, 4\)"):
        check_mask_shape(shape, (2, 2, 4, 4))


@pytest.mark.parametrize("shape", [(4, 4), (1, 4), (2, 1, 4, 4), (2, 2, 4, 4), (4,)])
def test_broadcastable_masks_pass(shape):
    check_mask_shape(shape, (2, 2, 4, 4))


def test_bias_head_count_mismatch_names_both():
    check_bias_shape((8, 3, 5), 8, 3, 5)
    with pytest.raises(ConfigError, match=r"bias has shape \(8, 3, 5\), expected .* \(4, 3, 5\).*num_heads=4"):
        check_bias_shape((8, 3, 5), 4, 3, 5)
