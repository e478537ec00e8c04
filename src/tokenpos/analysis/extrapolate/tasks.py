"""Synthetic length-generalisation tasks: Kazemnejad et al. (NeurIPS 2023) style, and passkey retrieval.

An example with n items: ``x_1 .. x_n SEP y_1 .. y_n`` over the symbols 0..S-1 (S = ``num_symbols``)
plus SEP = S. The model reads the first 2n tokens and must predict y_1..y_n at positions n..2n-1.

- ``copy``:    y = x;
- ``reverse``: y = x reversed;
- ``sort``:    y = x sorted ascending;
- ``passkey``: a number of ``passkey_digits`` symbols hidden at a uniformly random depth of filler:
  ``FILL .. FILL KEY d_1..d_m FILL .. FILL QUERY d_1..d_m`` (the long-range probe: flat perplexity does
  not show that extra context is used; retrieving the key from anywhere in the window does).

Vocabulary: V = S + 4 (SEP, KEY, QUERY, FILL). **Length** is the model's input length T (2n for the
item tasks). Training draws the length uniformly per batch from the task's lengths up to ``train_len``
(every example of a batch has the same length, so no padding) and stops once the **per-token accuracy**
in distribution (at ``train_len``) reaches ``target_accuracy`` (checked every ``check_every`` steps), or
at ``steps``; a model below the target is reported as not trained, and no extrapolation claim is made
from it. **Exact-match accuracy** at a length: the fraction of eval examples whose scored outputs are
all the argmax under teacher forcing, which equals greedy decoding for exact match (the first wrong
token makes both fail). The eval examples depend on (task, length) only, not on the seed.

Shapes: B batch, n items, T input length, V = S + 4 vocab.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:                      # the functions that use torch import it: this package imports light
    import torch
    from torch import nn

from tokenpos.tables.errors import ConfigError, PositionError

TASKS = ("copy", "reverse", "sort", "passkey")


@dataclass(frozen=True)
class TaskConfig:
    """The synthetic task's settings (model: D, layers, heads; training; eval lengths)."""

    tasks: tuple[str, ...] = ("copy", "passkey")
    train_len: int = 20
    eval_lens: tuple[int, ...] = (10, 20, 40, 80, 160)
    num_symbols: int = 10
    d_model: int = 64
    num_layers: int = 2
    num_heads: int = 4
    steps: int = 500
    batch_size: int = 32
    lr: float = 3e-3
    warmup: int = 30
    eval_examples: int = 200
    passkey_digits: int = 3
    target_accuracy: float = 0.95
    check_every: int = 250

    @property
    def vocab_size(self) -> int:
        """S symbols + SEP, KEY, QUERY, FILL."""
        return self.num_symbols + 4

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
        if "passkey" in self.tasks and (self.passkey_digits < 1 or self.train_len < 2 * self.passkey_digits + 2):
            raise ConfigError(f"passkey needs passkey_digits >= 1 and train_len >= 2 * passkey_digits + 2, got "
                              f"{self.passkey_digits} digits and train_len {self.train_len}")
        if not 0.0 < self.target_accuracy <= 1.0 or self.check_every < 1:
            raise ConfigError(f"target_accuracy must be in (0, 1] and check_every >= 1, got "
                              f"{self.target_accuracy!r} and {self.check_every!r}")
        return self


def make_batch(task: str, n: int, batch_size: int, num_symbols: int,
               rng: np.random.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """B examples of n items: inputs (B, 2n) and targets (B, 2n) int64; only targets[:, n:] are scored."""
    import torch

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


def make_passkey(length: int, batch_size: int, digits: int, num_symbols: int,
                 rng: np.random.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """B passkey examples of input length T: inputs and targets (B, T) int64; only targets[:, T - digits:]
    (the key after QUERY) are scored. The key sits at a uniformly random depth of the filler."""
    import torch

    key, query, fill = num_symbols + 1, num_symbols + 2, num_symbols + 3          # num_symbols is SEP
    filler = length - 2 * digits - 1                                         # FILL tokens in all
    full = np.full((batch_size, length + 1), fill, dtype=np.int64)           # (B, T + 1)
    code = rng.integers(0, num_symbols, size=(batch_size, digits))           # (B, m)
    depth = rng.integers(0, filler + 1, size=batch_size)                     # (B,) FILL tokens before KEY
    rows = np.arange(batch_size)[:, None]
    full[np.arange(batch_size), depth] = key
    full[rows, depth[:, None] + 1 + np.arange(digits)] = code
    full[:, length - digits] = query
    full[:, length - digits + 1:] = code
    return torch.from_numpy(full[:, :-1].copy()), torch.from_numpy(full[:, 1:].copy())


def make_examples(task: str, length: int, batch_size: int, cfg: TaskConfig,
                  rng: np.random.Generator) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Inputs and targets (B, T) at input length T and the first scored position."""
    if task == "passkey":
        x, y = make_passkey(length, batch_size, cfg.passkey_digits, cfg.num_symbols, rng)
        return x, y, length - cfg.passkey_digits
    x, y = make_batch(task, length // 2, batch_size, cfg.num_symbols, rng)
    return x, y, length // 2


def _train_lengths(task: str, cfg: TaskConfig) -> list[int]:
    low = 2 * cfg.passkey_digits + 2 if task == "passkey" else 2
    return list(range(low, cfg.train_len + 1, 2))


@dataclass(frozen=True)
class TaskScore:
    """Per-token and exact-match accuracy at one length (None: the model cannot run there)."""

    per_token: float | None
    exact: float | None


def score_task(model: nn.Module, task: str, length: int, cfg: TaskConfig) -> TaskScore:
    """Accuracy on ``cfg.eval_examples`` fixed examples at input length ``length``."""
    import torch

    rng = np.random.default_rng([TASKS.index(task), length, 12345])          # same examples for every seed
    inputs, targets, first = make_examples(task, length, cfg.eval_examples, cfg, rng)
    right = exact = 0
    try:
        with torch.inference_mode():
            for s in range(0, cfg.eval_examples, 100):
                hit = model(inputs[s:s + 100])[:, first:].argmax(-1) == targets[s:s + 100, first:]   # (b, n)
                right += int(hit.sum())
                exact += int(hit.all(dim=1).sum())
    except PositionError:
        return TaskScore(None, None)
    return TaskScore(right / (cfg.eval_examples * (length - first)), exact / cfg.eval_examples)


def exact_match(model: nn.Module, task: str, length: int, cfg: TaskConfig) -> float | None:
    """Exact-match accuracy at input length ``length``, or None where the model cannot run."""
    return score_task(model, task, length, cfg).exact


def train_task(model: nn.Module, task: str, cfg: TaskConfig, seed: int) -> tuple[float, int, float]:
    """Train until the per-token accuracy at ``train_len`` reaches the target, or ``cfg.steps``.

    Returns (mean loss of the last 5 % of steps, steps taken, per-token accuracy at ``train_len``).
    """
    import torch
    import torch.nn.functional as F

    from tokenpos.analysis.extrapolate.train import lr_at

    rng = np.random.default_rng([seed, TASKS.index(task), 7])
    lengths = _train_lengths(task, cfg)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=cfg.lr, betas=(0.9, 0.99),
                            weight_decay=0.0)
    losses: list[float] = []
    accuracy = 0.0
    model.train()
    for step in range(cfg.steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, cfg.steps, cfg.lr, cfg.warmup)
        inputs, targets, first = make_examples(task, lengths[int(rng.integers(len(lengths)))], cfg.batch_size,
                                               cfg, rng)
        logits = model(inputs)[:, first:]                                    # (B, n, V)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets[:, first:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        value = float(loss.detach())
        if not math.isfinite(value):
            raise RuntimeError(f"{task}: the loss became {value} at step {step}; expected a finite number")
        losses.append(value)
        if (step + 1) % cfg.check_every == 0 or step + 1 == cfg.steps:
            model.eval()
            accuracy = score_task(model, task, cfg.train_len, cfg).per_token or 0.0
            model.train()
            if accuracy >= cfg.target_accuracy:
                break
    model.eval()
    tail = losses[-max(1, len(losses) // 20):]
    return float(sum(tail) / len(tail)), len(losses), accuracy


def run_task(name: str, task: str, cfg: TaskConfig, seed: int, *, base: float = 10000.0) -> dict[str, Any]:
    """Train scheme ``name`` on ``task`` with ``seed``: ``{"accuracy": {length: exact | None}, "per_token":
    {length: acc | None}, "trained": bool, "steps", "final_loss", "seconds"[, "note"]}``."""
    from tokenpos.analysis.extrapolate.schemes import build_model

    start = time.perf_counter()
    model = build_model(name, cfg.vocab_size, train_len=cfg.train_len, d_model=cfg.d_model,
                        num_heads=cfg.num_heads, num_layers=cfg.num_layers, base=base, seed=seed)
    try:
        final, steps, in_dist = train_task(model, task, cfg, seed)
    except RuntimeError as exc:
        return {"accuracy": {t: None for t in cfg.eval_lens}, "per_token": {t: None for t in cfg.eval_lens},
                "trained": False, "steps": None, "final_loss": None, "note": str(exc),
                "seconds": time.perf_counter() - start}
    scores = {t: score_task(model, task, t, cfg) for t in cfg.eval_lens}
    trained = in_dist >= cfg.target_accuracy
    out = {"accuracy": {t: s.exact for t, s in scores.items()},
           "per_token": {t: s.per_token for t, s in scores.items()}, "trained": trained, "steps": steps,
           "final_loss": final, "seconds": time.perf_counter() - start}
    if not trained:
        out["note"] = (f"not trained: per-token accuracy {in_dist:.3f} at length {cfg.train_len} after {steps} "
                       f"steps, below {cfg.target_accuracy}")
    return out
