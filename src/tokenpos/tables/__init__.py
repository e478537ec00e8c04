"""The single source of truth for every formula in tokenpos: pure functions returning NumPy arrays.

Nothing here imports a backend. Frequencies, angles and positions are computed in float64.
"""

from tokenpos.tables.alibi import alibi_bias, alibi_distances, alibi_slopes
from tokenpos.tables.attention import causal_keep_mask
from tokenpos.tables.dropout import dropout_keep_mask
from tokenpos.tables.errors import ConfigError, DtypeError, PositionError, StateDictError, TokenIdError
from tokenpos.tables.init import INIT_SCHEMES, init_weight, resolve_rng
from tokenpos.tables.rope import (
    permute_qk_weight,
    qk_permutation,
    rope_angles,
    rope_cos_sin,
    rope_inv_freq,
    rope_rotate,
    rope_rotate_backward,
    rotate_half,
    rotate_pairs,
)
from tokenpos.tables.rope_scaling import ROPE_INIT_FUNCTIONS, normalize_rope_scaling
from tokenpos.tables.rope_state import RopeFrequencies, rope_kwargs_from_hf_config
from tokenpos.tables.sinusoidal import sinusoidal_encoding, sinusoidal_inv_freq, sinusoidal_table
from tokenpos.tables.t5 import t5_bias, t5_bias_backward, t5_bucket_matrix, t5_relative_bucket, t5_relative_positions

__all__ = [
    "ROPE_INIT_FUNCTIONS",
    "RopeFrequencies",
    "alibi_bias",
    "alibi_distances",
    "alibi_slopes",
    "causal_keep_mask",
    "normalize_rope_scaling",
    "permute_qk_weight",
    "qk_permutation",
    "rope_angles",
    "rope_cos_sin",
    "rope_inv_freq",
    "rope_kwargs_from_hf_config",
    "rope_rotate",
    "rope_rotate_backward",
    "rotate_half",
    "rotate_pairs",
    "t5_bias",
    "t5_bias_backward",
    "t5_bucket_matrix",
    "t5_relative_bucket",
    "t5_relative_positions",
    "INIT_SCHEMES",
    "ConfigError",
    "DtypeError",
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
