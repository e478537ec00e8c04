"""``tokenpos memory``: embedding parameters and memory per precision, with Adam training state; with
``--tp N`` also the vocab-parallel split (padded vocab, per-rank shard, Adam state and logits per rank);
with ``--logits`` the logits of a (batch, seq_len) step and what the fused tied loss saves of them; with
``--input-tables`` the per-layer (Gemma 3n) and hashed n-gram (Engram) tables (:mod:`tokenpos.analysis.memory_input`).

Output may go to a pipe that closes early (``tokenpos memory | head -1``): the command then stops
quietly with exit status 141 (128 + SIGPIPE, as a Unix tool killed by SIGPIPE), no error message.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from typing import Any

from tokenpos.cli._table import print_grid
from tokenpos.cli._ui import console, positive_int

HELP = "embedding memory: parameters, fp32 / fp16 / bf16 / int8 sizes, Adam training memory"


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    from tokenpos.analysis.memory import POSITIONAL_KINDS, PRESETS

    p = subparsers.add_parser(
        "memory", help=HELP, description=HELP + ". With no arguments: example sizes from small to GPT-3 scale, "
                                                "every preset, and what each positional scheme stores.",
        epilog="MiB = 2**20 bytes, MB = 10**6 bytes. Training memory = fp32 weights + grads + Adam m and v "
               "(16 bytes per trainable parameter, activations excluded). "
               "Example: tokenpos memory --vocab-size 50257 --d-model 768 --max-seq-len 1024",
    )
    p.add_argument("--preset", choices=sorted(PRESETS), help="a known model (total parameter count known)")
    p.add_argument("--vocab-size", type=positive_int, metavar="V", help="rows of the token table")
    p.add_argument("--d-model", type=positive_int, metavar="D", help="embedding width")
    p.add_argument("--max-seq-len", type=positive_int, metavar="L",
                   help="context length: rows of a learned position table (overrides a preset's)")
    p.add_argument("--positional", choices=POSITIONAL_KINDS, default=None, metavar="SCHEME",
                   help="positional scheme of a custom model, one of " + ", ".join(POSITIONAL_KINDS) + " (default: "
                        "learned, its table counted when --max-seq-len is given; an explicit --positional learned "
                        "needs it)")
    p.add_argument("--num-heads", type=positive_int, metavar="H",
                   help="heads (sizes the t5, fire and kerple parameters; those schemes need it)")
    p.add_argument("--untied", action="store_true", help="the output projection has its own V x D table")
    p.add_argument("--total-params", type=positive_int, metavar="N",
                   help="the whole model's parameters, to show the embedding share")
    p.add_argument("--tp", type=positive_int, metavar="N",
                   help="tensor-parallel ranks: show the vocab-parallel split (every preset, or the chosen model)")
    p.add_argument("--pad-to-multiple-of", type=positive_int, metavar="M",
                   help="with --tp: pad the vocab to a multiple of M x N (Megatron: 128; default 1)")
    p.add_argument("--logits", action="store_true",
                   help="the logits at --batch x --seq-len (materialised with their gradient) and what the fused "
                        "tied loss (tied_cross_entropy, TokenEmbedding.loss) saves: every preset, or the chosen model")
    p.add_argument("--logits-dtype", choices=("fp32", "bf16"), default=None,
                   help="with --logits: the dtype of the materialised logits (default fp32)")
    p.add_argument("--batch", type=positive_int, metavar="B",
                   help="with --tp or --logits: batch for the logits (default 8)")
    p.add_argument("--seq-len", type=positive_int, metavar="L",
                   help="with --tp or --logits: tokens per sequence for the logits (default: max_seq_len, else 2048)")
    p.add_argument("--input-tables", action="store_true",
                   help="the input tables beyond the token table: Gemma 3n E2B / E4B per-layer embeddings and the "
                        "Engram demo's hashed n-gram tables, stored fp32 / bf16 / int8 (+ fp32 row scales), and "
                        "training memory dense (fp32 weights + grads + Adam) and row-sparse (lazy optimisers: "
                        "dense weights + Adam, gradient of the --batch x --seq-len step's rows only)")
    p.add_argument("--json", action="store_true", help="print machine-readable JSON instead of tables")
    return p




def _configs(args: argparse.Namespace) -> list[Any] | None:
    """The requested config(s), or None for the scenario overview."""
    from tokenpos.analysis.memory import custom_config, get_preset

    custom = args.vocab_size is not None or args.d_model is not None
    if args.preset and custom:
        raise ValueError("give either --preset or --vocab-size/--d-model, not both")
    if args.preset:
        if args.positional or args.num_heads or args.untied or args.total_params:
            raise ValueError("--positional/--num-heads/--untied/--total-params apply to custom sizes, not --preset")
        cfg = get_preset(args.preset)
        return [replace(cfg, max_seq_len=args.max_seq_len) if args.max_seq_len else cfg]
    if custom:
        if args.vocab_size is None or args.d_model is None:
            raise ValueError("--vocab-size and --d-model go together; got only one of them")
        if args.positional == "learned" and args.max_seq_len is None:
            raise ValueError("--positional learned needs --max-seq-len L: the position table has L x d_model "
                             "parameters")
        return [custom_config(args.vocab_size, args.d_model, args.max_seq_len,
                              positional=args.positional or "learned", num_heads=args.num_heads,
                              tied_output=not args.untied, total_params=args.total_params)]
    if args.max_seq_len or args.positional or args.num_heads or args.untied or args.total_params:
        raise ValueError("these options need --preset NAME or --vocab-size V --d-model D")
    return None


def _parallel(args: argparse.Namespace, configs: list[Any] | None) -> list[Any]:
    """The vocab-parallel splits asked for with --tp (every preset when no model was chosen)."""
    from tokenpos.analysis.memory import PRESETS
    from tokenpos.analysis.memory_tp import DEFAULT_BATCH, vocab_parallel_memory

    if args.tp is None:
        sizes = () if args.logits or args.input_tables else (("--batch", args.batch), ("--seq-len", args.seq_len))
        given = [o for o, v in (("--pad-to-multiple-of", args.pad_to_multiple_of), *sizes) if v is not None]
        if given:
            raise ValueError(f"{'/'.join(given)} only apply with --tp N (the vocab-parallel split)"
                             + ("" if args.logits or args.input_tables
                                else " or, for --batch/--seq-len, with --logits or --input-tables"))
        return []
    return [vocab_parallel_memory(c, args.tp, args.pad_to_multiple_of or 1, batch=args.batch or DEFAULT_BATCH,
                                  seq_len=args.seq_len) for c in (configs or list(PRESETS.values()))]


def _logits(args: argparse.Namespace, configs: list[Any] | None) -> list[Any]:
    """The logits reports asked for with --logits (every preset when no model was chosen)."""
    from tokenpos.analysis.memory import PRESETS
    from tokenpos.analysis.memory_logits import logits_memory
    from tokenpos.analysis.memory_tp import DEFAULT_BATCH

    if not args.logits:
        if args.logits_dtype is not None:
            raise ValueError("--logits-dtype only applies with --logits")
        return []
    return [logits_memory(c, batch=args.batch or DEFAULT_BATCH, seq_len=args.seq_len,
                          dtype=args.logits_dtype or "fp32") for c in (configs or list(PRESETS.values()))]


def _input_tables(args: argparse.Namespace) -> tuple[list[Any], int] | None:
    """The input tables asked for with --input-tables and the tokens of one training step (--batch x --seq-len)."""
    from tokenpos.analysis.memory_input import input_tables
    from tokenpos.analysis.memory_tp import DEFAULT_BATCH

    if not args.input_tables:
        return None
    return input_tables(), (args.batch or DEFAULT_BATCH) * (args.seq_len or DEFAULT_SEQ_LEN)


DEFAULT_SEQ_LEN = 2048          # --input-tables without --seq-len: tokens per sequence of the training step


def run(args: argparse.Namespace) -> int:
    """Print the report (a reader that closes the pipe early is handled by ``tokenpos.cli.main``)."""
    return _run(args)


def _broken_pipe() -> None:
    raise BrokenPipeError(32, "Broken pipe")


def _run(args: argparse.Namespace) -> int:
    from tokenpos.analysis.memory import embedding_memory, position_alternatives, scenario_reports

    configs = _configs(args)
    parallel = _parallel(args, configs)
    logits = _logits(args, configs)
    inputs = _input_tables(args)
    reports = [embedding_memory(c) for c in configs] if configs else scenario_reports()
    if args.json:
        out: dict[str, Any] = {"models": [r.to_dict() for r in reports]}
        if configs is None:
            out["position_alternatives"] = [t.to_dict() for t in position_alternatives(*OVERVIEW_POSITIONS)]
        if parallel:
            out["vocab_parallel"] = [m.to_dict() for m in parallel]
        if logits:
            out["logits"] = [m.to_dict() for m in logits]
        if inputs:
            out["input_tables"] = [t.to_dict(inputs[1]) for t in inputs[0]]
        print(json.dumps(out, indent=2))
        sys.stdout.flush()
        return 0
    con = console()
    con.on_broken_pipe = _broken_pipe          # rich would exit(1) itself; main() ends it quietly
    if configs is None and not parallel and not logits and not inputs:
        _print_overview(con, reports)
    elif configs is not None:
        for r in reports:
            _print_model(con, r)
    if parallel:
        _print_vocab_parallel(con, parallel)
    if logits:
        _print_logits(con, logits)
    if inputs:
        _print_input_tables(con, *inputs)
    con.print("MiB = 2**20 bytes, MB = 10**6 bytes; fp16 and bf16 are both 2 bytes per parameter. "
              "Training = fp32 weights + grads + Adam m, v = 16 B/param (activations excluded).", markup=False)
    con.file.flush()
    return 0


# ---------------------------------------------------------------------------------------------- output


def _table(title: str, headers: list[str], text: tuple[int, ...] = (0,)) -> Any:
    """A Grid (printed by :func:`tokenpos.cli._table.print_grid`: never a number broken); ``text``: the columns of
    words (the first, and notes), the others numbers."""
    from tokenpos.cli._table import Grid

    return Grid(title, headers, frozenset(i % len(headers) for i in text))


def _size_cells(t: Any) -> list[str]:
    from tokenpos.analysis.memory import PRECISIONS, format_size

    cells = []
    for p in PRECISIONS:
        cells += [format_size(t.mib(p)), format_size(t.mb(p))]
    return cells


SIZE_HEADERS = ["fp32 MiB", "fp32 MB", "fp16/bf16 MiB", "fp16/bf16 MB", "int8 MiB", "int8 MB"]
# (max_seq_len, d_model, num_heads) of the overview's positional comparison
OVERVIEW_POSITIONS = (2048, 512, 8)


def _print_model(con: Any, r: Any) -> None:
    from tokenpos.analysis.memory import MB, MIB, TableMemory, format_share, format_size

    c = r.config
    pos = f"{c.positional} positions" + (f", max_seq_len {c.max_seq_len:,}" if c.max_seq_len else "")
    con.print(f"{c.title or c.name}: vocab_size {c.vocab_size:,}, d_model {c.d_model:,}, {pos}, output projection "
              f"{'tied to the token table' if c.tied_output else 'untied'}", style="bold", markup=False)
    if c.total_params:
        con.print(f"model total: {c.total_params:,} parameters{'' if c.total_exact else ' (approximate)'}"
                  + (f"; {c.note}" if c.note else ""), markup=False)
    for note in r.notes:
        con.print(f"note: {note}", markup=False)
    t = _table("Embedding tables", ["table", "shape", "params", "share of model", "note"], text=(0, -1))
    for tab in r.tables:
        t.add_row(tab.name, f"{tab.rows:,} x {tab.cols:,}", f"{tab.params:,}", format_share(r.share(tab.params)),
                  tab.note)
    t.add_row("embedding total", "", f"{r.params:,}", format_share(r.share()), "", style="bold")
    print_grid(con, t)
    t = _table("Memory", ["table", *SIZE_HEADERS, "train+Adam MiB", "train+Adam MB"])
    for tab in r.tables:
        t.add_row(tab.name, *_size_cells(tab), format_size(tab.train_bytes / MIB), format_size(tab.train_bytes / MB))
    total = TableMemory("total", r.params, 1)
    t.add_row("embedding total", *_size_cells(total), format_size(r.train_bytes / MIB),
              format_size(r.train_bytes / MB), style="bold")
    print_grid(con, t)
    if r.alternatives:
        _print_alternatives(con, r.alternatives, f"Position table alternatives at max_seq_len {c.max_seq_len:,}, "
                                                 f"d_model {c.d_model:,}")


def _print_alternatives(con: Any, alternatives: Any, title: str) -> None:
    from tokenpos.analysis.memory import MIB, format_size

    t = _table(title, ["scheme", "params", "fp32 MiB", "fp32 MB", "fp16/bf16 MiB", "int8 MiB",
                       "train+Adam MiB", "note"], text=(0, -1))
    for a in alternatives:
        sizes = _size_cells(a)
        t.add_row(a.name, f"{a.params:,}", sizes[0], sizes[1], sizes[2], sizes[4],
                  format_size(a.train_bytes / MIB), a.note)
    print_grid(con, t)


def _print_overview(con: Any, reports: list[Any]) -> None:
    from tokenpos.analysis.memory import MIB, format_share, format_size, position_alternatives

    t = _table("Token embedding table (V x D): example sizes and model presets",
               ["model", "vocab_size", "d_model", "params", *SIZE_HEADERS])
    for r in reports:
        tok = r.tables[0]
        t.add_row(r.config.title or r.config.name, f"{r.config.vocab_size:,}", f"{r.config.d_model:,}",
                  f"{tok.params:,}", *_size_cells(tok))
    print_grid(con, t)
    t = _table("All embedding tables (token + position + token type + untied output)",
               ["model", "positions", "output", "params", "fp32 MiB", "fp16/bf16 MiB", "train+Adam MiB",
                "model total", "share of model"], text=(0, 1, 2, 7))
    for r in reports:
        c = r.config
        pos = f"{c.positional} ({c.max_seq_len:,})" if c.max_seq_len else c.positional
        total = "" if c.total_params is None else f"{c.total_params:,}" + ("" if c.total_exact else " (approx.)")
        t.add_row(c.title or c.name, pos, "tied" if c.tied_output else "untied", f"{r.params:,}",
                  format_size(r.nbytes("fp32") / MIB), format_size(r.nbytes("fp16/bf16") / MIB),
                  format_size(r.train_bytes / MIB), total, format_share(r.share()))
    print_grid(con, t)
    L, D, H = OVERVIEW_POSITIONS
    _print_alternatives(con, position_alternatives(L, D, H),
                        f"Positional encoding memory of every scheme (max_seq_len {L:,}, d_model {D}, {H} heads)")


def _print_vocab_parallel(con: Any, splits: list[Any]) -> None:
    from tokenpos.analysis.memory import MIB, format_size

    first = splits[0]
    tp, m = first.tp, first.pad_to_multiple_of
    for v in splits:
        c = v.config
        con.print(f"{c.title or c.name}: vocab {c.vocab_size:,} padded to {v.padded_vocab:,} (a multiple of {m} x tp "
                  f"{tp} = {m * tp:,}): {v.padding_rows:,} padding rows = {100 * v.padding_share:.2f}% of the "
                  f"vocab, {v.padding_params:,} wasted parameters ({format_size(v.padding_params * 4 / MIB)} MiB "
                  f"fp32); {v.shard_rows:,} rows per rank", markup=False)
    t = _table(f"Vocab parallel over tp {tp}, per rank (logits: batch {first.batch} x seq_len x rows per rank)",
               ["model", "vocab", "padded", "padding rows", "rows/rank", "output", "weights/rank fp32 MiB",
                "Adam MiB tied", "Adam MiB untied", "seq_len", "logits/rank fp32 MiB", "bf16 MiB",
                "one device fp32 MiB"], text=(0, 5))
    for v in splits:
        c = v.config
        t.add_row(c.title or c.name, f"{c.vocab_size:,}", f"{v.padded_vocab:,}", f"{v.padding_rows:,}",
                  f"{v.shard_rows:,}", "tied" if c.tied_output else "untied", format_size(v.shard_params * 4 / MIB),
                  format_size(v.adam_bytes_if(True) / MIB), format_size(v.adam_bytes_if(False) / MIB),
                  f"{v.seq_len:,}", format_size(v.logits_bytes("fp32") / MIB),
                  format_size(v.logits_bytes("bf16") / MIB), format_size(v.logits_one_device * 4 / MIB))
    print_grid(con, t)
    con.print("Padding rows are stored, trained and optimised like real ones. weights/rank counts the model's "
              "vocab-sized tables (an untied output projection is a second sharded table); train+Adam = fp32 "
              "weights + grads + m + v of one table (tied) or two (untied). Logits per rank are the same tied or "
              "untied; the cross-entropy keeps an fp32 softmax of that size for backward.", markup=False)


def _print_logits(con: Any, reports: list[Any]) -> None:
    from tokenpos.analysis.memory import MIB, format_size

    first = reports[0]
    t = _table(f"Logits and the fused tied loss ({first.dtype} logits; fused blocks in fp32)",
               ["model", "vocab", "batch", "seq_len", "tokens", "logits MiB", "logits + grad MiB", "block tokens",
                "fused MiB", "saved MiB", "saved share"])
    for r in reports:
        c = r.config
        t.add_row(c.title or c.name, f"{c.vocab_size:,}", f"{r.batch:,}", f"{r.seq_len:,}", f"{r.tokens:,}",
                  format_size(r.logits_bytes / MIB), format_size(r.materialised_bytes / MIB), f"{r.chunk_tokens:,}",
                  format_size(r.fused_bytes / MIB), format_size(r.saved_bytes / MIB),
                  f"{100 * r.saved_bytes / r.materialised_bytes:.2f}%")
    print_grid(con, t)
    con.print("logits + grad = the materialised path's N x V logits and their gradient (F.cross_entropy also keeps "
              "a log-softmax of that size); fused = one block of logits (block tokens x V, fp32) and the (N,) "
              "log-sum-exp of tied_cross_entropy / TokenEmbedding.loss, which never hold the logits.", markup=False)


def _print_input_tables(con: Any, tables: list[Any], tokens: int) -> None:
    from tokenpos.analysis.memory import MIB, format_size

    def mib(n: int | None) -> str:
        return "-" if n is None else format_size(n / MIB)

    t = _table(f"Input tables beyond the token table (training step: {tokens:,} tokens)",
               ["model", "table", "shape", "params", "fp32 MiB", "bf16 MiB", "int8 MiB", "fp8 MiB",
                "host: device MiB/step", "train dense MiB", "grad rows/step", "train row-sparse MiB"], text=(0, 1, 2))
    for tab in tables:
        t.add_row(tab.model, tab.name, f"{tab.rows:,} x {tab.cols:,}", f"{tab.params:,}", mib(tab.nbytes("fp32")),
                  mib(tab.nbytes("bf16")), mib(tab.nbytes("int8")), mib(tab.nbytes("fp8")),
                  mib(tab.host_device_bytes(tokens)), mib(tab.train_dense_bytes),
                  f"{tab.grad_rows(tokens):,}", mib(tab.train_sparse_bytes(tokens)))
    print_grid(con, t)
    con.print("int8 / fp8 = 8-bit values + one fp32 scale per row (weight_dtype=int8 / float8_e4m3fn of every "
              "table, fp8 in torch only; inference only: the table is frozen). The fp32 / bf16 / int8 / fp8 sizes "
              "are device memory with storage='device' and host memory with storage='host'; host: device "
              "MiB/step = what a host-stored table costs the device, one step's gathered rows (tokens x lookups "
              "per token x width, fp32). train dense = fp32 weights + "
              "grads + Adam m, v (16 B/param). train row-sparse (lazy optimisers: NumPy sparse_mode lazy / "
              "sparse_adam on either table, torch PerLayerEmbedding sparse=True + SparseAdam) = fp32 weights + "
              "Adam m, v for the whole table (12 B/param, allocated at the first step) + a gradient of at most "
              "min(rows, tokens x lookups per token) fp32 rows and int64 ids (per-layer: 1 lookup per token; "
              "hashed: one per head). Table names: (layers x width per layer) and (hash heads x width per head); "
              "hashed rows = the sum of the heads' primes. Sources: Gemma 3n E4B = transformers' Gemma3nTextConfig "
              "defaults, E2B = its 30-layer slice (google/gemma3n-slicing-configs); Engram = deepseek-ai/Engram "
              "engram_demo_v1.py's EngramConfig.", markup=False)
