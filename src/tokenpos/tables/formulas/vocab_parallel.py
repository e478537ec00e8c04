"""Vocab padding and sharding rules for a vocab-parallel token table (one source for layers and memory).

V vocab, W world size (tensor-parallel ranks), M pad_to_multiple_of.

Rule (Megatron-LM's ``_vocab_size_with_padding``): the padded vocab is the smallest multiple of
``M * W`` that is >= V, so every rank holds the same number of rows and each shard is a multiple of
M. Examples: V=50257, M=128, W=8 -> 51200; V=50257, M=64, W=1 -> 50304; V=1003, M=1, W=2 -> 1004.
"""

from __future__ import annotations

from tokenpos.tables.checks.validation import check_int
from tokenpos.tables.errors import ConfigError


def padded_vocab_size(vocab_size: int, pad_to_multiple_of: int = 1, world_size: int = 1) -> int:
    """The smallest multiple of ``pad_to_multiple_of * world_size`` that is >= ``vocab_size``.

    Raises:
        ConfigError: a size below 1 (vocab_size, pad_to_multiple_of, world_size), or not an int.
    """
    v = check_int("vocab_size", vocab_size, minimum=1)
    m = check_int("pad_to_multiple_of", pad_to_multiple_of, minimum=1)
    w = check_int("world_size", world_size, minimum=1)
    step = m * w
    return -(-v // step) * step


def shard_range(padded_vocab: int, rank: int, world_size: int) -> tuple[int, int]:
    """``(vocab_start, vocab_end)`` of ``rank``'s contiguous shard of a padded vocab of that world size.

    Raises:
        ConfigError: ``padded_vocab`` not divisible by ``world_size``, or ``rank`` not in [0, world_size).
    """
    v = check_int("padded_vocab", padded_vocab, minimum=1)
    w = check_int("world_size", world_size, minimum=1)
    r = check_int("rank", rank, minimum=0)
    if r >= w:
        raise ConfigError(f"rank must be in [0, {w}), got {r}")
    if v % w:
        raise ConfigError(f"padded_vocab must be divisible by world_size={w}, got {v}")
    per = v // w
    return r * per, (r + 1) * per
