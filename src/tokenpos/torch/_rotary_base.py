"""The rotation protocol shared by the torch RoPE-family layers (RoPE, M-RoPE, xPos, 2-D RoPE).

Shapes: B batch, H heads (q and k may differ, e.g. GQA), L length, Dh head dim, F rotated pairs,
T packed tokens. q, k: (B, H, L, Dh) (or (B, L, H, Dh) with ``qk_layout="blhd"``, or one packed row
(T, H, Dh) with ``qk_layout="thd"``, rotated as (1, H, T, Dh)).

Packed documents: ``cu_seqlens`` (N + 1,) on q's device gives positions restarting at 0 in every
document (``tokenpos.torch.packing``: tensor ops, no host sync), which then take the per-token
positions path of the layer; a layer whose positions are not one index per token (``packs = False``)
refuses it with ConfigError. A packed ``"thd"`` or ``"blhd"`` row is rotated as T rows of one token,
(T, H, 1, Dh) at positions (T, 1): its memory order, so nothing is copied (:func:`to_bhld`).

A layer defines ``_rotate_bhld(q, k, positions, start_pos, key_positions) -> (q', k')`` on
(B, H, L, Dh) views, already checked by :meth:`RotaryBase._qk` (the same protocol as the NumPy
``RotaryBase``, whose layers also return their backward cache), rotating through
:meth:`RotaryBase._rotate_pair`. This base adds ``apply`` / ``forward`` (``apply(fn)`` with one
callable stays ``nn.Module.apply``), the layout plumbing, and the non-persistent frequency buffers:
float64 (float32 on MPS), reloaded from ``tokenpos.tables`` when ``.half()`` / ``.to(dtype)`` cast them.

``positions`` None means ``start_pos + arange(L)``; given positions are used as they are, so
``start_pos`` must then be 0 (None for 2-D RoPE, whose default it is): anything else raises
ConfigError (``tables.checks.validation.check_start_pos_with_positions``), as in the NumPy twin.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from tokenpos.tables.checks.packing import check_packed_rotary_args
from tokenpos.tables.checks.rope import (
    check_heads,
    check_no_key_positions,
    check_packed_qk,
    check_positions_shape,
    check_qk_lengths,
    check_same_key_positions,
    one_head,
    rope_dtype_message,
    rope_layout_shape_message,
    rotary_packed_message,
)
from tokenpos.tables.checks.validation import check_start_pos, check_start_pos_with_positions
from tokenpos.tables.errors import ConfigError
from tokenpos.torch import ops
from tokenpos.torch._checks import calc_dtype, check_position_tensor
from tokenpos.torch._module import TokenposModule
from tokenpos.torch.packing import document_positions


def to_bhld(name: str, x: Any, head_dim: int, qk_layout: str, num_heads: int | None,
            packed: bool = False) -> torch.Tensor:
    """q or k in the declared layout -> a (B, H, L, Dh) view; float dtype and head count checked.

    A ``"thd"`` row (T, H, Dh) is one row of T tokens, (1, H, T, Dh). In a packed call (``packed``), the
    token-major layouts (``"thd"`` (T, H, Dh), ``"blhd"`` (1, T, H, Dh)) are T rows of one token, (T, H,
    1, Dh): their memory in its own order, so the op reads them with no copy, at positions (T, 1). A
    ``"bhld"`` tensor stays as it is (a non-contiguous one is copied by the op, as in any call).
    :meth:`RotaryBase._out` undoes each view.
    """
    if not isinstance(x, torch.Tensor) or x.dim() != (3 if qk_layout == "thd" else 4) or x.shape[-1] != head_dim:
        shape = tuple(x.shape) if isinstance(x, torch.Tensor) else tuple(np.shape(x))
        raise ConfigError(rope_layout_shape_message(name, shape, head_dim, qk_layout))
    if not x.is_floating_point():
        raise ConfigError(rope_dtype_message(name, str(x.dtype).replace("torch.", "")))
    if num_heads is not None:
        check_heads(name, tuple(x.shape), qk_layout, num_heads)
    if qk_layout == "thd":
        return x.unsqueeze(2) if packed else x.transpose(0, 1).unsqueeze(0)
    if qk_layout == "blhd":
        return x.permute(1, 2, 0, 3) if packed else x.transpose(1, 2)
    return x


class RotaryBase(TokenposModule):
    """apply / forward and the buffer plumbing of a layer rotating q and k (see the module docstring).

    Shape:
        apply(q (B, Hq, L, Dh), k (B, Hk, L, Dh), positions, ...) -> (q', k'), same shapes and dtypes.
    """

    head_dim: int
    qk_layout: str
    num_heads: int | None
    inv_freq: torch.Tensor
    packs = False                    # positions one index per token: cu_seqlens accepted (RotaryEmbedding)
    # packed attention rotates a layer that does not pack at the row's (T,) in-document positions: M-RoPE takes
    # them (text tokens: its three axes equal); 2-D RoPE, whose positions are (row, column) pairs, cannot
    # (tables.checks.attention.check_packed_scheme then raises the layer's own reason)
    takes_token_positions = True
    # q and k are rotated only together, in one call: k's tables differ from q's and depend on the call
    # (xPos: k scaled down, q up, around one centre). The attention functions then rotate q and the keys in
    # one apply (keys at their positions) and refuse rotate_keys=False (tables.checks.attention.check_rotated_keys).
    rotates_qk_together = False

    # -- buffers -----------------------------------------------------------------------------------
    def _register_empty(self, device: Any, **buffers: tuple[tuple[int, ...], torch.dtype | None]) -> None:
        """Register empty non-persistent buffers ``name=(shape, dtype)`` on ``device`` (dtype None: the
        table dtype of :func:`calc_dtype`), in the order given; ``reset_parameters`` fills them."""
        dev = torch.empty(0, device=device).device
        for name, (shape, dtype) in buffers.items():
            self.register_buffer(name, torch.empty(shape, device=dev, dtype=dtype or calc_dtype(dev)),
                                 persistent=False)

    def _table(self, values: np.ndarray) -> torch.Tensor:
        """A float64 NumPy table (read-only ones too: copied) -> a tensor on the layer's device in the table dtype."""
        dev = self.inv_freq.device
        return torch.tensor(values).to(dev, calc_dtype(dev))

    def _tables_cast(self) -> bool:
        """Whether a dtype cast (``.half()``, ``.float()``, ``.to(dtype)``) reached the frequencies (then reloaded in
        the table dtype of :func:`calc_dtype`: a ``model.float()`` once left xPos, M-RoPE and 2-D RoPE in float32)."""
        return self.inv_freq.dtype != calc_dtype(self.inv_freq.device)

    def _apply(self, fn: Any, recurse: bool = True) -> Any:
        out = super()._apply(fn, recurse)             # .half() must not cast the frequencies: reload them
        if not self.inv_freq.is_meta and self._tables_cast():
            self.reset_parameters()
        return out

    @torch.no_grad()
    def reset_parameters(self, *, seed: Any = None, rng: Any = None) -> None:
        """(Re)load the frequencies and the layer's other tables from ``tokenpos.tables`` (no randomness);
        nothing to do on the meta device."""
        if not self.inv_freq.is_meta:
            self._load_tables()

    def _load_tables(self) -> None:  # pragma: no cover - abstract
        raise NotImplementedError(f"{type(self).__name__} defines _load_tables")

    # -- layout and checks -------------------------------------------------------------------------
    def _check(self, name: str, x: Any, packed: bool = False) -> torch.Tensor:
        return to_bhld(name, x, self.head_dim, self.qk_layout, self.num_heads, packed)

    def _qk(self, q: Any, k: Any, packed: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """q, k in the declared layout -> (B, Hq, L, Dh), (B, Hk, L, Dh) views (:func:`to_bhld`), each
        checked (q first)."""
        return self._check("q", q, packed), self._check("k", k, packed)

    def _out(self, x: torch.Tensor, packed: bool = False) -> torch.Tensor:
        """(B, H, L, Dh) -> the declared layout; the inverse of :func:`to_bhld`'s view (``packed``: of the
        packed view)."""
        if self.qk_layout == "thd":
            return x.squeeze(2) if packed else x.select(0, 0).transpose(0, 1)
        if self.qk_layout == "blhd":
            return x.permute(2, 0, 1, 3) if packed else x.transpose(1, 2)
        return x

    # -- positions ---------------------------------------------------------------------------------
    def _positions(self, positions: Any, start_pos: Any, batch: int, length: int) -> torch.Tensor:
        """The positions of a (B, H, L, Dh) tensor, on the layer's device: ``start_pos + arange(L)`` (L,)
        when ``positions`` is None (``check_start_pos``), else the given integers >= 0 of shape (L,) |
        (1, L) | (B, L) (HF's (1, L) read as (L,)), which need ``start_pos`` 0 (ConfigError otherwise).
        M-RoPE overrides it (three position axes)."""
        if positions is None:
            start = check_start_pos(start_pos, length)
            return torch.arange(start, start + length, device=self.inv_freq.device)
        check_start_pos_with_positions(start_pos, positions)
        pos = check_position_tensor(positions, device=self.inv_freq.device)
        return pos[0] if check_positions_shape(tuple(pos.shape), batch, length) else pos

    def _qk_positions(self, q: torch.Tensor, k: torch.Tensor, positions: Any, start_pos: Any, key_positions: Any
                      ) -> tuple[torch.Tensor, torch.Tensor]:
        """(q's positions, k's positions) for q (B, Hq, Lq, Dh), k (B, Hk, Lk, Dh) by :meth:`_positions`: k at
        ``key_positions`` (a KV cache of keys before rotation, used as given), else at q's (Lq == Lk, checked
        first: ConfigError)."""
        if key_positions is None:
            check_qk_lengths(tuple(q.shape), tuple(k.shape), self.qk_layout)
        pos_q = self._positions(positions, start_pos, q.shape[0], q.shape[2])
        return pos_q, pos_q if key_positions is None else self._positions(key_positions, 0, k.shape[0], k.shape[2])

    def _packed_positions(self, q: torch.Tensor, positions: Any, start_pos: Any, key_positions: Any,
                          cu_seqlens: Any) -> tuple[torch.Tensor, int | None]:
        """Positions for q's packed view (:func:`to_bhld`) counting from ``start_pos`` in every document (0 by
        default; an int, or one per document: flash-attn's ``seqlen_offsets``), on q's device (no host sync),
        shaped as q's (B, L): (1, T), or (T, 1) for T rows of one token; and a bound of ``max(positions) + 1``,
        None where it is not known without a sync (:func:`.packing.document_positions`); every other argument
        checked."""
        if not self.packs:
            raise ConfigError(rotary_packed_message(type(self).__name__))
        B, H, L, Dh = q.shape
        row = (B, H, L, Dh) if self.qk_layout == "bhld" else (L, H, B, Dh)    # token-major views: rows are tokens
        pos, end = document_positions(cu_seqlens, check_packed_rotary_args(row, positions, key_positions),
                                      q.device, start_pos)
        return pos.view(B, L), end

    @staticmethod
    def _same_key_positions(scheme: str, pos: torch.Tensor, key_positions: Any) -> None:
        """For schemes rotating q and k together: ``key_positions``, if given, must equal ``pos``.
        Read on the CPU (ConfigError); on another device the shapes are checked here and the values
        by one device-side assert (no host sync), as ``tokenpos.torch._checks`` does for ids."""
        if key_positions is None:
            return
        kp = check_position_tensor(key_positions, device=pos.device)
        if pos.is_cpu and kp.is_cpu:
            check_same_key_positions(scheme, pos.numpy(), kp.numpy())
            return
        try:
            torch.broadcast_shapes(pos.shape, kp.shape)
        except RuntimeError:
            check_same_key_positions(scheme, np.zeros(tuple(pos.shape)), np.zeros(tuple(kp.shape)))  # raises
        torch._assert_async((pos == kp).all(), f"{scheme} rotates q and k at the same positions; key_positions on "
                                               f"{pos.device} differ from the query positions (a device-side check)")

    # -- rotation: tokenpos::rope / rope_qk op calls -----------------------------------------------
    @staticmethod
    def _op_tables(t: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """The op's tables: float64 for float64 x, else float32 (float32 x as HF casts; bf16 / fp16 x too,
        which the op rotates in float32: float64 angles rounded once to float32, never a float64 kernel)."""
        dt = torch.float64 if x.dtype == torch.float64 else torch.float32
        return t if t.dtype == dt else t.to(dt)

    def _rotate_pair(self, q: torch.Tensor, k: torch.Tensor, tables_q: tuple[torch.Tensor, torch.Tensor],
                     tables_k: tuple[torch.Tensor, torch.Tensor] | None, interleaved: bool
                     ) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotate q, k (B, H, L, Dh) by cos / sin (..., F): one ``rope_qk`` op with q's tables when
        ``tables_k`` is None, else one ``rope`` op per tensor. Returns (B, H, L, Dh) tensors."""
        cq, sq = self._op_tables(tables_q[0], q), self._op_tables(tables_q[1], q)
        if tables_k is None:
            return ops.rotate_qk(q, k, cq, sq, interleaved)  # type: ignore[no-any-return]
        ck, sk = self._op_tables(tables_k[0], k), self._op_tables(tables_k[1], k)
        return ops.rotate(q, cq, sq, interleaved), ops.rotate(k, ck, sk, interleaved)

    def _rotate_packed(self, q: torch.Tensor, k: torch.Tensor, pos: torch.Tensor, end: int | None
                       ) -> tuple[torch.Tensor, torch.Tensor]:
        """q, k (B, H, L, Dh) packed views (:func:`to_bhld`) rotated at the packed positions (B, L) (each in
        [0, end); ``end`` None: not known): the per-token path."""
        return self._rotate_bhld(q, k, pos, 0, None)

    def _rotate_bhld(self, q: torch.Tensor, k: torch.Tensor, positions: Any, start_pos: Any, key_positions: Any
                     ) -> tuple[torch.Tensor, torch.Tensor]:  # pragma: no cover - abstract
        """q, k (B, H, L, Dh) views (checked) -> (q', k') (B, H, L, Dh)."""
        raise NotImplementedError(f"{type(self).__name__} defines _rotate_bhld")

    def apply(self, q: Any, k: Any = None, positions: Any = None, *, start_pos: int = 0,  # type: ignore[override]
              key_positions: Any = None, cu_seqlens: Any = None) -> Any:
        """Rotate q and k at ``positions`` (see the layer; given positions need start_pos=0); returns (q', k')
        with the input shapes and dtypes. With ``cu_seqlens`` (N + 1,): q (T, H, Dh) and k (T, Hk, Dh)
        (``qk_layout="thd"``; or one row of the declared layout), positions restarting at 0 in every document.
        ``start_pos`` with ``cu_seqlens``: where each document starts counting, an int or one int per document
        (N,) (flash-attn's ``seqlen_offsets``: documents continuing a KV cache).
        ``k`` None: q alone, returning (q', None) (q rotated as in a call with keys of q's length).

        ``apply(fn)`` with a single callable is ``nn.Module.apply`` (``model.apply(init_fn)`` recurses
        through every child, this one included), so that idiom keeps working.
        """
        # nn.Module.apply recursion calls child.apply(fn) on every child, so apply(fn) must stay nn.Module.apply.
        if k is None and callable(q) and not isinstance(q, torch.Tensor):
            return super().apply(q)
        if k is None:
            check_no_key_positions(key_positions)
            q_out, _ = self.apply(q, one_head(q, self.qk_layout), positions, start_pos=start_pos,
                                  cu_seqlens=cu_seqlens)
            return q_out, None
        packed = cu_seqlens is not None
        q4, k4 = self._qk(q, k, packed)
        if packed:
            if self.packs:                           # the others refuse cu_seqlens itself (_packed_positions)
                check_packed_qk(tuple(q.shape), tuple(k.shape), self.qk_layout)
            q_out, k_out = self._rotate_packed(q4, k4, *self._packed_positions(q4, positions, start_pos,
                                                                               key_positions, cu_seqlens))
        else:
            q_out, k_out = self._rotate_bhld(q4, k4, positions, start_pos, key_positions)
        return self._out(q_out, packed), self._out(k_out, packed)

    forward = apply
