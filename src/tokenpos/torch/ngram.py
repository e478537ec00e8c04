"""HashedNgramEmbedding: hashed n-gram memory (Engram, arXiv 2601.07372) as an ``nn.Module``; the torch twin of
``tokenpos.numpy.HashedNgramEmbedding`` (same arguments, hashing and state_dict).

Shapes: B batch, L length, T packed tokens, S documents, C context ids (<= n_max - 1), K hash heads
((max_ngram_size - 1) * n_head_per_ngram), Dh = n_embed_per_ngram // n_head_per_ngram, R table rows (the sum of
the heads' primes), E = K * Dh.

    out = weight[offsets + ngram_hash_ids(compress[ids])].reshape(..., E)     (the op ``tokenpos::ngram_embedding``)
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

from tokenpos.tables.checks.validation import check_choice
from tokenpos.tables.formulas.init import INIT_SCHEMES
from tokenpos.tables.formulas.ngram_hash import check_ngram_shapes, ngram_spec
from tokenpos.torch._checks import check_token_id_tensor, is_wrapped, resolve_dtype
from tokenpos.torch._init import empty_table, fill_init_, resolve_torch_rng
from tokenpos.torch._module import TokenposModule
from tokenpos.torch.ops.ngram import formula, ngram_embedding, table_rows
from tokenpos.torch.packing import check_cu_seqlens_tensor


class HashedNgramEmbedding(TokenposModule):
    """Hashed n-gram embedding of one layer, with the Engram reference's settings (see the NumPy layer's doc).

    Args:
        engram_vocab_size, max_ngram_size, n_embed_per_ngram, n_head_per_ngram, layer_id, layer_ids, pad_id,
            seed, compress: the reference's settings (``compress``: the old-to-new id array).
        init, std: the table's init scheme ("standard_normal": ``nn.Embedding``'s, as the reference).
        device, dtype: factory kwargs. init_seed / rng: initialise exactly as the NumPy backend does; otherwise a
            seed is drawn from ``generator`` (or torch's default generator).

    Shape:
        forward: ids (B, L) -> (B, L, E); packed ids (T,) with ``cu_seqlens`` (S + 1,) -> (T, E);
        ``context`` (B, C) / (S, C): the ids right before each sequence (decoding).

    state_dict: ``weight`` (R, Dh). The hashing tables are non-persistent buffers (they follow ``.to(device)``).
    """

    compress: torch.Tensor
    multipliers: torch.Tensor
    primes: torch.Tensor
    offsets: torch.Tensor

    def __init__(self, *, engram_vocab_size: Any, max_ngram_size: int, n_embed_per_ngram: int,
                 n_head_per_ngram: int, layer_id: int, layer_ids: Any, pad_id: int, seed: int, compress: Any,
                 init: str = "standard_normal", std: float = 0.02, device: Any = None, dtype: Any = None,
                 init_seed: int | None = None, rng: np.random.Generator | None = None,
                 generator: torch.Generator | None = None) -> None:
        super().__init__()
        if isinstance(compress, torch.Tensor):
            compress = compress.detach().cpu().numpy()
        self.spec = ngram_spec(engram_vocab_size=engram_vocab_size, max_ngram_size=max_ngram_size,
                               n_embed_per_ngram=n_embed_per_ngram, n_head_per_ngram=n_head_per_ngram,
                               layer_id=layer_id, layer_ids=layer_ids, pad_id=pad_id, seed=seed, compress=compress)
        self.init, self.std = check_choice("init", init, INIT_SCHEMES), std
        for name in ("compress", "multipliers", "primes", "offsets"):
            self.register_buffer(name, torch.tensor(np.array(getattr(self.spec, name)), device=device),
                                 persistent=False)
        self.weight = nn.Parameter(empty_table(self.spec.num_rows, self.spec.head_dim, device=device,
                                               dtype=resolve_dtype(dtype)))
        self.reset_parameters(seed=init_seed, rng=rng, generator=generator)

    @property
    def out_dim(self) -> int:
        """E = (max_ngram_size - 1) * n_embed_per_ngram."""
        return self.spec.out_dim

    def reset_parameters(self, *, seed: int | None = None, rng: np.random.Generator | None = None,
                         generator: torch.Generator | None = None) -> None:
        """Re-draw the table from its init scheme."""
        fill_init_(self.weight, self.init, self.std, resolve_torch_rng(seed, rng, generator))

    def _inputs(self, ids: Any, cu_seqlens: Any, context: Any
                ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        dev = self.weight.device
        vo = self.spec.compress.shape[0]
        x = check_token_id_tensor(ids, vo, device=dev)
        cu = None
        if cu_seqlens is not None:
            cu = check_cu_seqlens_tensor(cu_seqlens, x.shape[0] if x.dim() == 1 else None, device=dev)
        ctx = None if context is None else check_token_id_tensor(context, vo, device=dev)
        check_ngram_shapes(self.spec, tuple(x.shape), cu is not None, None if ctx is None else tuple(ctx.shape),
                           None if cu is None else cu.shape[0] - 1)
        if ctx is not None:
            docs = cu.shape[0] - 1 if cu is not None else (x.shape[0] if x.dim() == 2 else 1)
            ctx = ctx.reshape(docs, ctx.shape[-1])
        return x, cu, ctx

    def hash_rows(self, ids: Any, *, cu_seqlens: Any = None, context: Any = None) -> torch.Tensor:
        """ids (B, L) / (T,) -> (..., K) int64 table rows (the reference's hash ids plus the heads' offsets)."""
        x, cu, ctx = self._inputs(ids, cu_seqlens, context)
        return table_rows(x, cu, ctx, self.compress, self.multipliers, self.primes, self.offsets, self.spec.pad)

    def forward(self, ids: Any, *, cu_seqlens: Any = None, context: Any = None) -> torch.Tensor:
        """ids (B, L) -> (B, L, E), or packed (T,) with ``cu_seqlens`` -> (T, E); ``context``: the ids right before
        each sequence. Bad ids (outside compress's domain) raise TokenIdError naming the value."""
        x, cu, ctx = self._inputs(ids, cu_seqlens, context)
        op = formula if is_wrapped(self.weight) else ngram_embedding     # torch.func: the plain formula
        return op(self.weight, x, cu, ctx, self.compress, self.multipliers, self.primes, self.offsets, self.spec.pad)

    def extra_repr(self) -> str:
        s = self.spec
        return (f"max_ngram_size={s.max_ngram_size}, heads={s.num_heads}, head_dim={s.head_dim}, "
                f"rows={s.num_rows}, dtype={self.weight.dtype}")
