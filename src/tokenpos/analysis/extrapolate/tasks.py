"""A synthetic length-generalisation task in the style of Kazemnejad et al. (NeurIPS 2023).

An example with n items: ``x_1 .. x_n SEP y_1 .. y_n`` over the symbols 0..S-1 (S = ``num_symbols``)
plus SEP = S. The model reads the first 2n tokens and must predict y_1..y_n at positions n..2n-1.

- ``copy``:    y = x;
- ``reverse``: y = x reversed;
- ``sort``:    y = x sorted ascending.

**Length** is the model's input length 2n (what a positional scheme sees). Training draws
n uniformly from 1..train_len/2 per batch (every example of a batch has the same n, so no padding).
**Exact-match accuracy** at a length: the fraction of eval examples whose n outputs are all the
argmax under teacher forcing, which equals greedy decoding for exact match (the first wrong
token makes both fail). The eval examples depend on (task, length) only, not on the seed.

Shapes: B batch, n items, T = 2n input length, V = S + 1 vocab.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from tokenpos.tables.errors import ConfigError, PositionError

TASKS = ("copy", "reverse", "sort")


@dataclass(frozen=True)
class TaskConfig:
    """The synthetic task's settings (model: D, layers, heads; training; eval lengths)."""

    tasks: tuple[str, ...] = ("copy", "sort")
    train_len: int = 20
    eval_lens: tuple[int, ...] = (10, 20, 30, 40, 60, 80)
    num_symbols: int = 10
    d_model: int = 64
    num_layers: int = 2
    num_heads: int = 4
    steps: int = 500
    batch_size: int = 32
    lr: float = 3e-3
    warmup: int = 30
    eval_examples: int = 200

    def validate(self) -> TaskConfig:
        bad = [t for t in self.tasks if t not in TASKS]
        if bad:
            raise ConfigError(f"unknown tasks {bad}; expected a subset of {list(TASKS)}")
        if self.train_len < 2 or self.train_len % 2:
            raise ConfigError(f"task train_len must be an even integer >= 2, got {self.train_len}")
        if not self.eval_lens or any(t < 2 or t % 2 for t in self.eval_lens):
            raise ConfigError(f"task eval_lens must be even integers >= 2, got {self.eval_lens}")
        if self.d_model % self.num_heads:
            raise ConfigError(f"task d_model {self.d_model} is not divisible by num_heads {self.num_heads}")
        return self


def make_batch(task: str, n: int, batch_size: int, num_symbols: int,
               rng: np.random.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """B examples of n items: inputs (B, 2n) and targets (B, 2n) int64; only targets[:, n:] are scored."""
    x = rng.integers(0, num_symbols, size=(batch_size, n))                   # (B, n)
    if task == "copy":
        y = x
    elif task == "reverse":
        y = x[:, ::-1]
    elif task == "sort":
        y = np.sort(x, axis=1)
    else:
        raise ConfigError(f"unknown task {task!r}; expected one of {list(TASKS)}")
    sep = np.full((batch_size, 1), num_symbols)
    full = np.concatenate([x, sep, y], axis=1).astype(np.int64)             # (B, 2n + 1)
    return torch.from_numpy(full[:, :-1].copy()), torch.from_numpy(full[:, 1:].copy())


def train_task(model: nn.Module, task: str, cfg: TaskConfig, seed: int) -> float:
    """Train on lengths 2..train_len (n = 1..train_len/2); returns the mean loss of the last 5% steps."""
    from tokenpos.analysis.extrapolate.train import lr_at

    rng = np.random.default_rng([seed, TASKS.index(task), 7])
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=cfg.lr, betas=(0.9, 0.99),
                            weight_decay=0.0)
    losses: list[float] = []
    model.train()
    for step in range(cfg.steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, cfg.steps, cfg.lr, cfg.warmup)
        n = int(rng.integers(1, cfg.train_len // 2 + 1))
        inputs, targets = make_batch(task, n, cfg.batch_size, cfg.num_symbols, rng)
        logits = model(inputs)[:, n:]                                        # (B, n, V)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets[:, n:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        value = float(loss.detach())
        if not math.isfinite(value):
            raise RuntimeError(f"{task}: the loss became {value} at step {step}; expected a finite number")
        losses.append(value)
    model.eval()
    tail = losses[-max(1, len(losses) // 20):]
    return float(sum(tail) / len(tail))


def exact_match(model: nn.Module, task: str, length: int, cfg: TaskConfig) -> float | None:
    """Exact-match accuracy at input length ``length`` (= 2n), or None where the model cannot run."""
    n = length // 2
    rng = np.random.default_rng([TASKS.index(task), length, 12345])          # same examples for every seed
    inputs, targets = make_batch(task, n, cfg.eval_examples, cfg.num_symbols, rng)
    correct = 0
    try:
        with torch.inference_mode():
            for s in range(0, cfg.eval_examples, 100):
                pred = model(inputs[s:s + 100])[:, n:].argmax(-1)           # (b, n)
                correct += int((pred == targets[s:s + 100, n:]).all(dim=1).sum())
    except PositionError:
        return None
    return correct / cfg.eval_examples


def run_task(name: str, task: str, cfg: TaskConfig, seed: int, *, base: float = 10000.0) -> dict[str, Any]:
    """Train scheme ``name`` on ``task`` with ``seed``; ``{"accuracy": {length: acc | None}, ...}``."""
    from tokenpos.analysis.extrapolate.schemes import build_model

    start = time.perf_counter()
    model = build_model(name, cfg.num_symbols + 1, train_len=cfg.train_len, d_model=cfg.d_model,
                        num_heads=cfg.num_heads, num_layers=cfg.num_layers, base=base, seed=seed)
    try:
        final = train_task(model, task, cfg, seed)
    except RuntimeError as exc:
        return {"accuracy": {t: None for t in cfg.eval_lens}, "final_loss": None, "note": str(exc),
                "seconds": time.perf_counter() - start}
    acc = {t: exact_match(model, task, t, cfg) for t in cfg.eval_lens}
    return {"accuracy": acc, "final_loss": final, "seconds": time.perf_counter() - start}
