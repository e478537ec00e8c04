"""The examples of README.md and docs/*.md run as written, and what they claim holds.

A reader copies one README block at a time, so each ```python block runs alone: in a fresh interpreter,
in an empty folder, with nothing defined before it. A block whose first line names its command
(``# vp.py; run: torchrun --nproc-per-node 2 vp.py``) is saved under that name and run with that command
(``torchrun`` as ``python -m torch.distributed.run``, gloo on the CPU). A block states its results as
asserts; the one kind of claim left in comments, ``EXPR raises ERROR``, is run here after the block, and a
list of numbers in a comment must be one that an assert of the block checks. A block that ends with torch
loaded must not have put tokenpos's kernels on their own thread pool (the README's Performance section:
import torch before ``tokenpos.numpy``). The transcript of the vocab-parallel example and the numbers in the
comments of the ``tokenpos memory`` lines are checked against a run. Each block in docs/ stands alone too.
"""

from __future__ import annotations

import io
import json
import re
import shlex
import subprocess
import sys
from contextlib import redirect_stdout
from pathlib import Path

import pytest

from tests.torch.distributed.harness import free_port

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")
DOCS = sorted((ROOT / "docs").glob("*.md"))


def python_blocks(text: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", text, re.S)


def code_blocks(text: str) -> list[str]:
    return re.findall(r"```[a-z]*\n(.*?)```", text, re.S)


BLOCKS = python_blocks(README)
# A block's own command: "# NAME.py; run: COMMAND" on its first line.
RUN_LINE = re.compile(r"#\s*(?P<name>[\w.]+\.py); run: (?P<cmd>[^(]+?)\s*(?:\(.*)?$")
RAISES = re.compile(r"(?P<expr>\b[\w.]+\([^()]*\)) raises (?P<error>\w+)")   # in a comment
NUMBERS = re.compile(r"[(\[]-?\d[\d.e-]*(?:, -?\d[\d.e-]*)+[)\]]")     # (2, 4, 768), [0, 1, 2]


def _needs(block: str) -> str:
    if RUN_LINE.match(block.splitlines()[0]):
        return "launcher"
    if "import transformers" in block:
        return "transformers"
    return "torch" if re.search(r"^import torch", block, re.M) else "numpy"


def _block_id(i: int) -> str:
    return f"block{i}-{_needs(BLOCKS[i])}"


def _marks(i: int) -> list:
    return [pytest.mark.slow]      # a fresh interpreter each: 1-5 s of CPU (numba, torch), more on busy cores


# Run in the block's interpreter after the block: the claims of its comments, then the thread-pool check.
AFTER = '''
import sys
for expr, error in CLAIMS:
    try:
        eval(expr, namespace)
    except Exception as e:
        assert error in [c.__name__ for c in type(e).__mro__], f"{expr} raised {e!r}, the README says {error}"
    else:
        raise AssertionError(f"{expr} returned; the README says it raises {error}")
if "tokenpos.kernels" in sys.modules and "torch" in sys.modules and sys.platform.startswith("linux"):
    from tokenpos.kernels import _threading
    assert _threading._chosen != "tbb", "tokenpos.numpy was imported before torch: two thread pools"
'''


def _claims(block: str) -> list[tuple[str, str]]:
    return [(m["expr"], m["error"]) for ln in block.splitlines() for m in RAISES.finditer(ln.partition("#")[2])]


def _runner(block_path: Path, claims: list[tuple[str, str]]) -> str:
    return (f"import runpy\nCLAIMS = {claims!r}\n"
            f"namespace = runpy.run_path({str(block_path)!r}, run_name='__main__')\n" + AFTER)


def test_the_readme_has_the_examples_this_file_runs():
    kinds = [_needs(b) for b in BLOCKS]
    assert len(BLOCKS) >= 7 and kinds.count("launcher") == 2 and kinds.count("transformers") == 1   # vp.py, vp_ngram.py


@pytest.mark.parametrize("i", [pytest.param(i, marks=_marks(i), id=_block_id(i)) for i in range(len(BLOCKS))])
def test_readme_block_runs_alone(i, tmp_path):
    block = BLOCKS[i]
    claims = _claims(block)
    asserts = " ".join(ln for ln in block.splitlines() if ln.lstrip().startswith(("assert", "for ", "    assert")))
    for line in block.splitlines():
        comment = line.partition("#")[2]
        for numbers in NUMBERS.findall(comment):
            assert numbers in asserts, f"README block {i}: {numbers!r} in `{line.strip()}` is claimed, not asserted"
    run_line = RUN_LINE.match(block.splitlines()[0])
    if run_line is None:
        (tmp_path / "block.py").write_text(block, encoding="utf-8")
        cmd = [sys.executable, "-c", _runner(tmp_path / "block.py", claims)]
    else:
        assert not claims, "claims in comments are checked in one interpreter only"
        (tmp_path / run_line["name"]).write_text(block, encoding="utf-8")
        argv = shlex.split(run_line["cmd"])
        assert argv[0] == "torchrun" and argv[-1] == run_line["name"], run_line["cmd"]
        cmd = [sys.executable, "-m", "torch.distributed.run", "--master-port", str(free_port()), *argv[1:]]
    r = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, f"README python block {i} failed:\n{block}\n{r.stdout[-2000:]}{r.stderr[-4000:]}"
    if "emb.save(" in block:
        assert (tmp_path / "emb.safetensors").is_file() and (tmp_path / "optim.safetensors").is_file()


def test_the_claim_checks_catch_a_wrong_claim(tmp_path):
    block = "import numpy as np\nx = np.ones(3)   # x.item(5) raises IndexError; int('a') raises KeyError\n"
    (tmp_path / "block.py").write_text(block, encoding="utf-8")
    claims = _claims(block)
    assert claims == [("x.item(5)", "IndexError"), ("int('a')", "KeyError")]
    r = subprocess.run([sys.executable, "-c", _runner(tmp_path / "block.py", claims)], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode != 0 and "the README says KeyError" in r.stderr


# The transcript of the vocab-parallel LM: its command, then the lines it prints ("..." elides steps).
TRANSCRIPT = next(b for b in code_blocks(README) if b.startswith("torchrun") and "vocab_parallel_lm" in b)
LOSS_RTOL = 1e-4    # the last digits of a loss depend on the CPU's float32 kernels (5.878246 here, 5.878252 elsewhere)


def _steps(text: str) -> dict[int, tuple[float, float]]:
    found = re.findall(r"^step\s+(\d+)\s+loss ([\d.]+)\s+one process ([\d.]+)", text, re.M)
    return {int(s): (float(a), float(b)) for s, a, b in found}


def test_the_transcript_is_of_the_form_checked():
    assert set(_steps(TRANSCRIPT)) == {1, 30} and TRANSCRIPT.splitlines()[-1].startswith("check passed: 30 steps")


@pytest.mark.slow  # two processes, 30 training steps each
def test_vocab_parallel_lm_transcript_matches_a_run():
    command, *printed = TRANSCRIPT.strip().splitlines()
    argv = shlex.split(command)
    assert argv[0] == "torchrun"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--master-port", str(free_port()), *argv[1:]]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    ran = _steps(r.stdout)
    assert r.stdout.splitlines()[0] == printed[0]                                    # "world 2: vocab ..."
    for step, losses in _steps(TRANSCRIPT).items():
        assert ran[step] == pytest.approx(losses, rel=LOSS_RTOL), (step, ran[step], losses)
    last = r.stdout.strip().splitlines()[-1]
    assert last.partition(", max")[0] == printed[-1].partition(", max")[0]           # "check passed: 30 steps on 2"


def _memory_lines() -> list[tuple[list[str], set[int]]]:
    """``tokenpos memory --tp N --preset P ...  # numbers`` lines of README.md: the args and the numbers."""
    found = []
    for block in code_blocks(README):
        for line in block.splitlines():
            m = re.match(r"tokenpos (memory .*--preset .*?)\s+#(.*)$", line.strip())
            if m:
                found.append((shlex.split(m[1]), {int(n.replace(",", "")) for n in re.findall(r"\d[\d,]*", m[2])}))
    return found


MEMORY_LINES = _memory_lines()


def test_readme_has_memory_lines():
    assert len(MEMORY_LINES) >= 2


@pytest.mark.parametrize(("args", "numbers"), MEMORY_LINES, ids=[" ".join(a) for a, _ in MEMORY_LINES])
def test_memory_line_comments_are_the_commands_numbers(args, numbers):
    from tokenpos.cli import main

    out = io.StringIO()
    with redirect_stdout(out):
        assert main([*args, "--json"]) == 0

    def entries(node):
        if isinstance(node, dict):
            if "padded_vocab" in node:
                yield node
            for v in node.values():
                yield from entries(v)
        elif isinstance(node, list):
            for v in node:
                yield from entries(v)

    values = {v for e in entries(json.loads(out.getvalue())) for v in e.values() if isinstance(v, int)}
    assert numbers <= values, f"tokenpos {' '.join(args)}: {sorted(numbers - values)} not in its output"


def test_readme_test_command_is_what_ci_runs():
    """.ci/run ends with the README's test command; the fast subset is named beside it."""
    ci = [ln.strip() for ln in (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()]
    ci_command = [ln for ln in ci if ln and not ln.startswith("#")][-1]
    quick = README[README.index("The second runs the tests"):]
    first, second = code_blocks(quick)[:2]
    assert first.strip() == ci_command == "pytest"
    assert second.strip() == 'pytest -m "not slow"'


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_docs_examples_run(doc, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for i, block in enumerate(python_blocks(doc.read_text(encoding="utf-8"))):
        try:
            exec(compile(block, f"{doc.name} python block {i}", "exec"), {})
        except Exception as e:  # pragma: no cover - the failure message
            pytest.fail(f"{doc.name} python block {i} raised {e!r}:\n{block}")


def _cli_lines() -> list[tuple[str, str]]:
    """Every ``tokenpos ...`` command written in a code block of README.md or docs/*.md."""
    found = []
    for path in [ROOT / "README.md", *DOCS]:
        for block in code_blocks(path.read_text(encoding="utf-8")):
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
