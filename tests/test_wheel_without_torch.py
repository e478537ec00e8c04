"""The built wheel, installed with only its required packages, works without torch (issue 49).

``pip wheel --no-deps`` builds the wheel from a copy of the project (nothing is written into the checkout); a
fresh venv gets the wheel and its required packages, nothing else. There ``tokenpos --help`` and
``tokenpos memory --vocab-size 50257 --d-model 768`` exit 0, a command that needs an optional package names the
extra that installs it, and the NumPy backend trains a ``TokenEmbedding`` (forward, backward, an Adam step)
without torch. The wheel carries the Apache-2.0 LICENSE, and its metadata makes optional exactly what the CLI
treats as optional (``tokenpos.cli._ui.EXTRAS``).

Slow (a build and an install, about a minute). pip may download the required packages from the configured
index; the test is skipped, saying so, only when that index cannot be reached.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import textwrap
import venv
import zipfile
from pathlib import Path

import pytest

from tokenpos.cli._ui import EXTRAS

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
# sha256 of https://www.apache.org/licenses/LICENSE-2.0.txt, the standard text (Debian ships the same file as
# /usr/share/common-licenses/Apache-2.0)
APACHE_2_SHA256 = "cfc7749b96f63bd31c3c42b5c471bf756814053e847c10f3eb003417bc523d30"
OPTIONAL = tuple(EXTRAS)

NUMPY_EXAMPLE = textwrap.dedent("""
    import sys

    import numpy as np
    import tokenpos.numpy as tpn

    emb = tpn.TokenEmbedding(100, 8, seed=0)
    ids = np.array([[3, 5, 3], [7, 5, 9]])
    out = emb(ids)                                              # (2, 3, 8)
    assert out.shape == (2, 3, 8) and np.array_equal(out, emb.weight.data[ids])
    emb.zero_grad()
    emb.backward(np.ones_like(out))                             # dW[i] = number of times id i was looked up
    grad = np.zeros((100, 8), np.float32)
    np.add.at(grad, ids, 1.0)
    assert np.array_equal(emb.weight.grad, grad)
    before = emb.weight.data.copy()
    opt = tpn.optim.Adam(emb.parameters(), lr=0.1)
    opt.step()                                                  # step 1: m / sqrt(v) = g / |g|, so -lr where g > 0
    expected = before - np.where(grad > 0, 0.1 * grad / (grad + 1e-8), 0.0)
    assert np.allclose(emb.weight.data, expected, rtol=0, atol=1e-6)
    assert not any(m in sys.modules for m in {optional!r})
    print("numpy example ok")
""").format(optional=OPTIONAL)


def run(*argv: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return subprocess.run([str(a) for a in argv], capture_output=True, text=True, cwd=cwd, env=env, timeout=600)


def pip(*argv: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return run(sys.executable, "-m", "pip", "--disable-pip-version-check", *argv, cwd=cwd)


def require(done: subprocess.CompletedProcess[str], what: str, probe_dir: Path) -> None:
    """Fail with pip's output, or skip when the package index itself cannot be reached (a download of one
    required package, rich, fails as well)."""
    if done.returncode == 0:
        return
    probe = pip("download", "--no-deps", "--dest", probe_dir, "rich")
    if probe.returncode != 0:
        pytest.skip(f"the package index is unreachable ({what} failed, and so did `pip download rich`): "
                    f"{probe.stderr.strip().splitlines()[-1:]}")
    pytest.fail(f"{what} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(the wheel, the venv's bin folder): a venv with the wheel and only its required packages."""
    tmp = tmp_path_factory.mktemp("wheel")
    project = tmp / "project"                                   # a copy: the build writes build/ and egg-info
    project.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy2(ROOT / name, project / name)
    shutil.copytree(ROOT / "src", project / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    dist = tmp / "dist"
    require(pip("wheel", "--no-deps", "--wheel-dir", dist, project, cwd=tmp), "pip wheel", tmp / "probe")
    (wheel,) = dist.glob("tokenpos-*.whl")
    venv.create(tmp / "venv", with_pip=False)
    bin_dir = tmp / "venv" / ("Scripts" if os.name == "nt" else "bin")
    python = bin_dir / ("python.exe" if os.name == "nt" else "python")
    require(pip("--python", python, "install", "--find-links", dist, wheel, cwd=tmp), "pip install", tmp / "probe")
    return wheel, bin_dir


def test_the_venv_has_no_optional_package(built: tuple[Path, Path]) -> None:
    _, bin_dir = built
    check = f"import importlib.util as u; print([m for m in {OPTIONAL!r} if u.find_spec(m)])"
    done = run(bin_dir / "python", "-c", check)
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stdout + done.stderr


def test_help_and_memory_run_without_torch(built: tuple[Path, Path], tmp_path: Path) -> None:
    _, bin_dir = built
    done = run(bin_dir / "tokenpos", "--help", cwd=tmp_path)
    assert done.returncode == 0 and "usage: tokenpos" in done.stdout, done.stderr
    done = run(bin_dir / "tokenpos", "memory", "--vocab-size", "50257", "--d-model", "768", cwd=tmp_path)
    assert done.returncode == 0 and "38,597,376" in done.stdout, done.stderr       # V x D


def test_a_command_that_needs_an_extra_names_it(built: tuple[Path, Path], tmp_path: Path) -> None:
    _, bin_dir = built
    done = run(bin_dir / "tokenpos", "plot", "sinusoidal", "--out", "figs/s.png", cwd=tmp_path)
    assert done.returncode == 2 and done.stderr.strip() == (
        "tokenpos plot: error: needs matplotlib, which is not installed; install it with: pip install 'tokenpos[plot]'")
    assert not (tmp_path / "figs").exists()
    done = run(bin_dir / "tokenpos", "extrapolate", "--quick", "--no-progress", cwd=tmp_path)
    assert done.returncode == 2 and "pip install 'tokenpos[torch]'" in done.stderr, done.stderr


def test_the_numpy_backend_trains_without_torch(built: tuple[Path, Path], tmp_path: Path) -> None:
    _, bin_dir = built
    done = run(bin_dir / "python", "-c", NUMPY_EXAMPLE, cwd=tmp_path)
    assert done.returncode == 0 and "numpy example ok" in done.stdout, done.stderr


def test_the_wheel_carries_the_license_and_its_extras_are_the_clis(built: tuple[Path, Path]) -> None:
    wheel, _ = built
    with zipfile.ZipFile(wheel) as z:
        info = next(n.split("/")[0] for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        license_text = z.read(f"{info}/licenses/LICENSE")
        metadata = z.read(f"{info}/METADATA").decode("utf-8")
    assert license_text == (ROOT / "LICENSE").read_bytes()
    assert hashlib.sha256(license_text).hexdigest() == APACHE_2_SHA256
    assert "License-Expression: Apache-2.0" in metadata.splitlines() and "License-File: LICENSE" in metadata
    requires = [line.removeprefix("Requires-Dist: ") for line in metadata.splitlines()
                if line.startswith("Requires-Dist: ")]

    def name(requirement: str) -> str:
        return requirement.split(";")[0].split("[")[0].split(">")[0].split("<")[0].split("=")[0].strip().lower()

    required = {name(r) for r in requires if "extra ==" not in r}
    assert not required & set(OPTIONAL), required
    for package, extra in EXTRAS.items():
        assert any(name(r) == package and f'extra == "{extra}"' in r for r in requires), (package, extra)
