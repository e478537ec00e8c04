"""Vocab-parallel memory: the padded vocab, each rank's shard, its Adam state and its logits.

Pure integer arithmetic. V vocab, Vp padded vocab, W tensor-parallel ranks (``tp``), M
pad_to_multiple_of, Vl = Vp / W rows per rank, D d_model, B batch, L sequence length.

- Padding (Megatron's rule, :func:`tokenpos.tables.formulas.vocab_parallel.padded_vocab_size`): Vp is the smallest
  multiple of M * W that is >= V; the Vp - V padding rows are stored, trained and optimised like the others.
- Per rank: the token table shard Vl x D; an untied output projection is sharded the same way, so it
  doubles the weight and the Adam state (fp32 weight + grad + m + v = 16 bytes per parameter).
- Logits: B x L x Vl per rank, with tied or untied output alike (the output layer's width is the vocab
  either way); the vocab-parallel cross-entropy keeps an fp32 softmax of the same size for backward.
  Without vocab parallelism one device holds B x L x V.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tokenpos.analysis.memory import ADAM_BYTES_PER_PARAM, MIB, ModelConfig
from tokenpos.tables.checks.validation import check_positive_int
from tokenpos.tables.formulas.vocab_parallel import padded_vocab_size

LOGITS_BYTES = {"fp32": 4, "bf16": 2}       # logits dtype -> bytes per value
DEFAULT_BATCH = 8


@dataclass(frozen=True)
class VocabParallelMemory:
    """One model's token table split over ``tp`` ranks, and the logits of a (batch, seq_len) step."""

    config: ModelConfig
    tp: int
    pad_to_multiple_of: int
    batch: int
    seq_len: int

    @property
    def padded_vocab(self) -> int:
        return padded_vocab_size(self.config.vocab_size, self.pad_to_multiple_of, self.tp)

    @property
    def padding_rows(self) -> int:
        return self.padded_vocab - self.config.vocab_size

    @property
    def padding_params(self) -> int:
        """Stored values of the padding rows, over all ranks (twice when the output layer is untied)."""
        return self.padding_rows * self.config.d_model * self.tables

    @property
    def padding_share(self) -> float:
        """Padding rows as a fraction of the real vocab."""
        return self.padding_rows / self.config.vocab_size

    @property
    def tables(self) -> int:
        """Vocab-sized tables: 1 (tied) or 2 (token table + untied output projection)."""
        return 1 if self.config.tied_output else 2

    @property
    def shard_rows(self) -> int:
        return self.padded_vocab // self.tp

    @property
    def shard_params(self) -> int:
        """Parameters of the vocab-sized tables on one rank."""
        return self.shard_rows * self.config.d_model * self.tables

    @property
    def adam_bytes_per_rank(self) -> int:
        """fp32 weights + grads + Adam m, v of the vocab-sized tables on one rank (the model's own tying)."""
        return self.shard_params * ADAM_BYTES_PER_PARAM

    def adam_bytes_if(self, tied: bool) -> int:
        """``adam_bytes_per_rank`` had the output layer been tied (one table) or untied (two)."""
        return self.shard_rows * self.config.d_model * (1 if tied else 2) * ADAM_BYTES_PER_PARAM

    @property
    def logits_per_rank(self) -> int:
        """B x L x Vl values (tied or untied alike)."""
        return self.batch * self.seq_len * self.shard_rows

    def logits_bytes(self, dtype: str = "fp32") -> int:
        return self.logits_per_rank * LOGITS_BYTES[dtype]

    @property
    def logits_one_device(self) -> int:
        """B x L x V values when one device holds all logits (no vocab parallelism, no padding)."""
        return self.batch * self.seq_len * self.config.vocab_size

    def to_dict(self) -> dict[str, Any]:
        c = self.config
        return {
            "model": c.name, "vocab_size": c.vocab_size, "d_model": c.d_model, "tp": self.tp,
            "pad_to_multiple_of": self.pad_to_multiple_of, "padded_vocab": self.padded_vocab,
            "padding_rows": self.padding_rows, "padding_params": self.padding_params,
            "padding_share": self.padding_share, "tied_output": c.tied_output, "shard_rows": self.shard_rows,
            "shard_params_per_rank": self.shard_params, "adam_bytes_per_rank": self.adam_bytes_per_rank,
            "adam_mib_per_rank": self.adam_bytes_per_rank / MIB,
            "adam_mib_per_rank_tied": self.adam_bytes_if(True) / MIB,
            "adam_mib_per_rank_untied": self.adam_bytes_if(False) / MIB, "batch": self.batch, "seq_len": self.seq_len,
            "logits_per_rank": self.logits_per_rank,
            "logits_mib_per_rank": {d: self.logits_bytes(d) / MIB for d in LOGITS_BYTES},
            "logits_one_device": self.logits_one_device,
        }


def vocab_parallel_memory(config: ModelConfig, tp: int, pad_to_multiple_of: int = 1, *, batch: int = DEFAULT_BATCH,
                          seq_len: int | None = None) -> VocabParallelMemory:
    """The vocab-parallel split of ``config`` over ``tp`` ranks; ``seq_len`` defaults to its max_seq_len
    (2048 when unknown).

    Raises:
        ConfigError: a size below 1.
    """
    L = seq_len if seq_len is not None else (config.max_seq_len or 2048)
    return VocabParallelMemory(config, check_positive_int("tp", tp),
                               check_positive_int("pad_to_multiple_of", pad_to_multiple_of),
                               check_positive_int("batch", batch), check_positive_int("seq_len", L))
