"""TransformerEmbedding: token table (+ sqrt(D) scale) + token types + positions, norm, dropout.

    x = W[ids] * s + T[token_type_ids] + P(positions)      (P only for additive schemes)
    y = dropout(norm(x))

(Hugging Face's summation order, in both backends, so ``from_hf`` reproduces BERT/RoBERTa bit for bit.)

Shapes: B batch, L length, D d_model; ids (B, L) -> (B, L, D) and ids (L,) -> (L, D).
"""

from __future__ import annotations

import inspect
from typing import Any

import numpy as np
import torch

from tokenpos.tables.dropout import SEED_MASK
from tokenpos.tables.embedding_args import check_embedding_args
from tokenpos.tables.errors import ConfigError
from tokenpos.tables.positional_config import PositionalConfig
from tokenpos.tables.validation import (
    INT64_MAX,
    check_start_pos,
)
from tokenpos.torch import _fused
from tokenpos.torch._checks import check_position_tensor, check_token_id_tensor, is_compiling, resolve_dtype
from tokenpos.torch._dropout import dropout_torch
from tokenpos.torch._init import resolve_torch_rng
from tokenpos.torch._module import TokenposModule
from tokenpos.torch.learned import LearnedPositionalEmbedding
from tokenpos.torch.norm import build_norm
from tokenpos.torch.schemes import POSITIONAL_BUILDERS
from tokenpos.torch.sinusoidal import SinusoidalPositionalEncoding
from tokenpos.torch.token import TokenEmbedding


def positions_from_padding(ids: torch.Tensor, padding_idx: int, start_pos: int = 0) -> torch.Tensor:
    """RoBERTa's positions (``tables.positions.positions_from_padding`` in torch ops), int64 like ids."""
    mask = (ids != padding_idx).long()
    return (torch.cumsum(mask, dim=-1) + start_pos) * mask + padding_idx


class TransformerEmbedding(TokenposModule):
    """The input block of a transformer (the torch twin of ``tokenpos.numpy.TransformerEmbedding``).

    Args: as the NumPy layer (vocab_size, d_model, max_seq_len, positional, scale, dropout,
        padding_idx, init, std, scheme options, num_token_types, norm, norm_eps, position_ids), plus
        device / dtype (factory kwargs), seed / rng (NumPy-identical initialisation) and generator
        (a torch.Generator for the initial weights and the dropout seeds; default: torch's global one).

    Dropout uses the counter-based mask of ``tokenpos.tables.dropout``: a fresh 63-bit seed per
    training forward, drawn from torch's generator, so ``torch.manual_seed`` reproduces a run.

    Shape:
        forward(ids (B, L) or (L,), positions (L,) or (B, L) | None, start_pos=0, token_type_ids) -> (..., D)

    state_dict: ``token.weight``, ``position.weight`` (learned), ``token_type.weight``
    (num_token_types > 0), ``norm.weight`` and ``norm.bias`` (layernorm) / ``norm.weight`` (rmsnorm).
    """

    def __init__(self, vocab_size: int, d_model: int, max_seq_len: int = 512, *,
                 positional: Any = "learned", scale: bool = False, dropout: float = 0.0,
                 padding_idx: int | None = None, init: str = "normal", std: float = 0.02,
                 base: float = 10000.0, sinusoidal_layout: str = "interleaved",
                 num_heads: int | None = None, head_dim: int | None = None,
                 rope_scaling: dict[str, Any] | None = None, rope_interleaved: bool = False,
                 rotary_dim: int | None = None, t5_num_buckets: int = 32, t5_max_distance: int = 128,
                 t5_bidirectional: bool = True, num_token_types: int = 0, norm: str | None = None,
                 norm_eps: float = 1e-5, position_ids: str = "default", device: Any = None, dtype: Any = None,
                 seed: int | None = None, rng: np.random.Generator | None = None,
                 generator: torch.Generator | None = None) -> None:
        super().__init__()
        args = check_embedding_args(positional=positional, max_seq_len=max_seq_len, dropout=dropout,
                                    num_token_types=num_token_types, position_ids=position_ids,
                                    padding_idx=padding_idx)
        self.positional, self.max_seq_len, self.dropout = args.positional, args.max_seq_len, args.dropout
        self.num_token_types, self.position_ids = args.num_token_types, args.position_ids
        dtype = resolve_dtype(dtype)
        self.generator = generator
        self._fixed_dropout_seed: int | None = None      # tests: pin the dropout seed of every call
        self._arange = np.arange(0, dtype=np.int64)         # default positions for the fused path, grown on demand
        init_rng = resolve_torch_rng(seed, rng, generator)
        self.token = TokenEmbedding(vocab_size, d_model, init=init, std=std, scale=scale, padding_idx=padding_idx,
                                    device=device, dtype=dtype, rng=init_rng)
        self.d_model = self.token.d_model
        cfg = PositionalConfig(
            d_model=self.d_model, max_seq_len=self.max_seq_len, base=base, sinusoidal_layout=sinusoidal_layout,
            num_heads=num_heads, head_dim=head_dim, rope_scaling=rope_scaling, rope_interleaved=rope_interleaved,
            rotary_dim=rotary_dim, t5_num_buckets=t5_num_buckets, t5_max_distance=t5_max_distance,
            t5_bidirectional=t5_bidirectional, init=init, std=std,
            position_padding_idx=padding_idx if self.position_ids == "padding" else None,
            dtype=dtype, rng=init_rng, device=device)
        self.position = POSITIONAL_BUILDERS[self.positional](cfg)
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
            reset = getattr(m, "reset_parameters", None)
            if reset is None:
                continue
            if "rng" in inspect.signature(reset).parameters:
                reset(rng=init_rng)
            else:
                reset()

    # -- inputs ------------------------------------------------------------------------------
    def resolve_positions(self, ids: torch.Tensor, positions: Any, start_pos: int) -> torch.Tensor:
        """The positions of ``ids`` (..., L): given ones (checked), RoBERTa's, or start_pos + arange(L)."""
        if positions is not None:
            pos = check_position_tensor(positions, device=ids.device)
            if tuple(pos.shape) not in (tuple(ids.shape), tuple(ids.shape[-1:])):
                raise ConfigError(f"positions must have shape {tuple(ids.shape[-1:])} or {tuple(ids.shape)}, "
                                  f"got {tuple(pos.shape)}")
            return pos
        start_pos = check_start_pos(start_pos, ids.shape[-1])
        pad = self.token.padding_idx
        if self.position_ids == "padding" and pad is not None:     # the constructor ensures pad is set
            return positions_from_padding(ids, pad, start_pos)
        return torch.arange(start_pos, start_pos + ids.shape[-1], device=ids.device)

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

    def forward(self, ids: Any, positions: Any = None, *, start_pos: int = 0,
                token_type_ids: Any = None) -> torch.Tensor:
        """ids (B, L) or (L,) -> (B, L, D) or (L, D). Every input is checked before any work."""
        if positions is None and token_type_ids is None:
            fused = self._fused_default_call(ids, start_pos)
            if fused is not None:
                return fused
        ids = check_token_id_tensor(ids, self.vocab_size, device=self.token.weight.device)
        if ids.dim() not in (1, 2):
            raise ConfigError(f"ids must have shape (B, L) or (L,), got {tuple(ids.shape)}")
        pos = self.resolve_positions(ids, positions, start_pos)
        tt = self._token_types(ids, token_type_ids)
        if isinstance(self.position, LearnedPositionalEmbedding):   # range, indexed as NumPy does
            check_position_tensor(pos, self.position.max_seq_len, broadcast_to=tuple(ids.shape))
        return self.embed(ids, pos, tt)

    def embed(self, ids: torch.Tensor, pos: torch.Tensor, tt: torch.Tensor | None) -> torch.Tensor:
        """The computation on checked inputs: ids (..., L), pos (L,) or (..., L), tt (..., L) | None.

        The single place a fused kernel replaces (:meth:`_fused_embed`); :meth:`forward` takes the
        same kernel earlier for its most common call (default positions, no token types) to skip
        torch-side steps that cost more than the kernel's own checks on a large batch.
        """
        fused = self._fused_embed(ids, pos)
        if fused is not None:
            return fused
        x = self.token.lookup(ids)                                           # (..., L, D)
        if self.token_type is not None:
            x = x + (self.token_type.weight[0] if tt is None else self.token_type.lookup(tt))
        if self.position.kind == "additive":
            x = x + self.position(pos)                                       # (L, D) or (..., L, D)
        if self.norm is not None:
            x = self.norm(x)
        if self.training and self.dropout > 0.0:
            x = dropout_torch(x, self.dropout, self._dropout_seed(x.device))
        return x

    # -- the fused kernel (CPU float32 / float64, eager; tokenpos.kernels_enabled()) -------------
    def _fused_table(self) -> tuple[bool, torch.Tensor | None]:
        """(whether the fused kernel applies to this layer now, the (P, D) table it adds or None).

        It applies (see ``_fused.fusable``) to contiguous CPU float32/float64 tables outside
        ``torch.compile``, without norm, token types or a sparse token table, with learned or
        sinusoidal positions (their table in the token dtype) or a scheme that adds nothing here
        (rope, alibi, t5, none).
        """
        token, position = self.token, self.position                  # (each module lookup is a Python call)
        w = token.weight
        if (not _fused.fusable(w) or self.norm is not None or self.token_type is not None or token.sparse
                or not w.is_contiguous()):
            return False, None
        if position.kind != "additive":
            return True, None
        table: torch.Tensor
        if isinstance(position, LearnedPositionalEmbedding):
            if position.padding_idx is not None:     # no padding row to skip in the kernel's gradient
                return False, None
            table = position.weight
        elif isinstance(position, SinusoidalPositionalEncoding):
            table = position.table
        else:
            return False, None
        return table.dtype == w.dtype and table.is_cpu and table.is_contiguous(), table

    def _fused_embed(self, ids: torch.Tensor, pos: torch.Tensor) -> torch.Tensor | None:
        """``dropout(W[ids] * s + P[pos])`` in one kernel pass on checked inputs, or None where the
        kernel does not apply (sinusoidal positions beyond the precomputed table included)."""
        ok, table = self._fused_table()
        if not ok or not ids.is_cpu or not pos.is_cpu:
            return None
        if (table is not None and isinstance(self.position, SinusoidalPositionalEncoding) and pos.numel()
                and int(pos.max()) >= table.shape[0]):                        # beyond the table: the formula
            return None
        return self._fused_call(ids, table, None if table is None else pos)

    def _fused_default_call(self, ids: Any, start_pos: Any) -> torch.Tensor | None:
        """``forward(ids, start_pos=...)`` (positions start_pos + arange(L), no token types) through
        the kernel with few Python and torch steps, or None: then :meth:`forward` runs as usual.

        Same checks, errors and order as :meth:`forward`: ids (dtype, values via the shared NumPy
        check on the zero-copy view, which is what the torch check raises with; shape), start_pos,
        then the learned range (out of range: None, so forward raises its PositionError).
        """
        if not isinstance(ids, torch.Tensor) or not ids.is_cpu or self.position_ids != "default":
            return None
        ok, table = self._fused_table()
        if not ok:
            return None
        checked = _fused.checked_ids(ids, self.vocab_size)
        if checked is None or checked.ndim not in (1, 2):
            return None                                                       # forward raises / converts
        if type(start_pos) is not int or not 0 <= start_pos <= INT64_MAX - checked.shape[-1]:
            start_pos = check_start_pos(start_pos, checked.shape[-1])   # raises as forward does
        pos = None
        if table is not None:
            end = start_pos + checked.shape[-1]
            if end > table.shape[0]:                                          # learned: an error; sinusoidal: formula
                return None
            if self._arange.shape[0] < end:
                self._arange = np.arange(max(end, 2 * self._arange.shape[0]), dtype=np.int64)
            pos = self._arange[start_pos:end]                                 # (L,) view, never written
        return self._fused_call(ids, table, pos)

    def _fused_call(self, ids: torch.Tensor, table: torch.Tensor | None, pos: Any) -> torch.Tensor:
        """The kernel call; the dropout seed is drawn as the plain path draws it (same mask)."""
        p = self.dropout if self.training and self.dropout > 0.0 else 0.0
        seed = self._dropout_seed(ids.device) if p else 0
        token = self.token
        return _fused.embedding(token.weight, ids, scale=token.multiplier, table=table, pos=pos, dropout_p=p,
                                seed=seed, padding_idx=token.padding_idx)

    def _dropout_seed(self, device: torch.device) -> Any:
        """A fresh 63-bit seed per call: an int in eager mode, a device tensor under torch.compile."""
        if self._fixed_dropout_seed is not None:
            return self._fixed_dropout_seed
        if is_compiling():
            return torch.randint(0, SEED_MASK, (), device=device, dtype=torch.int64)
        return int(torch.randint(0, SEED_MASK, (), generator=self.generator, dtype=torch.int64))

    def extra_repr(self) -> str:
        s = f"{self.vocab_size}, {self.d_model}, max_seq_len={self.max_seq_len}, positional={self.positional!r}"
        if self.dropout:
            s += f", dropout={self.dropout}"
        return s


EmbeddingLayer = TransformerEmbedding
