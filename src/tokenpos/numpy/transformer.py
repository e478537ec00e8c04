"""TransformerEmbedding: token table (+ sqrt(D) scale) + positions + token types, norm, dropout.

    x = W[ids] * s + P[positions]                          (no token types; P only for additive schemes)
    x = W[ids] * s + T[token_type_ids] + P[positions]      (with token types: Hugging Face's BERT order)
    y = dropout(norm(x))                                   (s = sqrt(D) when scale=True, else 1)

Each step is one call of ``tokenpos.numpy.functional``; without norm and token types the first call
also applies the dropout (one fused pass on the kernel path). The torch backend sums in the same order.

Shapes: B batch, L length, D d_model; ids (B, L) -> (B, L, D) and ids (L,) -> (L, D).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from tokenpos.numpy import functional as F
from tokenpos.numpy.module import Module, Parameter
from tokenpos.numpy.norm import build_norm
from tokenpos.numpy.schemes import build_shortcut
from tokenpos.numpy.token import TokenEmbedding
from tokenpos.tables.dropout import draw_seed, undo_draw_seed
from tokenpos.tables.embedding_args import check_embedding_args
from tokenpos.tables.errors import ConfigError
from tokenpos.tables.init import resolve_rng
from tokenpos.tables.positions import positions_from_padding, shared_default_positions
from tokenpos.tables.validation import check_positions, check_start_pos_with_positions, check_token_ids


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
        forward(ids (B, L) or (L,), positions (L,) or (B, L) | None, start_pos=0, token_type_ids) -> (..., D);
        positions default to start_pos + arange(L); given positions are used as they are, so start_pos
        must then be 0 (anything else: ConfigError; add the offset to the positions instead).
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

    def _resolve_positions(self, ids: np.ndarray, positions: Any, start_pos: int) -> np.ndarray:
        """The positions of ``ids`` (..., L): given ones (checked; start_pos must then be 0), RoBERTa's, or
        start_pos + arange(L)."""
        if positions is not None:
            check_start_pos_with_positions(start_pos, positions)
            pos = check_positions(positions)
            if pos.shape not in (ids.shape, ids.shape[-1:]):
                raise ConfigError(f"positions must have shape {ids.shape[-1:]} or {ids.shape}, got {pos.shape}")
            return pos
        pad = self._position_padding()
        if pad is not None:
            return positions_from_padding(ids, pad, start_pos)
        return shared_default_positions(ids.shape[-1], start_pos)         # read-only: nothing here writes it

    def _inputs(self, ids: np.ndarray, positions: Any, start_pos: int, token_type_ids: Any
                ) -> tuple[np.ndarray, np.ndarray | None, tuple[Any, Any, Any]]:
        """Checks everything but the ids' values (the op checks those); returns (positions, token
        types, (table, its row of each position, the table's Parameter) or Nones).

        Any error here is preceded by the ids' own check: a bad id is reported first, as when the
        ids are checked up front, so kernels on and off raise the same error.
        """
        try:
            if ids.ndim not in (1, 2):
                raise ConfigError(f"ids must have shape (B, L) or (L,), got {ids.shape}")
            pos = self._resolve_positions(ids, positions, start_pos)            # (L,) or (B, L)
            tt = self._token_types(ids, token_type_ids)
            lookup = (self.position.table_for(pos, ids.shape, in_range=self._in_range(
                positions, start_pos, ids.shape[-1])) if self.position.kind == "additive" else (None, None, None))
        except ValueError:                                                      # every typed error
            check_token_ids(ids, self.vocab_size)
            raise
        return pos, tt, lookup

    def _position_padding(self) -> int | None:
        """The padding id that positions are derived from when none are given (RoBERTa), else None."""
        return self.token.padding_idx if self.position_ids == "padding" else None

    def _in_range(self, positions: Any, start_pos: int, length: int) -> bool:
        """Whether the positions are the default ones and end inside the positional table (so
        ``table_for`` need not read them): start_pos + L <= max_seq_len."""
        default = positions is None and self._position_padding() is None
        return default and start_pos + length <= self.position.max_seq_len

    def _token_types(self, ids: np.ndarray, token_type_ids: Any) -> np.ndarray | None:
        if self.token_type is None:
            if token_type_ids is not None:
                raise ConfigError("token_type_ids given but num_token_types=0; construct with num_token_types > 0")
            return None
        tt = np.zeros_like(ids) if token_type_ids is None else check_token_ids(token_type_ids, self.num_token_types)
        if tt.shape != ids.shape:
            raise ConfigError(f"token_type_ids must have shape {ids.shape}, got {tt.shape}")
        return tt

    def forward(self, ids: Any, positions: Any = None, *, start_pos: int = 0,
                token_type_ids: Any = None) -> np.ndarray:
        """ids (B, L) or (L,) -> (B, L, D) or (L, D). Every input but the ids' values is checked before
        any state changes.

        The ids' values are checked once, by the first embedding op (its kernel inside the gather
        loop, its plain path first), and a bad id is reported before any other bad input. A call
        that raises changes nothing: the dropout seed drawn before the op is taken back
        (``undo_draw_seed``).
        """
        p = self.dropout if self.training else 0.0
        ids = check_token_ids(ids, self.vocab_size, values=False)              # the op checks the values
        pos, tt, (table, index, table_param) = self._inputs(ids, positions, start_pos, token_type_ids)
        before = self._rng.bit_generator.state if p > 0.0 else None
        seed = draw_seed(self._rng) if p > 0.0 else 0
        w, late = self.token.weight.data, self.norm is not None or tt is not None   # late: dropout after norm
        s, pad_pos = self.token.multiplier, getattr(self.position, "padding_idx", None)
        c_pos = c_tt = c_norm = c_drop = None
        try:                                                # the first op checks the ids' values
            if tt is None:
                x, c_emb = F.embedding_forward(                                 # W[ids] * s + P[pos]
                    w, ids, scale=s, table=table, pos=index, p=0.0 if late else p, seed=seed,
                    padding_idx=self.token.padding_idx, table_padding_idx=pad_pos,
                    table_grad=table_param is not None and table_param.requires_grad, check_ids=True)
            else:                                                               # HF's (BERT's) order:
                x, c_emb = F.embedding_forward(w, ids, scale=s, padding_idx=self.token.padding_idx,  # W[ids] * s
                                               check_ids=True)
        except ValueError:                                  # a bad id or position: the draw is taken back
            if before is not None:
                undo_draw_seed(self._rng, before)
            raise
        if tt is not None:
            t, c_tt = F.embedding_forward(self.token_type.weight.data, tt)      # type: ignore[union-attr]
            x = x + t                                                           # + T[token_type_ids]
            if table is not None and index is not None:                         # + P[pos]
                rows, c_pos = F.embedding_forward(table, np.broadcast_to(index, ids.shape), padding_idx=pad_pos)
                x = x + rows
        if self.norm is not None:                                               # norm
            x, c_norm = self.norm.norm_forward(x)
        if late:                                                                # dropout
            x, c_drop = F.dropout_forward(x, p=p, seed=seed)
        self._cache = TransformerCache(c_emb, c_tt, c_pos, c_norm, c_drop, table_param, x.shape)
        return x

    def backward(self, grad_output: np.ndarray) -> None:
        """Gradients flow to the token table (row-sparse), learned positions, token types and norm."""
        cache = self._cached(self._cache)
        g = np.asarray(grad_output)
        if g.shape != cache.shape:
            raise ValueError(f"grad_output must have shape {cache.shape}, got {g.shape}")
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
