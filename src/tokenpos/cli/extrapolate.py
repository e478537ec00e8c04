"""``tokenpos extrapolate``: train short, test long (Press et al., ICLR 2022) on a laptop CPU."""

from __future__ import annotations

import argparse
from typing import Any

from tokenpos.cli._ui import check_size, console, positive_int

HELP = "train short, test long: train a tiny LM per positional scheme at L, evaluate at 2L, 4L, 8L"


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    from tokenpos.analysis.extrapolate.experiment import ROPE_SCALINGS, SCHEMES
    from tokenpos.analysis.extrapolate.schemes import DEFAULT_SCHEMES

    p = subparsers.add_parser(
        "extrapolate", help=HELP, description=HELP + ". One tiny causal character LM (pre-LN, tied output) is "
        "trained per scheme with identical settings; RoPE is also evaluated with inference-time scaling "
        "(linear, dynamic NTK, YaRN at factor k) without retraining.",
        epilog="R(k) = NLL at kL / NLL at L of the same scored target tokens (sliding window, primary; or the "
               "last L/2 positions of windows right-aligned on the same ends). Add-k 2- to 4-gram baselines "
               "are scored on the same tokens; a scheme that does not beat the 4-gram at L is reported as "
               "'does not use context'. Default corpus: the standard library's pydoc_data.topics (90% train, "
               "10% eval). Example: tokenpos extrapolate --seed 0 --json out.json --plot out.png; the full "
               "study: tokenpos extrapolate --config docs/study.toml --checkpoint-dir ckpt --json out.json",
    )
    p.add_argument("--config", metavar="TOML", help="every setting of a study from a TOML file (see "
                   "docs/study.toml); flags given as well override it")
    p.add_argument("--checkpoint-dir", metavar="DIR", help="checkpoint every scheme and seed here; rerunning the "
                   "same command continues an interrupted run")
    p.add_argument("--seed", type=int, help="seed for init and data order (default 0)")
    p.add_argument("--seeds", metavar="S,S", help="several seeds (e.g. 0,1,2): mean and 95%% t-interval per number")
    p.add_argument("--eval", choices=("nonoverlap", "sliding", "both"), default=None,
                   help="evaluation protocol: the ALiBi paper's sliding window (default, primary), tails of "
                        "non-overlapping windows right-aligned on the same targets, or both")
    p.add_argument("--sliding-stride", type=positive_int, metavar="S", help="sliding-window stride (default L/4)")
    p.add_argument("--sliding-tokens", type=positive_int, metavar="N",
                   help="scored tokens per length in the sliding protocol (default 2048)")
    p.add_argument("--tasks", metavar="A,B", help="also run the synthetic task(s): copy, reverse, sort, passkey")
    p.add_argument("--task-steps", type=positive_int, metavar="N",
                   help="most training steps per task model (default 500; --full: the study's)")
    p.add_argument("--full", action="store_true",
                   help="the full study: all schemes, seeds 0-4, both protocols, 4 layers, the copy and passkey "
                        "tasks (hours on 2 cores; see docs/EXTRAPOLATION.md)")
    p.add_argument("--json", metavar="PATH", help="write {train_len, results: [...]} here")
    p.add_argument("--plot", metavar="FILE", help="write the figure here (.png, .svg, .pdf)")
    p.add_argument("--quick", action="store_true",
                   help="150 steps instead of 1000 and a smaller eval set, the same schemes (117 s measured on 2 "
                        "idle cores); too short for the models to use their context: it shows that the pipeline "
                        "runs, not which scheme extrapolates")
    p.add_argument("--corpus", metavar="PATH", help="a UTF-8 text file instead of pydoc_data.topics")
    p.add_argument("--train-len", type=positive_int, metavar="L", help="training length (default 64)")
    p.add_argument("--multiples", metavar="K,K", help="eval lengths as multiples of L (default 1,2,4,8)")
    p.add_argument("--schemes", metavar="A,B",
                   help=f"subset of {','.join(SCHEMES)} (default: {','.join(DEFAULT_SCHEMES)}; --full: all)")
    p.add_argument("--rope-scalings", metavar="A,B",
                   help=f"subset of {','.join(ROPE_SCALINGS)}, or 'none' (default: all)")
    p.add_argument("--steps", type=positive_int, metavar="N", help="training steps per scheme")
    p.add_argument("--batch-size", type=positive_int, metavar="B", help="windows per step (default 32)")
    p.add_argument("--lr", type=float, metavar="LR", help="peak AdamW learning rate (default 4e-3)")
    p.add_argument("--d-model", type=positive_int, metavar="D", help="model width (default 128)")
    p.add_argument("--num-layers", type=positive_int, metavar="N", help="transformer blocks (default 2)")
    p.add_argument("--num-heads", type=positive_int, metavar="H", help="attention heads (default 4)")
    p.add_argument("--eval-tokens", type=positive_int, metavar="N",
                   help="cap on predicted tokens per eval length (default: the whole eval split)")
    p.add_argument("--threads", type=positive_int, metavar="N",
                   help="threads of torch and of the compiled kernels (default 2)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars on stderr")
    return p


def _names(text: str | None, flag: str) -> tuple[str, ...] | None:
    if text is None:
        return None
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    if not names:
        raise ValueError(f"{flag} needs at least one name, got {text!r}")
    return names


def build_config(args: argparse.Namespace) -> Any:
    """The ExtrapolationConfig for parsed arguments (``--quick`` first, explicit flags override)."""
    from dataclasses import replace

    from tokenpos.analysis.extrapolate.experiment import ExtrapolationConfig
    from tokenpos.analysis.extrapolate.study_file import load_study
    from tokenpos.analysis.extrapolate.tasks import TaskConfig

    if args.config is not None:
        base = load_study(args.config)
    elif args.full:
        base = ExtrapolationConfig.full()
    else:
        base = ExtrapolationConfig.quick() if args.quick else ExtrapolationConfig()
    overrides: dict[str, Any] = {}
    if args.seed is not None:
        overrides["seed"] = args.seed
    if args.checkpoint_dir is not None:
        overrides["checkpoint_dir"] = args.checkpoint_dir
    if args.seeds is not None:
        try:
            overrides["seeds"] = tuple(int(s) for s in _names(args.seeds, "--seeds") or ())
        except ValueError:
            raise ValueError(f"--seeds expects integers like 0,1,2; got {args.seeds!r}") from None
    if args.eval is not None:
        overrides["protocols"] = ("nonoverlap", "sliding") if args.eval == "both" else (args.eval,)
    if args.sliding_stride is not None:
        overrides["sliding_stride"] = args.sliding_stride
    if args.sliding_tokens is not None:
        overrides["sliding_tokens"] = args.sliding_tokens
    task = base.task
    if args.tasks is not None:                   # keep the study's task settings (--full: its steps), only the names
        task = replace(base.task or TaskConfig(), tasks=_names(args.tasks, "--tasks") or ())
    if args.task_steps is not None and task is not None:
        task = replace(task, steps=args.task_steps)
    overrides["task"] = task
    for flag, key in (("corpus", "corpus"), ("train_len", "train_len"), ("steps", "steps"),
                      ("batch_size", "batch_size"), ("lr", "lr"), ("d_model", "d_model"),
                      ("num_layers", "num_layers"), ("num_heads", "num_heads"), ("eval_tokens", "eval_tokens"),
                      ("threads", "threads")):
        if getattr(args, flag) is not None:
            overrides[key] = getattr(args, flag)
    if args.schemes is not None:
        overrides["schemes"] = _names(args.schemes, "--schemes")
    if args.rope_scalings is not None:
        names = _names(args.rope_scalings, "--rope-scalings")
        overrides["rope_scalings"] = () if names == ("none",) else names
    if args.multiples is not None:
        try:
            multiples = tuple(sorted({int(k) for k in _names(args.multiples, "--multiples") or ()}))
        except ValueError:
            raise ValueError(f"--multiples expects integers like 1,2,4,8; got {args.multiples!r}") from None
        overrides["multiples"] = tuple(check_size("extrapolate", "multiples", k) for k in multiples)
    return replace(base, **overrides).validate()


class _Bars:
    """rich progress bars on stderr: one per step name, with the training loss and an ETA."""

    def __init__(self) -> None:
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        self.progress = Progress(TextColumn("{task.description:<20}"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("{task.fields[info]:<12}"), TimeElapsedColumn(), TextColumn("ETA"),
                                 TimeRemainingColumn(), console=console(stderr=True))
        self.tasks: dict[str, Any] = {}

    def __call__(self, step: str, done: int, total: int, **info: Any) -> None:
        text = f"loss {info['loss']:.3f}" if "loss" in info else ""
        if step not in self.tasks:
            self.tasks[step] = self.progress.add_task(step, total=max(total, 1), info=text)
        self.progress.update(self.tasks[step], completed=done, total=max(total, 1), info=text)


def _print_table(con: Any, title: str, headers: list[str], rows: list[list[str]]) -> None:
    from rich.table import Table

    tab = Table(title=title)
    for i, h in enumerate(headers):
        tab.add_column(h, justify="left" if i == 0 or h == "note" else "right")
    for cells in rows:
        tab.add_row(*cells)
    con.print(tab)


def _print_result(result: Any) -> None:
    from tokenpos.analysis.extrapolate.render import comparison_table, protocols, table, task_table

    data = result.to_dict()
    L = data["train_len"]
    con = console()
    ci = " Mean [95% t-interval over seeds]." if "interval" in data else ""
    for protocol in protocols(data):
        if protocol == "sliding":
            title = (f"Sliding window (stride {result.config.stride}): trained at L = {L}, perplexity of the "
                     f"scored tokens and R(k) = NLL at kL / at L.{ci}")
        else:
            title = (f"Train short, test long: trained at L = {L}, perplexity of the tail (last {max(1, L // 2)} "
                     f"positions of windows right-aligned on the same targets) and R(k) = tail NLL at kL / at L.{ci}")
        _print_table(con, title, *table(data, protocol))
    for task in sorted({e["task"] for e in data.get("task_results", [])}):
        _print_table(con, f"Synthetic task {task}: per-token / exact-match accuracy (%) by input length "
                          f"[95% interval]", *task_table(data, task))
    if "comparisons" in data and len(result.seeds) > 1:
        _print_table(con, "Pre-registered comparisons (Holm-adjusted over the tested ones)", *comparison_table(data))
    from tokenpos.analysis.extrapolate.experiment import ExtrapolationConfig
    from tokenpos.analysis.extrapolate.gate import explain

    for line in explain(data, ExtrapolationConfig().steps):      # what the gate and a short run can show
        con.print(line, markup=False)
    runs = data["runs"]
    if runs:
        losses = ", ".join(f"{r['scheme']} {r['final_train_loss']:.3f}" for r in runs)
        con.print(f"final train loss (nats/char): {losses}", markup=False)
    else:                                                # every run diverged: the notes above say why
        con.print("no scheme finished training (every run diverged; see the notes): nothing to compare", markup=False)
    size = f"{runs[0]['parameters']} parameters ({runs[0]['scheme']}), " if runs else ""
    con.print(f"corpus {data['corpus']} ({data['train_chars']} train / {data['eval_chars']} eval chars, "
              f"V = {data['vocab_size']}), {data['eval_tokens_per_length']} predicted tokens per length, "
              f"{size}{data['threads']} threads, seeds {result.seeds}, wall time {data['seconds']:.0f} s",
              markup=False)


def run(args: argparse.Namespace) -> int:
    import shlex
    from contextlib import nullcontext

    from tokenpos._files import check_output_path
    from tokenpos.analysis.extrapolate.document import write_json
    from tokenpos.analysis.extrapolate.experiment import run_extrapolation

    config = build_config(args)
    if args.json:                                          # fail in a second, not after the run
        check_output_path(args.json)
    if args.plot:
        check_output_path(args.plot, suffixes=(".png", ".svg", ".pdf"))
    bars = None if args.no_progress else _Bars()
    # several seeds or the task: save the partial document after each unit (marked "complete": false)
    def save_partial(res: Any) -> None:
        write_json(res, args.json)

    partial = save_partial if args.json and (len(config.seed_list) > 1 or config.task is not None) else None
    argv = getattr(args, "argv", None)
    command = None if argv is None else "tokenpos " + shlex.join(argv)
    with bars.progress if bars is not None else nullcontext():
        result = run_extrapolation(config, progress=bars, on_update=partial, command=command)
    written = write_json(result, args.json) if args.json else None     # before printing: never lose a run
    _print_result(result)
    con = console()
    if written is not None:
        con.print(f"wrote {written}", markup=False)
    if args.plot:
        from tokenpos.analysis.extrapolate.plot import plot_extrapolation

        con.print(f"wrote {plot_extrapolation(result, args.plot)}", markup=False)
    return 0
