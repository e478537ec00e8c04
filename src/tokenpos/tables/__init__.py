"""The single source of truth for every formula in tokenpos: pure functions returning NumPy arrays.

Nothing here imports a backend. Frequencies, angles and positions are computed in float64.
"""

from tokenpos.tables.dropout import dropout_keep_mask
from tokenpos.tables.errors import ConfigError, PositionError, StateDictError, TokenIdError
from tokenpos.tables.init import INIT_SCHEMES, init_weight, resolve_rng
from tokenpos.tables.sinusoidal import sinusoidal_encoding, sinusoidal_inv_freq, sinusoidal_table

__all__ = [
    "INIT_SCHEMES",
    "ConfigError",
    "PositionError",
    "StateDictError",
    "TokenIdError",
    "dropout_keep_mask",
    "init_weight",
    "resolve_rng",
    "sinusoidal_encoding",
    "sinusoidal_inv_freq",
    "sinusoidal_table",
]
