"""The logits behind a tied output projection, and what the fused tied loss saves of them.

Pure integer arithmetic. V vocab, D d_model, B batch, L sequence length, N = B x L tokens, b bytes per value
of the logits' dtype (fp32 4, bf16 2), c = ``tables.formulas.tied_loss.default_chunk_size(V)`` tokens.

- Materialised (``F.cross_entropy(h @ W.T, t)``): the logits N x V and their gradient N x V, 2 N V b bytes
  (at least: ``F.cross_entropy`` also keeps a log-softmax of the same size for backward).
- Fused (``tied_cross_entropy``, ``TokenEmbedding.loss``): one block of min(c, N) x V float32 logits (the
  compute dtype, bf16 inputs included: at most ``DEFAULT_CHUNK_BYTES``) and the (N,) float32 log-sum-exp.
- Saved: the difference. dh (N, D) and dW (V, D) are the same in both and not counted.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tokenpos.analysis.memory import MIB, ModelConfig
from tokenpos.analysis.memory_tp import DEFAULT_BATCH, LOGITS_BYTES
from tokenpos.tables.checks.validation import check_choice, check_positive_int
from tokenpos.tables.formulas.tied_loss import default_chunk_size

FUSED_BYTES = 4                     # the fused loss computes in float32 (or float64, not reported)


@dataclass(frozen=True)
class LogitsMemory:
    """One model's logits at (batch, seq_len) in ``dtype``, materialised or fused."""

    config: ModelConfig
    batch: int
    seq_len: int
    dtype: str = "fp32"

    @property
    def tokens(self) -> int:
        return self.batch * self.seq_len

    @property
    def logits_bytes(self) -> int:
        """N x V x b: the logits alone."""
        return self.tokens * self.config.vocab_size * LOGITS_BYTES[self.dtype]

    @property
    def materialised_bytes(self) -> int:
        """The logits and their gradient: 2 N V b."""
        return 2 * self.logits_bytes

    @property
    def chunk_tokens(self) -> int:
        """Tokens in one block of the fused loss: min(c, N)."""
        return min(default_chunk_size(self.config.vocab_size), self.tokens)

    @property
    def fused_bytes(self) -> int:
        """One float32 block of logits, min(c, N) x V, and the (N,) float32 log-sum-exp."""
        return (self.chunk_tokens * self.config.vocab_size + self.tokens) * FUSED_BYTES

    @property
    def saved_bytes(self) -> int:
        return self.materialised_bytes - self.fused_bytes

    def to_dict(self) -> dict[str, Any]:
        c = self.config
        return {
            "model": c.name, "vocab_size": c.vocab_size, "batch": self.batch, "seq_len": self.seq_len,
            "tokens": self.tokens, "dtype": self.dtype, "logits_bytes": self.logits_bytes,
            "logits_mib": self.logits_bytes / MIB, "materialised_bytes": self.materialised_bytes,
            "materialised_mib": self.materialised_bytes / MIB, "chunk_tokens": self.chunk_tokens,
            "fused_bytes": self.fused_bytes, "fused_mib": self.fused_bytes / MIB, "saved_bytes": self.saved_bytes,
            "saved_mib": self.saved_bytes / MIB,
        }


def logits_memory(config: ModelConfig, *, batch: int = DEFAULT_BATCH, seq_len: int | None = None,
                  dtype: str = "fp32") -> LogitsMemory:
    """The logits of ``config`` at (batch, seq_len); ``seq_len`` defaults to its max_seq_len (2048 when unknown).

    Raises:
        ConfigError: a size below 1, or a dtype other than "fp32" / "bf16".
    """
    L = seq_len if seq_len is not None else (config.max_seq_len or 2048)
    return LogitsMemory(config, check_positive_int("batch", batch), check_positive_int("seq_len", L),
                        check_choice("dtype", dtype, tuple(LOGITS_BYTES)))
