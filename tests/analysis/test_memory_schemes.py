"""The memory tables list every registered positional scheme, and count what each one trains as its NumPy class
holds it (issue 49: FIRE and KERPLE were missing from ``tokenpos memory --positional`` and the tables)."""

from __future__ import annotations

import numpy as np
import pytest

from tokenpos.analysis.memory import (
    ADAM_BYTES_PER_PARAM,
    POSITIONAL_KINDS,
    custom_config,
    embedding_memory,
    position_alternatives,
)
from tokenpos.tables.registry import SHORTCUTS, ShortcutContext, build_scheme

L, D, H = 196, 64, 4                     # 196 = 14 x 14: sincos2d's square patch grid


def test_every_registered_scheme_is_listed_once() -> None:
    assert sorted(POSITIONAL_KINDS) == sorted(SHORTCUTS)
    assert [t.name for t in position_alternatives(L, D, H)] == list(POSITIONAL_KINDS)


@pytest.mark.parametrize("name", SHORTCUTS)
def test_trained_parameters_match_the_numpy_class(name: str) -> None:
    """The trained count of each scheme is the parameters its NumPy object holds, built by the registry at the
    same (L, D, H); a fixed scheme trains nothing (its buffers are listed as a note, not trained)."""
    scheme = build_scheme(name, "numpy", ShortcutContext(d_model=D, max_seq_len=L, num_heads=H),
                          rng=np.random.default_rng(0))
    held = sum(p.data.size for p in scheme.parameters())
    (row,) = [t for t in position_alternatives(L, D, H) if t.name == name]
    assert (row.params if row.trainable else 0) == held
    assert row.train_bytes == held * ADAM_BYTES_PER_PARAM


@pytest.mark.parametrize("name", ["t5", "fire", "kerple"])
def test_a_model_with_a_trained_bias_counts_it_and_needs_its_heads(name: str) -> None:
    from tokenpos.tables.errors import ConfigError

    rep = embedding_memory(custom_config(1000, D, L, positional=name, num_heads=H))
    (row,) = [t for t in position_alternatives(L, D, H) if t.name == name]
    assert rep.tables[1].name == f"position ({name})" and rep.tables[1].params == row.params
    assert rep.params == 1000 * D + row.params
    with pytest.raises(ConfigError, match=f"a {name} model needs num_heads"):
        embedding_memory(custom_config(1000, D, L, positional=name))


@pytest.mark.parametrize("name", [n for n in SHORTCUTS if n not in ("learned", "t5", "fire", "kerple")])
def test_a_model_with_a_fixed_scheme_has_only_its_token_table(name: str) -> None:
    rep = embedding_memory(custom_config(1000, D, L, positional=name))
    assert [t.name for t in rep.tables] == ["token embedding"]
