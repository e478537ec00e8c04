"""TransformerEmbedding: token table (+ sqrt(D) scale) + token types + positions, norm, dropout.

    x = W[ids] * s + T[token_type_ids] + P(positions)      (P only for additive schemes)
    y = dropout(norm(x))

(Hugging Face's summation order, in both backends, so ``from_hf`` reproduces BERT/RoBERTa bit for bit.)
Without token types and norm, the whole line is ONE ``tokenpos::embedding`` op call.

Shapes: B batch, L length, D d_model; ids (B, L) -> (B, L, D) and ids (L,) -> (L, D).
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import torch

from tokenpos.tables.dropout import SEED_MASK
from tokenpos.tables.embedding_args import check_embedding_args
from tokenpos.tables.errors import ConfigError
from tokenpos.tables.positions import check_padding_start
from tokenpos.tables.validation import check_start_pos, check_start_pos_with_positions
from tokenpos.torch._checks import (
    check_position_tensor,
    check_token_id_tensor,
    is_compiling,
    resolve_dtype,
    values_readable,
)
from tokenpos.torch._dropout import draw_seed_torch, dropout_torch, seed_snapshot, undo_seed_draw
from tokenpos.torch._init import resolve_torch_rng
from tokenpos.torch._module import TokenposModule
from tokenpos.torch.learned import LearnedPositionalEmbedding
from tokenpos.torch.norm import build_norm
from tokenpos.torch.ops import embed
from tokenpos.torch.ops.entry import no_seed
from tokenpos.torch.schemes import build_shortcut
from tokenpos.torch.sinusoidal import SinusoidalPositionalEncoding
from tokenpos.torch.token import TokenEmbedding, _pad, checked_ids, token_rows


@functools.lru_cache(maxsize=64)
def _cpu_arange(start: int, stop: int) -> torch.Tensor:
    with torch.inference_mode(False):                  # a normal tensor, so autograd may save it
        return torch.arange(start, stop, device="cpu")  # whatever the default device (torch.device context)


def default_positions(start: int, length: int, like: torch.Tensor) -> torch.Tensor:
    """``start + arange(length)`` (int64) on ``like``'s device. On the CPU in eager mode, one shared
    tensor per (start, length) (a ``torch.arange`` per call costs 30-100 us when caches are cold):
    the ops never write their inputs. A caller can still reach it, through a graph's
    ``grad_fn.saved_tensors``; if it was written there (its version counter moved), the cache is
    dropped and rebuilt, so a later call never reads changed positions."""
    if like.is_cpu and not torch.compiler.is_compiling():
        pos = _cpu_arange(start, start + length)
        if pos._version:                                # written in place by someone: not ours any more
            _cpu_arange.cache_clear()
            pos = _cpu_arange(start, start + length)
        return pos
    return torch.arange(start, start + length, device=like.device)


def positions_from_padding(ids: torch.Tensor, padding_idx: int, start_pos: int = 0) -> torch.Tensor:
    """RoBERTa's positions (``tables.positions.positions_from_padding`` in torch ops), int64 like ids;
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
            torch's global one).

    Dropout uses the counter-based mask of ``tokenpos.tables.dropout``: a fresh 63-bit seed per
    training forward, drawn from torch's generator, so ``torch.manual_seed`` (or ``generator=``)
    reproduces a run.

    Shape:
        forward(ids (B, L) or (L,), positions (L,) or (B, L) | None, start_pos=0, token_type_ids) -> (..., D);
        positions default to start_pos + arange(L); given positions are used as they are, so start_pos
        must then be 0 (anything else: ConfigError; add the offset to the positions instead).

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
        self.position = args.scheme if args.scheme is not None else build_shortcut(
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

    # -- inputs (checked once, here) -------------------------------------------------------------
    def _resolve_positions(self, ids: torch.Tensor, positions: Any, start_pos: int) -> torch.Tensor:
        """The positions of ``ids`` (..., L): given ones (checked; start_pos must then be 0), RoBERTa's, or
        start_pos + arange(L)."""
        if positions is not None:
            check_start_pos_with_positions(start_pos, positions)
            pos = check_position_tensor(positions, device=ids.device)
            if tuple(pos.shape) not in (tuple(ids.shape), tuple(ids.shape[-1:])):
                raise ConfigError(f"positions must have shape {tuple(ids.shape[-1:])} or {tuple(ids.shape)}, "
                                  f"got {tuple(pos.shape)}")
        position = self.position
        limit = position.max_seq_len if isinstance(position, LearnedPositionalEmbedding) else None  # rows of a table
        if positions is None:
            pad = self.token.padding_idx if self.position_ids == "padding" else None
            if pad is not None:                                        # the constructor ensures pad is set
                pos = positions_from_padding(ids, pad, start_pos)      # checks start_pos for its longer span
            else:
                start_pos = check_start_pos(start_pos, ids.shape[-1])
                pos = default_positions(start_pos, ids.shape[-1], ids)
                if limit is None or start_pos + ids.shape[-1] <= limit:
                    return pos                                         # in range by construction
        if limit is not None:                                          # range, indexed as NumPy does
            check_position_tensor(pos, limit, broadcast_to=tuple(ids.shape))
        return pos

    def _inputs(self, ids: torch.Tensor, positions: Any, start_pos: int, token_type_ids: Any, fuses: bool, *,
                defer: bool) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """Checks everything but the ids' values (``defer``: the op checks those); returns (positions,
        token types, the positional table of a one-op block or None).

        With ``defer``, any error here is preceded by the ids' own check: a bad id is reported
        first, as when the ids are checked up front (and as the NumPy layer reports it).
        """
        try:
            if ids.dim() not in (1, 2):
                raise ConfigError(f"ids must have shape (B, L) or (L,), got {tuple(ids.shape)}")
            pos = self._resolve_positions(ids, positions, start_pos)              # (L,) or (B, L)
            tt = self._token_types(ids, token_type_ids)
            end = self._positions_end(positions, start_pos, ids.shape[-1])
            table = self._position_table(pos, end) if fuses else None
        except ValueError:                                                      # every typed error
            if defer:
                checked_ids(ids, self.vocab_size, self.token.weight)
            raise
        return pos, tt, table

    def _positions_end(self, positions: Any, start_pos: int, length: int) -> int | None:
        """An exclusive bound of the positions this layer derives (None for given ones): start_pos + L
        for the default arange, padding_idx + start_pos + L + 1 for RoBERTa's (the last real token of
        a row without padding sits at padding_idx + start_pos + L)."""
        if positions is not None:
            return None
        if self.position_ids == "padding":
            return int(self.token.padding_idx) + start_pos + length + 1  # type: ignore[arg-type]
        return start_pos + length

    def _token_types(self, ids: torch.Tensor, token_type_ids: Any) -> torch.Tensor | None:
        if self.num_token_types:
            if token_type_ids is None:
                return None                                  # all type 0: row 0, broadcast
            tt = check_token_id_tensor(token_type_ids, self.num_token_types, device=ids.device)
            if tuple(tt.shape) != tuple(ids.shape):
                raise ConfigError(f"token_type_ids must have shape {tuple(ids.shape)}, got {tuple(tt.shape)}")
            return tt
        if token_type_ids is not None:
            raise ConfigError("token_type_ids given but num_token_types=0; construct with num_token_types > 0")
        return None

    # -- the model ---------------------------------------------------------------------------------
    def forward(self, ids: Any, positions: Any = None, *, start_pos: int = 0,
                token_type_ids: Any = None) -> torch.Tensor:
        """ids (B, L) or (L,) -> (B, L, D) or (L, D). Every input is checked before any work.

        The ids' values are checked once: by the op when the block is one op (its kernel inside the
        gather loop, else first), else here, first. Either way a bad id is reported before any other
        bad input, and a call that raises leaves the generator as it was (the dropout seed it drew is
        taken back: ``undo_seed_draw``).
        """
        token, position = self.token, self.position
        weight = token.weight
        p = self.dropout if self.training else 0.0
        fuses = self.fuses
        early = not fuses                              # several ops follow: check the ids first
        ids = checked_ids(ids, token.vocab_size, weight, values=early)
        pos, tt, table = self._inputs(ids, positions, start_pos, token_type_ids, fuses, defer=not early)
        if table is not None or (fuses and position.kind != "additive"):
            # dropout(W[ids] * s + P[pos]) in one op, which checks the ids (the kernel in its gather loop)
            before = seed_snapshot(self.generator) if p > 0.0 and not is_compiling() else None
            seed = self._dropout_seed(p, ids)
            try:
                return embed(weight, ids, table, pos if table is not None else None, scale=token.multiplier, p=p,
                             seed=seed, padding_idx=_pad(token.padding_idx), check_ids=True)
            except ValueError:                          # a bad id or position: the draw is taken back
                if before is not None:
                    undo_seed_draw(*before)
                raise
        x = token_rows(token, ids, check_ids=not early)                              # (..., L, D)
        if self.token_type is not None:
            x = x + (self.token_type.weight[0] if tt is None else token_rows(self.token_type, tt))
        if self.position.kind == "additive":
            x = x + self.position(pos)                                               # (L, D) or (..., L, D)
        if self.norm is not None:
            x = self.norm(x)
        if p > 0.0:
            x = dropout_torch(x, p, self._dropout_seed(p, x))
        return x

    @property
    def fuses(self) -> bool:
        """Whether the whole block is one op: no token types, no norm, no sparse token table."""
        return self.token_type is None and self.norm is None and not self.token.sparse

    def _position_table(self, pos: torch.Tensor, end: int | None) -> torch.Tensor | None:
        """For a block that is one op (:attr:`fuses`): the (P, D) table the op adds rows of, or None.

        Learned tables without a padding row, and the sinusoidal table when every position lies in
        it: known from ``end`` (a bound of the positions the layer derived itself, exclusive), else
        read from the positions when their values can be read (not under torch.compile / torch.func).
        """
        position = self.position
        if position.kind != "additive":
            return None
        if isinstance(position, LearnedPositionalEmbedding):
            return position.weight if position.padding_idx is None else None
        if isinstance(position, SinusoidalPositionalEncoding):
            P = position.max_seq_len
            inside = end <= P if end is not None else (values_readable(pos)
                                                        and (pos.numel() == 0 or int(pos.max()) < P))
            return position.table if inside else None
        return None

    def _dropout_seed(self, p: float, like: torch.Tensor) -> torch.Tensor:
        """A 0-d int64 seed on ``like``'s device: fresh per training call (from ``generator``), 0
        without dropout."""
        if p == 0.0:
            return no_seed(like)
        if is_compiling():                                  # in-graph draw (generators do not trace)
            return torch.randint(0, SEED_MASK, (), device=like.device, dtype=torch.int64)
        seed = draw_seed_torch(self.generator)
        return seed if like.is_cpu else seed.to(like.device)

    def extra_repr(self) -> str:
        s = f"{self.vocab_size}, {self.d_model}, max_seq_len={self.max_seq_len}, positional={self.positional!r}"
        if self.dropout:
            s += f", dropout={self.dropout}"
        return s


EmbeddingLayer = TransformerEmbedding
