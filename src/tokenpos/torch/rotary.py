"""RotaryEmbedding (RoPE) for the torch backend: rotates q and k through the ``tokenpos::rope`` ops.

Shapes: B batch, H heads (q and k may differ, e.g. GQA), L length, Dh head dim, R rotary dim,
F = R / 2, P cached positions. q, k: (B, H, L, Dh) (or (B, L, H, Dh) with ``qk_layout="blhd"``);
positions: (L,), (1, L) or (B, L) integers.

Tables: cos / sin come from :class:`tokenpos.torch._rope_tables.RopeTables`, the base of the layer
(precision, the (P, F) cache, the frequency variant of each call, dynamic NTK on a device): calls with
``positions=None`` slice the cache, explicit positions are computed from the formula (same numbers),
and a packed row reads the cache at its positions (:func:`rotate_at_positions`).

Kernel: each call is one ``tokenpos::rope_qk`` op (q and k at the same positions) or ``tokenpos::rope``
per tensor (k at its own positions); the op picks the fused CPU kernel, Triton or plain torch, and
registers autograd (double backward included), fake tensors and vmap.
"""

from __future__ import annotations

from typing import Any

import torch

from tokenpos.tables.checks.rope import check_qk_layout, check_qk_lengths
from tokenpos.tables.checks.validation import check_int
from tokenpos.tables.formulas.rope_state import CACHE_GROWTH_LIMIT as CACHE_GROWTH_LIMIT
from tokenpos.tables.formulas.rope_state import rotary_frequencies
from tokenpos.tables.hf.rope import RopeFromHFConfig
from tokenpos.torch import ops
from tokenpos.torch._checks import resolve_dtype
from tokenpos.torch._rope_tables import RopeTables
from tokenpos.torch._rotary_base import to_bhld as to_bhld


class RotaryEmbedding(RopeTables, RopeFromHFConfig):
    """Rotary position embedding with every HF scaling (default, linear, dynamic, yarn, longrope, llama3).

    Args:
        head_dim: Dh.
        base: rope_theta.
        max_seq_len: rows precomputed in the cache; also HF's ``max_position_embeddings``.
        scaling: None or an HF ``rope_scaling`` / ``rope_parameters`` dict (see ``tables.rope_inv_freq``).
        interleaved: False = half-split pairs (HF / GPT-NeoX), True = adjacent pairs (Meta / GPT-J).
        rotary_dim: R (partial rotary); None = Dh.
        qk_layout: "bhld" = q, k are (B, H, L, Dh) (HF's unsqueeze_dim=1); "blhd" = (B, L, H, Dh)
            (unsqueeze_dim=2, flash-attention); "thd" = one packed row (T, H, Dh) (flash-attention's
            varlen layout): ``apply(q, k, cu_seqlens=cu)`` restarts the positions at 0 in every
            document (``positions_from_cu_seqlens``), then takes the per-token positions path.
        num_heads: H of q when known: q's head axis must equal it and k's must divide it.
        seed, rng: accepted for the common scheme signature; RoPE has no random state.
        device: where the cache lives. dtype: accepted for a uniform signature; outputs follow the
            input dtype and the tables stay float64.

    Threads: in eager mode the frequency variant and the cache rows of one call are taken together
    under a lock (the cache buffers are replaced, never written in place); the rotation runs outside.

    Shape:
        apply(q (B, Hq, L, Dh), k (B, Hk, L, Dh), positions (L,) | (1, L) | (B, L) | None) -> (q', k')
        (with qk_layout="blhd": (B, L, Hq, Dh), (B, L, Hk, Dh)).
    """

    kind = "rotary"
    name = "rope"
    packs = True

    def __init__(self, head_dim: int, *, base: float = 10000.0, max_seq_len: int = 2048, scaling: Any = None,
                 interleaved: bool = False, rotary_dim: int | None = None, qk_layout: str = "bhld",
                 num_heads: int | None = None, seed: Any = None, rng: Any = None, device: Any = None,
                 dtype: Any = None) -> None:
        super().__init__()
        resolve_dtype(dtype)                 # checked as the NumPy twin does; outputs follow the input dtype
        self.head_dim, self.max_seq_len, self.interleaved, self.freqs = rotary_frequencies(
            head_dim, max_seq_len, interleaved, base=base, scaling=scaling, rotary_dim=rotary_dim)
        self.qk_layout, self.num_heads = check_qk_layout(qk_layout, num_heads)
        self.base, self.rotary_dim = self.freqs.base, self.freqs.rotary_dim
        self.scaling = dict(self.freqs.params)
        self.attention_factor = self.freqs.attention_factor
        self.rope_type = self.freqs.rope_type
        self._init_tables(device)
        self.reset_parameters()

    @staticmethod
    def _start(start_pos: Any) -> int:
        """``check_int("start_pos", ...)`` with a shortcut for the common plain int (same result)."""
        return start_pos if type(start_pos) is int and start_pos >= 0 else check_int("start_pos", start_pos, minimum=0)

    @property
    def layout(self) -> str:
        """"interleaved" or "half"."""
        return "interleaved" if self.interleaved else "half"

    def _pairs_of(self, x: torch.Tensor, positions: Any, start_pos: Any, seq_len: int | None
                  ) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin (L, F) | (B, L, F) for x (B, H, L, Dh) at ``positions`` (default start_pos + arange(L))."""
        if positions is None:
            return self._pairs_range(self._start(start_pos), x.shape[2], seq_len,
                                     torch.float64 if x.dtype == torch.float64 else torch.float32)
        pos = self._positions(positions, start_pos, x.shape[0], x.shape[2])
        with self._guard():
            return self._pairs_positions(pos, seq_len)

    # -- rotation: one tokenpos::rope / rope_qk op call --------------------------------------------
    def apply(self, q: Any, k: Any = None, positions: Any = None, *, start_pos: Any = 0,  # type: ignore[override]
              key_positions: Any = None, cu_seqlens: Any = None) -> Any:
        """Rotate q and k at ``positions`` (default ``start_pos + arange(L)``); returns (q', k') with the input
        shapes and dtypes. The general forms (q alone, given positions, ``key_positions``, ``cu_seqlens``,
        ``apply(fn)``: :meth:`RotaryBase.apply`) are documented there.

        With ``cu_seqlens``: a packed row equals the same documents padded in a batch; it equals each document
        rotated alone except under a scaling that depends on the batch's longest position (dynamic NTK, longrope),
        where every document gets the frequencies of the row's largest position, as HF gives a padded batch.

        The default call reads top to bottom: q and k as (B, H, L, Dh) views (layout, dtype, heads checked),
        the cached cos / sin rows of ``start_pos .. start_pos + L`` (:meth:`_rows`), one ``tokenpos::rope_qk`` op.
        """
        if (positions is not None or key_positions is not None or cu_seqlens is not None
                or not isinstance(k, torch.Tensor) or not isinstance(q, torch.Tensor) or q.dtype != k.dtype):
            return super().apply(q, k, positions, start_pos=start_pos, key_positions=key_positions,
                                 cu_seqlens=cu_seqlens)
        layout = self.qk_layout
        q4 = to_bhld("q", q, self.head_dim, layout, self.num_heads)                  # (B, Hq, L, Dh) views
        k4 = to_bhld("k", k, self.head_dim, layout, self.num_heads)                  # (B, Hk, L, Dh)
        if q4.shape[0] != k4.shape[0] or q4.shape[2] != k4.shape[2]:
            check_qk_lengths(tuple(q4.shape), tuple(k4.shape), layout)                       # raises
        start = start_pos if type(start_pos) is int and start_pos >= 0 else check_int("start_pos", start_pos,
                                                                                       minimum=0)
        cos, sin = self._rows(start, q4.shape[2], torch.float64 if q.dtype == torch.float64 else torch.float32)
        q_out, k_out = ops.rotate_qk(q4, k4, cos, sin, self.interleaved)
        if layout == "bhld":
            return q_out, k_out
        return self._out(q_out), self._out(k_out)

    def rotate(self, x: torch.Tensor, positions: Any = None, *, start_pos: int = 0,
               seq_len: int | None = None) -> torch.Tensor:
        """Rotate one tensor x (B, H, L, Dh) at positions (L,) | (1, L) | (B, L) (default start_pos + arange(L);
        given positions are used as they are, so start_pos must then be 0, else ConfigError)."""
        x = self._check("x", x)
        cos, sin = self._pairs_of(x, positions, start_pos, seq_len)
        return self._out(ops.rotate(x, self._op_tables(cos, x), self._op_tables(sin, x), self.interleaved))

    def _rotate_packed(self, q: torch.Tensor, k: torch.Tensor, pos: torch.Tensor, end: int | None
                       ) -> tuple[torch.Tensor, torch.Tensor]:
        """q, k packed views (:func:`to_bhld`: (T, H, 1, Dh) or (1, H, T, Dh)) at the packed positions, of
        their (B, L), in [0, end): one op pass reading the cached (P, F) cos / sin at the positions
        (flash-attn's rotary cache; no per-call table), when one static frequency variant serves every
        position and the cache holds the first ``end`` rows (``end``: read on the CPU, T plus an int start_pos
        elsewhere, :func:`.packing.document_positions`). Otherwise
        (dynamic NTK, longrope, positions past the cache or not bounded on the host, q and k of two dtypes) the
        per-token formula path of :meth:`_rotate_bhld`."""
        if self.freqs.length_dependent or q.dtype != k.dtype or end is None:
            return self._rotate_bhld(q, k, pos, 0, None)
        tables = None
        with self._guard():
            if end <= self.cos_cached.shape[0] and self._cover(end) is None:
                tables = self._cached_as(torch.float64 if q.dtype == torch.float64 else torch.float32)
        if tables is None:
            return self._rotate_bhld(q, k, pos, 0, None)
        return ops.rotate_qk(q, k, *tables, self.interleaved, pos)  # type: ignore[no-any-return]

    def _rotate_bhld(self, q: torch.Tensor, k: torch.Tensor, positions: Any, start_pos: Any, key_positions: Any
                     ) -> tuple[torch.Tensor, torch.Tensor]:
        """q, k (B, H, L, Dh) rotated at positions (L,) | (1, L) | (B, L) (default start_pos + arange(L)).

        ``key_positions`` (Lk,) | (B, Lk) rotates k at other positions (a KV cache); by default k
        uses q's positions (one ``tokenpos::rope_qk`` call). One frequency variant serves both
        (chosen by the largest position). Given ``positions`` need ``start_pos=0`` (ConfigError otherwise).
        """
        if key_positions is None and q.dtype == k.dtype:
            check_qk_lengths(tuple(q.shape), tuple(k.shape), self.qk_layout)
            return self._rotate_pair(q, k, self._pairs_of(q, positions, start_pos, None), None, self.interleaved)
        pos_q, pos_k = self._qk_positions(q, k, positions, start_pos, key_positions)
        need = torch.maximum(pos_q.max(), pos_k.max()) + 1 \
            if self.freqs.length_dependent and pos_q.numel() and pos_k.numel() else 0
        with self._guard():                                              # one variant for q and k
            cq, sq = self._pairs_positions(pos_q, need)
            ck, sk = self._pairs_positions(pos_k, need)
        return self._rotate_pair(q, k, (cq, sq), (ck, sk), self.interleaved)

    def extra_repr(self) -> str:
        return (f"head_dim={self.head_dim}, rotary_dim={self.rotary_dim}, base={self.base}, "
                f"max_seq_len={self.max_seq_len}, rope_type={self.rope_type!r}, layout={self.layout!r}, "
                f"qk_layout={self.qk_layout!r}")
