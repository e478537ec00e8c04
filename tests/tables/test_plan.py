"""tables.plan: the one decision of which ops a TransformerEmbedding call runs, for both backends."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tokenpos.tables.plan import EmbeddingPlan, plan_embedding, table_limit

P = 16


def scheme(kind: str = "additive", *, extends: bool = False, padding_idx: int | None = None) -> SimpleNamespace:
    """A stand-in with exactly the attributes the plan may read (the additive protocol)."""
    return SimpleNamespace(kind=kind, max_seq_len=P, extends=extends, padding_idx=padding_idx)


LEARNED, SINUSOIDAL, ROBERTA = scheme(), scheme(extends=True), scheme(padding_idx=1)
NONE_KINDS = [SimpleNamespace(kind=k) for k in ("rotary", "bias", "none")]   # no table attributes at all


def plan(s: SimpleNamespace, pos_end: int | None = 8, **kw: bool) -> EmbeddingPlan:
    flags = {"token_types": False, "norm": False, "sparse": False, "dropout": True} | kw
    return plan_embedding(s, pos_end=pos_end, **flags)


def test_one_op_when_nothing_follows_the_sum() -> None:
    for s in (LEARNED, SINUSOIDAL):
        assert plan(s) == EmbeddingPlan(table=True, rows=None, fused_dropout=True, late_dropout=False)
    for s in NONE_KINDS:                              # rotary / bias / NoPE add nothing: the token op alone
        assert plan(s) == EmbeddingPlan(table=False, rows=None, fused_dropout=True, late_dropout=False)


@pytest.mark.parametrize("pos_end", [None, P + 1, 10**9])
def test_a_learned_table_is_always_inside_and_a_sinusoidal_one_only_when_known(pos_end: int | None) -> None:
    """Learned positions were checked against P at the boundary; sinusoidal ones past the table (or
    unknown, as under torch.compile) are computed by the formula, after the token op."""
    assert plan(LEARNED, pos_end).table
    assert plan(SINUSOIDAL, pos_end) == EmbeddingPlan(table=False, rows="formula", fused_dropout=False,
                                                      late_dropout=True)
    assert plan(SINUSOIDAL, P).table


@pytest.mark.parametrize("flag", ["token_types", "sparse"])
def test_token_types_and_a_sparse_table_take_the_rows_in_their_own_op(flag: str) -> None:
    for s in (LEARNED, SINUSOIDAL):
        assert plan(s, **{flag: True}) == EmbeddingPlan(table=False, rows="lookup", fused_dropout=False,
                                                        late_dropout=True)
    for s in NONE_KINDS:
        assert plan(s, **{flag: True}) == EmbeddingPlan(table=False, rows=None, fused_dropout=False,
                                                        late_dropout=True)


def test_a_padding_row_is_looked_up_by_its_own_op_and_a_norm_moves_the_dropout_last() -> None:
    assert plan(ROBERTA) == EmbeddingPlan(table=False, rows="lookup", fused_dropout=False, late_dropout=True)
    assert plan(LEARNED, norm=True) == EmbeddingPlan(table=True, rows=None, fused_dropout=False, late_dropout=True)


@pytest.mark.parametrize("s", [LEARNED, SINUSOIDAL, ROBERTA, *NONE_KINDS])
def test_without_dropout_no_step_drops(s: SimpleNamespace) -> None:
    for kw in ({}, {"norm": True}, {"token_types": True}, {"sparse": True}):
        p = plan(s, dropout=False, **kw)
        assert not p.fused_dropout and not p.late_dropout


def test_the_table_limit_is_the_table_of_a_scheme_that_does_not_extend() -> None:
    assert table_limit(LEARNED) == P and table_limit(ROBERTA) == P
    assert table_limit(SINUSOIDAL) is None
    assert all(table_limit(s) is None for s in NONE_KINDS)
