"""Count-based n-gram baselines (add-k smoothing) scored on the study's own target tokens.

A transformer that does not beat a 4-gram model in distribution does not use its context, and a model
that does not use its context cannot degrade when given more: its "flat" R(k) says nothing about
extrapolation. The study therefore scores these baselines on exactly the tokens each protocol scores
and gates every scheme's extrapolation numbers on beating the 4-gram (``gate.py``).

Model of order n: ``p(t | c) = (count(c, t) + k) / (count(c) + k V)`` with c the n - 1 preceding ids
(order 1: no context, a unigram). k is chosen from ``K_GRID`` on the last 10 % of the training ids
(counts from the first 90 %), then the counts are refitted on all training ids. Every scored target
in the study has at least ``n - 1`` preceding ids in the text, which is the context used (an n-gram
model reads only those, whatever the window).

Shapes: N ids; M scored positions; V vocab.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from tokenpos.tables.errors import ConfigError

ORDERS = (2, 3, 4)
K_GRID = (1.0, 0.3, 0.1, 0.03, 0.01, 0.003, 0.001)


def _codes(ids: np.ndarray, positions: np.ndarray, width: int, vocab_size: int) -> np.ndarray:
    """Base-V integer code of ``ids[p - width : p]`` for every p in ``positions`` (M,) -> (M,) int64."""
    code = np.zeros(len(positions), dtype=np.int64)
    for back in range(width, 0, -1):
        code = code * vocab_size + ids[positions - back]
    return code


@dataclass(frozen=True)
class NGramModel:
    """Counts of an order-n model over a vocabulary of ``vocab_size`` ids with add-k smoothing.

    Attributes:
        order: n (1 = unigram).
        vocab_size: V.
        k: the add-k constant.
        joint_keys, joint_counts: sorted codes of (context, target) and their counts.
        context_keys, context_counts: sorted codes of contexts and their counts.
    """

    order: int
    vocab_size: int
    k: float
    joint_keys: np.ndarray
    joint_counts: np.ndarray
    context_keys: np.ndarray
    context_counts: np.ndarray

    @classmethod
    def fit(cls, ids: np.ndarray, order: int, vocab_size: int, k: float) -> NGramModel:
        """Count every n-gram of ``ids`` (N,) int64.

        Raises:
            ConfigError: order < 1, k <= 0, too few ids, or ``vocab_size ** order`` beyond int64.
        """
        if not isinstance(order, int) or order < 1:
            raise ConfigError(f"n-gram order must be a positive integer, got {order!r}")
        if not k > 0:
            raise ConfigError(f"add-k constant must be > 0, got {k!r}")
        if len(ids) <= order:
            raise ConfigError(f"an order-{order} model needs more than {order} ids, got {len(ids)}")
        if order * math.log2(max(vocab_size, 2)) >= 62:
            raise ConfigError(f"vocab_size {vocab_size} ** order {order} does not fit an int64 code")
        pos = np.arange(order - 1, len(ids))                                    # (M,) target positions
        ctx = _codes(ids, pos, order - 1, vocab_size)                           # (M,)
        joint = ctx * vocab_size + ids[pos]                                     # (M,)
        jk, jc = np.unique(joint, return_counts=True)
        ck, cc = np.unique(ctx, return_counts=True)
        return cls(order, vocab_size, float(k), jk, jc, ck, cc)

    def nll(self, ids: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """NLL (nats) of ``ids[p]`` given ``ids[p - n + 1 : p]`` for each p in ``positions`` (M,) -> (M,) float64.

        Raises:
            ConfigError: a position with fewer than n - 1 preceding ids, or past the end.
        """
        positions = np.asarray(positions, dtype=np.int64)
        if len(positions) and (positions.min() < self.order - 1 or positions.max() >= len(ids)):
            raise ConfigError(f"positions must lie in [{self.order - 1}, {len(ids)}) for an order-{self.order} "
                              f"model, got [{positions.min()}, {positions.max()}]")
        ctx = _codes(ids, positions, self.order - 1, self.vocab_size)
        joint = ctx * self.vocab_size + ids[positions]
        return -np.log((_lookup(self.joint_keys, self.joint_counts, joint) + self.k)
                       / (_lookup(self.context_keys, self.context_counts, ctx) + self.k * self.vocab_size))


def _lookup(keys: np.ndarray, counts: np.ndarray, query: np.ndarray) -> np.ndarray:
    """counts[keys == q] for every q (0 where absent) -> float64 (M,)."""
    at = np.minimum(np.searchsorted(keys, query), len(keys) - 1)
    return np.where(keys[at] == query, counts[at], 0).astype(np.float64)


def fit_tuned(train_ids: np.ndarray, order: int, vocab_size: int) -> NGramModel:
    """An order-n model whose k (from ``K_GRID``) is best on the last 10 % of ``train_ids``, refitted on all."""
    from dataclasses import replace

    cut = int(len(train_ids) * 0.9)
    held = np.arange(max(cut, order - 1), len(train_ids))
    counts = NGramModel.fit(train_ids[:cut], order, vocab_size, K_GRID[0])          # counts do not depend on k
    best = min(K_GRID, key=lambda k: float(replace(counts, k=k).nll(train_ids, held).mean()))
    return NGramModel.fit(train_ids, order, vocab_size, best)


def baselines(train_ids: np.ndarray, vocab_size: int, orders: tuple[int, ...] = ORDERS) -> dict[int, NGramModel]:
    """One tuned model per order (bigram, trigram, 4-gram by default)."""
    return {n: fit_tuned(train_ids, n, vocab_size) for n in orders}
