"""The single source of truth for every formula in tokenpos: pure functions returning NumPy arrays.

Nothing here imports a backend. Frequencies, angles and positions are computed in float64. The
package is laid out by concept; this module re-exports the public names:

- ``formulas/``: every formula (pure functions and frozen values), one module per scheme or concept;
- ``checks/``: every input check and every error message (``checks.validation``: the generic ones);
- ``hf/``: reading Hugging Face configs into tokenpos arguments;
- ``errors`` (exception classes), ``plan`` (what one ``TransformerEmbedding`` call does),
  ``registry`` (the positional-scheme registry), ``checkpoint`` (safetensors checkpoint IO).

Imports run one way: ``hf`` -> ``formulas`` -> ``checks`` -> ``errors`` (``checks.embedding`` also
reads ``registry``); a check never imports a formula, a formula never reads an HF config.
"""

from tokenpos.tables.errors import ConfigError, DtypeError, PositionError, StateDictError, TokenIdError
from tokenpos.tables.formulas.alibi import alibi_bias, alibi_distances, alibi_slopes
from tokenpos.tables.formulas.attention import causal_keep_mask
from tokenpos.tables.formulas.dropout import dropout_keep_mask
from tokenpos.tables.formulas.init import INIT_SCHEMES, init_weight, resolve_rng
from tokenpos.tables.formulas.packing import cu_seqlens_from_positions, positions_from_cu_seqlens
from tokenpos.tables.formulas.rope import (
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
from tokenpos.tables.formulas.rope_scaling import ROPE_INIT_FUNCTIONS, normalize_rope_scaling
from tokenpos.tables.formulas.rope_state import RopeFrequencies
from tokenpos.tables.formulas.sinusoidal import sinusoidal_encoding, sinusoidal_inv_freq, sinusoidal_table
from tokenpos.tables.formulas.t5 import (
    t5_bias,
    t5_bias_backward,
    t5_bucket_matrix,
    t5_relative_bucket,
    t5_relative_positions,
)
from tokenpos.tables.hf.rope import rope_kwargs_from_hf_config

__all__ = [
    "ROPE_INIT_FUNCTIONS",
    "RopeFrequencies",
    "alibi_bias",
    "alibi_distances",
    "alibi_slopes",
    "causal_keep_mask",
    "cu_seqlens_from_positions",
    "normalize_rope_scaling",
    "permute_qk_weight",
    "positions_from_cu_seqlens",
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
