"""The CLI imports what a command needs, when it runs (issue 49): ``tokenpos --help``, any argument error and
``tokenpos memory`` import no torch, numba or matplotlib; a command that needs a missing optional package says
which extra installs it; the CLI's extras are pyproject.toml's.

Each check runs ``tokenpos.cli.main`` in a fresh interpreter: in this one the suite's own fixtures (conftest.py)
have imported torch and numba already. The installed wheel without torch: tests/test_wheel_without_torch.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tokenpos.cli._ui import EXTRAS, missing_extra

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "numba", "matplotlib", "transformers", "triton")

# Every one runs in one interpreter, in this order; after each, the heavy modules loaded so far are recorded (the
# first command to load one is the one that did).
LIGHT = [
    ["--help"],
    ["--version"],
    [],
    ["frobnicate"],
    ["--bogus"],
    ["memory", "--vocab-size", "50257", "--d-model", "768"],
    ["memory"],
    ["memory", "--preset", "gpt2", "--tp", "8", "--logits", "--json"],
    ["memory", "--vocab-size", "1000", "--d-model", "256", "--max-seq-len", "128", "--positional", "fire",
     "--num-heads", "4"],
    ["memory", "--help"],
    ["memory", "--vocab-size", "x"],
    ["memory", "--positional", "nope"],
    ["plot", "--help"],
    ["plot", "nope"],
    ["plot", "sinusoidal", "--dpi", "0"],
    ["report", "--help"],
    ["report", "--quick", "--full"],
    ["bench", "--help"],
    ["bench", "--cases", "nope"],
    ["extrapolate", "--help"],
    ["extrapolate", "--steps", "0"],
]

_RUNNER = textwrap.dedent("""
    import contextlib, io, json, sys
    from tokenpos.cli import main

    heavy, out = {heavy!r}, []
    for argv in json.loads(sys.argv[1]):
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()) as err:
            code = main(argv)
        out.append({{"argv": argv, "code": code, "err": err.getvalue(),
                     "loaded": sorted(m for m in heavy if m in sys.modules)}})
    print(json.dumps(out))
""")


def run_fresh(commands: list[list[str]], *, prelude: str = "", cwd: Path = ROOT) -> list[dict]:
    """Run each command through ``tokenpos.cli.main`` in one new interpreter (after ``prelude``): for each, its
    exit code, its stderr and the heavy modules loaded by then."""
    code = prelude + _RUNNER.format(heavy=HEAVY)
    env = {"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin", "COLUMNS": "100"}
    done = subprocess.run([sys.executable, "-c", code, json.dumps(commands)], capture_output=True, text=True,
                          cwd=cwd, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_help_argument_errors_and_memory_import_nothing_heavy() -> None:
    results = run_fresh(LIGHT)
    for r in results:
        assert r["loaded"] == [], f"tokenpos {' '.join(r['argv'])} imported {r['loaded']}"
    codes = {" ".join(r["argv"]): r["code"] for r in results}
    assert codes["--help"] == 0 and codes["memory --vocab-size 50257 --d-model 768"] == 0 and codes["memory"] == 0
    for r in results:                                              # the argument errors: one line, exit 2
        if r["code"] == 2 and r["argv"]:
            assert len(r["err"].strip().splitlines()) == 1, r


# A module finder that reports the optional packages as not installed (as in a venv without them).
_WITHOUT = textwrap.dedent("""
    import importlib.abc, sys

    class _NotInstalled(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.partition(".")[0] in {blocked!r}:
                raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
            return None

    sys.meta_path.insert(0, _NotInstalled())
""")


@pytest.mark.parametrize(("blocked", "argv", "extra"), [
    (("matplotlib",), ["plot", "sinusoidal", "--out", "out/figs/x.png"], "plot"),
    (("torch",), ["bench", "--quick", "--no-progress", "--json", "out/bench/b.json"], "torch"),
], ids=["plot-without-matplotlib", "bench-without-torch"])
def test_a_missing_optional_package_names_its_extra(blocked: tuple[str, ...], argv: list[str], extra: str,
                                                    tmp_path: Path) -> None:
    (r,) = run_fresh([argv], prelude=_WITHOUT.format(blocked=set(blocked)), cwd=tmp_path)
    line = r["err"].strip()
    assert r["code"] == 2 and len(line.splitlines()) == 1, r
    assert line == (f"tokenpos {argv[0]}: error: needs {blocked[0]}, which is not installed; install it with: "
                    f"pip install 'tokenpos[{extra}]'")
    assert not (tmp_path / "out").exists()                        # the folders made for the output: removed again


def test_missing_extra_only_for_a_missing_optional_package() -> None:
    assert missing_extra(ModuleNotFoundError("No module named 'torch.nn'", name="torch.nn")) == (
        "needs torch, which is not installed; install it with: pip install 'tokenpos[torch]'")
    assert "tokenpos[hf]" in str(missing_extra(ModuleNotFoundError("x", name="transformers")))
    assert missing_extra(ModuleNotFoundError("No module named 'foo'", name="foo")) is None
    assert missing_extra(ImportError("cannot import name 'x' from 'torch'", name="torch")) is None  # installed, broken


def test_the_cli_extras_are_pyprojects() -> None:
    """Every optional package the CLI names is in the extra it names, and in no required dependency; every extra
    a user installs for a command (not test / dev / all) is one the CLI names."""
    tomllib = pytest.importorskip("tomllib", reason="tomllib is in the standard library from Python 3.11")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    extras = project["optional-dependencies"]

    def names(requirements: list[str]) -> set[str]:
        return {r.split(";")[0].split("[")[0].split(">")[0].split("<")[0].split("=")[0].strip().lower()
                for r in requirements}

    required = names(project["dependencies"])
    for package, extra in EXTRAS.items():
        assert package in names(extras[extra]), (package, extra)
        assert package not in required, package
    assert set(EXTRAS.values()) == set(extras) - {"test", "dev", "all"}
