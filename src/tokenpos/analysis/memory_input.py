"""Memory of the input tables beyond the token table: per-layer embeddings and hashed n-gram tables (issue 51).

Pure arithmetic on integers (no table is allocated). Shapes: a table has R rows and C columns; T tokens per
training step.

- Per-layer embeddings (Gemma 3n; ``PerLayerEmbedding``): R = vocab_size_per_layer_input,
  C = num_hidden_layers * hidden_size_per_layer_input; one row looked up per token.
- Hashed n-gram tables (Engram; ``HashedNgramEmbedding``): one table per Engram layer, R = the sum of that layer's
  head primes (:func:`tokenpos.tables.formulas.ngram_hash.ngram_primes`), C = n_embed_per_ngram //
  n_head_per_ngram; K = (max_ngram_size - 1) * n_head_per_ngram rows looked up per token.

Storage (what the layers hold): ``fp32`` and ``bf16`` store C values of 4 or 2 bytes per row; ``int8`` and ``fp8``
store C 8-bit values and one float32 scale per row (``weight_dtype=int8`` / ``float8_e4m3fn`` of every table with
``dtype=float32``: ``weight`` (R, C) + ``weight_scale`` (R,); float8 in the torch backend only), inference only
(the quantised table is frozen).

Where the table lives (``storage=``): "device" puts all of it in the accelerator's memory; "host" keeps it in host
memory (:attr:`InputTable.nbytes` there) and the device holds only one step's gathered rows, T * lookups per token
rows of C output values (:meth:`InputTable.host_device_bytes`: fp32 outputs, 4 bytes a value, whatever the
table's storage: an 8-bit table's rows are dequantised before they are sent).

Training memory (activations excluded), as ``tokenpos memory`` counts it for every table:

- dense: fp32 weights + fp32 gradient + Adam's m and v = 16 bytes per parameter;
- row-sparse (the lazy optimisers: NumPy ``sparse_mode="lazy"`` / ``"sparse_adam"`` on either table's row-sparse
  gradient; torch ``PerLayerEmbedding(sparse=True)`` with ``SparseAdam``): fp32 weights + m + v stay dense (12
  bytes per parameter: the moments are allocated for the whole table at the first step), the gradient holds at
  most min(R, T * lookups per token) fp32 rows and their int64 row ids.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tokenpos.tables.checks.validation import check_choice, check_positive_int

# storage name -> (bytes per value, bytes per row besides the values: an 8-bit table's float32 scale)
STORAGES: dict[str, tuple[int, int]] = {"fp32": (4, 0), "bf16": (2, 0), "int8": (1, 4), "fp8": (1, 4)}
OUT_BYTES = 4                   # a gathered row's value as sent to the device (fp32 outputs)
DENSE_TRAIN_BYTES = 16          # fp32 weight + grad + Adam m + v, per parameter
SPARSE_STATE_BYTES = 12         # fp32 weight + Adam m + v, per parameter (the row-sparse gradient counted apart)
GRAD_ROW_ID_BYTES = 8           # one int64 row id per gradient row
DEFAULT_TOKENS = 8 * 2048       # tokens per step for the row-sparse gradient (tokenpos memory's default batch x L)


@dataclass(frozen=True)
class InputTable:
    """One input table: R x C and how many rows a token looks up."""

    model: str
    name: str
    rows: int
    cols: int
    lookups_per_token: int
    note: str = ""
    source: str = ""

    def __post_init__(self) -> None:
        check_positive_int("rows", self.rows)
        check_positive_int("cols", self.cols)
        check_positive_int("lookups_per_token", self.lookups_per_token)

    @property
    def params(self) -> int:
        return self.rows * self.cols

    def nbytes(self, storage: str = "fp32") -> int:
        """Bytes of the stored table (int8 / fp8: values + one float32 scale per row), wherever it is stored."""
        value, per_row = STORAGES[check_choice("storage", storage, STORAGES)]
        return self.params * value + self.rows * per_row

    def host_device_bytes(self, tokens: int = DEFAULT_TOKENS) -> int:
        """Device bytes of a host-stored table (``storage="host"``) in one step: the step's gathered rows,
        T * lookups per token rows of C fp32 values (the table itself stays in host memory, :meth:`nbytes`)."""
        return check_positive_int("tokens", tokens) * self.lookups_per_token * self.cols * OUT_BYTES

    @property
    def train_dense_bytes(self) -> int:
        """fp32 weights + dense gradient + Adam m, v."""
        return self.params * DENSE_TRAIN_BYTES

    def grad_rows(self, tokens: int = DEFAULT_TOKENS) -> int:
        """At most this many rows in one step's row-sparse gradient: min(R, T * lookups per token)."""
        return min(self.rows, check_positive_int("tokens", tokens) * self.lookups_per_token)

    def train_sparse_bytes(self, tokens: int = DEFAULT_TOKENS) -> int:
        """fp32 weights + Adam m, v (dense) + a row-sparse gradient of at most :meth:`grad_rows` rows and ids."""
        g = self.grad_rows(tokens)
        return self.params * SPARSE_STATE_BYTES + g * (self.cols * 4 + GRAD_ROW_ID_BYTES)

    def to_dict(self, tokens: int = DEFAULT_TOKENS) -> dict[str, Any]:
        return {"model": self.model, "name": self.name, "shape": [self.rows, self.cols], "params": self.params,
                "lookups_per_token": self.lookups_per_token, "note": self.note, "source": self.source,
                "bytes": {s: self.nbytes(s) for s in STORAGES},
                "storage": {"device": {"device_bytes": {s: self.nbytes(s) for s in STORAGES}, "host_bytes": 0},
                            "host": {"device_bytes": self.host_device_bytes(tokens),
                                     "host_bytes": {s: self.nbytes(s) for s in STORAGES}}},
                "train_dense_bytes": self.train_dense_bytes,
                "tokens_per_step": tokens, "grad_rows": self.grad_rows(tokens),
                "train_sparse_bytes": self.train_sparse_bytes(tokens)}


@dataclass(frozen=True)
class PerLayerConfig:
    """The per-layer embedding settings of one Gemma 3n model (HF ``Gemma3nTextConfig`` names)."""

    name: str
    vocab_size_per_layer_input: int
    num_hidden_layers: int
    hidden_size_per_layer_input: int
    source: str


# E4B: transformers' Gemma3nTextConfig defaults ("gemma3n_text-E4B style configuration", transformers 5.24:
# vocab_size_per_layer_input 262144, hidden_size_per_layer_input 256, num_hidden_layers 35).
# E2B: 30 layers, "Config for official E2B Model" in Google's MatFormer slicing table
# (https://huggingface.co/datasets/google/gemma3n-slicing-configs: E2B is the 30-layer slice of E4B, the same
# per-layer width and vocabulary).
GEMMA3N: dict[str, PerLayerConfig] = {
    c.name: c for c in (
        PerLayerConfig("gemma3n-e2b", 262_144, 30, 256, "google/gemma3n-slicing-configs (official E2B: 30 layers)"),
        PerLayerConfig("gemma3n-e4b", 262_144, 35, 256, "transformers Gemma3nTextConfig defaults (E4B)"),
    )
}


@dataclass(frozen=True)
class EngramSettings:
    """The reference's ``EngramConfig`` (deepseek-ai/Engram ``engram_demo_v1.py``)."""

    engram_vocab_size: tuple[int, ...] = (129280 * 5, 129280 * 5)
    max_ngram_size: int = 3
    n_embed_per_ngram: int = 512
    n_head_per_ngram: int = 8
    layer_ids: tuple[int, ...] = (1, 15)


ENGRAM_DEMO = EngramSettings()


def per_layer_table(cfg: PerLayerConfig) -> InputTable:
    """The per-layer table of ``cfg``: (vocab_size_per_layer_input, num_hidden_layers * hidden_size_per_layer_input),
    HF's ``embed_tokens_per_layer.weight``."""
    return InputTable(cfg.name, f"per-layer ({cfg.num_hidden_layers} x {cfg.hidden_size_per_layer_input})",
                      cfg.vocab_size_per_layer_input,
                      cfg.num_hidden_layers * cfg.hidden_size_per_layer_input, 1,
                      f"{cfg.num_hidden_layers} layers x {cfg.hidden_size_per_layer_input}", cfg.source)


def engram_tables(settings: EngramSettings = ENGRAM_DEMO, model: str = "engram-demo") -> list[InputTable]:
    """One hashed table per Engram layer: R = the sum of its head primes, C = n_embed_per_ngram // n_head_per_ngram."""
    from tokenpos.tables.formulas.ngram_hash import ngram_primes

    primes = ngram_primes(list(settings.engram_vocab_size), settings.max_ngram_size, settings.n_head_per_ngram,
                          list(settings.layer_ids))
    heads = (settings.max_ngram_size - 1) * settings.n_head_per_ngram
    dim = settings.n_embed_per_ngram // settings.n_head_per_ngram
    return [InputTable(model, f"hashed, layer {layer} ({heads} x {dim})", sum(sum(p) for p in per_n), dim, heads,
                       f"{heads} heads x {dim}; rows: sum of the head primes",
                       "deepseek-ai/Engram engram_demo_v1.py EngramConfig")
            for layer, per_n in primes.items()]


def input_tables() -> list[InputTable]:
    """Every preset row: Gemma 3n E2B and E4B per-layer tables, then the Engram demo's hashed tables."""
    return [per_layer_table(c) for c in GEMMA3N.values()] + engram_tables()
