"""The frequency settings of a rotary layer and the variant choice (static / longrope / dynamic NTK).

Shared by both backends' ``RotaryEmbedding`` (pure Python + NumPy; no backend import). Nothing here
changes after it is built: :class:`RopeFrequencies` is frozen, the dynamic-NTK state is a frozen
:class:`RopeState` value that :func:`rope_variant` takes and returns, and the layers keep the current
one (under their lock). Shapes: Dh head dim, R rotary dim, F = R / 2 frequencies. Reading the
settings from an HF config: ``tables.hf.rope.rope_kwargs_from_hf_config``.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tokenpos.tables.checks.rope import check_rotary_dim
from tokenpos.tables.checks.validation import check_float, check_int
from tokenpos.tables.errors import ConfigError
from tokenpos.tables.formulas.rope import resolve_rope_base, rope_inv_freq
from tokenpos.tables.formulas.rope_scaling import FULL_WIDTH_TYPES, LENGTH_DEPENDENT_TYPES, normalize_rope_scaling

__all__ = ["CACHE_GROWTH_LIMIT", "RopeFrequencies", "RopeState", "rope_cache_rows", "rope_variant",
           "rotary_frequencies"]

# Positions up to this many times max_seq_len grow a layer's cos/sin cache; larger ones are computed directly.
CACHE_GROWTH_LIMIT = 16


def _frozen(a: np.ndarray) -> np.ndarray:
    a = np.array(a, dtype=np.float64)
    a.setflags(write=False)
    return a


# ----------------------------------------------------------------------------------------------
# Settings (frozen) and state (a frozen value the layers keep)
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class RopeState:
    """HF's ``dynamic_rope_update`` state, as a value: the length the frequencies were made for
    (HF's ``max_seq_len_cached``) and those frequencies (F,) float64, read-only.

    Only "dynamic" ever moves it; for every other type it stays the initial one
    (``max_position_embeddings``, the original frequencies).
    """

    max_seq_len_cached: int
    inv_freq: np.ndarray = field(repr=False)


@dataclass(frozen=True, eq=False, init=False)
class RopeFrequencies:
    """The frozen frequency settings of a RoPE layer: which scaling, and every (F,) array it can use.

    - static types (default, linear, yarn, llama3, proportional): ``original_inv_freq`` always.
    - ``longrope``: ``long_inv_freq`` when a call needs more than ``original_max_position_embeddings``
      positions, else the short (original) ones.
    - ``dynamic``: HF's ``dynamic_rope_update``, through the :class:`RopeState` a layer keeps.

    :func:`rope_variant` makes that choice; this object never changes.

    Attributes:
        params (a copy of) the normalised scaling dict; base: the resolved base; rotary_dim: R;
        rope_type; max_position_embeddings; attention_factor: HF's cos/sin multiplier;
        original_inv_freq: (F,) float64; long_inv_freq: (F,) float64 (longrope) or None;
        initial_state: the :class:`RopeState` of a fresh layer. Arrays are read-only.
    """

    max_position_embeddings: int
    base: float
    rotary_dim: int
    rope_type: str
    attention_factor: float
    original_inv_freq: np.ndarray = field(repr=False)
    long_inv_freq: np.ndarray | None = field(repr=False)
    initial_state: RopeState = field(repr=False)
    _params: dict[str, Any] = field(repr=False)

    def __init__(self, head_dim: int, *, base: float = 10000.0, scaling: Any = None,
                 max_position_embeddings: int = 2048, rotary_dim: int | None = None) -> None:
        max_pos = check_int("max_seq_len", max_position_embeddings, minimum=1)
        params = normalize_rope_scaling(scaling, max_position_embeddings=max_pos)
        base = resolve_rope_base(base, params)
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
        rotary_dim = check_rotary_dim(head_dim, rotary_dim)
        params.pop("rope_theta", None)
        put = object.__setattr__
        put(self, "max_position_embeddings", max_pos)
        put(self, "base", base)
        put(self, "rotary_dim", rotary_dim)
        put(self, "rope_type", params["rope_type"])
        put(self, "_params", params)
        inv, attention_factor = self._compute(None)
        put(self, "original_inv_freq", _frozen(inv))
        put(self, "attention_factor", attention_factor)
        long = None
        if self.rope_type == "longrope":                 # HF: seq_len = original + 1 picks the long factors
            long = _frozen(self._compute(int(params["original_max_position_embeddings"]) + 1)[0])
        put(self, "long_inv_freq", long)
        put(self, "initial_state", RopeState(max_pos, self.original_inv_freq))

    @property
    def params(self) -> dict[str, Any]:
        """A copy of the normalised scaling dict (without ``rope_theta``)."""
        return copy.deepcopy(self._params)

    @property
    def length_dependent(self) -> bool:
        """Whether the frequencies of a call depend on the positions it needs (longrope, dynamic)."""
        return self.rope_type in LENGTH_DEPENDENT_TYPES

    def _compute(self, seq_len: int | None) -> tuple[np.ndarray, float]:
        return rope_inv_freq(self.rotary_dim, base=self.base, scaling=self._params,
                             max_position_embeddings=self.max_position_embeddings, seq_len=seq_len)

    def inv_freq_for(self, which: str, state: RopeState) -> np.ndarray:
        """The (F,) float64 frequencies named by ``which`` of :func:`rope_variant`: "original", "long", "dynamic"."""
        if which == "long":
            assert self.long_inv_freq is not None
            return self.long_inv_freq
        return state.inv_freq if which == "dynamic" else self.original_inv_freq


# ----------------------------------------------------------------------------------------------
# The variant choice: written once, for both backends
# ----------------------------------------------------------------------------------------------


_STATIC = ("static",)


def rope_variant(freqs: RopeFrequencies, need: Any, state: RopeState) -> tuple[tuple[Any, ...], Any, RopeState]:
    """``(key, which, new_state)``: which frequencies serve a call whose positions are ``[0, need)``, as HF
    chooses them.

    Pure: ``state`` (the layer's current :class:`RopeState`) is not changed; ``new_state`` (``state``
    itself when nothing changed) is for the layer to keep, under its lock, together with what it
    builds from the variant, so concurrent calls never see half an update.

    key: names the variant (it goes into cos/sin cache keys). which: the frequencies serving the call,
    "original", "long" (longrope's long factors) or "dynamic" (``new_state.inv_freq``); see
    :meth:`RopeFrequencies.inv_freq_for`.

    - static types: ``("static",)``, "original".
    - ``longrope``: ``("longrope", "long")``, "long" when ``need > original_max_position_embeddings``,
      else ``("longrope", "short")``, "original". ``need`` may be a 0-d integer tensor: ``which`` is then
      the boolean tensor ``need > original_max_position_embeddings`` (True: long), never read, so a
      traced call (torch.compile) does not depend on data; the key's variant is then None.
    - ``dynamic`` (HF's ``dynamic_rope_update``): ``("dynamic", max_seq_len_cached)``, "dynamic". When
      ``need`` exceeds the cached length, the frequencies are recomputed for ``need`` (growth); when a call
      needs fewer than ``max_position_embeddings`` positions after a growth, the original ones come
      back (reset). ``need`` is read (an int).
    """
    rope_type = freqs.rope_type
    if rope_type == "longrope":
        long = need > int(freqs._params["original_max_position_embeddings"])
        if isinstance(long, (bool, np.bool_)):
            return ("longrope", "long" if long else "short"), "long" if long else "original", state
        return ("longrope", None), long, state
    if rope_type == "dynamic":
        need = int(need)
        cached, inv = state.max_seq_len_cached, state.inv_freq
        if need > cached:                                            # growth
            cached, inv = need, _frozen(freqs._compute(need)[0])
        if need < freqs.max_position_embeddings < cached:            # reset
            cached, inv = freqs.max_position_embeddings, freqs.original_inv_freq
        if cached != state.max_seq_len_cached:
            state = RopeState(cached, inv)
        return ("dynamic", cached), "dynamic", state
    return _STATIC, "original", state


def rope_cache_rows(need: int, rows: int, same_key: bool, max_seq_len: int) -> int | None:
    """How many rows ``[0, n)`` a layer's cos/sin cache should hold for a call needing rows ``[0, need)``.

    ``rows`` (keep it) when the cache has the call's variant (``same_key``) and covers it; None when
    ``need`` is beyond ``CACHE_GROWTH_LIMIT * max_seq_len`` (compute those rows from the formula, cache
    nothing); else a new size: at least ``max_seq_len``, doubling the rows of the same variant.
    """
    if same_key and need <= rows:
        return rows
    if need > CACHE_GROWTH_LIMIT * max_seq_len:
        return None
    return max(need, 2 * rows if same_key else 0, max_seq_len)


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
