"""Train short, test long: train one tiny LM per positional scheme at length L, evaluate at k * L.

``run_extrapolation(config, progress=None, on_update=None) -> ExtrapolationResult`` returns data and
never prints. The model code is the same for every scheme; ``schemes.build_model`` builds the token
table and the scheme object(s). Per seed and scheme: train, then score every length with every
protocol (both score the same target tokens at every length, see evaluate.py; ``sliding`` is primary).
RoPE (and iRoPE) are also evaluated with inference-time scaling by swapping a scaled ``RotaryEmbedding``
in. The add-k n-gram baselines (``ngram.py``) are scored once on each protocol's targets. With
``config.task`` set, the synthetic tasks (``tasks.py``) run for every scheme as well. With
``config.checkpoint_dir`` set, every unit is checkpointed there and a rerun continues (checkpoint.py).
``on_update(result)`` is called after every seed's unit of work, so a long run can save partial results.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from tokenpos.analysis.extrapolate.results import ExtrapolationResult, ResultRow, SchemeRun, TaskRow
from tokenpos.analysis.extrapolate.schemes import DEFAULT_SCHEMES, SCHEMES
from tokenpos.analysis.extrapolate.tasks import TaskConfig
from tokenpos.tables.errors import ConfigError

ROPE_SCALINGS = ("linear", "dynamic", "yarn")
FULL_D_MODEL = 128
FULL_STEPS = 1000
PROTOCOLS = ("nonoverlap", "sliding")
Progress = Callable[..., None]

__all__ = ["PROTOCOLS", "ROPE_SCALINGS", "SCHEMES", "ExtrapolationConfig", "ExtrapolationResult", "ResultRow",
           "SchemeRun", "TaskRow", "rope_scaling_dict", "run_extrapolation"]


@dataclass(frozen=True)
class ExtrapolationConfig:
    """Everything that defines one run. Defaults: 2 layers, D 128, 4 heads, L 64, one seed, the sliding protocol.
    ``checkpoint_dir``: where each unit is checkpointed (None: nowhere; checkpoint.py)."""

    train_len: int = 64
    multiples: tuple[int, ...] = (1, 2, 4, 8)
    schemes: tuple[str, ...] = DEFAULT_SCHEMES
    rope_scalings: tuple[str, ...] = ROPE_SCALINGS
    d_model: int = 128
    num_layers: int = 2
    num_heads: int = 4
    base: float = 10000.0
    steps: int = 1000
    batch_size: int = 32
    lr: float = 4e-3
    warmup: int = 50
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    eval_tokens: int | None = None
    t5_num_buckets: int = 32
    corpus: str | None = None
    seed: int = 0
    threads: int | None = 2
    seeds: tuple[int, ...] = ()
    protocols: tuple[str, ...] = ("sliding",)
    sliding_stride: int | None = None
    sliding_tokens: int = 2048
    task: TaskConfig | None = None
    task_seeds: tuple[int, ...] | None = None
    checkpoint_dir: str | None = None

    @classmethod
    def quick(cls, **overrides: Any) -> ExtrapolationConfig:
        """About a minute on 2 cores: fewer steps, a capped eval set. Numbers are only indicative."""
        return replace(cls(steps=150, eval_tokens=8192), **overrides)

    @classmethod
    def full(cls, **overrides: Any) -> ExtrapolationConfig:
        """The full study: every scheme, five seeds, both protocols, four layers (iRoPE at 3:1), the copy and
        passkey tasks (three seeds) trained to 95 % per-token accuracy within 20000 steps (or reported as
        not trained).

        d_model 128, 4 layers, 1000 steps: which schemes pass the context gate is in docs/EXTRAPOLATION.md,
        with the study's time and a half-budget check (docs/study_budget.toml); 4096 tail tokens per length,
        sliding stride L/4 over 2048 scored tokens. One thread. docs/study.toml writes out every setting.
        """
        return replace(cls(d_model=FULL_D_MODEL, num_layers=4, batch_size=32, steps=FULL_STEPS, eval_tokens=4096,
                           schemes=SCHEMES, seeds=(0, 1, 2, 3, 4), protocols=("sliding", "nonoverlap"),
                           threads=1, task=TaskConfig(steps=20000), task_seeds=(0, 1, 2)), **overrides)

    @property
    def seed_list(self) -> tuple[int, ...]:
        return tuple(self.seeds) if self.seeds else (self.seed,)

    @property
    def task_seed_list(self) -> tuple[int, ...]:
        return self.seed_list if self.task_seeds is None else tuple(self.task_seeds)

    @property
    def stride(self) -> int:
        """The sliding-window stride S (default L / 4): each window scores its last S tokens."""
        return self.sliding_stride if self.sliding_stride is not None else max(1, self.train_len // 4)

    def validate(self) -> ExtrapolationConfig:
        """Raise ConfigError on a config that cannot run; return self."""
        checks = {"train_len": self.train_len, "d_model": self.d_model, "num_layers": self.num_layers,
                  "num_heads": self.num_heads, "steps": self.steps, "batch_size": self.batch_size,
                  "sliding_tokens": self.sliding_tokens}
        for name, value in checks.items():
            if not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name} must be a positive integer, got {value!r}")
        if self.train_len < 2:
            raise ConfigError(f"train_len must be >= 2 (the tail is its last L/2 positions), got {self.train_len}")
        if self.d_model % self.num_heads:
            raise ConfigError(f"d_model {self.d_model} is not divisible by num_heads {self.num_heads}")
        if not self.multiples or any(not isinstance(k, int) or k < 1 for k in self.multiples) \
                or 1 not in self.multiples:
            raise ConfigError(f"multiples must be positive integers including 1, got {self.multiples!r}")
        unknown = [s for s in self.schemes if s not in SCHEMES]
        if unknown or not self.schemes:
            raise ConfigError(f"unknown schemes {unknown}; expected a non-empty subset of {list(SCHEMES)}")
        bad = [s for s in self.rope_scalings if s not in ROPE_SCALINGS]
        if bad:
            raise ConfigError(f"unknown rope scalings {bad}; expected a subset of {list(ROPE_SCALINGS)}")
        bad = [p for p in self.protocols if p not in PROTOCOLS]
        if bad or not self.protocols:
            raise ConfigError(f"unknown protocols {bad}; expected a non-empty subset of {list(PROTOCOLS)}")
        if self.eval_tokens is not None and (not isinstance(self.eval_tokens, int) or self.eval_tokens < 1):
            raise ConfigError(f"eval_tokens must be a positive integer or None, got {self.eval_tokens!r}")
        if not isinstance(self.stride, int) or not 1 <= self.stride <= self.train_len:
            raise ConfigError(f"sliding_stride must be an integer in [1, train_len], got {self.sliding_stride!r}")
        if isinstance(self.lr, bool) or not isinstance(self.lr, (int, float)) or not 0 < self.lr < math.inf:
            raise ConfigError(f"lr must be a finite number > 0, got {self.lr!r}")
        if len(set(self.seed_list)) != len(self.seed_list):
            raise ConfigError(f"seeds must be distinct, got {list(self.seed_list)}")
        bad_seeds = [s for s in self.seed_list if isinstance(s, bool) or not isinstance(s, int) or not 0 <= s < 2**63]
        if bad_seeds:                      # torch.manual_seed and NumPy take [0, 2**63): refused before any work
            raise ConfigError(f"seeds must be integers in [0, 2**63), got {bad_seeds}")
        if self.task is not None:
            self.task.validate()
        return self

    @property
    def eval_lens(self) -> tuple[int, ...]:
        return tuple(self.train_len * k for k in sorted(set(self.multiples)))


def rope_scaling_dict(rope_type: str, factor: float, train_len: int) -> dict[str, Any]:
    """The HF-style dict for RoPE at ``factor`` = eval length / train length (original length L).

    linear and dynamic take only the factor (dynamic reads the original length from the rotary
    object's ``max_seq_len``, HF's ``max_position_embeddings``); yarn names it explicitly.
    """
    if rope_type in ("linear", "dynamic"):
        return {"rope_type": rope_type, "factor": float(factor)}
    return {"rope_type": rope_type, "factor": float(factor), "original_max_position_embeddings": int(train_len)}


def _scaled_rope(rope_type: str, config: ExtrapolationConfig, k: int) -> Any:
    """RoPE at factor k = kL / L, same head_dim and base as trained; ``max_seq_len`` = L is HF's
    ``max_position_embeddings``, the original length that dynamic NTK scales from."""
    from tokenpos.torch import RotaryEmbedding

    return RotaryEmbedding(config.d_model // config.num_heads, base=config.base, max_seq_len=config.train_len,
                           scaling=rope_scaling_dict(rope_type, k, config.train_len))


def _variants(model: Any, scheme: str, config: ExtrapolationConfig) -> list[tuple[str, Callable[[int], Any]]]:
    """(name, k -> scheme object or None): the trained scheme, and for a rotary scheme one
    inference-time scaling per ``config.rope_scalings``."""
    from functools import partial

    out: list[tuple[str, Callable[[int], Any]]] = [(scheme, lambda k: None)]
    if getattr(model.embed.position, "kind", None) == "rotary":
        out += [(f"{scheme}+{t}", partial(_scaled_rope, t, config)) for t in config.rope_scalings]
    return out


class _Runner:
    """One run's state: the corpus, the eval settings, the baselines, the rows so far, checkpoints, progress."""

    def __init__(self, config: ExtrapolationConfig, notify: Progress) -> None:
        import torch

        from tokenpos.analysis.extrapolate.checkpoint import lm_settings, task_settings, unit_folder
        from tokenpos.analysis.extrapolate.data import eval_token_count, load_corpus

        self.config, self.notify = config, notify
        self.corpus = load_corpus(config.corpus)
        self.tokens = eval_token_count(len(self.corpus.eval), max(config.eval_lens), config.eval_tokens)
        self.train_ids = torch.from_numpy(self.corpus.train)
        self.rows: list[ResultRow] = []
        self.runs: list[SchemeRun] = []
        self.task_rows: list[TaskRow] = []
        self.ngram = self._baselines()
        plain, root = _plain_config(config), config.checkpoint_dir
        self.store = None if root is None else unit_folder(root, "lm", lm_settings(plain))
        self.task_store = None if root is None or config.task is None else \
            unit_folder(root, "task", task_settings(plain))

    def _targets(self, protocol: str) -> Any:
        """Indices into the eval ids of the targets ``protocol`` scores (the same at every length)."""
        from tokenpos.analysis.extrapolate.data import sliding_targets, tail_targets

        c = self.config
        if protocol == "sliding":
            return sliding_targets(c.stride, c.sliding_tokens, max(c.eval_lens))
        return tail_targets(max(c.eval_lens), self.tokens, max(1, c.train_len // 2))

    def _baselines(self) -> list[dict[str, Any]]:
        """The add-k bigram, trigram and 4-gram NLL on each protocol's scored targets."""
        from tokenpos.analysis.extrapolate.ngram import baselines

        models = baselines(self.corpus.train, self.corpus.vocab_size)
        return [{"order": n, "k": m.k, "protocol": p, "nll": float(m.nll(self.corpus.eval, self._targets(p)).mean()),
                 "tokens": len(self._targets(p))} for p in self.config.protocols for n, m in models.items()]

    def lm(self, seed: int) -> None:
        for scheme in self.config.schemes:
            key = f"{scheme}-s{seed}"
            saved = self.store.load(key, "rows") if self.store is not None else None
            if saved is None:
                saved = self._train_and_score(scheme, seed, key)
                if self.store is not None:
                    self.store.save(key, "rows", saved)
            self.rows += [ResultRow(**r) for r in saved["rows"]]
            if saved["run"] is not None:
                self.runs.append(SchemeRun(**saved["run"]))

    def _train_and_score(self, scheme: str, seed: int, key: str) -> dict[str, Any]:
        """Train (or load the checkpointed weights) and score: ``{"rows": [...], "run": {...} | None}``."""
        from dataclasses import asdict

        from tokenpos.analysis.extrapolate.schemes import build_model
        from tokenpos.analysis.extrapolate.train import TrainStats, count_parameters, train_model

        c = self.config
        model = build_model(scheme, self.corpus.vocab_size, train_len=c.train_len, d_model=c.d_model,
                            num_heads=c.num_heads, num_layers=c.num_layers, base=c.base,
                            t5_num_buckets=c.t5_num_buckets, seed=seed)
        label = f"train {scheme}" + (f" s{seed}" if len(c.seed_list) > 1 else "")
        trained = self.store.load(key, "train") if self.store is not None else None
        if trained is not None and self.store is not None and self.store.load_model(key, model):
            stats = TrainStats(trained["losses"], trained["seconds"])
        else:
            try:
                stats = train_model(model, self.train_ids, steps=c.steps, batch_size=c.batch_size,
                                    seq_len=c.train_len, lr=c.lr, warmup=c.warmup, weight_decay=c.weight_decay,
                                    grad_clip=c.grad_clip, seed=seed, progress=self.notify, label=label)
            except RuntimeError as exc:              # a diverged run is a result, not a crash
                failed = [ResultRow(scheme, t, None, None, None, f"training diverged: {exc}", p, seed)
                          for p in c.protocols for t in c.eval_lens]
                return {"rows": [asdict(r) for r in failed], "run": None}
            if self.store is not None:
                self.store.save_model(key, model)
                self.store.save(key, "train", {"losses": stats.losses, "seconds": stats.seconds})
        eval_start = time.perf_counter()
        rows: list[ResultRow] = []
        for name, make_scheme in _variants(model, scheme, c):
            for protocol in c.protocols:
                rows += self._score(model, name, make_scheme, protocol, seed)
        run = SchemeRun(scheme, count_parameters(model), stats.seconds, time.perf_counter() - eval_start,
                        stats.final_loss, stats.losses, seed)
        return {"rows": [asdict(r) for r in rows], "run": asdict(run)}

    def _score(self, model: Any, name: str, make_scheme: Callable[[int], Any], protocol: str,
               seed: int) -> list[ResultRow]:
        from tokenpos.analysis.extrapolate.evaluate import score_length, score_sliding

        c, L = self.config, self.config.train_len
        scores = []
        for k in sorted(set(c.multiples)):
            if protocol == "nonoverlap":
                scores.append(score_length(model, self.corpus.eval, k * L, self.tokens, max(1, L // 2),
                                           longest=max(c.eval_lens), bin_width=max(1, L // 2),
                                           scheme=make_scheme(k)))
            else:
                scores.append(score_sliding(model, self.corpus.eval, k * L, c.stride, c.sliding_tokens,
                                            start=max(c.eval_lens), scheme=make_scheme(k)))
        self.notify(f"eval {name}", 1, 1)
        base = scores[0].tail_nll                                    # sorted by length: the first is at L
        return [ResultRow(name, s.eval_len, s.ppl, s.tail_nll, None if s.tail_nll is None or not base
                          else s.tail_nll / base, s.note, protocol, seed, s.curve) for s in scores]

    def tasks(self, seed: int) -> None:
        from tokenpos.analysis.extrapolate.tasks import run_task

        task = self.config.task
        if task is None:
            return
        for name in self.config.schemes:
            for t in task.tasks:
                key = f"{t}-{name}-s{seed}"
                out = self.task_store.load(key, "rows") if self.task_store is not None else None
                if out is None:
                    out = run_task(name, t, task, seed, base=self.config.base)
                    out["accuracy"] = {str(k): v for k, v in out["accuracy"].items()}
                    out["per_token"] = {str(k): v for k, v in out["per_token"].items()}
                    if self.task_store is not None:
                        self.task_store.save(key, "rows", out)
                self.notify(f"task {t} {name} s{seed}", 1, 1)
                self.task_rows += [TaskRow(name, t, int(length), acc, seed, task.eval_examples, out.get("note"),
                                           out["per_token"][length], out["trained"], out["steps"])
                                   for length, acc in out["accuracy"].items()]


def _plain_config(config: ExtrapolationConfig) -> dict[str, Any]:
    """The config as a JSON-ready dict (tuples as lists)."""
    from dataclasses import asdict

    return json.loads(json.dumps(asdict(config)))


def run_extrapolation(config: ExtrapolationConfig, progress: Progress | None = None,
                      on_update: Callable[[ExtrapolationResult], None] | None = None,
                      command: str | None = None) -> ExtrapolationResult:
    """Train every scheme at ``train_len`` for every seed and evaluate it at every ``train_len * k``.

    Order: the language model for the first seed, the synthetic task for its first seed, then the
    remaining seeds of each (so a run cut short still has every scheme once). ``progress(step, done,
    total, **info)`` reports training steps (``"train <scheme>"``, info ``loss``) and finished
    evaluations; ``on_update(result)`` receives the partial result after each seed's unit of work.
    ``command`` (the exact command line that ran the study) is recorded in the document.
    Threads: ``config.threads`` for the run, torch's (``torch.set_num_threads``) and the compiled kernels'
    (``numba.set_num_threads``, at most numba's pool), both restored afterwards. With numba left at its
    default, a ``--threads 1`` run still launched the kernels on two OpenMP threads, and the second one
    spun between launches: two workers of the full study on two cores each burned half a core that way.
    """
    import numba
    import torch
    from numba.core import config as numba_config

    config.validate()
    notify: Progress = progress or (lambda *a, **k: None)
    start = time.perf_counter()
    runner = _Runner(config, notify)
    seeds, task_seeds = config.seed_list, config.task_seed_list if config.task is not None else ()
    units = [("lm", seeds[0])] + [("task", s) for s in task_seeds[:1]] + [("lm", s) for s in seeds[1:]] \
        + [("task", s) for s in task_seeds[1:]]
    old_threads, old_numba = torch.get_num_threads(), numba.get_num_threads()
    torch.set_num_threads(config.threads or old_threads)
    threads = torch.get_num_threads()
    numba.set_num_threads(min(threads, numba_config.NUMBA_NUM_THREADS))  # type: ignore[attr-defined]

    def result(complete: bool) -> ExtrapolationResult:
        c = runner.corpus
        return ExtrapolationResult(config=config, rows=list(runner.rows), runs=list(runner.runs), corpus=c.name,
                                   vocab_size=c.vocab_size, train_chars=len(c.train), eval_chars=len(c.eval),
                                   eval_tokens=runner.tokens, seconds=time.perf_counter() - start, threads=threads,
                                   task_rows=list(runner.task_rows), complete=complete, ngram=runner.ngram,
                                   command=command)

    try:
        for i, (kind, seed) in enumerate(units):
            runner.lm(seed) if kind == "lm" else runner.tasks(seed)
            notify("overall", i + 1, len(units))
            if on_update is not None and i + 1 < len(units):
                on_update(result(False))
    finally:
        torch.set_num_threads(old_threads)
        numba.set_num_threads(old_numba)
    return result(True)
