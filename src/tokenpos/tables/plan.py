"""What one ``TransformerEmbedding`` call does, decided once for both backends.

Both backends check every input at their public entry first (their ``_batch``), then ask
:func:`plan_embedding` which steps to run, then make only the op calls the plan names:

    x = embedding op: W[ids] * s (+ P[pos] if plan.table) (then dropout if plan.fused_dropout)
    x = x + T[token_type_ids]                     (token types, Hugging Face's order)
    x = x + scheme rows at pos                    (plan.rows: "lookup" of its table, or "formula")
    x = norm(x)                                   (a norm)
    x = dropout(x)                                (if plan.late_dropout)

The decision depends only on the layer's settings and on a bound of the positions known without
reading data (``pos_end``), so it is the same in eager mode, under ``torch.compile`` and in NumPy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Generic, NamedTuple, TypeVar

A = TypeVar("A")            # the backend's array type: np.ndarray or torch.Tensor


class EmbeddingPlan(NamedTuple):
    """The steps of one call (an immutable value).

    Attributes:
        table: the first op adds rows of the positional scheme's (P, D) table at the positions.
        rows: how the positional rows are added after the token (and token-type) rows, when the
            first op does not add them: "lookup" (the table's rows at the positions, their own op:
            a table with a padding row, a row-sparse token table, Hugging Face's order with token
            types), "formula" (positions beyond a fixed table: the scheme computes their rows), or
            None (nothing more to add).
        fused_dropout: the first op applies the dropout (nothing but the sum precedes it).
        late_dropout: the dropout is its own step at the end.
    """

    table: bool
    rows: str | None
    fused_dropout: bool
    late_dropout: bool


def table_limit(scheme: Any) -> int | None:
    """P for an additive scheme whose positions must lie inside its table (it does not extend beyond
    it: learned, the 2-D patch grid), else None: the bound the boundary checks positions against."""
    return scheme.max_seq_len if scheme.kind == "additive" and not scheme.extends else None


def plan_embedding(scheme: Any, *, pos_end: int | None, token_types: bool, norm: bool, sparse: bool,
                   dropout: bool) -> EmbeddingPlan:
    """The plan of a call (see the module doc).

    Args:
        scheme: the layer's positional scheme. Of an additive scheme the plan reads ``max_seq_len``
            (P, its table's rows), ``extends`` (rows beyond the table exist: sinusoidal; a table that
            does not extend had its positions checked against P at the boundary, so they lie inside
            it) and ``padding_idx`` (a padding row, RoBERTa's, whose gradient the op cannot hold back).
        pos_end: an exclusive bound of the positions, known without reading data (None: unknown).
        token_types: token-type rows are added (BERT); norm: a norm follows the sum.
        sparse: the token table is row-sparse (torch ``sparse=True``): its lookup is its own op.
        dropout: p > 0 in this call.
    """
    additive = scheme.kind == "additive"
    inside = additive and (not scheme.extends or (pos_end is not None and pos_end <= scheme.max_seq_len))
    table = inside and not (scheme.padding_idx is not None or token_types or sparse)
    rows = None if table or not additive else ("lookup" if inside else "formula")
    late = dropout and (rows is not None or token_types or norm or sparse)
    return EmbeddingPlan(table=table, rows=rows, fused_dropout=dropout and not late, late_dropout=late)


@dataclass(slots=True)
class Batch(Generic[A]):
    """The inputs of one ``TransformerEmbedding`` call after the boundary check (NumPy arrays or
    torch tensors, by backend): every value valid, nothing left for an op to check. Made once per
    call and only read after (a plain slotted record: a frozen dataclass costs 4x as much to build).

    Attributes:
        ids: (B, L) or (L,) integer ids, each in [0, V).
        positions: (L,) or (B, L) integer positions, each >= 0 (and < P for a table that does not
            extend beyond its rows).
        pos_end: an exclusive bound of the positions known without reading data, or None.
        token_types: (B, L) / (L,) token-type ids in [0, num_token_types), or None (all type 0).
    """

    ids: A
    positions: A
    pos_end: int | None
    token_types: A | None
