"""``tokenpos memory``: embedding parameters and memory per precision, with Adam training state; with
``--tp N`` also the vocab-parallel split (padded vocab, per-rank shard, Adam state and logits per rank);
with ``--logits`` the logits of a (batch, seq_len) step and what the fused tied loss saves of them.

Output may go to a pipe that closes early (``tokenpos memory | head -1``): the command then stops
quietly with exit status 141 (128 + SIGPIPE, as a Unix tool killed by SIGPIPE), no error message.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from typing import Any

from tokenpos.cli._ui import console, positive_int

HELP = "embedding memory: parameters, fp32 / fp16 / bf16 / int8 sizes, Adam training memory"


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    from tokenpos.analysis.memory import POSITIONAL_KINDS, PRESETS

    p = subparsers.add_parser(
        "memory", help=HELP, description=HELP + ". With no arguments: seed 004's scenarios and every preset.",
        epilog="MiB = 2**20 bytes, MB = 10**6 bytes. Training memory = fp32 weights + grads + Adam m and v "
               "(16 bytes per trainable parameter, activations excluded). "
               "Example: tokenpos memory --vocab-size 50257 --d-model 768 --max-seq-len 1024",
    )
    p.add_argument("--preset", choices=sorted(PRESETS), help="a known model (total parameter count known)")
    p.add_argument("--vocab-size", type=positive_int, metavar="V", help="rows of the token table")
    p.add_argument("--d-model", type=positive_int, metavar="D", help="embedding width")
    p.add_argument("--max-seq-len", type=positive_int, metavar="L",
                   help="context length: rows of a learned position table (overrides a preset's)")
    p.add_argument("--positional", choices=POSITIONAL_KINDS, default=None,
                   help="positional scheme of a custom model (default: learned, its table counted when "
                        "--max-seq-len is given; an explicit --positional learned needs it)")
    p.add_argument("--num-heads", type=positive_int, metavar="H", help="heads (sizes the T5 bias table)")
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
        sizes = () if args.logits else (("--batch", args.batch), ("--seq-len", args.seq_len))
        given = [o for o, v in (("--pad-to-multiple-of", args.pad_to_multiple_of), *sizes) if v is not None]
        if given:
            raise ValueError(f"{'/'.join(given)} only apply with --tp N (the vocab-parallel split)"
                             + ("" if args.logits else " or, for --batch/--seq-len, with --logits"))
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
    reports = [embedding_memory(c) for c in configs] if configs else scenario_reports()
    if args.json:
        out: dict[str, Any] = {"models": [r.to_dict() for r in reports]}
        if configs is None:
            out["seed_position_comparison"] = [t.to_dict() for t in position_alternatives(2048, 512, 8)]
        if parallel:
            out["vocab_parallel"] = [m.to_dict() for m in parallel]
        if logits:
            out["logits"] = [m.to_dict() for m in logits]
        print(json.dumps(out, indent=2))
        sys.stdout.flush()
        return 0
    con = console()
    con.on_broken_pipe = _broken_pipe          # rich would exit(1) itself; main() ends it quietly
    if configs is None and not parallel and not logits:
        _print_overview(con, reports)
    elif configs is not None:
        for r in reports:
            _print_model(con, r)
    if parallel:
        _print_vocab_parallel(con, parallel)
    if logits:
        _print_logits(con, logits)
    con.print("MiB = 2**20 bytes, MB = 10**6 bytes; fp16 and bf16 are both 2 bytes per parameter. "
              "Training = fp32 weights + grads + Adam m, v = 16 B/param (activations excluded).", markup=False)
    con.file.flush()
    return 0


# ---------------------------------------------------------------------------------------------- output


def _table(title: str, headers: list[str]) -> Any:
    from rich import box
    from rich.table import Table

    t = Table(title=title, box=box.SIMPLE_HEAD, title_justify="left", title_style="bold")
    for i, h in enumerate(headers):
        t.add_column(h, justify="left" if i == 0 else "right", overflow="fold")
    return t


def _size_cells(t: Any) -> list[str]:
    from tokenpos.analysis.memory import PRECISIONS, format_size

    cells = []
    for p in PRECISIONS:
        cells += [format_size(t.mib(p)), format_size(t.mb(p))]
    return cells


SIZE_HEADERS = ["fp32 MiB", "fp32 MB", "fp16/bf16 MiB", "fp16/bf16 MB", "int8 MiB", "int8 MB"]


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
    t = _table("Embedding tables", ["table", "shape", "params", "share of model", "note"])
    for tab in r.tables:
        t.add_row(tab.name, f"{tab.rows:,} x {tab.cols:,}", f"{tab.params:,}", format_share(r.share(tab.params)),
                  tab.note)
    t.add_row("embedding total", "", f"{r.params:,}", format_share(r.share()), "", style="bold")
    t.columns[-1].justify = "left"
    con.print(t)
    t = _table("Memory", ["table", *SIZE_HEADERS, "train+Adam MiB", "train+Adam MB"])
    for tab in r.tables:
        t.add_row(tab.name, *_size_cells(tab), format_size(tab.train_bytes / MIB), format_size(tab.train_bytes / MB))
    total = TableMemory("total", r.params, 1)
    t.add_row("embedding total", *_size_cells(total), format_size(r.train_bytes / MIB),
              format_size(r.train_bytes / MB), style="bold")
    con.print(t)
    if r.alternatives:
        _print_alternatives(con, r.alternatives, f"Position table alternatives at max_seq_len {c.max_seq_len:,}, "
                                                 f"d_model {c.d_model:,}")


def _print_alternatives(con: Any, alternatives: Any, title: str) -> None:
    from tokenpos.analysis.memory import MIB, format_size

    t = _table(title, ["scheme", "params", "fp32 MiB", "fp32 MB", "fp16/bf16 MiB", "int8 MiB",
                       "train+Adam MiB", "note"])
    for a in alternatives:
        sizes = _size_cells(a)
        t.add_row(a.name, f"{a.params:,}", sizes[0], sizes[1], sizes[2], sizes[4],
                  format_size(a.train_bytes / MIB), a.note)
    t.columns[-1].justify = "left"
    con.print(t)


def _print_overview(con: Any, reports: list[Any]) -> None:
    from tokenpos.analysis.memory import MIB, format_share, format_size, position_alternatives

    t = _table("Token embedding table (V x D), seed 004 scenarios and presets",
               ["model", "vocab_size", "d_model", "params", *SIZE_HEADERS])
    for r in reports:
        tok = r.tables[0]
        t.add_row(r.config.title or r.config.name, f"{r.config.vocab_size:,}", f"{r.config.d_model:,}",
                  f"{tok.params:,}", *_size_cells(tok))
    con.print(t)
    t = _table("All embedding tables (token + position + token type + untied output)",
               ["model", "positions", "output", "params", "fp32 MiB", "fp16/bf16 MiB", "train+Adam MiB",
                "model total", "share of model"])
    for r in reports:
        c = r.config
        pos = f"{c.positional} ({c.max_seq_len:,})" if c.max_seq_len else c.positional
        total = "" if c.total_params is None else f"{c.total_params:,}" + ("" if c.total_exact else " (approx.)")
        t.add_row(c.title or c.name, pos, "tied" if c.tied_output else "untied", f"{r.params:,}",
                  format_size(r.nbytes("fp32") / MIB), format_size(r.nbytes("fp16/bf16") / MIB),
                  format_size(r.train_bytes / MIB), total, format_share(r.share()))
    con.print(t)
    _print_alternatives(con, position_alternatives(2048, 512, 8),
                        "Positional encoding memory (seed 004: d_model 512, max_seq_len 2048)")


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
                "one device fp32 MiB"])
    for v in splits:
        c = v.config
        t.add_row(c.title or c.name, f"{c.vocab_size:,}", f"{v.padded_vocab:,}", f"{v.padding_rows:,}",
                  f"{v.shard_rows:,}", "tied" if c.tied_output else "untied", format_size(v.shard_params * 4 / MIB),
                  format_size(v.adam_bytes_if(True) / MIB), format_size(v.adam_bytes_if(False) / MIB),
                  f"{v.seq_len:,}", format_size(v.logits_bytes("fp32") / MIB),
                  format_size(v.logits_bytes("bf16") / MIB), format_size(v.logits_one_device * 4 / MIB))
    con.print(t)
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
    con.print(t)
    con.print("logits + grad = the materialised path's N x V logits and their gradient (F.cross_entropy also keeps "
              "a log-softmax of that size); fused = one block of logits (block tokens x V, fp32) and the (N,) "
              "log-sum-exp of tied_cross_entropy / TokenEmbedding.loss, which never hold the logits.", markup=False)
