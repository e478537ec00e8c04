"""Train short, test long: train one tiny LM per positional scheme at length L, evaluate at k * L.

``run_extrapolation(config, progress=None) -> ExtrapolationResult`` returns data and never prints.
The model code is the same for every scheme; the scheme only changes the ``positional=`` argument of
``TransformerEmbedding`` (plus settings every scheme receives, e.g. T5's max distance = L). RoPE is
also evaluated with inference-time scaling by swapping a scaled ``RotaryEmbedding`` in as the scheme.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any

from tokenpos.tables.errors import ConfigError

if TYPE_CHECKING:
    from tokenpos.analysis.extrapolate.evaluate import LengthScore

SCHEMES = ("sinusoidal", "learned", "rope", "alibi", "t5", "nope")
ROPE_SCALINGS = ("linear", "dynamic", "yarn")
# experiment name -> TransformerEmbedding ``positional`` kind (identity unless listed)
POSITIONAL_KIND = {"nope": "none"}
Progress = Callable[..., None]


@dataclass(frozen=True)
class ExtrapolationConfig:
    """Everything that defines one run. Defaults are the issue's: 2 layers, D 128, 4 heads, L 64."""

    train_len: int = 64
    multiples: tuple[int, ...] = (1, 2, 4, 8)
    schemes: tuple[str, ...] = SCHEMES
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

    @classmethod
    def quick(cls, **overrides: Any) -> ExtrapolationConfig:
        """About a minute on 2 cores: fewer steps, a capped eval set. Numbers are only indicative."""
        return replace(cls(steps=150, eval_tokens=8192), **overrides)

    def validate(self) -> ExtrapolationConfig:
        """Raise ConfigError on a config that cannot run; return self."""
        checks = {"train_len": self.train_len, "d_model": self.d_model, "num_layers": self.num_layers,
                  "num_heads": self.num_heads, "steps": self.steps, "batch_size": self.batch_size}
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
        if self.eval_tokens is not None and (not isinstance(self.eval_tokens, int) or self.eval_tokens < 1):
            raise ConfigError(f"eval_tokens must be a positive integer or None, got {self.eval_tokens!r}")
        return self

    @property
    def eval_lens(self) -> tuple[int, ...]:
        return tuple(self.train_len * k for k in sorted(set(self.multiples)))

    def scheme_kwargs(self) -> dict[str, Any]:
        """TransformerEmbedding settings given to every scheme (each uses the ones that concern it).

        T5: causal buckets, max_distance = L (else the far buckets never see a gradient); the bucket
        count is capped at L so that the L/2 exact buckets fit below max_distance for tiny L.
        """
        buckets = min(self.t5_num_buckets, self.train_len)
        return {"base": self.base, "t5_num_buckets": buckets, "t5_max_distance": self.train_len,
                "t5_bidirectional": False}


@dataclass(frozen=True)
class ResultRow:
    """One line of the JSON ``results`` list. ``ratio`` = tail NLL here / tail NLL at L."""

    scheme: str
    eval_len: int
    ppl: float | None
    tail_nll: float | None
    ratio: float | None
    note: str | None = None

    def to_dict(self) -> dict[str, Any]:
        out = {"scheme": self.scheme, "eval_len": self.eval_len, "ppl": self.ppl, "tail_nll": self.tail_nll,
               "ratio": self.ratio}
        if self.note is not None:
            out["note"] = self.note
        return out


@dataclass
class SchemeRun:
    """Training facts for one trained scheme (RoPE's scaled variants reuse RoPE's run)."""

    scheme: str
    parameters: int
    train_seconds: float
    eval_seconds: float
    final_loss: float
    losses: list[float] = field(default_factory=list, repr=False)


@dataclass
class ExtrapolationResult:
    """Everything a run produced: rows for the table/JSON, training facts, timing, the config."""

    config: ExtrapolationConfig
    rows: list[ResultRow]
    runs: list[SchemeRun]
    corpus: str
    vocab_size: int
    train_chars: int
    eval_chars: int
    eval_tokens: int
    seconds: float
    threads: int

    def row(self, scheme: str, eval_len: int) -> ResultRow:
        return next(r for r in self.rows if r.scheme == scheme and r.eval_len == eval_len)

    def to_dict(self) -> dict[str, Any]:
        """The JSON document: ``{"train_len": L, "results": [...]}`` plus run metadata."""
        return {
            "train_len": self.config.train_len,
            "results": [r.to_dict() for r in self.rows],
            "config": {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(self.config).items()},
            "runs": [{"scheme": r.scheme, "parameters": r.parameters, "train_seconds": round(r.train_seconds, 2),
                      "eval_seconds": round(r.eval_seconds, 2), "final_train_loss": round(r.final_loss, 4)}
                     for r in self.runs],
            "corpus": self.corpus, "vocab_size": self.vocab_size, "train_chars": self.train_chars,
            "eval_chars": self.eval_chars, "eval_tokens_per_length": self.eval_tokens,
            "seconds": round(self.seconds, 2), "threads": self.threads,
        }


def rope_scaling_dict(rope_type: str, factor: float, train_len: int) -> dict[str, Any]:
    """The HF-style dict for RoPE at ``factor`` = eval length / train length (original length L).

    linear and dynamic take only the factor (dynamic reads the original length from the rotary
    object's ``max_seq_len``, HF's ``max_position_embeddings``); yarn names it explicitly.
    """
    if rope_type in ("linear", "dynamic"):
        return {"rope_type": rope_type, "factor": float(factor)}
    return {"rope_type": rope_type, "factor": float(factor), "original_max_position_embeddings": int(train_len)}


def _rows(scheme: str, scores: list[LengthScore]) -> list[ResultRow]:
    base = scores[0].tail_nll  # scores are sorted by length; the first is at L
    return [ResultRow(scheme, s.eval_len, s.ppl, s.tail_nll,
                      None if s.tail_nll is None or not base else s.tail_nll / base, s.note) for s in scores]


def _eval_units(config: ExtrapolationConfig, tokens: int, eval_len: int) -> float:
    """Rough cost of one evaluation in training-step units (a forward is ~1/3 of a step)."""
    return tokens / (3 * config.batch_size * config.train_len) * (1 + eval_len / (6 * config.d_model))


class _Overall:
    """The ``"overall"`` progress step, in training-step units, so one ETA covers the whole run."""

    def __init__(self, notify: Progress, total: float) -> None:
        self.notify, self.total, self.done = notify, max(1, math.ceil(total)), 0.0

    def advance(self, units: float) -> None:
        self.done += units
        self.notify("overall", min(int(self.done), self.total), self.total)

    def train_callback(self) -> Progress:
        """``progress`` for ``train_model``: forwards the step and moves the overall bar along."""
        base = self.done

        def on_step(step: str, done: int, total: int, **info: Any) -> None:
            self.notify(step, done, total, **info)
            self.notify("overall", min(int(base + done), self.total), self.total)

        return on_step


def _variants(model: Any, scheme: str, config: ExtrapolationConfig) -> list[tuple[str, Callable[[int], Any]]]:
    """(name, k -> scheme object or None) to evaluate: the trained scheme itself, and for a rotary
    scheme one inference-time scaling per ``config.rope_scalings`` (a new RotaryEmbedding at factor k)."""
    from functools import partial

    out: list[tuple[str, Callable[[int], Any]]] = [(scheme, lambda k: None)]
    if getattr(model.embed.position, "kind", None) == "rotary":
        out += [(f"{scheme}+{t}", partial(_scaled_rope, t, config)) for t in config.rope_scalings]
    return out


def _scaled_rope(rope_type: str, config: ExtrapolationConfig, k: int) -> Any:
    """RoPE at factor k = kL / L, same head_dim and base as trained; ``max_seq_len`` = L is HF's
    ``max_position_embeddings``, the original length that dynamic NTK scales from."""
    from tokenpos.torch import RotaryEmbedding

    return RotaryEmbedding(config.d_model // config.num_heads, base=config.base, max_seq_len=config.train_len,
                           scaling=rope_scaling_dict(rope_type, k, config.train_len))


def run_extrapolation(config: ExtrapolationConfig, progress: Progress | None = None) -> ExtrapolationResult:
    """Train every scheme at ``train_len`` and evaluate it at every ``train_len * k``.

    ``progress(step, done, total, **info)`` is called as work proceeds: step ``"train <scheme>"``
    (info: ``loss``, a moving average), ``"eval <scheme>"`` and ``"overall"`` (in step units).
    Threads: ``torch.set_num_threads(config.threads)`` for the run, restored afterwards.
    """
    import torch

    from tokenpos.analysis.extrapolate.data import eval_token_count, load_corpus
    from tokenpos.analysis.extrapolate.evaluate import score_length
    from tokenpos.analysis.extrapolate.model import TinyLM
    from tokenpos.analysis.extrapolate.train import count_parameters, train_model

    config.validate()
    notify: Progress = progress or (lambda *a, **k: None)
    start = time.perf_counter()
    corpus = load_corpus(config.corpus)
    L, ks = config.train_len, sorted(set(config.multiples))
    tokens = eval_token_count(len(corpus.eval), max(config.eval_lens), config.eval_tokens)
    train_ids = torch.from_numpy(corpus.train)
    n_rotary = len(config.rope_scalings) if "rope" in config.schemes else 0   # only for the ETA
    eval_units = sum(_eval_units(config, tokens, t) for t in config.eval_lens)
    overall = _Overall(notify, len(config.schemes) * config.steps + eval_units * (len(config.schemes) + n_rotary))
    old_threads = torch.get_num_threads()
    torch.set_num_threads(config.threads or old_threads)
    threads = torch.get_num_threads()
    rows: list[ResultRow] = []
    runs: list[SchemeRun] = []
    try:
        for scheme in config.schemes:
            model = TinyLM(corpus.vocab_size, positional=POSITIONAL_KIND.get(scheme, scheme),
                           d_model=config.d_model, num_layers=config.num_layers, num_heads=config.num_heads,
                           max_seq_len=L, scheme_kwargs=config.scheme_kwargs(), seed=config.seed)
            stats = train_model(model, train_ids, steps=config.steps, batch_size=config.batch_size, seq_len=L,
                                lr=config.lr, warmup=config.warmup, weight_decay=config.weight_decay,
                                grad_clip=config.grad_clip, seed=config.seed, progress=overall.train_callback(),
                                label=f"train {scheme}")
            overall.advance(config.steps)
            eval_start = time.perf_counter()
            for name, make_scheme in _variants(model, scheme, config):
                scores = []
                for i, k in enumerate(ks):
                    scores.append(score_length(model, corpus.eval, k * L, tokens, max(1, L // 2),
                                               scheme=make_scheme(k)))
                    notify(f"eval {name}", i + 1, len(ks))
                    overall.advance(_eval_units(config, tokens, k * L))
                rows.extend(_rows(name, scores))
            runs.append(SchemeRun(scheme, count_parameters(model), stats.seconds,
                                  time.perf_counter() - eval_start, stats.final_loss, stats.losses))
    finally:
        torch.set_num_threads(old_threads)
    return ExtrapolationResult(config=config, rows=rows, runs=runs, corpus=corpus.name,
                               vocab_size=corpus.vocab_size, train_chars=len(corpus.train),
                               eval_chars=len(corpus.eval), eval_tokens=tokens,
                               seconds=time.perf_counter() - start, threads=threads)
