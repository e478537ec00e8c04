"""Embedding memory across model scales: parameters, bytes per precision, training memory with Adam.

Pure arithmetic on integers (no NumPy arrays are allocated). Shapes: V vocab, D model dim, L max
sequence length (rows of a learned position table), H heads.

Units: MiB = 2**20 bytes, MB = 10**6 bytes. Training memory counts fp32 weights + fp32 gradients +
Adam's two fp32 moments = 16 bytes per trainable parameter (activations not included).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from tokenpos.tables.checks.validation import check_choice, check_int, check_positive_int
from tokenpos.tables.errors import ConfigError
from tokenpos.tables.registry import SCHEMES

MIB = 2**20
MB = 10**6
# precision name -> bytes per parameter (fp16 and bf16 are both 2 bytes).
PRECISIONS: dict[str, int] = {"fp32": 4, "fp16/bf16": 2, "int8": 1}
JSON_PRECISIONS: dict[str, int] = {"fp32": 4, "fp16": 2, "bf16": 2, "int8": 1}  # keys in to_dict()
ADAM_BYTES_PER_PARAM = 4 * 4  # fp32 weight + grad + Adam m + Adam v
# Every registered positional scheme (tokenpos.tables.registry), additive ones first, then rotary, bias, none.
KIND_ORDER = ("additive", "rotary", "bias", "none")
POSITIONAL_KINDS: tuple[str, ...] = tuple(sorted(SCHEMES, key=lambda n: KIND_ORDER.index(SCHEMES[n].kind)))
T5_NUM_BUCKETS = 32
FIRE_WIDTH = 32          # FIRE's MLP width (tokenpos.tables.formulas.fire, the paper's listing)


@dataclass(frozen=True)
class ModelConfig:
    """The embedding-relevant facts of one model (a preset, an example scenario, or user input).

    Attributes:
        name: short label, e.g. "gpt2".
        vocab_size, d_model: V and D of the token table.
        max_seq_len: L, the trained context (rows of a learned position table); None if unknown.
        positional: one of POSITIONAL_KINDS, the scheme the model uses.
        num_heads: H (sizes the T5, FIRE and KERPLE parameters in the alternatives); None = D // 64 (at least 1).
        token_types: rows of a segment/token-type table (BERT: 2), 0 for none.
        tied_output: True if the output projection (LM head) shares the token table.
        total_params: the whole model's parameter count, if known.
        total_exact: False when total_params is a rounded headline figure (e.g. "175B").
        title, note: human-readable name and source notes.
    """

    name: str
    vocab_size: int
    d_model: int
    max_seq_len: int | None = None
    positional: str = "learned"
    num_heads: int | None = None
    token_types: int = 0
    tied_output: bool = True
    total_params: int | None = None
    total_exact: bool = True
    title: str = ""
    note: str = ""

    def __post_init__(self) -> None:
        check_positive_int("vocab_size", self.vocab_size)
        check_positive_int("d_model", self.d_model)
        if self.max_seq_len is not None:
            check_positive_int("max_seq_len", self.max_seq_len)
        if self.num_heads is not None:
            check_positive_int("num_heads", self.num_heads)
        check_int("token_types", self.token_types, minimum=0)
        check_choice("positional", self.positional, POSITIONAL_KINDS)
        if self.total_params is not None:
            check_positive_int("total_params", self.total_params)

    @property
    def heads(self) -> int:
        return self.num_heads if self.num_heads is not None else max(1, self.d_model // 64)


PRESETS: dict[str, ModelConfig] = {
    cfg.name: cfg
    for cfg in (
        ModelConfig("gpt2", 50257, 768, 1024, "learned", 12, 0, True, 124_439_808, True, "GPT-2 small",
                    "HF GPT2LMHeadModel; lm_head tied to wte"),
        ModelConfig("gpt3-175b", 50257, 12288, 2048, "learned", 96, 0, True, 175_000_000_000, False,
                    "GPT-3 175B", "total is the paper's headline 175B; output tied as in GPT-2"),
        ModelConfig("bert-base", 30522, 768, 512, "learned", 12, 2, True, 109_482_240, True, "BERT-base uncased",
                    "HF BertModel incl. pooler (~110M); MLM decoder tied to word embeddings"),
        ModelConfig("llama2-7b", 32000, 4096, 4096, "rope", 32, 0, False, 6_738_415_616, True, "Llama 2 7B",
                    "RoPE (no position table); separate lm_head"),
        ModelConfig("llama3-8b", 128256, 4096, 8192, "rope", 32, 0, False, 8_030_261_248, True, "Llama 3 8B",
                    "RoPE base 500000; separate lm_head"),
    )
}

# Example sizes (name, V, D) from small to GPT-3 scale; L = 2048 as in the positional comparison. GPT-3 scale is
# the gpt3-175b preset's token table, so scenario_reports() lists it once, as the preset.
SEED_SCENARIOS: tuple[ModelConfig, ...] = (
    ModelConfig("small", 10_000, 256, 2048, title="Small Model"),
    ModelConfig("medium", 50_000, 512, 2048, title="Medium Model"),
    ModelConfig("large", 100_000, 1024, 2048, title="Large Model"),
    ModelConfig("gpt3-scale", 50_257, 12_288, 2048, title="GPT-3 Scale"),
)


def get_preset(name: str) -> ModelConfig:
    """The preset called ``name``; ValueError listing the known names otherwise."""
    return PRESETS[check_choice("preset", name, sorted(PRESETS))]


@dataclass(frozen=True)
class TableMemory:
    """One table: its shape, parameter count and whether an optimiser trains it.

    ``params`` counts stored values; a fixed (non-trainable) table has ``trainable=False`` and costs no
    gradient or optimiser state.
    """

    name: str
    rows: int
    cols: int
    trainable: bool = True
    note: str = ""

    @property
    def params(self) -> int:
        return self.rows * self.cols

    def nbytes(self, precision: str = "fp32") -> int:
        return self.params * PRECISIONS[check_choice("precision", precision, PRECISIONS)]

    def mib(self, precision: str = "fp32") -> float:
        return self.nbytes(precision) / MIB

    def mb(self, precision: str = "fp32") -> float:
        return self.nbytes(precision) / MB

    @property
    def train_bytes(self) -> int:
        """fp32 weights + grads + Adam m, v for a trainable table; 0 for a fixed one."""
        return self.params * ADAM_BYTES_PER_PARAM if self.trainable else 0

    def to_dict(self) -> dict[str, Any]:
        return _sizes_dict({"name": self.name, "shape": [self.rows, self.cols], "trainable": self.trainable,
                            "note": self.note}, self.params, self.train_bytes)


def _sizes_dict(head: dict[str, Any], params: int, train_bytes: int) -> dict[str, Any]:
    out = dict(head, params=params)
    out["bytes"] = {p: params * b for p, b in JSON_PRECISIONS.items()}
    out["mib"] = {p: params * b / MIB for p, b in JSON_PRECISIONS.items()}
    out["mb"] = {p: params * b / MB for p, b in JSON_PRECISIONS.items()}
    out["train_adam_bytes"] = train_bytes
    out["train_adam_mib"] = train_bytes / MIB
    out["train_adam_mb"] = train_bytes / MB
    return out


@dataclass(frozen=True)
class MemoryReport:
    """The embedding tables of one model and the position-table alternatives at the same (L, D)."""

    config: ModelConfig
    tables: tuple[TableMemory, ...]
    alternatives: tuple[TableMemory, ...] = field(default_factory=tuple)
    notes: tuple[str, ...] = field(default_factory=tuple)    # what was assumed or left out, shown to the user

    @property
    def params(self) -> int:
        return sum(t.params for t in self.tables)

    @property
    def train_bytes(self) -> int:
        return sum(t.train_bytes for t in self.tables)

    def nbytes(self, precision: str = "fp32") -> int:
        return sum(t.nbytes(precision) for t in self.tables)

    def share(self, params: int | None = None) -> float | None:
        """``params`` (default: all embedding tables) as a fraction of the model total, if known."""
        total = self.config.total_params
        return None if total is None else (self.params if params is None else params) / total

    def to_dict(self) -> dict[str, Any]:
        cfg = self.config
        tables = []
        for t in self.tables:
            d = t.to_dict()
            d["share_of_model"] = self.share(t.params)
            tables.append(d)
        totals = _sizes_dict({"name": "embedding total"}, self.params, self.train_bytes)
        totals["share_of_model"] = self.share()
        return {
            "config": {k: getattr(cfg, k) for k in cfg.__dataclass_fields__},
            "tables": tables,
            "total": totals,
            "position_alternatives": [t.to_dict() for t in self.alternatives],
            "notes": list(self.notes),
            "units": {"MiB": MIB, "MB": MB, "adam_bytes_per_param": ADAM_BYTES_PER_PARAM},
        }


def _stored(name: str, L: int, D: int, H: int) -> TableMemory:
    """What scheme ``name`` stores for context L, width D and H heads (see :func:`position_alternatives`)."""
    return _STORED[name](L, D, H)


def _fixed_cache(name: str, what: str) -> Callable[[int, int, int], TableMemory]:
    def stored(L: int, D: int, H: int) -> TableMemory:
        return TableMemory(name, 0, D, False, f"fixed, {what}; optional fp32 cache {L}x{D} = {L * D * 4 / MIB:.1f} MiB")
    return stored


def _rotary(name: str, what: str) -> Callable[[int, int, int], TableMemory]:
    def stored(L: int, D: int, H: int) -> TableMemory:
        return TableMemory(name, 0, D, False, f"fixed; {what}")
    return stored


# name -> (L, D, H) -> what the scheme stores: one entry per registered scheme (tests/analysis/test_memory_schemes.py
# checks the keys against the registry and the trained counts against each NumPy class's parameters).
_STORED: dict[str, Callable[[int, int, int], TableMemory]] = {
    "learned": lambda L, D, H: TableMemory("learned", L, D, True, f"trained; positions >= {L} refused"),
    "sinusoidal": _fixed_cache("sinusoidal", "any position"),
    "sincos2d": _fixed_cache("sincos2d", "the 2-D table of a patch grid of L patches"),
    "rope": _rotary("rope", "rotates q and k in attention"),
    "mrope": _rotary("mrope", "rotates q and k by (t, h, w) position ids (Qwen2-VL)"),
    "rope2d": _rotary("rope2d", "rotates q and k by (row, col) patch positions (Pixtral)"),
    "xpos": _rotary("xpos", "rotates and scales q and k in attention"),
    "alibi": lambda L, D, H: TableMemory("alibi", 0, H, False, f"fixed; {H} slopes (one per head)"),
    "t5": lambda L, D, H: TableMemory("t5", T5_NUM_BUCKETS, H, True,
                                      f"trained; {T5_NUM_BUCKETS} buckets x {H} heads"),
    "fire": lambda L, D, H: TableMemory("fire", 1, 2 * FIRE_WIDTH + 2 + (FIRE_WIDTH + 1) * H, True,
                                        f"trained; MLP 1->{FIRE_WIDTH}->{H} + c + threshold, any position"),
    "kerple": lambda L, D, H: TableMemory("kerple", 2, H, True, f"trained; r1, r2 per head ({H} heads), any position"),
    "none": lambda L, D, H: TableMemory("none", 0, D, False, "no positional signal (NoPE)"),
}


def position_alternatives(max_seq_len: int, d_model: int, num_heads: int) -> tuple[TableMemory, ...]:
    """What each registered positional scheme stores for context L and width D, in :data:`POSITIONAL_KINDS` order.

    learned: an (L, D) trainable table. sinusoidal, sincos2d: nothing trainable; a layer may cache an (L, D)
    fp32 buffer, listed with trainable=False. rope, mrope, rope2d, xpos, alibi, none: no table. t5: a
    (32 buckets, H) bias table. fire: its MLP (2W + 2 + (W + 1) H parameters, W = 32), one row. kerple: r1 and
    r2, (2, H).
    """
    L = check_positive_int("max_seq_len", max_seq_len)
    D = check_positive_int("d_model", d_model)
    H = check_positive_int("num_heads", num_heads)
    return tuple(_stored(name, L, D, H) for name in POSITIONAL_KINDS)


def embedding_memory(config: ModelConfig) -> MemoryReport:
    """The embedding tables of ``config``: token, trained position parameters (learned, t5, fire, kerple),
    token type, untied output projection.

    A learned scheme with ``max_seq_len=None`` has no sized position table: only the token table counts,
    and ``notes`` says so. When ``num_heads`` is None the headed alternatives assume H = D // 64 (noted).

    Raises:
        ConfigError: a t5, fire or kerple model without ``num_heads`` (its parameters depend on H), or a
            ``total_params`` smaller than the embedding tables themselves.
    """
    V, D, L = config.vocab_size, config.d_model, config.max_seq_len
    p = config.positional
    own = _stored(p, L or 1, D, config.heads)                 # what the model's own scheme stores
    if own.trainable and p != "learned" and config.num_heads is None:
        raise ConfigError(f"a {p} model needs num_heads: its trained parameters depend on H ({own.note}); "
                          f"got num_heads=None")
    notes = []
    if p == "learned" and L is None:
        notes.append("no learned position table counted: max_seq_len is unknown (give it to count L x D)")
    tables = [TableMemory("token embedding", V, D, True, "tied with the output projection" if config.tied_output
                          else "")]
    if own.trainable and (p != "learned" or L is not None):
        tables.append(replace(own, name=f"position ({p})"))
    if config.token_types:
        tables.append(TableMemory("token type", config.token_types, D, True, "segment embeddings"))
    if not config.tied_output:
        tables.append(TableMemory("output projection", V, D, True, "untied LM head (its own V x D table)"))
    alternatives = position_alternatives(L, D, config.heads) if L is not None else ()
    if alternatives and config.num_heads is None:
        notes.append(f"alibi / t5 / fire / kerple alternatives assume {config.heads} heads (d_model // 64); "
                     "give num_heads")
    report = MemoryReport(config, tuple(tables), alternatives, tuple(notes))
    if config.total_params is not None and config.total_params < report.params:
        raise ConfigError(f"total_params {config.total_params:,} is smaller than the embedding tables alone "
                          f"({report.params:,} parameters); expected the whole model's parameter count")
    return report


def custom_config(vocab_size: int, d_model: int, max_seq_len: int | None = None, *,
                  positional: str = "learned", num_heads: int | None = None, tied_output: bool = True,
                  total_params: int | None = None) -> ModelConfig:
    """A ModelConfig from user-given sizes (validated: ConfigError on bad values).

    Without ``max_seq_len`` a learned position table cannot be sized, so only the token table counts
    (the report's ``notes`` say so).
    """
    return ModelConfig("custom", vocab_size, d_model, max_seq_len, positional, num_heads,
                       tied_output=tied_output, total_params=total_params, title="custom")


def scenario_reports(include_presets: bool = True) -> list[MemoryReport]:
    """The example scenarios, then every preset: one MemoryReport each. With the presets, a scenario whose
    tables a preset already has (the same V, D, L and scheme: GPT-3 scale is gpt3-175b) is listed once, as
    the preset."""
    presets = list(PRESETS.values()) if include_presets else []
    known = {_sizes(c) for c in presets}
    return [embedding_memory(c) for c in [c for c in SEED_SCENARIOS if _sizes(c) not in known] + presets]


def _sizes(c: ModelConfig) -> tuple[Any, ...]:
    """What sizes a model's embedding tables (two configs with equal sizes have equal tables)."""
    return (c.vocab_size, c.d_model, c.max_seq_len, c.positional, c.token_types, c.tied_output)


def memory_grid(vocab_sizes: Any, d_models: Any, precision: str = "fp32") -> list[list[float]]:
    """Token-table MiB for every (d_model, vocab_size) pair: rows follow d_models, columns vocab_sizes."""
    b = PRECISIONS[check_choice("precision", precision, PRECISIONS)]
    return [[int(v) * int(d) * b / MIB for v in vocab_sizes] for d in d_models]


LARGE_SIZE = 1e12   # from here on a size is written in scientific notation (float digits stop meaning anything)


def format_size(x: float) -> str:
    """``147.2``; small non-zero sizes keep two significant digits (``0.0015``); zero is ``0``;
    sizes >= 1e12 in scientific notation (``9.537e+23``) rather than a row of meaningless float digits."""
    if x == 0:
        return "0"
    if abs(x) >= LARGE_SIZE:
        return f"{x:.3e}"
    return f"{x:,.1f}" if abs(x) >= 0.1 else f"{x:.2g}"


def format_share(share: float | None) -> str:
    """``31.02%``, or ``n/a`` when the model total is unknown."""
    if share is None:
        return "n/a"
    return f"{100 * share:.2f}%" if share >= 0.0001 else f"{100 * share:.2g}%"
