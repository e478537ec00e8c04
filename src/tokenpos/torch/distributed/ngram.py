"""VocabParallelHashedNgramEmbedding: the hashed n-gram table (Engram, arXiv 2601.07372) split by rows over ranks.

Shapes: as ``tokenpos.torch.HashedNgramEmbedding``: B batch, L length, T packed tokens, S documents, C context ids,
K hash heads, Dh = n_embed_per_ngram // n_head_per_ngram, R table rows (the sum of the heads' primes),
E = K * Dh; W world size, Rl = ceil(R / W) rows per rank.

Rank r holds rows [row_start, row_end) = [r * Rl, (r + 1) * Rl) of the one (R, Dh) table, head offsets included
(a head's rows may span two ranks); the last shard's rows >= R are zero padding, never looked up. Every rank
runs the same code on the same ids (SPMD):

1. check the inputs (ids in compress's domain, ``cu_seqlens``, ``context``) on every rank; with the table on the
   CPU, one all-reduce of a refusal code follows, so a refusal is raised on every rank together, even when only
   some ranks' inputs were bad (``_comm.raise_together``);
2. on the CPU with the numba kernel (float32 / float64, kernels on): hash and gather in one pass, reading only this
   rank's rows and writing zeros for the others (the fused kernel's shard, ``ops.ngram.ngram_lookup`` with
   ``row_start``), (..., E); elsewhere (CUDA, kernels off, bf16) as before: the (..., K) int64 rows by the same
   hashing (``ops.ngram.hashed_rows``: torch ops off the CPU), then the rows this rank owns looked up and the others
   zeroed (``_lookup.masked_lookup``: the ``tokenpos::embedding`` op on the shard), (..., K, Dh) -> (..., E);
   nothing of size (..., K, Dh) beyond the output either way;
3. one all-reduce (sum). Each output element comes from exactly one rank and the others add zeros, so the output
   is bit for bit the one-process layer's.

Backward: none of the collectives; each rank's ``weight.grad`` is its slice of the one-process gradient (dense,
or row-sparse with ``sparse=True``, holding only rows this rank owns that the batch looked up). On the CPU kernels
both are the fused kernel's backward with this rank's range (``ops.ngram``: the sparse one each owned row once,
``ngram_lookup_sparse``); elsewhere the dense one is the embedding op's, and the sparse route selects the owned
entries with ``nonzero``, a host sync on CUDA, as torch's own sparse embedding makes.

Cost per rank: on the CPU path the hashing of all T * K rows (cheap), the copies of the rows this rank owns and
zeros for the rest, so a rank's gather work shrinks with W (the hashing and the output's writes do not); the
backward's dense gradient takes the same range (the kernel's segment sum of owned rows only). Measured on a loaded
2-core guest, one thread, thread CPU time after a matmul, ids (4, 1024), K = 16, Dh = 64, 256 MiB table, median of
100: the one-process layer 3.2-3.5 ms; this layer at W = 1 9.4 ms before the fused shard, 3.9 ms with it, 3.5 ms
with its table in huge pages too (``empty_table``, as the one-process layer's); the shard lookup of one rank of
W = 2 2.8-3.3 ms, of W = 4 2.2-2.5 ms. Elsewhere (the masked route) a rank still gathers all T * K rows, those of
other ranks from local row 0.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from tokenpos.tables.checks.validation import check_bool, check_choice
from tokenpos.tables.formulas.init import INIT_SCHEMES
from tokenpos.tables.formulas.ngram_hash import ngram_spec
from tokenpos.tables.formulas.vocab_parallel import padded_vocab_size, shard_range
from tokenpos.torch._checks import resolve_dtype
from tokenpos.torch._init import empty_table, resolve_torch_rng
from tokenpos.torch._module import TokenposModule
from tokenpos.torch.distributed import checkpoint
from tokenpos.torch.distributed._comm import (
    AGREED_ERRORS,
    raise_together,
    reduce_from_group,
    resolve_group,
    shared_seed,
)
from tokenpos.torch.distributed._lookup import masked_lookup
from tokenpos.torch.distributed._shard_init import shard_init
from tokenpos.torch.ngram import ngram_inputs
from tokenpos.torch.ops.ngram import fused_on, hashed_rows, ngram_lookup, ngram_lookup_sparse


class VocabParallelHashedNgramEmbedding(TokenposModule):
    """``HashedNgramEmbedding`` with its (R, Dh) table sharded by rows over ``group`` (see the module doc).

    Args:
        engram_vocab_size, max_ngram_size, n_embed_per_ngram, n_head_per_ngram, layer_id, layer_ids, pad_id,
            seed, compress, init, std, device, dtype: as ``tokenpos.torch.HashedNgramEmbedding``.
        group: a ``torch.distributed`` process group (None: the default world).
        sparse: a row-sparse ``weight.grad`` (a ``torch.sparse_coo`` (Rl, Dh) tensor, as ``nn.Embedding(sparse=
            True)``) holding the rows this rank owns that the batch looked up; default dense.
        init_seed / rng: the whole table is ``HashedNgramEmbedding(..., init_seed=...)``'s (or ``rng=``'s, in the
            same state on every rank) at every world size, each rank holding its slice; every rank draws the
            whole table's values and keeps its rows (O(block + shard) memory, O(R * Dh) time). Neither: rank 0
            draws a seed from ``generator`` (or torch's default generator) and gives it to every rank (one
            collective), the table a one-process layer draws from rank 0's generator.

    Shape:
        forward: ids (B, L) -> (B, L, E); packed ids (T,) with ``cu_seqlens`` (S + 1,) -> (T, E); ``context``
        (B, C) / (S, C): the ids right before each sequence (decoding). The same on every rank.

    state_dict: ``weight`` (Rl, Dh), this rank's shard; ``full_state_dict`` gives the whole (R, Dh) table.
    """

    compress: torch.Tensor
    multipliers: torch.Tensor
    primes: torch.Tensor
    offsets: torch.Tensor

    def __init__(self, *, engram_vocab_size: Any, max_ngram_size: int, n_embed_per_ngram: int,
                 n_head_per_ngram: int, layer_id: int, layer_ids: Any, pad_id: int, seed: int, compress: Any,
                 group: Any = None, init: str = "standard_normal", std: float = 0.02, sparse: bool = False,
                 device: Any = None, dtype: Any = None, init_seed: int | None = None,
                 rng: np.random.Generator | None = None, generator: torch.Generator | None = None) -> None:
        super().__init__()
        if isinstance(compress, torch.Tensor):
            compress = compress.detach().cpu().numpy()
        self.spec = ngram_spec(engram_vocab_size=engram_vocab_size, max_ngram_size=max_ngram_size,
                               n_embed_per_ngram=n_embed_per_ngram, n_head_per_ngram=n_head_per_ngram,
                               layer_id=layer_id, layer_ids=layer_ids, pad_id=pad_id, seed=seed, compress=compress)
        self.init, self.std = check_choice("init", init, INIT_SCHEMES), std
        self.sparse = check_bool("sparse", sparse)
        self.group, self.rank, self.world_size = resolve_group(group)
        self.row_start, self.row_end = shard_range(padded_vocab_size(self.num_rows, 1, self.world_size), self.rank,
                                                   self.world_size)
        for name in ("compress", "multipliers", "primes", "offsets"):
            self.register_buffer(name, torch.tensor(np.array(getattr(self.spec, name)), device=device),
                                 persistent=False)
        self.weight = torch.nn.Parameter(empty_table(self.num_local_rows, self.head_dim, device=device,
                                                     dtype=resolve_dtype(dtype)))   # huge pages, as one process's
        self.reset_parameters(seed=init_seed, rng=rng, generator=generator)

    # -- facts -------------------------------------------------------------------------------
    @property
    def num_rows(self) -> int:
        """R: rows of the whole table (the sum of the heads' primes)."""
        return self.spec.num_rows

    @property
    def head_dim(self) -> int:
        """Dh = n_embed_per_ngram // n_head_per_ngram."""
        return self.spec.head_dim

    @property
    def out_dim(self) -> int:
        """E = (max_ngram_size - 1) * n_embed_per_ngram."""
        return self.spec.out_dim

    @property
    def num_local_rows(self) -> int:
        """Rl = row_end - row_start (padding rows included)."""
        return self.row_end - self.row_start

    @property
    def num_real_rows(self) -> int:
        """Rows of this shard that are rows of the table (< R)."""
        return max(0, min(self.row_end, self.num_rows) - self.row_start)

    @property
    def row_shard(self) -> checkpoint.RowShard:
        """This shard's place in the whole (R, Dh) table (what the checkpoint functions read)."""
        return checkpoint.RowShard(self.num_rows, self.head_dim, self.row_start, self.num_real_rows,
                                   "HashedNgramEmbedding")

    # -- init --------------------------------------------------------------------------------
    @torch.no_grad()
    def reset_parameters(self, *, seed: int | None = None, rng: np.random.Generator | None = None,
                         generator: torch.Generator | None = None) -> None:
        """Re-draw this rank's rows of the one-process table (see the class doc for seed / rng / generator)."""
        if seed is None and rng is None:
            gen = np.random.default_rng(shared_seed(self.group, self.rank, self.world_size, generator))
        else:
            gen = resolve_torch_rng(seed, rng, generator)          # (refuses generator= with seed= / rng=)
        if self.weight.is_meta:
            return
        rows = shard_init(self.num_rows, self.head_dim, self.row_start, self.row_end, self.init, std=self.std,
                          rng=gen)
        self.weight.copy_(torch.from_numpy(rows))

    # -- lookup ------------------------------------------------------------------------------
    def _inputs(self, ids: Any, cu_seqlens: Any, context: Any
                ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """The checks of ``HashedNgramEmbedding`` (:func:`tokenpos.torch.ngram.ngram_inputs`)."""
        return ngram_inputs(self.spec, self.weight.device, ids, cu_seqlens, context)

    def _agreed_inputs(self, ids: Any, cu_seqlens: Any, context: Any
                       ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """``_inputs``, refused on every rank together when the table is on the CPU (one all-reduce at W > 1; on
        a device the values are device-side asserts, and a collective there would wait for the stream)."""
        if self.weight.device.type != "cpu":
            return self._inputs(ids, cu_seqlens, context)
        error: ValueError | None = None
        try:
            out = self._inputs(ids, cu_seqlens, context)
        except AGREED_ERRORS as exc:
            error = exc
        raise_together(error, self.group, self.world_size, "ids, cu_seqlens or context")
        return out

    def _rows(self, x: torch.Tensor, cu: torch.Tensor | None, ctx: torch.Tensor | None) -> torch.Tensor:
        """(..., K) int64 rows of the whole table: the numba kernel on the CPU (one pass), else torch ops."""
        return hashed_rows(x, cu, ctx, self.compress, self.multipliers, self.primes, self.offsets, self.spec.pad)

    def hash_rows(self, ids: Any, *, cu_seqlens: Any = None, context: Any = None) -> torch.Tensor:
        """ids (B, L) / (T,) -> (..., K) int64 rows of the whole table (as ``HashedNgramEmbedding.hash_rows``;
        no collective)."""
        return self._rows(*self._inputs(ids, cu_seqlens, context))

    def _sparse_part(self, rows: torch.Tensor) -> torch.Tensor:
        """rows (..., K) -> (N, Dh) with N = rows.numel(): the owned rows gathered alone through ``F.embedding(
        sparse=True)``, so the sparse gradient names only them; zeros elsewhere."""
        flat = rows.reshape(-1) - self.row_start                                 # (N,)
        sel = ((flat >= 0) & (flat < self.num_local_rows)).nonzero().squeeze(1)  # (n,) owned entries
        vals = F.embedding(flat[sel], self.weight, sparse=True)                 # (n, Dh)
        return vals.new_zeros(flat.shape[0], self.head_dim).index_copy(0, sel, vals)

    def forward(self, ids: Any, *, cu_seqlens: Any = None, context: Any = None) -> torch.Tensor:
        """ids (B, L) -> (B, L, E), or packed (T,) with ``cu_seqlens`` -> (T, E); ``context``: the ids right before
        each sequence. The same on every rank, equal to the one-process layer's; one all-reduce (two with the table
        on the CPU: the inputs' agreement first). Bad inputs raise the one-process layer's error (TokenIdError for
        an id outside compress's domain) on every rank."""
        x, cu, ctx = self._agreed_inputs(ids, cu_seqlens, context)
        sparse = self.sparse and self.weight.requires_grad and torch.is_grad_enabled()
        if fused_on(self.weight) and not (sparse and torch.compiler.is_compiling()):
            # hash and gather the owned rows in one pass, zeros elsewhere; the gradient of the owned rows only
            lookup = ngram_lookup_sparse if sparse else ngram_lookup
            part = lookup(self.weight, x, cu, ctx, self.compress, self.multipliers, self.primes, self.offsets,
                          self.spec.pad, self.row_start)                         # (..., E)
        elif sparse:
            part = self._sparse_part(self._rows(x, cu, ctx))                    # (N, Dh)
        else:
            part = masked_lookup(self.weight, self._rows(x, cu, ctx), self.row_start, 1.0, None)   # (..., K, Dh)
        return reduce_from_group(part.reshape(*x.shape, self.out_dim), self.group, self.world_size, in_place=True)

    # -- whole-table state -------------------------------------------------------------------
    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """``{"weight": (R, Dh)}``: the whole table on every rank (one all-gather), a ``HashedNgramEmbedding``
        state_dict."""
        return {"weight": checkpoint.gather_rows(self.weight.detach(), self.num_rows, self.group, self.world_size)}

    def load_full_state_dict(self, state_dict: Any) -> None:
        """Take this rank's rows of a whole (R, Dh) table of the shard's dtype (any world size, or a one-process
        ``HashedNgramEmbedding``, wrote it). No collective.

        Raises:
            StateDictError: wrong keys, shape or dtype (checked before anything is written).
        """
        checkpoint.load_rows(self, state_dict)

    def save(self, path: str | Path) -> None:
        """Write the whole table as a ``HashedNgramEmbedding`` safetensors file (rank 0 writes, atomically; every
        rank must call; all ranks raise if rank 0 could not write)."""
        checkpoint.save_full(self, path)

    def load(self, path: str | Path, strict: bool = True) -> None:
        """Read a whole-table safetensors file (from ``save`` or ``HashedNgramEmbedding.save``) on every rank and
        take this rank's rows; all ranks raise together if any rank failed (one all-reduce)."""
        checkpoint.load_full(self, path, strict=strict)

    def extra_repr(self) -> str:
        s = self.spec
        out = (f"max_ngram_size={s.max_ngram_size}, heads={s.num_heads}, head_dim={s.head_dim}, rows "
               f"[{self.row_start}, {self.row_end}) of {s.num_rows}, rank {self.rank}/{self.world_size}")
        return out + (", sparse=True" if self.sparse else "") + f", dtype={self.weight.dtype}"
