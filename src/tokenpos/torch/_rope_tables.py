"""The cos / sin tables of the torch RoPE layer (``tokenpos.torch.rotary.RotaryEmbedding``): which
frequencies serve a call, the (P, F) cache, and dynamic NTK on a device. The layer subclasses
:class:`RopeTables` and adds the rotation (its positions, the op calls, the packed path).

Shapes: L length, R rotary dim, F = R / 2, P cached positions; cos / sin (..., F), one entry per rotated
pair (``cos_sin_range`` / ``cos_sin_positions``: (..., R) in the layout).

Precision: frequencies come from ``tokenpos.tables`` (float64); angles, cos and sin are computed in
float64 (float32 on MPS, which has no float64), times the attention factor, and cast to the input
dtype for float32 / float64 inputs (as HF does) and to float32 for bf16 / fp16 inputs, which the op
rotates in float32 and rounds once. So bf16 inputs at position 1,000,000 still get accurate angles, not bf16 ones
(whose positions are multiples of 4096 there).

Cache: ``cos_cached`` / ``sin_cached`` (P, F) non-persistent buffers, one entry per rotated pair, for
positions [0, P); replaced (never written into) when its key changes (R, base, layout, attention
factor, the frozen scaling and the frequency variant) or when a call needs more rows (eager mode).
The variant (``tables.formulas.rope_state.rope_variant``, from the layer's frozen ``RopeState``) and the rows of
one call are taken together under a lock, and the new state kept, so threads sharing a layer never mix
frequencies. Calls with ``positions=None`` slice the cache; explicit position tensors are
computed from the formula (same numbers). Under ``torch.compile`` nothing is mutated. Static scalings
and longrope run under ``fullgraph=True``; ``dynamic`` keeps HF's state in Python and reads
``max(positions)`` on the CPU in eager mode (see below for the device and compiled path).

Dynamic NTK on another device (CUDA), and under ``torch.compile``: nothing is read on the host. HF's
state (the length the frequencies were made for) is the 0-d int64 buffer ``dynamic_len``, updated in
place by tensor ops from ``max(positions) + 1`` (growth, and the reset below
``max_position_embeddings``, as ``tables.formulas.rope_state.rope_variant``), and the frequencies are
recomputed from it there (:func:`dynamic_inv_freq_torch`, the formula of
``tables.formulas.rope_scaling._compute_dynamic``); cos / sin come from the formula (no cache). The
buffer is the one state: the eager CPU path reads it (a CPU scalar) and writes its changes back, so
compiled and eager calls, and a layer moved between devices, go on from where the last call left it.
"""

from __future__ import annotations

import contextlib
import copy
import threading
from typing import Any

import numpy as np
import torch

from tokenpos.tables.checks.validation import check_start_pos
from tokenpos.tables.formulas.rope import rope_angles
from tokenpos.tables.formulas.rope_scaling import freeze_rope_scaling
from tokenpos.tables.formulas.rope_state import RopeFrequencies, rope_cache_rows, rope_variant
from tokenpos.torch._checks import calc_dtype as _calc_dtype
from tokenpos.torch._checks import is_compiling
from tokenpos.torch._rotary_base import RotaryBase


class RopeTables(RotaryBase):
    """cos / sin of a RoPE layer for a call's positions (see the module docstring). The layer sets its
    settings (``freqs`` from ``tables.formulas.rope_state.rotary_frequencies``, ``max_seq_len``,
    ``interleaved``, ``base``, ``rotary_dim``, ``scaling``, ``attention_factor``, ``rope_type``), then calls
    :meth:`_init_tables` and ``reset_parameters``.

    Shape:
        cos_sin_range(start, L) -> cos, sin (L, R); cos_sin_positions(pos (...)) -> cos, sin (..., R).
    """

    freqs: RopeFrequencies
    max_seq_len: int
    interleaved: bool
    base: float
    rotary_dim: int
    scaling: dict[str, Any]
    attention_factor: float
    rope_type: str

    # -- state and buffers -----------------------------------------------------------------------
    def _init_tables(self, device: Any) -> None:
        """The lock, HF's dynamic state, the empty non-persistent buffers on ``device`` (``inv_freq``,
        ``long_inv_freq``, ``cos_cached`` / ``sin_cached`` (0, F), and dynamic NTK's 0-d ``dynamic_len``) and
        the memos; ``reset_parameters`` fills the buffers. Called by the layer's constructor once its
        settings are set."""
        self._lock = threading.RLock()
        self._rope_state = self.freqs.initial_state         # HF's dynamic state: a frozen value, swapped under the lock
        self.long_inv_freq: torch.Tensor
        self.cos_cached: torch.Tensor
        self.sin_cached: torch.Tensor
        f = self.rotary_dim // 2
        self._register_empty(device, inv_freq=((0,), None), long_inv_freq=((0,), None),
                             cos_cached=((0, f), None), sin_cached=((0, f), None))
        self.dynamic_len: torch.Tensor                      # dynamic NTK: HF's max_seq_len_cached, on the device
        if self.rope_type == "dynamic":
            self.register_buffer("dynamic_len", torch.full((), self.max_seq_len, dtype=torch.int64,
                                                           device=self.inv_freq.device), persistent=False)
        self._cache_key: tuple[Any, ...] | None = None
        self._rows_memo: tuple[Any, ...] | None = None     # (dtype, rows, cos, sin, factor): :meth:`_rows`
        self._cast_memo: tuple[Any, ...] | None = None    # (cos_cached, dtype, cos, sin) cast once per build
        self._scaling_memo: tuple[Any, ...] | None = None  # (copy of scaling, its frozen key)

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__() if hasattr(super(), "__getstate__") else dict(self.__dict__)
        state = dict(state)
        state.pop("_lock", None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        self._lock = threading.RLock()

    def _guard(self) -> Any:
        """The lock in eager mode; nothing under torch.compile (which mutates no state)."""
        return contextlib.nullcontext() if is_compiling() else self._lock

    def _load_tables(self) -> None:
        """(Re)compute the frequencies and the cache from ``tokenpos.tables`` in float64, and start HF's dynamic
        state afresh (a layer made on the meta device, then ``to_empty``, held an uninitialised ``dynamic_len``)."""
        self._rope_state = self.freqs.initial_state
        if self.rope_type == "dynamic":
            self.dynamic_len.fill_(self.max_seq_len)
        self.inv_freq = self._table(self.freqs.original_inv_freq)
        self.long_inv_freq = self.inv_freq.new_empty((0,)) if self.freqs.long_inv_freq is None \
            else self._table(self.freqs.long_inv_freq)
        variant, inv_np, _ = self._variant(self.max_seq_len, mutate=False)
        assert inv_np is not None
        self._build(variant, inv_np, self.max_seq_len)

    def _build(self, variant: tuple[Any, ...], inv_freq: np.ndarray, n: int) -> None:
        """Replace (never write into) the cache: rows [0, n) of cos / sin, (n, F), times the factor."""
        ang = rope_angles(np.arange(n), inv_freq)
        dev, calc = self.inv_freq.device, _calc_dtype(self.inv_freq.device)
        self.cos_cached = torch.from_numpy(np.cos(ang) * self.attention_factor).to(dev, calc)
        self.sin_cached = torch.from_numpy(np.sin(ang) * self.attention_factor).to(dev, calc)
        self._cache_key = self._key(variant)
        self._rows_memo = None

    def _variant(self, need: int | torch.Tensor, mutate: bool = True
                 ) -> tuple[tuple[Any, ...], np.ndarray | None, torch.Tensor]:
        """(variant key, inv_freq (F,) float64 NumPy, the same as a tensor) for a call needing ``need`` rows,
        chosen by ``tables.formulas.rope_state.rope_variant``; keeps the new state unless ``mutate`` is False.

        ``need`` may be a 0-d tensor: longrope then chooses on the device with ``torch.where`` (nothing is
        read, so torch.compile traces it; no NumPy frequencies: None); dynamic reads it (eager CPU calls
        only: on a device and under torch.compile :meth:`_dynamic_on_device` serves dynamic instead).
        The state is ``dynamic_len``'s, which the tensor path may have moved: read first (a CPU scalar).
        """
        if self.rope_type == "dynamic" and not is_compiling() and self.dynamic_len.is_cpu:
            n = int(self.dynamic_len)                    # the tensor path (compiled calls, a device) may have moved it
            if n != self._rope_state.max_seq_len_cached:
                self._rope_state = rope_variant(self.freqs, n, self.freqs.initial_state)[2]
        key, which, state = rope_variant(self.freqs, need, self._rope_state)
        if mutate and state is not self._rope_state:
            self._rope_state = state
            if self.rope_type == "dynamic" and not self.dynamic_len.is_meta and not is_compiling():
                self.dynamic_len.fill_(state.max_seq_len_cached)
        if isinstance(which, torch.Tensor):
            return key, None, torch.where(which, self.long_inv_freq, self.inv_freq)
        inv_np = self.freqs.inv_freq_for(which, state)
        inv_t = {"original": self.inv_freq, "long": self.long_inv_freq}.get(which)
        return key, inv_np, self._table(inv_np) if inv_t is None else inv_t

    def _on_device_dynamic(self) -> bool:
        """Dynamic NTK by tensor ops (module doc): on a non-CPU device, and under torch.compile (which
        cannot branch on a position's value)."""
        return (self.rope_type == "dynamic" and not self.inv_freq.is_meta
                and (not self.inv_freq.is_cpu or is_compiling()))

    def _dynamic_on_device(self, need: torch.Tensor | int) -> torch.Tensor:
        """HF's dynamic update for a call needing rows [0, need) (``need`` a 0-d int tensor, or an int),
        by tensor ops on the device: the state ``dynamic_len`` is updated in place (growth past it;
        back to ``max_position_embeddings`` when a call needs fewer after a growth, as
        ``rope_variant``), and the (F,) frequencies for it are returned. Nothing is read on the host."""
        dev = self.dynamic_len.device
        if not isinstance(need, torch.Tensor):
            need = torch.full((), int(need), dtype=torch.int64, device=dev)
        need = need.to(torch.int64)
        m = self.freqs.max_position_embeddings
        grown = torch.maximum(self.dynamic_len, need)                          # growth
        cached = torch.where((need < m) & (grown > m), m, grown)              # reset
        self.dynamic_len.copy_(cached)
        return dynamic_inv_freq_torch(cached, self.freqs)

    def _key(self, variant: tuple[Any, ...]) -> tuple[Any, ...]:
        return (self.rotary_dim, self.base, self.interleaved, self.attention_factor, self._scaling_key(), variant)

    def _scaling_key(self) -> tuple[Any, ...]:
        """``freeze_rope_scaling(self.scaling)``, recomputed only when the dict no longer equals a
        (deep) copy of the one it was computed from (a dict comparison instead of a sort per call)."""
        memo = getattr(self, "_scaling_memo", None)
        if memo is None or memo[0] != self.scaling:
            memo = self._scaling_memo = (copy.deepcopy(self.scaling), freeze_rope_scaling(self.scaling))
        return memo[1]  # type: ignore[no-any-return]

    # -- cos / sin (one entry per rotated pair: (..., F)) ------------------------------------------
    def _formula(self, pos: torch.Tensor, inv_freq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        ang = pos.to(inv_freq.dtype)[..., None] * inv_freq                 # (..., F)
        return torch.cos(ang) * self.attention_factor, torch.sin(ang) * self.attention_factor

    def _expand(self, t: torch.Tensor) -> torch.Tensor:
        """(..., F) -> (..., R) in the layout."""
        return t.repeat_interleave(2, dim=-1) if self.interleaved else torch.cat((t, t), dim=-1)

    def _cover(self, need: int, seq_len: int | None = None) -> torch.Tensor | None:
        """Pick the variant for a call needing rows [0, need) and make the cache hold them.

        Returns None when the cache covers them (grown or rebuilt as needed), else the inverse
        frequencies to compute the rows from the formula (under torch.compile, or far positions).
        """
        variant, inv_np, inv_t = self._variant(max(need, seq_len or 0))
        same_key, rows = self._key(variant) == self._cache_key, self.cos_cached.shape[0]
        n = rope_cache_rows(need, rows, same_key, self.max_seq_len)
        if same_key and n == rows:
            return None
        if n is None or is_compiling() or inv_np is None:              # no mutation: the formula
            return inv_t
        self._build(variant, inv_np, n)                                # grow (doubling) or rebuild for a new key
        return None

    def _cached_as(self, dtype: torch.dtype | None) -> tuple[torch.Tensor, torch.Tensor]:
        """The cached (P, F) cos / sin in ``dtype`` (None: as cached), cast once per cache build and
        kept beside it (two conversions per call cost as much as the rest of the layer's Python)."""
        cos, sin = self.cos_cached, self.sin_cached
        if dtype is None or dtype == cos.dtype:
            return cos, sin
        if is_compiling():
            return cos.to(dtype), sin.to(dtype)
        memo = getattr(self, "_cast_memo", None)
        if memo is None or memo[0] is not cos or memo[1] != dtype:       # rebuilt, moved, or another dtype
            memo = self._cast_memo = (cos, dtype, cos.to(dtype), sin.to(dtype))
        return memo[2], memo[3]

    def _rows(self, start: int, length: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin (L, F) in ``dtype`` (the op's table dtype) for positions ``start + arange(length)``: views of
        the cached table, cast once (:meth:`_cached_as`), when one static frequency variant serves every position
        and the cache holds the rows (kept as ``_rows_memo`` beside the cache, with the attention factor it was made
        for: a call then reads one attribute and slices); otherwise :meth:`_pairs_range` (the variant, the cache
        grown or rebuilt, the formula), after which the memo is refreshed."""
        memo = self._rows_memo
        end = start + length
        if (memo is not None and memo[0] is dtype and end <= memo[1] and memo[4] == self.attention_factor
                and not torch.compiler.is_compiling()):
            return memo[2][start:end], memo[3][start:end]
        cos, sin = self._pairs_range(start, length, None, dtype)
        if not (self.freqs.length_dependent or self.rope_type == "dynamic" or is_compiling()):
            with self._guard():
                self._rows_memo = (dtype, self.cos_cached.shape[0], *self._cached_as(dtype), self.attention_factor)
        return cos, sin

    def _apply(self, fn: Any, recurse: bool = True) -> Any:
        self._rows_memo = None                            # the cache buffers are replaced: rebuild the memo
        return super()._apply(fn, recurse)

    def _pairs_range(self, start: int, length: int, seq_len: int | None, dtype: torch.dtype | None = None
                     ) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin (L, F) for positions ``start + arange(length)`` (Python ints), variant and rows in one
        step; cached rows come in ``dtype`` when given (the op's table dtype), else as cached."""
        start = check_start_pos(start, length)                       # beyond int64: PositionError
        need = start + length
        if self._on_device_dynamic():                                   # the device's state, the formula
            with self._guard():
                inv_d = self._dynamic_on_device(max(need, seq_len or 0))
            return self._formula(torch.arange(start, need, device=self.inv_freq.device), inv_d)
        with self._guard():
            inv_t = self._cover(need, seq_len)
            if inv_t is None:
                cos, sin = self._cached_as(dtype)
                if start == 0 and need == cos.shape[0]:          # the whole cache: no slicing
                    return cos, sin
                return cos[start:need], sin[start:need]
        return self._formula(torch.arange(start, need, device=self.inv_freq.device), inv_t)

    def _pairs_positions(self, pos: torch.Tensor, need: torch.Tensor | int | None
                         ) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin (..., F) for an int tensor of positions (...), from the formula; ``need`` (default
        ``max(pos) + 1``, a tensor: not read by longrope) picks the variant."""
        if need is None:
            need = pos.max() + 1 if self.freqs.length_dependent and pos.numel() else 0
        elif isinstance(need, torch.Tensor):
            need = need.to(pos.device)
        if self._on_device_dynamic():                                   # nothing read on the host
            return self._formula(pos, self._dynamic_on_device(need))
        return self._formula(pos, self._variant(need)[2])

    def cos_sin_range(self, start: int, length: int, seq_len: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin (L, R) in float64, in the layout, for positions ``start + arange(length)``."""
        cos, sin = self._pairs_range(start, length, seq_len)
        return self._expand(cos), self._expand(sin)

    def cos_sin_positions(self, pos: torch.Tensor, need: torch.Tensor | int | None = None
                          ) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin (..., R) in float64, in the layout, for an int tensor of positions (...).

        ``need`` (default ``max(pos) + 1``) selects the longrope / dynamic variant.
        """
        with self._guard():
            cos, sin = self._pairs_positions(pos, need)
        return self._expand(cos), self._expand(sin)


def dynamic_inv_freq_torch(length: torch.Tensor, freqs: Any) -> torch.Tensor:
    """Dynamic NTK's (F,) inverse frequencies for the 0-d int ``length`` (>= max_position_embeddings
    M), in float64 on its device (float32 on MPS): the formula of
    ``tables.formulas.rope_scaling._compute_dynamic`` in tensor ops, so nothing is read on the host.

        base' = base * (factor * S / M - (factor - 1)) ** (R / (R - 2)),  S = max(length, M)
        inv_freq = 1 / base' ** (arange(0, R, 2) / R)
    """
    calc = _calc_dtype(length.device)
    R, m = freqs.rotary_dim, float(freqs.max_position_embeddings)
    factor = float(freqs._params["factor"])
    s = length.to(calc).clamp_min(m)
    base = freqs.base * ((factor * s / m) - (factor - 1.0)) ** (R / (R - 2))
    return 1.0 / torch.pow(base, torch.arange(0, R, 2, dtype=calc, device=length.device) / R)
