"""TransformerEmbedding: token table (+ sqrt(D) scale) + token types + positions, norm, dropout.

    x = W[ids] * s + T[token_type_ids] + P(positions)      (P only for additive schemes)
    y = dropout(norm(x))

(Hugging Face's summation order, in both backends, so ``from_hf`` reproduces BERT/RoBERTa bit for bit.)
Which ops a call runs is decided by ``tables.plan.plan_embedding`` (shared with NumPy); without
token types and norm, the whole line is ONE ``tokenpos::embedding`` op call.

Shapes: B batch, L length, D d_model; ids (B, L) -> (B, L, D) and ids (L,) -> (L, D).
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import torch

from tokenpos.tables.checks.embedding import NO_TOKEN_TYPES, check_embedding_args, check_padding_start
from tokenpos.tables.checks.packing import check_packed_embedding_args
from tokenpos.tables.checks.validation import check_start_pos, check_start_pos_with_positions, shape_message
from tokenpos.tables.errors import ConfigError
from tokenpos.tables.formulas.dropout import SEED_MASK
from tokenpos.tables.plan import Batch, plan_embedding, table_limit
from tokenpos.torch._checks import (
    check_position_tensor,
    check_token_id_tensor,
    index_tensor,
    is_compiling,
    resolve_dtype,
    values_readable,
)
from tokenpos.torch._dropout import draw_seed_torch, dropout_torch, generator_device_message
from tokenpos.torch._init import resolve_torch_rng
from tokenpos.torch._module import TokenposModule
from tokenpos.torch.norm import build_norm
from tokenpos.torch.ops import embed
from tokenpos.torch.packing import document_positions
from tokenpos.torch.schemes import build_shortcut
from tokenpos.torch.token import TokenEmbedding, _pad, token_rows

ARANGE_CAP = 1 << 22                                    # positions below this come from the shared arange


@functools.lru_cache(maxsize=16)
def _arange(n: int, device: torch.device) -> torch.Tensor:
    with torch.inference_mode(False):                  # a normal tensor, so autograd may save it
        return torch.arange(n, device=device)


@functools.lru_cache(maxsize=64)
def _positions(start: int, end: int, device: torch.device) -> torch.Tensor:
    return _arange(max(1024, 1 << (end - 1).bit_length()), device)[start:end]     # a view: no kernel


def default_positions(start: int, length: int, device: torch.device) -> torch.Tensor:
    """``start + arange(length)`` (int64) on ``device``: a view of one shared ``arange`` per device (its
    length a power of two, at least 1024), so a call launches no kernel and allocates nothing, decode
    steps included (a ``torch.arange`` per call is a kernel launch on a GPU, and 30-100 us on the CPU
    when caches are cold); the views of the last 64 (start, length) are kept too (a slice costs 2 us of
    host time). The ops never write their inputs; a caller can still reach the view through a graph's
    ``grad_fn.saved_tensors``, and if it was written there (the version counter it shares with the
    arange moved) both caches are dropped, so a later call never reads changed positions. Under
    ``torch.compile`` and past ``ARANGE_CAP``: a fresh ``torch.arange``."""
    end = start + length
    if torch.compiler.is_compiling() or end > ARANGE_CAP:
        return torch.arange(start, end, device=device)
    pos = _positions(start, end, device)
    if pos._version:                                    # written in place by someone: not ours any more
        _positions.cache_clear()
        _arange.cache_clear()
        pos = _positions(start, end, device)
    return pos


def positions_from_padding(ids: torch.Tensor, padding_idx: int, start_pos: int = 0) -> torch.Tensor:
    """RoBERTa's positions (``tables.formulas.positions.positions_from_padding`` in torch ops), int64 like ids;
    ``start_pos`` checked as there (the positions run to padding_idx + start_pos + L)."""
    start_pos = check_padding_start(start_pos, padding_idx, ids.shape[-1] if ids.dim() else 1)
    mask = (ids != padding_idx).long()
    return (torch.cumsum(mask, dim=-1) + start_pos) * mask + padding_idx


class TransformerEmbedding(TokenposModule):
    """The input block of a transformer (the torch twin of ``tokenpos.numpy.TransformerEmbedding``).

    Args:
        vocab_size, d_model, max_seq_len: V, D, and the number of positions of a learned table.
        positional: a string shortcut ("learned", "sinusoidal", "rope", "alibi", "t5", "none"; None =
            "none"), built with default settings, or a tokenpos.torch scheme object carrying its own
            settings (``RotaryEmbedding(64, scaling=...)``, ``T5RelativePositionBias(12, ...)``, ...).
        num_heads: H, for the "rope" (head_dim = D / H), "alibi" and "t5" shortcuts.
        scale: multiply token rows by sqrt(D). dropout: p of the output dropout.
        padding_idx, init, std: the token table's. num_token_types, norm, norm_eps, position_ids: as
            the NumPy layer. device / dtype: factory kwargs. seed / rng: NumPy-identical init;
            generator: a torch.Generator for the initial weights and the dropout seeds (default:
            torch's global one). The dropout seeds are drawn on the layer's device, so a
            ``generator`` must live there when the layer trains with dropout: a CPU generator serves
            a CPU layer; a layer on CUDA takes a CUDA generator (``torch.Generator("cuda")``) or None
            (CUDA's default generator); a CPU generator there is refused (ConfigError) at the first
            training call rather than silently ignored. The initial weights take any generator.

    Dropout uses the counter-based mask of ``tokenpos.tables.formulas.dropout``: a fresh 63-bit seed per
    training forward, drawn from torch's generator on the layer's device, so ``torch.manual_seed`` (or
    ``generator=``; on CUDA ``torch.cuda.manual_seed``) reproduces a run. On CUDA the seed is drawn on
    the device (no host sync), so a training step can be captured in a CUDA graph and each replay
    draws fresh masks.

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

    state_dict: ``token.weight``, ``position.weight`` (learned), ``token_type.weight``
    (num_token_types > 0), ``norm.weight`` and ``norm.bias`` (layernorm) / ``norm.weight`` (rmsnorm).
    """

    def __init__(self, vocab_size: int, d_model: int, max_seq_len: int = 512, *,
                 positional: Any = "learned", scale: bool = False, dropout: float = 0.0,
                 padding_idx: int | None = None, init: str = "normal", std: float = 0.02,
                 num_heads: int | None = None, num_token_types: int = 0, norm: str | None = None,
                 norm_eps: float = 1e-5, position_ids: str = "default", device: Any = None, dtype: Any = None,
                 seed: int | None = None, rng: np.random.Generator | None = None,
                 generator: torch.Generator | None = None) -> None:
        super().__init__()
        args = check_embedding_args(positional=positional, d_model=d_model, max_seq_len=max_seq_len,
                                    dropout=dropout, num_token_types=num_token_types, position_ids=position_ids,
                                    padding_idx=padding_idx, num_heads=num_heads, scale=scale,
                                    backend="torch", scheme_base=TokenposModule)
        self.positional, self.max_seq_len, self.dropout = args.positional, args.max_seq_len, args.dropout
        self.num_token_types, self.position_ids = args.num_token_types, args.position_ids
        dtype = resolve_dtype(dtype)
        self.generator = generator
        init_rng = resolve_torch_rng(seed, rng, generator)
        self.token = TokenEmbedding(vocab_size, d_model, init=init, std=std, scale=args.scale,
                                    padding_idx=padding_idx, device=device, dtype=dtype, rng=init_rng)
        self.d_model = self.token.d_model
        self.position: Any = args.scheme if args.scheme is not None else build_shortcut(
            args.positional, d_model=self.d_model, max_seq_len=self.max_seq_len, num_heads=args.num_heads,
            position_padding_idx=padding_idx if self.position_ids == "padding" else None, init=init, std=std,
            rng=init_rng, device=device, dtype=dtype)
        self.token_type = (TokenEmbedding(self.num_token_types, self.d_model, init=init, std=std, device=device,
                                          dtype=dtype, rng=init_rng) if self.num_token_types else None)
        self.norm = build_norm(norm, self.d_model, norm_eps, device=device, dtype=dtype)

    @property
    def vocab_size(self) -> int:
        """V, read from the token table (so ``emb.token.resize(...)`` is seen by the id checks)."""
        return self.token.vocab_size

    @property
    def padding_idx(self) -> int | None:
        return self.token.padding_idx

    @property
    def dtype(self) -> torch.dtype:
        return self.token.weight.dtype

    def reset_parameters(self, *, seed: int | None = None, rng: np.random.Generator | None = None,
                         generator: torch.Generator | None = None) -> None:
        """Re-draw every table in the constructor's order (same seed: same weights as NumPy)."""
        init_rng = resolve_torch_rng(seed, rng, generator)
        for m in (self.token, self.position, self.token_type, self.norm):
            if m is not None:
                m.reset_parameters(rng=init_rng)  # type: ignore[operator]

    # -- the one boundary: every input checked here, before anything changes ---------------------
    def _batch(self, token: TokenEmbedding, weight: torch.Tensor, position: Any, ids: Any, positions: Any,
               start_pos: Any, token_type_ids: Any, cu_seqlens: Any = None) -> Batch[torch.Tensor]:
        """Every input of :meth:`forward`, checked, as a :class:`tables.plan.Batch`: ids (L,) / (B, L) of an
        index dtype (:func:`index_tensor`: on the CPU their values are read where they are gathered); the
        positions (given ones, RoBERTa's, or start_pos + arange(L)), inside the table of a scheme that does not
        extend beyond it; token types. A bad id is reported before any other bad input, as in NumPy: when
        another check fails, the ids' values are checked first. ``token``, its ``weight`` and ``position`` are
        the layer's, which :meth:`forward` reads once per call (each ``nn.Module`` submodule or parameter read
        is a ``__getattr__``).
        """
        ids = index_tensor(ids, token.vocab_size, weight)
        try:
            if ids.dim() not in (1, 2):
                raise ConfigError(shape_message("ids", "(B, L) or (L,)", ids.shape))
            shape, L = tuple(ids.shape), ids.shape[-1]
            limit = table_limit(position)
            end: int | None                                             # max(positions) + 1; None: not read
            if cu_seqlens is not None:                                  # packed: positions restart per document
                total = check_packed_embedding_args(shape, positions, self.position_ids)
                pos, end = document_positions(cu_seqlens, total, ids.device, start_pos)   # from start_pos in each
                if limit is not None and (end is None or end > limit):  # a document may run past the table
                    check_position_tensor(pos, limit, broadcast_to=shape)
            elif positions is not None:                                 # given: used as they are
                check_start_pos_with_positions(start_pos, positions)
                pos = check_position_tensor(positions, device=ids.device)
                if pos.shape != ids.shape and pos.shape != ids.shape[-1:]:
                    raise ConfigError(shape_message("positions", f"{shape[-1:]} or {shape}", pos.shape))
                if limit is not None:                                   # indexed as used, as NumPy does
                    check_position_tensor(pos, limit, broadcast_to=shape)
                # a table that extends: inside it? Read on the CPU only (elsewhere a read would sync:
                # unknown, so the rows come from the formula, the same values)
                readable = (limit is None and position.kind == "additive" and pos.numel() and pos.is_cpu
                            and values_readable(pos))
                end = int(pos.max()) + 1 if readable else None
            else:
                if self.position_ids == "padding":                      # RoBERTa: from the padding id
                    check_token_id_tensor(ids, token.vocab_size)        # the positions read the ids: checked first
                    pad = int(token.padding_idx)                        # type: ignore[arg-type]
                    pos, end = positions_from_padding(ids, pad, start_pos), pad + start_pos + L + 1
                else:
                    if not (type(start_pos) is int and 0 <= start_pos <= ARANGE_CAP):
                        start_pos = check_start_pos(start_pos, L)       # bool, float, negative, past int64
                    pos, end = default_positions(start_pos, L, ids.device), start_pos + L
                if limit is not None and end > limit:                   # may run past the table: read them
                    check_position_tensor(pos, limit, broadcast_to=shape)
            tt = None if token_type_ids is None else self._token_types(shape, ids.device, token_type_ids)
            return Batch(ids, pos, end, tt)
        except Exception:
            check_token_id_tensor(ids, token.vocab_size)           # a bad id first
            raise

    def _token_types(self, shape: tuple[int, ...], device: torch.device, token_type_ids: Any) -> torch.Tensor:
        """Given token types (not None; None means all type 0) of the ids' ``shape``, checked."""
        if not self.num_token_types:
            raise ConfigError(NO_TOKEN_TYPES)
        tt = check_token_id_tensor(token_type_ids, self.num_token_types, device=device)
        if tuple(tt.shape) != shape:
            raise ConfigError(shape_message("token_type_ids", shape, tt.shape))
        return tt

    # -- the model ---------------------------------------------------------------------------------
    def forward(self, ids: Any, positions: Any = None, *, start_pos: int = 0,
                token_type_ids: Any = None, cu_seqlens: Any = None) -> torch.Tensor:
        """ids (B, L) or (L,) -> (B, L, D) or (L, D). Every input is checked first (:meth:`_batch`), then the
        dropout seed is drawn, then the ops of the call's plan run. Without dropout the ids' values on the CPU
        are read by the op that gathers them (a bad one raises the shared TokenIdError from there; nothing has
        changed); a training call with dropout reads them before it draws its seed, so a refused call leaves
        the generator as it was."""
        token, position, token_type, norm = self.token, self.position, self.token_type, self.norm
        weight = token.weight
        batch = self._batch(token, weight, position, ids, positions, start_pos, token_type_ids, cu_seqlens)
        p = self.dropout if self.training else 0.0
        plan = plan_embedding(position, pos_end=batch.pos_end, token_types=token_type is not None,
                              norm=norm is not None, sparse=token.sparse, dropout=p > 0.0)
        seed = None
        if p:                                   # a refused call must not move the generator: the ids' values first
            check_token_id_tensor(batch.ids, token.vocab_size)
            seed = self._dropout_seed(p, weight)
        try:
            if token.sparse:                                                         # W[ids] * s, row-sparse
                x = token_rows(token, batch.ids, weight)
            else:                                                                    # W[ids] * s (+ P[pos])
                x = embed(weight, batch.ids, position.table if plan.table else None,
                          batch.positions if plan.table else None, token.multiplier,
                          p if plan.fused_dropout else 0.0, seed, _pad(token.padding_idx))
        except Exception:
            check_token_id_tensor(batch.ids, token.vocab_size)     # a bad id the gather met: the shared error
            raise
        if token_type is not None:                                                   # + T[tt]
            tt = batch.token_types
            x = x + (token_type.weight[0] if tt is None else token_rows(token_type, tt))
        if plan.rows == "lookup":                                                    # + P[pos]
            x = x + embed(position.table, batch.positions, padding_idx=_pad(position.padding_idx))
        elif plan.rows == "formula":
            x = x + position.encode(batch.positions)
        if norm is not None:
            x = norm(x)
        if plan.late_dropout:
            x = dropout_torch(x, p, seed)
        return x

    def _dropout_seed(self, p: float, like: torch.Tensor) -> torch.Tensor:
        """A 0-d int64 seed on ``like``'s device: fresh per training call, 0 without dropout. Drawn on
        that device (:func:`draw_seed_torch`: no host-to-device copy, no sync, CUDA-graph safe) from
        ``generator`` or the device's default generator.

        Raises:
            ConfigError: ``generator`` lives on another device than the layer (a CPU generator for
                a layer moved to CUDA): checked before anything changes. A ``generator`` under
                ``torch.compile``: a generator does not trace, and drawing from the global one instead would
                silently break "generator= reproduces a run".
        """
        if is_compiling():                                  # in-graph draw (generators do not trace)
            if self.generator is not None:
                raise ConfigError("a TransformerEmbedding with its own generator cannot draw its dropout seed under "
                                  "torch.compile (a generator does not trace); seed torch's global generator "
                                  "(torch.manual_seed) and set layer.generator = None, or run it eagerly")
            return torch.randint(0, SEED_MASK, (), device=like.device, dtype=torch.int64)
        g = self.generator
        if g is not None and g.device != like.device:
            raise ConfigError(generator_device_message(g.device, like.device))
        return draw_seed_torch(g, like.device)

    def extra_repr(self) -> str:
        s = f"{self.vocab_size}, {self.d_model}, max_seq_len={self.max_seq_len}, positional={self.positional!r}"
        if self.dropout:
            s += f", dropout={self.dropout}"
        return s


EmbeddingLayer = TransformerEmbedding
