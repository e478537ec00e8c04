"""The checks of ``TransformerEmbedding``'s own arguments, shared by both backends.

``positional=`` is a string shortcut (built by the backend's ``schemes.py`` with its defaults) or a
positional-scheme object. A scheme object is recognised by two class attributes:

- ``kind``: its category, one of :data:`SCHEME_KINDS` ("additive" is added to the embeddings,
  "rotary" rotates q and k, "bias" is added to the attention logits, "none" adds nothing);
- ``name``: its registry string ("learned", "sinusoidal", "rope", "alibi", "t5", "none", ...).

The shortcuts, their kinds and defaults are the entries of ``tables.registry`` (one per scheme);
:data:`POSITIONAL_SHORTCUTS` and :data:`HEADED_SHORTCUTS` are derived from it. Scheme settings (rope
scaling, T5 buckets, sinusoidal layout, ...) travel with the object; only ``num_heads`` remains here,
for the shortcuts that need it. Token-table options are checked by ``TokenEmbedding``. Everything is
checked before any table is built, so a bad argument never leaves a half-made layer. Also here: the
``start_pos`` check of RoBERTa's padding-derived positions (:func:`check_padding_start`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tokenpos.tables.checks.validation import (
    check_bool,
    check_choice,
    check_int,
    check_positive_int,
    check_probability,
    check_start_pos,
)
from tokenpos.tables.errors import ConfigError
from tokenpos.tables.registry import (
    HEADED,
    SCHEME_KINDS,
    SHORTCUTS,
    needs_heads_message,
    positional_choice_message,
)

POSITIONAL_SHORTCUTS = SHORTCUTS          # every registered scheme's name, sorted (tables.registry)
HEADED_SHORTCUTS = HEADED                 # the shortcuts that need num_heads
POSITION_IDS = ("default", "padding")


# ----------------------------------------------------------------------------------------------
# Messages (both backends raise these texts; positional_choice_message lives with the registry)
# ----------------------------------------------------------------------------------------------


NO_TOKEN_TYPES = "token_type_ids given but num_token_types=0; construct with num_token_types > 0"
"""The refusal of token types by a ``TransformerEmbedding`` built without a token-type table (both backends)."""


def scheme_backend_message(scheme: Any, backend: str) -> str:
    """A scheme object of the other backend (e.g. a torch RotaryEmbedding given to a NumPy layer)."""
    cls = type(scheme)
    return (f"positional scheme {cls.__module__}.{cls.__qualname__} does not belong to the {backend} backend; "
            f"expected an instance from tokenpos.{backend} (for example tokenpos.{backend}.{cls.__name__})")


# ----------------------------------------------------------------------------------------------
# Checks
# ----------------------------------------------------------------------------------------------


def is_scheme(obj: Any) -> bool:
    """Whether ``obj`` is a positional-scheme object: class attributes ``kind`` and ``name``."""
    cls = type(obj)
    return getattr(cls, "kind", None) in SCHEME_KINDS and isinstance(getattr(cls, "name", None), str)


def check_positional(positional: Any, *, backend: str, scheme_base: type) -> Any:
    """A shortcut string (None means "none") or a scheme object of ``backend`` (an instance of
    ``scheme_base``, the backend's module class); returns the string or the object unchanged.

    Raises:
        ConfigError: anything else (the message lists the shortcuts), or a scheme object of the
            other backend.
    """
    if positional is None:
        return "none"
    if isinstance(positional, str):
        if positional not in POSITIONAL_SHORTCUTS:
            raise ConfigError(positional_choice_message(positional))
        return positional
    if getattr(type(positional), "kind", None) in SCHEME_KINDS and not isinstance(positional, scheme_base):
        raise ConfigError(scheme_backend_message(positional, backend))      # e.g. a torch scheme given to NumPy
    if not is_scheme(positional):
        raise ConfigError(positional_choice_message(positional))
    return positional


def check_num_heads(num_heads: Any, d_model: int, positional: Any) -> int | None:
    """H for the shortcuts that need it: a positive integer dividing D (Dh = D // H).

    None is allowed where no shortcut needs it. With a scheme object, a given ``num_heads`` must
    equal the object's own ``num_heads`` (when it has one).
    """
    shortcut = positional if isinstance(positional, str) else None
    if num_heads is None:
        if shortcut in HEADED_SHORTCUTS:
            raise ConfigError(needs_heads_message(shortcut, d_model))
        return None
    h = check_positive_int("num_heads", num_heads)
    if d_model % h:
        raise ConfigError(f"num_heads must divide d_model={d_model} (head_dim = d_model // num_heads); got {h}")
    own = getattr(positional, "num_heads", None) if shortcut is None else None
    if own is not None and own != h:
        raise ConfigError(f"num_heads={h} disagrees with the positional scheme's num_heads={own}")
    return h


def check_scheme_width(scheme: Any, d_model: int) -> None:
    """An additive scheme object must produce rows of width D."""
    if type(scheme).kind == "additive" and getattr(scheme, "d_model", d_model) != d_model:
        raise ConfigError(f"the additive positional scheme has d_model={scheme.d_model}, "
                          f"expected the embedding's d_model={d_model}")


@dataclass(frozen=True)
class EmbeddingArgs:
    """The validated arguments of TransformerEmbedding.

    Attributes:
        positional: the scheme's registry name (the shortcut, or ``type(scheme).name``).
        scheme: the scheme object that was passed, or None for a shortcut (the backend builds it).
        num_heads: H or None.
        d_model, max_seq_len, dropout, num_token_types, position_ids, scale: as passed, checked.
    """

    positional: str
    scheme: Any
    num_heads: int | None
    d_model: int
    max_seq_len: int
    dropout: float
    num_token_types: int
    position_ids: str
    scale: bool


def check_embedding_args(*, positional: Any, d_model: Any, max_seq_len: Any, dropout: Any, num_token_types: Any,
                         position_ids: Any, padding_idx: Any, num_heads: Any, scale: Any, backend: str,
                         scheme_base: type) -> EmbeddingArgs:
    """Validate every TransformerEmbedding argument that is not the token table's own.

    Args:
        backend: "numpy" or "torch" (named in messages).
        scheme_base: the backend's module base class; scheme objects must be instances of it.
    """
    d = check_positive_int("d_model", d_model)
    choice = check_positional(positional, backend=backend, scheme_base=scheme_base)
    scheme = None if isinstance(choice, str) else choice
    if scheme is not None:
        check_scheme_width(scheme, d)
    args = EmbeddingArgs(
        positional=choice if scheme is None else type(scheme).name,
        scheme=scheme,
        num_heads=check_num_heads(num_heads, d, choice),
        d_model=d,
        max_seq_len=check_positive_int("max_seq_len", max_seq_len),
        dropout=check_probability("dropout", dropout),
        num_token_types=check_int("num_token_types", num_token_types, minimum=0),
        position_ids=check_choice("position_ids", position_ids, POSITION_IDS),
        scale=check_bool("scale", scale),
    )
    if args.position_ids == "padding" and padding_idx is None:
        raise ConfigError("position_ids='padding' (RoBERTa) needs padding_idx; got None")
    return args


def check_padding_start(start_pos: Any, padding_idx: int, length: int) -> int:
    """``start_pos`` checked over the whole span of RoBERTa's positions (``position_ids="padding"``), which
    run to ``padding_idx + start_pos + length`` (both backends call this, so they raise alike)."""
    return check_start_pos(start_pos, padding_idx + 1 + length)
