"""The embedding as a forward/backward pair: gather, scale, + positional rows, dropout.

Shapes: V vocab (table rows), D d_model, P positional-table rows, ids (...) any shape, pos the ids'
shape or a trailing part of it ((L,) for ids (B, L)), out (..., D).

    out = dropout(weight[ids] * scale + table[pos])          (the table part optional)

Float16 weights are gathered, widened to float32, scaled by the float32 constant sqrt(D) (never a
float16-rounded one), positioned, dropped and rounded once (docs/DESIGN.md). Float32/float64 run
the fused numba kernel when kernels are on (``_dispatch.use_kernel``), else the same arithmetic in
NumPy. Inputs are checked by the calling layer (ids in [0, V), pos in [0, P)): nothing here checks
them again (the kernel keeps its memory bound, ``kernels.embedding.forward_rows``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tokenpos._config import OUTPUTS
from tokenpos.kernels import embedding as kernel
from tokenpos.numpy.functional._dispatch import compute_dtype, use_kernel
from tokenpos.numpy.functional.dropout import dropout_multiplier
from tokenpos.numpy.module import coalesce_rows
from tokenpos.tables.errors import ConfigError


@dataclass(frozen=True)
class EmbeddingCache:
    """What :func:`embedding_backward` needs; ``ids`` and ``pos`` are private copies (``_dispatch.kept``'s
    rule, its ``np.array(x, copy=True)`` written inline: one call less on every embedding call).

    Attributes:
        ids: (...) int64 ids of the forward.
        pos: positions into the table (the ids' shape or a trailing part), or None.
        table_rows: P when the table receives a gradient, else None.
        scale, p, seed: the forward's multiplier, dropout probability and dropout seed.
        padding_idx / table_padding_idx: the token / table row that receives no gradient.
    """

    ids: np.ndarray
    pos: np.ndarray | None
    table_rows: int | None
    scale: float
    p: float
    seed: int
    padding_idx: int | None
    table_padding_idx: int | None


def embedding_forward(weight: np.ndarray, ids: np.ndarray, *, scale: float = 1.0, table: np.ndarray | None = None,
                      pos: np.ndarray | None = None, p: float = 0.0, seed: int = 0, padding_idx: int | None = None,
                      table_grad: bool = False, table_padding_idx: int | None = None
                      ) -> tuple[np.ndarray, EmbeddingCache]:
    """weight (V, D), ids (...) -> (out (..., D) in weight's dtype, cache).

    Args:
        scale: the token multiplier (sqrt(D) for scaled embeddings, else 1.0), a Python float.
        table, pos: an optional (P, D) positional table and the rows to add (given together).
        p, seed: dropout probability in [0, 1) and its counter-hash seed.
        padding_idx: the token row that receives no gradient in backward.
        table_grad: whether backward returns the (P, D) table gradient (a learned table);
            ``table_padding_idx`` is its row that stays zero (RoBERTa's padding position).
    """
    if (table is None) != (pos is None):
        raise ConfigError("embedding_forward needs table and pos together (or neither)")
    rows = table.shape[0] if table is not None and table_grad else None
    cache = EmbeddingCache(np.array(ids, copy=True), None if pos is None else np.array(pos, copy=True),  # kept()
                           rows, float(scale), float(p), int(seed), padding_idx, table_padding_idx)
    if use_kernel(weight) if table is None else use_kernel(weight, table):
        shape, dt = (*ids.shape, weight.shape[1]), weight.dtype
        # what OUTPUTS.empty gives an output under its min_bytes (np.empty), without its two calls
        small = ids.size * weight.shape[1] * dt.itemsize < OUTPUTS.min_bytes
        out = np.empty(shape, dt) if small else OUTPUTS.empty(shape, dt)
        return kernel.forward_rows(weight, ids, table, pos, scale, p, seed, out), cache
    ct = compute_dtype(weight.dtype)
    x = weight[ids].astype(ct, copy=False)                           # (..., D), a fresh array
    if scale != 1.0:
        x *= ct.type(scale)
    if table is not None and pos is not None:
        x += table[np.broadcast_to(pos, ids.shape)]                    # (..., D)
    if p > 0.0:
        with np.errstate(invalid="ignore"):                           # inf * 0 = nan, as torch.nn.Dropout
            x *= dropout_multiplier(seed, x.shape, p, 0, ct)
    return x.astype(weight.dtype, copy=False), cache


def embedding_backward(dout: np.ndarray, cache: EmbeddingCache
                       ) -> tuple[tuple[np.ndarray, np.ndarray], np.ndarray | None]:
    """dout (..., D) -> ((token ids (U,) int64 sorted unique, rows (U, D)), table_grad (P, D) | None).

    ``rows[j] = scale * sum of dropout(dout) rows whose id is ids[j]`` (padding id left out);
    ``table_grad[q]`` the same sum without ``scale`` over rows at position q. Results are in
    dout's dtype (float16: summed in float32, rounded once).
    """
    d = dout.shape[-1]
    if use_kernel(dout):
        uniq, rows, table_grad = kernel.embedding_backward(
            dout, cache.ids, scale=cache.scale, dropout_p=cache.p, seed=cache.seed, padding_idx=cache.padding_idx,
            pos_ids=cache.pos if cache.table_rows is not None else None, num_positions=cache.table_rows)
    else:
        ct = compute_dtype(dout.dtype)
        g = dout.astype(ct)                                            # (..., D), a fresh array
        if cache.p > 0.0:
            with np.errstate(invalid="ignore"):
                g *= dropout_multiplier(cache.seed, g.shape, cache.p, 0, ct)
        flat_ids, flat_g = cache.ids.reshape(-1), g.reshape(-1, d)    # (N,), (N, D)
        if cache.padding_idx is not None:
            keep = flat_ids != cache.padding_idx
            sparse = coalesce_rows(flat_ids[keep], flat_g[keep] * ct.type(cache.scale))
        else:
            sparse = coalesce_rows(flat_ids, flat_g * ct.type(cache.scale))
        uniq, rows = sparse.indices, sparse.rows.astype(dout.dtype, copy=False)
        table_grad = None
        if cache.table_rows is not None and cache.pos is not None:
            acc = np.zeros((cache.table_rows, d), ct)                  # (P, D)
            np.add.at(acc, np.broadcast_to(cache.pos, cache.ids.shape).reshape(-1), flat_g)
            table_grad = acc.astype(dout.dtype, copy=False)
    if table_grad is not None and cache.table_padding_idx is not None:
        table_grad[cache.table_padding_idx] = 0
    return (uniq, rows), table_grad
