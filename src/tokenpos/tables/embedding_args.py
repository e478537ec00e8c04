"""The checks of ``TransformerEmbedding``'s own arguments, shared by both backends.

Scheme-specific options are checked by the scheme that uses them; token-table options by
``TokenEmbedding``. What is left (the kind, lengths, dropout, token types, position ids) is here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tokenpos.tables.errors import ConfigError
from tokenpos.tables.validation import check_choice, check_int, check_positive_int, check_probability

POSITIONAL_KINDS = ("alibi", "fire", "kerple", "learned", "none", "rope", "sinusoidal", "t5")
POSITION_IDS = ("default", "padding")


def resolve_positional_kind(positional: Any) -> str:
    """None means "none"; anything else must be one of POSITIONAL_KINDS (the error lists them)."""
    return check_choice("positional", "none" if positional is None else positional, POSITIONAL_KINDS)


@dataclass(frozen=True)
class EmbeddingArgs:
    """The validated arguments: positional kind, max_seq_len, dropout p, num_token_types, position_ids."""

    positional: str
    max_seq_len: int
    dropout: float
    num_token_types: int
    position_ids: str


def check_embedding_args(*, positional: Any, max_seq_len: Any, dropout: Any, num_token_types: Any,
                         position_ids: Any, padding_idx: Any) -> EmbeddingArgs:
    """Validate before any table is built, so a bad argument never leaves a half-made layer."""
    args = EmbeddingArgs(
        positional=resolve_positional_kind(positional),
        max_seq_len=check_positive_int("max_seq_len", max_seq_len),
        dropout=check_probability("dropout", dropout),
        num_token_types=check_int("num_token_types", num_token_types, minimum=0),
        position_ids=check_choice("position_ids", position_ids, POSITION_IDS),
    )
    if args.position_ids == "padding" and padding_idx is None:
        raise ConfigError("position_ids='padding' (RoBERTa) needs padding_idx; got None")
    return args
