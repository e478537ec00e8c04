"""VocabParallelEmbedding: a token table split by rows over the ranks of a process group.

Shapes: V vocab (unpadded), Vp padded vocab, W world size, Vl = Vp / W rows per rank, D d_model,
ids (...), h (..., D), local logits (..., Vl).

Rank r holds rows [vocab_start, vocab_end) = [r * Vl, (r + 1) * Vl) of the padded table (Megatron's
rule, :func:`tokenpos.tables.formulas.vocab_parallel.padded_vocab_size`); rows >= V are padding, zero, never
looked up, and give ``-inf`` logits. Every rank runs the same code on the same ids (SPMD).

Forward: validate ids (every rank, before any collective, so bad ids raise the same ``TokenIdError``
on all ranks together; on CUDA a device-side assert on every rank, with no host sync), look up the
owned ids locally, zero the others, one all-reduce (sum). Exactly one rank contributes each output
row and the rest add zeros, so the result is bit-identical to the one-process ``TokenEmbedding``.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from tokenpos.tables.checks.tied_loss import check_options, check_same_dtype
from tokenpos.tables.checks.validation import check_choice, check_feature_dim, check_padding_idx, check_positive_int
from tokenpos.tables.formulas.init import INIT_SCHEMES, resolve_rng
from tokenpos.tables.formulas.vocab_parallel import padded_vocab_size, shard_range
from tokenpos.torch._checks import check_float_tensor, check_target_values, check_token_id_tensor, resolve_dtype
from tokenpos.torch._module import TokenposModule
from tokenpos.torch.distributed import checkpoint
from tokenpos.torch.distributed._comm import copy_to_group, reduce_from_group, resolve_group, shared_seed
from tokenpos.torch.distributed._lookup import masked_lookup
from tokenpos.torch.distributed._shard_init import shard_init
from tokenpos.torch.distributed.tied_loss import VocabParallelTiedLoss
from tokenpos.torch.ops.tied_loss import check_tensors


class VocabParallelEmbedding(TokenposModule):
    """Token ids -> vectors with the (V, D) table sharded by rows over ``group``; tied logits via ``attend``.

    Args:
        vocab_size: V > 0 (the real vocab; ids must lie in [0, V)).
        d_model: D > 0.
        group: a ``torch.distributed`` process group (None: the default world).
        pad_to_multiple_of: M; the table is padded to the smallest multiple of M * W that is >= V.
        init, std: as ``TokenEmbedding`` ("normal", "trunc_normal", "xavier_uniform", ...).
        scale: multiply the output by sqrt(D).
        padding_idx: that row (held by one rank) starts at zero and never receives gradient from lookups.
        seed / rng: with ``seed=``, the full table is ``TokenEmbedding(V, D, init=..., seed=...)``'s at
            every world size. ``rng=`` must be in the same state on every rank (it is advanced past the
            whole table, as the one-process layer would). Neither: rank 0 draws a seed from torch's
            default generator and broadcasts it (one collective), so all shards come from one table.
        device, dtype: factory kwargs of the local shard.

    Shape:
        forward: ids (...) int -> (..., D), the same on every rank. attend: h (..., D) -> (..., Vl).

    state_dict: ``weight`` (Vl, D), this rank's shard; see ``full_state_dict`` for the whole table.
    """

    def __init__(self, vocab_size: int, d_model: int, *, group: Any = None, pad_to_multiple_of: int = 1,
                 init: str = "normal", std: float = 0.02, scale: bool = False, padding_idx: int | None = None,
                 seed: int | None = None, rng: np.random.Generator | None = None, device: Any = None,
                 dtype: Any = None) -> None:
        super().__init__()
        self.vocab_size = check_positive_int("vocab_size", vocab_size)
        self.d_model = check_positive_int("d_model", d_model)
        self.padding_idx = check_padding_idx(padding_idx, self.vocab_size)
        self.init, self.std, self.scale = check_choice("init", init, INIT_SCHEMES), std, bool(scale)
        self.group, self.rank, self.world_size = resolve_group(group)
        self.pad_to_multiple_of = check_positive_int("pad_to_multiple_of", pad_to_multiple_of)
        self.padded_vocab_size = padded_vocab_size(self.vocab_size, self.pad_to_multiple_of, self.world_size)
        self.vocab_start, self.vocab_end = shard_range(self.padded_vocab_size, self.rank, self.world_size)
        self.weight = torch.nn.Parameter(torch.empty(self.num_local_rows, self.d_model, device=device,
                                                     dtype=resolve_dtype(dtype)))
        self.reset_parameters(seed=seed, rng=rng)

    # -- facts -------------------------------------------------------------------------------
    @property
    def num_local_rows(self) -> int:
        """Vl = vocab_end - vocab_start (padding rows included)."""
        return self.vocab_end - self.vocab_start

    @property
    def num_real_rows(self) -> int:
        """Rows of this shard that hold real tokens (< vocab_size)."""
        return max(0, min(self.vocab_end, self.vocab_size) - self.vocab_start)

    @property
    def row_shard(self) -> checkpoint.RowShard:
        """This shard's place in the whole (V, D) table (what the checkpoint functions read)."""
        return checkpoint.RowShard(self.vocab_size, self.d_model, self.vocab_start, self.num_real_rows)

    @property
    def multiplier(self) -> float:
        """sqrt(D) when ``scale`` else 1.0."""
        return math.sqrt(self.d_model) if self.scale else 1.0

    @property
    def local_padding_idx(self) -> int | None:
        """``padding_idx`` as a row of this shard, or None when another rank holds it."""
        p = self.padding_idx
        return p - self.vocab_start if p is not None and self.vocab_start <= p < self.vocab_end else None

    # -- init --------------------------------------------------------------------------------
    @torch.no_grad()
    def reset_parameters(self, *, seed: int | None = None, rng: np.random.Generator | None = None) -> None:
        """Re-draw this rank's rows of the one-process table (see the class doc for seed / rng)."""
        if seed is None and rng is None:                         # rank 0's draw, on every rank
            seed = shared_seed(self.group, self.rank, self.world_size)
        gen = resolve_rng(seed, rng)
        if self.weight.is_meta:
            return
        rows = shard_init(self.vocab_size, self.d_model, self.vocab_start, self.vocab_end, self.init,
                          std=self.std, rng=gen, padding_idx=self.padding_idx)
        self.weight.copy_(torch.from_numpy(rows))

    # -- lookup ------------------------------------------------------------------------------
    def _checked_ids(self, ids: Any) -> torch.Tensor:
        """Ids validated in [0, V) on this rank: read on the CPU (TokenIdError), a device-side assert
        elsewhere (no host sync; never a silent zero row), see ``tokenpos.torch._checks``."""
        return check_token_id_tensor(ids, self.vocab_size, device=self.weight.device).to(self.weight.device)

    def forward(self, ids: Any) -> torch.Tensor:
        """ids (...) -> (..., D), one all-reduce. Bad ids raise TokenIdError on every rank, before it."""
        ids = self._checked_ids(ids)
        part = masked_lookup(self.weight, ids, self.vocab_start, self.multiplier, self.local_padding_idx)  # (..., D)
        return reduce_from_group(part, self.group, self.world_size, in_place=True)               # part is fresh

    # -- tied output projection --------------------------------------------------------------
    def attend(self, h: torch.Tensor) -> torch.Tensor:
        """This rank's logits of a tied output layer: h (..., D) -> (..., Vl); padding columns are -inf.

        Backward all-reduces h's gradient (so ``h.grad`` is the one-process gradient on every rank);
        ``weight.grad`` is this rank's slice of the one-process gradient (padding rows get none).

        Raises:
            DtypeError: h not float, or of another dtype than the shard (as ``loss``), outside ``torch.autocast``.
            ConfigError: h's last axis is not d_model.
        """
        check_float_tensor("h", h)
        check_feature_dim("h", tuple(h.shape), self.d_model)
        if h.dtype != self.weight.dtype and not torch.is_autocast_enabled(h.device.type):
            check_same_dtype(h.dtype, self.weight.dtype)                       # raises
        logits = F.linear(copy_to_group(h, self.group, self.world_size), self.weight)    # (..., Vl)
        if self.num_real_rows < self.num_local_rows:
            pad = torch.arange(self.num_local_rows, device=logits.device) >= self.num_real_rows   # (Vl,)
            logits = logits.masked_fill(pad, float("-inf"))
        return logits

    def loss(self, h: torch.Tensor, targets: Any, *, ignore_index: int = -100, label_smoothing: float = 0.0,
             reduction: str = "mean", softcap: float | None = None, chunk_size: int | None = None) -> torch.Tensor:
        """The tied loss of the whole vocab from this rank's rows, never gathering logits: h (..., D) and targets
        (...) the same on every rank -> the one-process ``TokenEmbedding.loss`` on every rank.

        Three all-reduces of (N,) vectors in forward, one (h's gradient) in backward; padded rows never count
        (the layer knows its real ``vocab_size``). Options as ``tokenpos.torch.tied_cross_entropy``.

        Raises:
            TokenIdError: a target outside [0, vocab_size) that is not ``ignore_index`` (CPU; a device-side
                assert elsewhere), on every rank, before any collective.
            DtypeError / ConfigError: as ``tokenpos.torch.tied_cross_entropy``.
        """
        check_float_tensor("h", h)
        check_feature_dim("h", tuple(h.shape), self.d_model)
        t = targets if isinstance(targets, torch.Tensor) else torch.as_tensor(targets, device=self.weight.device)
        ignore_index, eps, reduction, cap, chunk = check_options(ignore_index, label_smoothing, reduction, softcap,
                                                                 chunk_size)
        check_tensors(h, self.weight, t, self.vocab_size, ignore_index)
        check_target_values(t, self.vocab_size, ignore_index)
        return VocabParallelTiedLoss.apply(copy_to_group(h, self.group, self.world_size), self.weight, t, self.group,
                                           self.world_size, self.vocab_start, self.num_real_rows, self.vocab_size,
                                           ignore_index, eps, reduction, cap, chunk)

    # -- whole-table state -------------------------------------------------------------------
    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """``{"weight": (V, D)}``: the whole unpadded table on every rank (one all-gather)."""
        return {"weight": checkpoint.gather_rows(self.weight.detach(), self.vocab_size, self.group,
                                                 self.world_size)}

    def load_full_state_dict(self, state_dict: Any) -> None:
        """Take this rank's rows of a whole (V, D) table (any world size wrote it). No collective.

        Raises:
            StateDictError: wrong keys, shape or dtype (checked before anything is written).
        """
        checkpoint.load_rows(self, state_dict)

    def save(self, path: str | Path) -> None:
        """Write the whole table as a safetensors file (rank 0 writes, atomically; every rank must call).

        The file is a ``TokenEmbedding`` checkpoint (one-process layers load it too). All ranks raise if
        rank 0 could not write.
        """
        checkpoint.save_full(self, path)

    def load(self, path: str | Path, strict: bool = True) -> None:
        """Read a whole-table safetensors file (from ``save`` or ``TokenEmbedding.save``) on every rank and
        take this rank's rows. All ranks raise together if any rank failed (one all-reduce).
        """
        checkpoint.load_full(self, path, strict=strict)

    def extra_repr(self) -> str:
        s = (f"{self.vocab_size}, {self.d_model}, rows [{self.vocab_start}, {self.vocab_end}) of "
             f"{self.padded_vocab_size}, rank {self.rank}/{self.world_size}")
        if self.padding_idx is not None:
            s += f", padding_idx={self.padding_idx}"
        if self.scale:
            s += ", scale=True"
        return s + f", dtype={self.weight.dtype}"
