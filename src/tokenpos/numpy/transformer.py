"""TransformerEmbedding: token table (+ sqrt(D) scale) + positions + token types, norm, dropout.

    x = W[ids] * s + P[positions]                          (no token types; P only for additive schemes)
    x = W[ids] * s + T[token_type_ids] + P[positions]      (with token types: Hugging Face's BERT order)
    y = dropout(norm(x))                                   (s = sqrt(D) when scale=True, else 1)

Each step is one call of ``tokenpos.numpy.functional``, as ``tables.plan.plan_embedding`` (shared with
torch) decides; without norm and token types the first call also applies the dropout (one fused pass
on the kernel path). The torch backend sums in the same order.

Shapes: B batch, L length, D d_model; ids (B, L) -> (B, L, D) and ids (L,) -> (L, D).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from tokenpos.kernels.packing import document_positions
from tokenpos.numpy import functional as F
from tokenpos.numpy.module import Module, Parameter
from tokenpos.numpy.norm import build_norm
from tokenpos.numpy.schemes import build_shortcut
from tokenpos.numpy.token import INT64, TokenEmbedding
from tokenpos.tables.checks.embedding import NO_TOKEN_TYPES, check_embedding_args
from tokenpos.tables.checks.packing import check_packed_embedding_args
from tokenpos.tables.checks.validation import (
    INT64_MAX,
    check_grad,
    check_positions,
    check_positions_at,
    check_start_pos_with_positions,
    check_token_ids,
    shape_message,
)
from tokenpos.tables.errors import ConfigError
from tokenpos.tables.formulas.dropout import draw_seed
from tokenpos.tables.formulas.init import resolve_rng
from tokenpos.tables.formulas.positions import positions_from_padding, shared_default_positions
from tokenpos.tables.plan import Batch, plan_embedding, table_limit


@dataclass(frozen=True)
class TransformerCache:
    """One forward's caches, in order: embedding (token, + positions without token types), token
    types, positions (with token types), norm, dropout.

    ``table_param`` is the learned positional Parameter that receives the table gradient, or None.
    """

    embedding: F.EmbeddingCache
    token_type: F.EmbeddingCache | None
    position: F.EmbeddingCache | None
    norm: F.NormCache | None
    dropout: F.DropoutCache | None
    table_param: Parameter | None
    shape: tuple[int, ...]


class TransformerEmbedding(Module):
    """The input block of a transformer.

    Args:
        vocab_size, d_model, max_seq_len: V, D, and the positions a learned table can hold.
        positional: a shortcut "learned", "sinusoidal", "rope", "alibi", "t5", "none" (or None), built
            with its defaults, or a NumPy scheme object carrying its own settings (for example
            ``RotaryEmbedding(64, scaling={...})`` or ``SinusoidalPositionalEncoding(P, D, layout="half")``).
            Attention-level schemes (rotary, bias) add nothing here; ``self.position`` is the object
            that ``scaled_dot_product_attention(..., positional=emb.position)`` uses.
        num_heads: H for the "rope" (head_dim = D // H), "alibi" and "t5" shortcuts; must divide D.
        scale: multiply token vectors by sqrt(D).
        dropout: drop probability in [0, 1), active only in training mode.
        padding_idx, init, std: token-table options (see TokenEmbedding).
        num_token_types: > 0 adds a (num_token_types, D) segment table (BERT).
        norm, norm_eps: None, "layernorm" or "rmsnorm" after the sum (BERT uses layernorm).
        position_ids: "default" (start_pos + arange(L)) or "padding" (RoBERTa: derived from
            padding_idx, which must be set).
        dtype, seed, rng: parameter dtype and the explicit random source (init and dropout).

    Shape:
        forward(ids (B, L) or (L,), positions (L,) or (B, L) | None, start_pos=0, token_type_ids,
        cu_seqlens=None) -> (..., D);
        positions default to start_pos + arange(L); given positions are used as they are, so start_pos
        must then be 0 (anything else: ConfigError; add the offset to the positions instead).
        Packed documents: ids (T,) or (1, T) and ``cu_seqlens`` (N + 1,) (0, the cumulative lengths, T):
        the positions restart at 0 in every document (``positions_from_cu_seqlens``), so each token
        gets the output it would get in the same documents padded in (N, max length); ``start_pos``, an
        int or (N,) ints, is where each document starts counting (documents continuing a KV cache, as
        flash-attn's ``seqlen_offsets``); positions or position_ids="padding" with cu_seqlens: ConfigError.
    """

    def __init__(self, vocab_size: int, d_model: int, max_seq_len: int = 512, *,
                 positional: Any = "learned", num_heads: int | None = None, scale: bool = False,
                 dropout: float = 0.0, padding_idx: int | None = None, init: str = "normal", std: float = 0.02,
                 num_token_types: int = 0, norm: str | None = None, norm_eps: float = 1e-5,
                 position_ids: str = "default", dtype: Any = np.float32,
                 seed: int | None = None, rng: np.random.Generator | None = None) -> None:
        super().__init__()
        args = check_embedding_args(positional=positional, d_model=d_model, max_seq_len=max_seq_len,
                                    dropout=dropout, num_token_types=num_token_types, position_ids=position_ids,
                                    padding_idx=padding_idx, num_heads=num_heads, scale=scale,
                                    backend="numpy", scheme_base=Module)
        self.positional, self.max_seq_len, self.dropout = args.positional, args.max_seq_len, args.dropout
        self.num_token_types, self.position_ids = args.num_token_types, args.position_ids
        self.num_heads = args.num_heads
        self._rng = resolve_rng(seed, rng)
        self.token = TokenEmbedding(vocab_size, d_model, init=init, std=std, scale=args.scale,
                                    padding_idx=padding_idx, dtype=dtype, rng=self._rng)
        self.d_model, self.dtype = self.token.d_model, self.token.dtype
        self.position: Any = args.scheme if args.scheme is not None else build_shortcut(
            args.positional, d_model=self.d_model, max_seq_len=self.max_seq_len, num_heads=args.num_heads,
            position_padding_idx=padding_idx if self.position_ids == "padding" else None,
            init=init, std=std, dtype=self.dtype, rng=self._rng)
        self.token_type: TokenEmbedding | None = (
            TokenEmbedding(self.num_token_types, self.d_model, init=init, std=std, dtype=dtype, rng=self._rng)
            if self.num_token_types else None)
        self.norm: Any = build_norm(norm, self.d_model, norm_eps, self.dtype)
        self._cache: TransformerCache | None = None

    def reset_parameters(self, *, seed: int | None = None, rng: np.random.Generator | None = None) -> None:
        """Re-draw every table (token, position, token type) from one generator, in that order."""
        gen = resolve_rng(seed, rng)
        self.token.reset_parameters(rng=gen)
        self.position.reset_parameters(rng=gen)
        if self.token_type is not None:
            self.token_type.reset_parameters(rng=gen)
        if self.norm is not None:
            self.norm.reset_parameters()

    @property
    def vocab_size(self) -> int:
        """V, live: follows ``token.resize``."""
        return self.token.vocab_size

    @property
    def padding_idx(self) -> int | None:
        return self.token.padding_idx

    # -- the one boundary: every input checked here, before anything changes ---------------------
    def _batch(self, token: TokenEmbedding, position: Any, ids: Any, positions: Any, start_pos: int,
               token_type_ids: Any, cu_seqlens: Any = None) -> Batch[np.ndarray]:
        """Every input of :meth:`forward`, checked (ids first, so a bad id is reported before any other
        bad input, as in torch), as a :class:`tables.plan.Batch`: ids (L,) / (B, L) int64 in [0, V);
        the positions (given ones, RoBERTa's, or start_pos + arange(L)), inside the table of a scheme
        that does not extend beyond it; token types. ``token`` and ``position`` are the layer's,
        read once per call by :meth:`forward`.
        """
        vocab = token.vocab_size
        if not (type(ids) is np.ndarray and ids.dtype == INT64 and ids.size and ids.view(np.uint64).max() < vocab):
            ids = check_token_ids(ids, vocab)                       # (token.INT64: one reduction for int64 ids)
        if ids.ndim not in (1, 2):
            raise ConfigError(shape_message("ids", "(B, L) or (L,)", ids.shape))
        L = ids.shape[-1]
        limit = table_limit(position)
        end: int | None                                             # max(positions) + 1; None: not read
        if cu_seqlens is not None:                                  # packed: positions restart per document
            total = check_packed_embedding_args(ids.shape, positions, self.position_ids)
            pos, end = document_positions(cu_seqlens, total, start_pos)     # from start_pos in every document
            if limit is not None and end > limit:                   # a document may run past the table
                check_positions_at(pos, ids.shape, limit)
        elif positions is not None:                                 # given: used as they are
            check_start_pos_with_positions(start_pos, positions)
            pos = check_positions(positions)
            if pos.shape not in (ids.shape, ids.shape[-1:]):
                raise ConfigError(shape_message("positions", f"{ids.shape[-1:]} or {ids.shape}", pos.shape))
            if limit is not None:
                check_positions_at(pos, ids.shape, limit)
            end = int(pos.max()) + 1 if limit is None and position.kind == "additive" and pos.size else None
        else:
            if self.position_ids == "padding":                      # RoBERTa: from the padding id
                pad = int(token.padding_idx)                        # type: ignore[arg-type]
                pos, end = positions_from_padding(ids, pad, start_pos), pad + start_pos + L + 1
            elif type(start_pos) is int and 0 <= start_pos <= INT64_MAX - L:   # valid: check_start_pos's verdict
                pos, end = np.arange(start_pos, start_pos + L, dtype=np.int64), start_pos + L if L else 0
            else:
                pos = shared_default_positions(L, start_pos)        # checks start_pos: ConfigError, PositionError
                end = int(pos[-1]) + 1 if L else 0
            if limit is not None and end > limit:                   # may run past the table: read them
                check_positions_at(pos, ids.shape, limit)
        tt = None if token_type_ids is None and self.token_type is None else self._token_types(ids.shape,
                                                                                              token_type_ids)
        return Batch(ids, pos, end, tt)

    def _token_types(self, shape: tuple[int, ...], token_type_ids: Any) -> np.ndarray | None:
        """Token types of the ids' ``shape``, checked; all type 0 when none are given."""
        if self.token_type is None:
            if token_type_ids is not None:
                raise ConfigError(NO_TOKEN_TYPES)
            return None
        tt = np.zeros(shape, np.int64) if token_type_ids is None else check_token_ids(token_type_ids,
                                                                                     self.num_token_types)
        if tt.shape != shape:
            raise ConfigError(shape_message("token_type_ids", shape, tt.shape))
        return tt

    # -- the model ---------------------------------------------------------------------------------
    def forward(self, ids: Any, positions: Any = None, *, start_pos: int = 0,
                token_type_ids: Any = None, cu_seqlens: Any = None) -> np.ndarray:
        """ids (B, L) or (L,) -> (B, L, D) or (L, D). Every input is checked first (:meth:`_batch`); the
        dropout seed is drawn after that, so a call that raises changes nothing."""
        token, position = self.token, self.position
        batch = self._batch(token, position, ids, positions, start_pos, token_type_ids, cu_seqlens)
        p = self.dropout if self.training else 0.0
        plan = plan_embedding(position, pos_end=batch.pos_end, token_types=self.token_type is not None,
                              norm=self.norm is not None, sparse=False, dropout=p > 0.0)
        ids, pos = batch.ids, batch.positions
        seed = draw_seed(self._rng) if p > 0.0 else 0
        table = position.table if plan.table else None
        table_param = position.table_param if plan.table or plan.rows == "lookup" else None
        x, c_emb = F.embedding_forward(                                         # W[ids] * s (+ P[pos])
            token.weight.data, ids, scale=token.multiplier if token.scale else 1.0, table=table,
            pos=pos if plan.table else None, p=p if plan.fused_dropout else 0.0, seed=seed,
            padding_idx=token.padding_idx, table_grad=plan.table and table_param is not None
            and table_param.requires_grad)
        c_tt = c_pos = c_norm = c_drop = None
        if batch.token_types is not None:                                       # + T[tt]
            t, c_tt = F.embedding_forward(self.token_type.weight.data, batch.token_types)  # type: ignore[union-attr]
            x = x + t
        if plan.rows == "lookup":                                               # + P[pos]
            rows, c_pos = F.embedding_forward(position.table, np.broadcast_to(pos, ids.shape),
                                              padding_idx=position.padding_idx)
            x = x + rows
        elif plan.rows == "formula":
            x = x + position.encode(pos)
        if self.norm is not None:                                               # norm
            x, c_norm = self.norm.norm_forward(x)
        if plan.late_dropout:                                                   # dropout
            x, c_drop = F.dropout_forward(x, p=p, seed=seed)
        object.__setattr__(self, "_cache", TransformerCache(c_emb, c_tt, c_pos, c_norm, c_drop, table_param,
                                                            x.shape))        # a plain attribute: no registration
        return x

    def backward(self, grad_output: np.ndarray) -> None:
        """Gradients flow to the token table (row-sparse), learned positions, token types and norm."""
        cache = self._cached(self._cache)
        g = check_grad("grad_output", grad_output, cache.shape)
        if cache.dropout is not None:
            g = F.dropout_backward(g, cache.dropout)
        if cache.norm is not None:
            g = self.norm.norm_backward(g, cache.norm)
        if cache.token_type is not None:
            (ids, rows), _ = F.embedding_backward(g, cache.token_type)
            self.token_type.weight.accumulate_rows(ids, rows, coalesced=True)   # type: ignore[union-attr]
        if cache.position is not None and cache.table_param is not None:
            (at, rows), _ = F.embedding_backward(g, cache.position)
            cache.table_param.accumulate_rows(at, rows, coalesced=True)
        (ids, rows), table_grad = F.embedding_backward(g, cache.embedding)
        self.token.weight.accumulate_rows(ids, rows, coalesced=True)
        if table_grad is not None:
            cache.table_param.accumulate(table_grad)

    def extra_repr(self) -> str:
        s = f"{self.vocab_size}, {self.d_model}, max_seq_len={self.max_seq_len}, positional={self.positional!r}"
        if self.dropout:
            s += f", dropout={self.dropout}"
        return s


EmbeddingLayer = TransformerEmbedding
