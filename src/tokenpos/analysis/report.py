"""``build_report``: the whole analysis as one self-contained HTML page (tokenpos report).

Sections: embedding memory, a quick lookup benchmark (tokenpos.analysis.bench, when present; its HTML is
:mod:`.report_bench`'s), the figures of every positional scheme, the positional trade-offs (memory,
extrapolation, variance across positions) and the extrapolation results when a JSON file from
``tokenpos extrapolate`` exists.
Progress goes through ``progress(step, done, total)``; nothing is printed.
"""

from __future__ import annotations

import html
import os
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from tokenpos.analysis import report_html as H
from tokenpos.analysis.memory import MIB, PRECISIONS, format_share, format_size, position_alternatives
from tokenpos.analysis.report_bench import BENCH_QUICK_CASES as BENCH_QUICK_CASES  # re-exported: defined with
from tokenpos.analysis.report_bench import bench_html as bench_html  # the bench section's HTML
from tokenpos.analysis.report_bench import calls_html as calls_html
from tokenpos.tables.checks.validation import check_choice

Progress = Callable[[str, int, int], None]
MODES = ("quick", "default", "full")
HTML_NAME = "index.html"
EXTRAPOLATION_NAME = "extrapolation.json"
# the full study (docs/EXTRAPOLATION.md) ships inside the package (pyproject's package-data), so an installed
# wheel's report has it too; docs/extrapolation_full.json in the repository links to this file
CHECKED_IN_STUDY = Path(str(resources.files("tokenpos.analysis") / "data" / "extrapolation_full.json"))
# plot kind -> (caption, options per mode)
FIGURES: dict[str, str] = {
    "memory": "Token-table size (fp32) over vocab size and d_model; the model presets and the example sizes are "
              "marked.",
    "sinusoidal": "The sinusoidal table: fast dimensions on the left, slow ones on the right barely change over "
                  "256 positions.",
    "similarity": "Cosine similarity of the encodings of two positions against their distance. The learned table "
                  "is freshly initialised (random N(0, 0.02), never trained): it has no notion of distance yet.",
    "rope": "RoPE wavelength per dimension pair (log scale) for each HF scaling, and its ratio to the unscaled one.",
    "alibi": "ALiBi: one linear distance penalty per head, with geometrically decreasing slopes.",
    "t5": "T5 relative buckets: exact for small distances, logarithmic up to max_distance, then one shared bucket.",
    "mrope": "M-RoPE: which position axis (temporal, height, width) each frequency reads in the Qwen2-VL section "
             "layout and the Qwen3-VL interleaved layout, and the (3, L) ids of a text + image + text sequence.",
    "positions2d": "2-D patch positions: how similar the axial 2-D RoPE (Pixtral) rotation of each patch is to "
                   "the centre patch's, and the 2-D sin-cos table of ViT-MAE.",
    "fire": "FIRE at initialisation: its bias against distance per head, for queries at several positions (the "
            "normaliser max(i, L) stretches the same distances as the query moves past L).",
    "kerple": "KERPLE-log at initialisation: -r1 log(1 + r2 d) per head, with ALiBi's linear penalties dotted.",
}
SCHEME_FIGURES = ("sinusoidal", "similarity", "rope", "mrope", "positions2d", "alibi", "t5", "fire", "kerple")
DPI = {"quick": 80, "default": 110, "full": 140}


@dataclass
class ReportContext:
    out_dir: Path
    mode: str
    progress: Progress
    on_note: Callable[[str], None] = lambda note: None
    images: list[Path] = field(default_factory=list)


def _memory_section(ctx: ReportContext) -> str:
    from tokenpos.analysis.memory import scenario_reports

    ctx.progress("memory tables", 0, 1)
    reports = scenario_reports()
    heads = ["model", "vocab_size", "d_model", "token params"]
    for p in PRECISIONS:
        heads += [f"{p} MiB", f"{p} MB"]
    rows = []
    for r in reports:
        tok = r.tables[0]
        sizes = [format_size(f(p)) for p in PRECISIONS for f in (tok.mib, tok.mb)]
        rows.append([r.config.title or r.config.name, f"{r.config.vocab_size:,}", f"{r.config.d_model:,}",
                     f"{tok.params:,}", *sizes])
    body = H.table(heads, rows, caption="Token embedding table (V x D): example sizes (small to GPT-3 scale) and "
                                        "model presets. MiB = 2^20 bytes, MB = 10^6 bytes; fp16 and bf16 are both "
                                        "2 bytes.",
                   cls="memory")
    rows = []
    for r in reports:
        c = r.config
        total = "n/a" if c.total_params is None else f"{c.total_params:,}" + ("" if c.total_exact else " (approx.)")
        rows.append([c.title or c.name, f"{c.positional}" + (f" ({c.max_seq_len:,})" if c.max_seq_len else ""),
                     "tied" if c.tied_output else "untied", f"{r.params:,}", format_size(r.nbytes("fp32") / MIB),
                     format_size(r.nbytes("fp16/bf16") / MIB), format_size(r.train_bytes / MIB), total,
                     format_share(r.share())])
    body += H.table(["model", "positions (L)", "output proj.", "embedding params", "fp32 MiB", "fp16/bf16 MiB",
                     "train+Adam MiB", "model params", "share of model"], rows, numeric={3, 4, 5, 6, 7, 8},
                    caption="All embedding tables: token + learned position + token type + untied output "
                            "projection. Training = fp32 weights + gradients + Adam m and v = 16 bytes per parameter.")
    rows = [[t.name, f"{t.params:,}", format_size(t.mib("fp32")), format_size(t.mib("fp16/bf16")),
             format_size(t.train_bytes / MIB), t.note] for t in position_alternatives(2048, 512, 8)]
    body += H.table(["scheme", "params", "fp32 MiB", "fp16/bf16 MiB", "train+Adam MiB", "note"], rows,
                    numeric={1, 2, 3, 4}, caption="Positional encoding memory of every registered scheme at "
                                                  "d_model 512, max_seq_len 2048, 8 heads.")
    ctx.progress("memory tables", 1, 1)
    return body


def _figures(ctx: ReportContext) -> dict[str, str]:
    from tokenpos.analysis.plots import plot

    out = {}
    ctx.progress("plots", 0, len(FIGURES))
    for i, (kind, caption) in enumerate(FIGURES.items()):
        if kind in ("fire", "kerple"):                   # the learned bias schemes' figures (tokenpos plot fire)
            from tokenpos.analysis.extrapolate import plot_bias

            path = getattr(plot_bias, f"plot_{kind}")(ctx.out_dir / f"{kind}.png", dpi=DPI[ctx.mode])
        else:
            path = plot(kind, ctx.out_dir / f"{kind}.png", dpi=DPI[ctx.mode])
        ctx.images.append(path)
        out[kind] = H.figure(path, caption, alt=f"{kind} plot")
        ctx.progress("plots", i + 1, len(FIGURES))
    return out


def _bench_section(ctx: ReportContext, enabled: bool) -> str:
    if not enabled:
        return H.paragraphs(["Benchmark skipped (--no-bench)."], "note")
    try:
        from tokenpos.analysis.bench import run_bench
    except ImportError as exc:
        ctx.on_note(f"benchmark unavailable: {exc}")
        return H.paragraphs([f"Benchmark unavailable: tokenpos.analysis.bench could not be imported ({exc})."],
                            "warn")
    kwargs: dict[str, Any] = {"quick": ctx.mode != "full"}
    if ctx.mode == "quick":
        kwargs["cases"] = BENCH_QUICK_CASES
    try:
        rep = run_bench(**kwargs,
                        progress=lambda label, done, total: ctx.progress(f"benchmark: {label}", done, total))
    except Exception as exc:  # the report must still be written; the failure is shown in it
        ctx.on_note(f"benchmark failed: {type(exc).__name__}: {exc}")
        return H.paragraphs([f"Benchmark failed: {type(exc).__name__}: {exc}"], "warn")
    return bench_html(rep, ctx.mode, ctx.out_dir, DPI[ctx.mode], ctx.images)


def _tradeoff_section(ctx: ReportContext) -> str:
    from tokenpos.analysis.tradeoffs import positional_tradeoffs

    t = positional_tradeoffs(progress=ctx.progress)
    body = H.paragraphs([f"Computed now for max_seq_len L = {t.max_seq_len}, d_model D = {t.d_model}, "
                         f"{t.num_heads} heads, RoPE head_dim {t.head_dim} (the memory section's "
                         "positional table uses L = 2048, D = 512)."], "note")
    body += "<ul>" + "".join(f"<li>{html.escape(s)}</li>" for s in t.summary) + "</ul>"
    body += "<h3>Memory</h3>" + H.table(["scheme", "params", "fp32 MiB", "note"],
                                         [[n, f"{p:,}", format_size(m), note] for n, p, m, note in t.memory],
                                         numeric={1, 2})
    body += "<h3>Extrapolation beyond L</h3>" + H.table(
        ["scheme", f"positions >= {t.max_seq_len}", "what the library computes"],
        [[e.scheme, e.beyond_max, e.finding] for e in t.extrapolation], numeric=set())
    body += "<h3>Variance across positions</h3>" + H.table(
        ["table (L x D)", "mean per-dim variance", "min", "max", "dims with variance < 0.01"],
        [[v.name, f"{v.mean:.4g}", f"{v.min:.3g}", f"{v.max:.3g}", f"{100 * v.frac_low:.0f}%"] for v in t.variance],
        caption="Variance over the L positions of each dimension, summarised over the D dimensions. The schemes "
                f"that add nothing to the embeddings ({', '.join(_not_additive())}) have no row here.")
    return body


def _not_additive() -> list[str]:
    """The registered schemes that act in attention or not at all (no table added to the embeddings)."""
    from tokenpos.tables.registry import SCHEMES

    return [name for name, entry in SCHEMES.items() if entry.kind != "additive"]


def read_extrapolation(path: Path) -> Any:
    """The parsed results of ``tokenpos extrapolate --json`` (ValueError / KeyError / TypeError if broken)."""
    try:
        from tokenpos.analysis.extrapolate.document import load_json
    except ImportError:
        import json

        data = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(data, dict) or not isinstance(data.get("results"), list):
            raise ValueError("expected a JSON object with a 'results' list") from None
        return data
    return load_json(path)


def _extrapolation_section(ctx: ReportContext, path: Path, data: Any) -> str:
    """``data``: results read before the run (an explicit file), or None to read ``path`` now (the
    default file; a broken one becomes a note)."""
    target = html.escape(str(ctx.out_dir / EXTRAPOLATION_NAME))
    hint = (f"No extrapolation results. Run <code>tokenpos extrapolate --json {target}</code> (under 10 minutes "
            "on 2 cores), "
            "then <code>tokenpos report</code> again.")
    if data is None:
        if not path.is_file():
            return f'<p class="note">{hint}</p>'
        try:
            data = read_extrapolation(path)
        except (ValueError, KeyError, TypeError) as exc:
            ctx.on_note(f"extrapolation results skipped: {exc}")
            return H.paragraphs([f"Could not read {path}: {exc}"], "warn")
    ctx.progress("extrapolation table", 0, 1)
    try:
        from tokenpos.analysis.extrapolate.render import html_table, protocols

        ci = f" Every number: mean [{data['interval']}]." if "interval" in data else ""
        study = path == CHECKED_IN_STUDY
        own = (f" These are the checked-in study's results (docs/EXTRAPOLATION.md), shipped with tokenpos; run "
               f"`tokenpos extrapolate --json {ctx.out_dir / EXTRAPOLATION_NAME}` for your own." if study else "")
        source = f"the study shipped with tokenpos ({path.name})" if study else str(path)
        from tokenpos.analysis.extrapolate.experiment import ExtrapolationConfig
        from tokenpos.analysis.extrapolate.gate import explain

        body = (H.paragraphs([f"From {source}.{ci}{own}", *explain(data, ExtrapolationConfig().steps)], "note")
                + "".join(html_table(data, p) for p in protocols(data)))
        body += _task_tables(data)
    except ImportError:
        rows = [[r["scheme"], r["eval_len"], r["ppl"], r["tail_nll"], r["ratio"]] for r in data["results"]]
        body = H.table(["scheme", "eval_len", "ppl", "tail NLL", "ratio"], rows,
                       caption=f"Trained at L = {data['train_len']} ({path}).")
    try:
        from tokenpos.analysis.extrapolate.plot import plot_extrapolation
    except ImportError:
        pass
    else:
        png = plot_extrapolation(data, ctx.out_dir / "extrapolation.png")
        ctx.images.append(png)
        body += H.figure(png, "Perplexity and tail-NLL ratio against evaluation length.", "extrapolation plot")
        if data.get("task_results"):
            from tokenpos.analysis.extrapolate.plot import plot_tasks

            png = plot_tasks(data, ctx.out_dir / "extrapolation_tasks.png")
            ctx.images.append(png)
            body += H.figure(png, "Synthetic tasks: exact-match accuracy against input length.", "task plot")
    ctx.progress("extrapolation table", 1, 1)
    return body


def _task_tables(data: dict[str, Any]) -> str:
    """The synthetic tasks' accuracy tables (HTML), empty without ``task_results``."""
    from tokenpos.analysis.extrapolate.render import task_table

    out = ""
    for task in sorted({e["task"] for e in data.get("task_results", [])}):
        headers, rows = task_table(data, task)
        out += H.table(headers, rows, caption=f"Synthetic task {task}: exact-match accuracy (%) by input length "
                                              "[95% interval].")
    return out


def build_report(out_dir: str | Path = "report", *, mode: str = "default", bench: bool = True,
                 extrapolation: str | Path | None = None, progress: Progress | None = None,
                 on_note: Callable[[str], None] | None = None) -> Path:
    """Write ``out_dir/index.html`` (PNGs embedded, and also written beside it) and return its path.

    Args:
        mode: "quick" (low-resolution figures), "default", or "full" (full benchmark, sharper figures).
        bench: run the quick benchmark (the full one in "full" mode).
        extrapolation: a JSON file from ``tokenpos extrapolate --json``; default ``out_dir/extrapolation.json``
            when it exists.
        progress: ``progress(step, done, total)``, called as each step advances.
        on_note: called with a one-line message when a section is skipped (benchmark missing or failed,
            unreadable default extrapolation file); the page shows the same message.
    Every check (mode, the ``extrapolation`` file, a writable folder) runs before anything is
    written; every file (figures, index.html) is written atomically (temporary file + rename), so an
    interrupted or failed run leaves the previous report as it was, never a truncated page.

    Raises:
        ConfigError: unknown mode, an ``out_dir`` that is a file, or an ``extrapolation`` file that is
            missing or not a result.
        OSError: ``out_dir`` cannot be created or written.
    """
    from tokenpos._files import atomic_write_text, check_output_path
    from tokenpos.tables.errors import ConfigError

    check_choice("mode", mode, MODES)
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise ConfigError(f"report folder {str(out)!r} exists and is not a folder")
    data = None
    if extrapolation is not None:        # read and checked before anything is written
        if not Path(extrapolation).is_file():
            raise ConfigError(f"extrapolation results file {str(extrapolation)!r} does not exist")
        try:
            data = read_extrapolation(Path(extrapolation))
        except (ValueError, KeyError, TypeError) as exc:
            raise ConfigError(f"cannot read extrapolation results {extrapolation}: {exc}") from exc
    out.mkdir(parents=True, exist_ok=True)
    target = check_output_path(out / HTML_NAME)   # writable? (probed with a temporary file; index.html untouched)
    ctx = ReportContext(out, mode, progress or (lambda step, done, total: None), on_note or (lambda note: None))
    start = time.perf_counter()
    memory = _memory_section(ctx)
    figs = _figures(ctx)
    bench_body = _bench_section(ctx, bench)
    tradeoffs = _tradeoff_section(ctx)
    ext = Path(extrapolation) if extrapolation is not None else out / EXTRAPOLATION_NAME
    if extrapolation is None and not ext.is_file() and CHECKED_IN_STUDY.is_file():
        ext = CHECKED_IN_STUDY          # no run of the user's own: show the checked-in study (intervals)
    ext_body = _extrapolation_section(ctx, ext, data)
    ctx.progress("writing HTML", 0, 1)
    sections = [
        ("memory", "Embedding memory", memory + figs["memory"]),
        ("bench", "Lookup benchmark", bench_body),
        ("schemes", "Positional schemes",
         "".join(figs[k] for k in SCHEME_FIGURES)),
        ("tradeoffs", "Positional encoding trade-offs", tradeoffs),
        ("extrapolation", "Length extrapolation", ext_body),
    ]
    from tokenpos import __version__

    meta = (f"tokenpos {__version__}, mode {mode}, generated {time.strftime('%Y-%m-%d %H:%M:%S')} in "
            f"{time.perf_counter() - start:.1f} s on {platform.platform()}, Python {platform.python_version()}, "
            f"{os.cpu_count()} CPUs")
    atomic_write_text(target, H.page("tokenpos analysis report", html.escape(meta), sections))
    ctx.progress("writing HTML", 1, 1)
    return target
