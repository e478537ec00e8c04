"""The frequency state of a rotary layer, and reading RoPE settings from an HF config.

Shared by both backends' ``RotaryEmbedding`` (pure Python + NumPy; no backend import).
Shapes: Dh head dim, R rotary dim, F = R / 2 frequencies.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tokenpos.tables.errors import ConfigError
from tokenpos.tables.rope import check_rotary_dim, resolve_rope_base, rope_inv_freq
from tokenpos.tables.rope_hf_config import rope_kwargs_from_hf_config
from tokenpos.tables.rope_scaling import FULL_WIDTH_TYPES, normalize_rope_scaling
from tokenpos.tables.validation import check_float, check_int

__all__ = ["RopeFrequencies", "rope_kwargs_from_hf_config", "rotary_frequencies"]

# ----------------------------------------------------------------------------------------------
# Frequency state of a rotary layer (shared by both backends)
# ----------------------------------------------------------------------------------------------


class RopeFrequencies:
    """Which inverse frequencies serve a call that needs positions ``[0, seq_len)``, as HF does.

    - static types (default, linear, yarn, llama3): always the same (F,) array.
    - ``longrope``: the long factors when ``seq_len > original_max_position_embeddings``, else short.
    - ``dynamic``: HF's ``dynamic_rope_update``: recompute for ``seq_len`` when it grows beyond the
      length the current frequencies were made for; reset to the original ones when a call needs
      fewer than ``max_position_embeddings`` positions again. This is state, kept here in NumPy.

    Attributes:
        params: the normalised scaling dict; base: the resolved base; rotary_dim: R;
        attention_factor: HF's cos/sin multiplier; original_inv_freq: (F,) float64 at construction.
    """

    def __init__(self, head_dim: int, *, base: float = 10000.0, scaling: Any = None,
                 max_position_embeddings: int = 2048, rotary_dim: int | None = None) -> None:
        self.max_position_embeddings = check_int("max_seq_len", max_position_embeddings, minimum=1)
        params = normalize_rope_scaling(scaling, max_position_embeddings=self.max_position_embeddings)
        self.base = resolve_rope_base(base, params)
        head_dim = check_int("head_dim", head_dim, minimum=2)
        prf = params.pop("partial_rotary_factor", None)
        if prf is not None and params["rope_type"] in FULL_WIDTH_TYPES:     # p-RoPE: R = Dh, factor inside
            params["partial_rotary_factor"] = check_float("rope_scaling['partial_rotary_factor']", prf, low=0.0,
                                                          high=1.0, low_inclusive=False)
        elif prf is not None:
            prf = check_float("rope_scaling['partial_rotary_factor']", prf, low=0.0, high=1.0, low_inclusive=False)
            from_prf = int(head_dim * prf)
            if rotary_dim is not None and rotary_dim != from_prf:
                raise ConfigError(f"rotary_dim={rotary_dim} conflicts with rope_scaling['partial_rotary_factor']={prf} "
                                  f"(int({head_dim} * {prf}) = {from_prf}); give one of them")
            rotary_dim = from_prf
        self.rotary_dim = check_rotary_dim(head_dim, rotary_dim)
        params.pop("rope_theta", None)
        self.params = params
        self.rope_type: str = params["rope_type"]
        self.original_inv_freq, self.attention_factor = self._compute(None)
        self._current = self.original_inv_freq
        self.max_seq_len_cached = self.max_position_embeddings   # HF's name, used by "dynamic"
        self._long: np.ndarray | None = None

    def _compute(self, seq_len: int | None) -> tuple[np.ndarray, float]:
        return rope_inv_freq(self.rotary_dim, base=self.base, scaling=self.params,
                             max_position_embeddings=self.max_position_embeddings, seq_len=seq_len)

    def select(self, seq_len: int, *, mutate: bool = True) -> tuple[tuple[Any, ...], np.ndarray]:
        """``(variant_key, inv_freq (F,))`` for a call whose largest position is ``seq_len - 1``.

        The key names the variant (it goes into cos/sin cache keys); for "dynamic" it also updates
        the state exactly as HF's ``dynamic_frequency_update`` does (unless ``mutate`` is False).
        The new state is computed first and then assigned in one step; the layers call this under
        their lock, so concurrent calls never see half an update.
        """
        seq_len = int(seq_len)
        if self.rope_type == "longrope":
            if seq_len > int(self.params["original_max_position_embeddings"]):
                return ("longrope", "long"), self.long_inv_freq()
            return ("longrope", "short"), self.original_inv_freq
        if self.rope_type == "dynamic":
            current, cached = self._current, self.max_seq_len_cached
            if seq_len > cached:                                   # growth
                current, cached = self._compute(seq_len)[0], seq_len
            if seq_len < self.max_position_embeddings < cached:    # reset
                current, cached = self.original_inv_freq, self.max_position_embeddings
            if mutate:
                self._current, self.max_seq_len_cached = current, cached
            return ("dynamic", cached), current
        return ("static",), self.original_inv_freq

    def long_inv_freq(self) -> np.ndarray:
        """longrope's long-context frequencies (F,), computed once (HF: ``seq_len = original + 1``)."""
        if self._long is None:
            self._long = self._compute(int(self.params["original_max_position_embeddings"]) + 1)[0]
        return self._long

    @property
    def current_inv_freq(self) -> np.ndarray:
        """The (F,) frequencies of the current state (dynamic: the last grown ones; else the original)."""
        return self._current

    def peek(self, seq_len: int) -> tuple[tuple[Any, ...], np.ndarray]:
        """Like :meth:`select` but without changing any state (for tracing / inspection)."""
        return self.select(seq_len, mutate=False)


def rotary_frequencies(head_dim: Any, max_seq_len: Any, interleaved: Any, *, base: Any, scaling: Any,
                       rotary_dim: Any) -> tuple[int, int, bool, RopeFrequencies]:
    """The checks every ``RotaryEmbedding`` constructor makes, written once for both backends.

    Returns ``(head_dim, max_seq_len, interleaved, RopeFrequencies)``.
    """
    head_dim = check_int("head_dim", head_dim, minimum=2)
    max_seq_len = check_int("max_seq_len", max_seq_len, minimum=1)
    if not isinstance(interleaved, (bool, np.bool_)):
        raise ConfigError(f"interleaved must be True or False, got {interleaved!r}")
    freqs = RopeFrequencies(head_dim, base=base, scaling=scaling, max_position_embeddings=max_seq_len,
                            rotary_dim=rotary_dim)
    return head_dim, max_seq_len, bool(interleaved), freqs
