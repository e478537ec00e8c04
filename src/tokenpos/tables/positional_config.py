"""The validated, backend-neutral description of a positional scheme.

`TransformerEmbedding` builds one `PositionalConfig` from its keyword arguments and hands it to the
builder registered for its ``positional`` kind (``numpy/schemes.py`` / ``torch/schemes.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class PositionalConfig:
    """Everything any positional scheme may need.

    Attributes:
        d_model: D, the embedding width (additive schemes produce (..., D)).
        max_seq_len: rows of a learned table; cache size hint for rotary; max_distance hint.
        base: the sinusoidal / rotary wavelength base.
        sinusoidal_layout: "interleaved" (Vaswani) or "half" ([sin | cos], HF Marian).
        num_heads: H for bias schemes (alibi, t5) and for deriving head_dim.
        head_dim: Dh for rotary (default d_model // num_heads).
        rope_scaling: an HF-style scaling dict ({"rope_type": "yarn", "factor": 4.0, ...}) or None.
        rope_interleaved: rotary layout, False = half-split (HF/NeoX), True = interleaved (GPT-J/Meta).
        rotary_dim: R <= Dh, the rotated part (partial rotary); None = Dh.
        t5_num_buckets, t5_max_distance, t5_bidirectional: T5 relative-bias settings.
        position_padding_idx: a learned table's row that stays zero and gets no gradient (RoBERTa's
            padding position; set by TransformerEmbedding when position_ids="padding").
        init, std: init scheme for learned tables.
        dtype: the parameter / output dtype (a NumPy dtype; torch builders translate it).
        rng: the generator for initialisation (NumPy backend) or None.
    """

    d_model: int
    max_seq_len: int
    base: float = 10000.0
    sinusoidal_layout: str = "interleaved"
    num_heads: int | None = None
    head_dim: int | None = None
    rope_scaling: dict[str, Any] | None = None
    rope_interleaved: bool = False
    rotary_dim: int | None = None
    t5_num_buckets: int = 32
    t5_max_distance: int = 128
    t5_bidirectional: bool = True
    position_padding_idx: int | None = None
    init: str = "normal"
    std: float = 0.02
    dtype: Any = np.float32
    rng: Any = None
    device: Any = None

    def resolved_head_dim(self) -> int:
        """Dh: ``head_dim`` if given, else ``d_model // num_heads``; ConfigError if neither fits."""
        from tokenpos.tables.errors import ConfigError

        if self.head_dim is not None:
            return int(self.head_dim)
        if self.num_heads is None:
            raise ConfigError("positional='rope' needs num_heads= or head_dim=; got neither")
        if self.d_model % self.num_heads:
            raise ConfigError(
                f"d_model {self.d_model} is not divisible by num_heads {self.num_heads}; pass head_dim= explicitly"
            )
        return self.d_model // self.num_heads

    def resolved_num_heads(self, kind: str) -> int:
        from tokenpos.tables.errors import ConfigError

        if self.num_heads is None:
            raise ConfigError(f"positional={kind!r} needs num_heads=; got None")
        return int(self.num_heads)
