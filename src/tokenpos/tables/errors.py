"""Exception classes shared by every part of tokenpos."""

from __future__ import annotations


class TokenIdError(ValueError, IndexError):
    """A token id that the table cannot look up: out of range, negative, or not an integer."""


class PositionError(ValueError, IndexError):
    """A position that a layer cannot represent (for example >= max_seq_len for learned tables)."""


class ConfigError(ValueError):
    """A constructor argument or a scheme configuration that is invalid."""


class StateDictError(ValueError):
    """A state_dict that does not fit the layer: missing or unexpected keys, wrong shape or dtype."""


class DtypeError(ConfigError, TypeError):
    """A float input (q, k, v, hidden states) of a dtype that is not floating point (int, bool, complex)."""


class KernelBoundError(TokenIdError, PositionError):
    """A fused kernel met an id or position outside its table and skipped the row (its memory bound).

    Layers check every input at their public entry, so this means an op or kernel was called
    directly with unchecked data: check it first (``tables.checks.validation.check_token_ids``)."""
