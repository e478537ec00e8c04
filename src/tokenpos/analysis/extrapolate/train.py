"""Training loop of the extrapolation experiment: random windows, AdamW, warmup + cosine decay.

Shapes: N training ids, B batch, L train length, V vocab.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

Progress = Callable[..., None]


def sample_batch(ids: torch.Tensor, batch_size: int, seq_len: int,
                 generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """B random windows of ``ids`` (N,): inputs ids[s : s+L], targets ids[s+1 : s+L+1].

    Returns:
        inputs, targets: (B, L) int64 each.
    """
    starts = torch.randint(0, ids.numel() - seq_len - 1, (batch_size,), generator=generator)   # (B,)
    offsets = starts[:, None] + torch.arange(seq_len + 1)                                     # (B, L+1)
    windows = ids[offsets]                                                                    # (B, L+1)
    return windows[:, :-1], windows[:, 1:]


def lr_at(step: int, total: int, peak: float, warmup: int, floor: float = 0.1) -> float:
    """Linear warmup to ``peak`` over ``warmup`` steps, then cosine decay to ``floor * peak``."""
    if step < warmup:
        return peak * (step + 1) / warmup
    t = (step - warmup) / max(1, total - warmup)
    return peak * (floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * min(t, 1.0))))


@dataclass
class TrainStats:
    """What one training run did: per-step losses (nats/char) and wall time in seconds."""

    losses: list[float] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def final_loss(self) -> float:
        """Mean loss over the last 5% of steps (at least one)."""
        tail = self.losses[-max(1, len(self.losses) // 20):]
        return float(sum(tail) / len(tail))


def train_model(model: nn.Module, train_ids: torch.Tensor, *, steps: int, batch_size: int, seq_len: int,
                lr: float, warmup: int, weight_decay: float, grad_clip: float, seed: int,
                progress: Progress | None = None, label: str = "train") -> TrainStats:
    """Train ``model`` (ids (B, L) -> logits (B, L, V)) by next-character cross-entropy.

    Batches come from a ``torch.Generator`` seeded with ``seed``, so a seed fixes the data order.
    Weight decay applies to matrices only (not biases, norms or 1-d tables). ``progress(label, done,
    total, loss=...)`` is called after every step with an exponential moving average of the loss.
    """
    gen = torch.Generator().manual_seed(int(seed))
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=lr, betas=(0.9, 0.99))
    stats, ema = TrainStats(), None
    model.train()
    start = time.perf_counter()
    for step in range(steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, steps, lr, warmup)
        inputs, targets = sample_batch(train_ids, batch_size, seq_len, gen)      # (B, L) each
        logits = model(inputs)                                                    # (B, L, V)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
        opt.step()
        value = float(loss.detach())
        if not math.isfinite(value):
            raise RuntimeError(f"{label}: the loss became {value} at step {step}; expected a finite number")
        stats.losses.append(value)
        ema = value if ema is None else 0.95 * ema + 0.05 * value
        if progress is not None:
            progress(label, step + 1, steps, loss=ema)
    stats.seconds = time.perf_counter() - start
    model.eval()
    return stats


def count_parameters(model: nn.Module) -> int:
    """Trainable parameters (the tied output adds none)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


