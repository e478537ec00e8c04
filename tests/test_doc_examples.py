"""The Python examples of README.md and docs/*.md run as written.

A reader pastes the README's blocks of "The layers" in order into one session, so they run in one
namespace (in a temporary folder: they save checkpoints). The vocab-parallel block is written for
``torchrun``; it runs here on a one-rank gloo group in a child process, with the ``ids``, ``h`` and
``targets`` its surrounding text describes. Each block in docs/ stands alone.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.torch.distributed.harness import free_port

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted((ROOT / "docs").glob("*.md"))


def python_blocks(path: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", path.read_text(encoding="utf-8"), re.S)


BLOCKS = python_blocks(ROOT / "README.md")
DISTRIBUTED = [b for b in BLOCKS if "tokenpos.torch.distributed" in b]
LOCAL = [b for b in BLOCKS if b not in DISTRIBUTED]


def test_the_readme_has_the_examples_this_file_runs():
    assert len(LOCAL) >= 4 and len(DISTRIBUTED) == 1


def test_local_examples_run_in_order_in_one_session(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    for i, block in enumerate(LOCAL):
        try:
            exec(compile(block, f"README.md python block {i}", "exec"), namespace)
        except Exception as e:  # pragma: no cover - the failure message
            pytest.fail(f"README python block {i} raised {e!r}:\n{block}")
    assert (tmp_path / "emb.safetensors").is_file() and (tmp_path / "optim.safetensors").is_file()


def test_vocab_parallel_example_runs_on_one_gloo_rank(tmp_path):
    script = textwrap.dedent(f"""
        import torch, torch.distributed as dist
        dist.init_process_group("gloo", init_method="tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
        B, L, D = 2, 8, 768
        ids = torch.randint(0, 50257, (B, L))
        h = torch.randn(B, L, D)
        targets = torch.randint(0, 50257, (B, L))
    """) + DISTRIBUTED[0] + textwrap.dedent("""
        assert x.shape == (B, L, D) and logits.shape[:2] == (B, L) and torch.isfinite(loss)
        dist.destroy_process_group()
    """)
    r = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_docs_examples_run(doc, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for i, block in enumerate(python_blocks(doc)):
        try:
            exec(compile(block, f"{doc.name} python block {i}", "exec"), {})
        except Exception as e:  # pragma: no cover - the failure message
            pytest.fail(f"{doc.name} python block {i} raised {e!r}:\n{block}")


def _cli_lines() -> list[tuple[str, str]]:
    """Every ``tokenpos ...`` command written in a code block of README.md or docs/*.md."""
    found = []
    for path in [ROOT / "README.md", *DOCS]:
        for block in re.findall(r"```[a-z]*\n(.*?)```", path.read_text(encoding="utf-8"), re.S):
            for line in block.splitlines():
                m = re.search(r"(?:^|&& )tokenpos (.*)$", line.strip())
                if m:
                    found.append((path.name, m.group(1)))
    return found


CLI_LINES = _cli_lines()


def test_the_docs_show_cli_commands():
    assert len(CLI_LINES) >= 8


@pytest.mark.parametrize(("doc", "args"), CLI_LINES, ids=[f"{d}: {a[:40]}" for d, a in CLI_LINES])
def test_documented_cli_commands_parse(doc, args):
    from tokenpos.cli import UsageError, build_parser

    try:
        build_parser().parse_args(shlex.split(args, comments=True))
    except (UsageError, SystemExit) as e:  # pragma: no cover - the failure message
        pytest.fail(f"{doc}: `tokenpos {args}` no longer parses: {e}")
