"""The test helper ``tests.frames.is_package_frame``: a frame is tokenpos's when its file is inside the
imported package's folder, whatever the checkout, its virtual environment or the install is called.

Guard (issue 28, item 12): a newcomer's checkout named ``tokenpos`` with ``.venv`` inside made the
README's test command count pytest's frames as tokenpos frames (the old rule matched "tokenpos" in
the path). Source checkout and installed package are both checked, with the real package too.
"""

from __future__ import annotations

from pathlib import Path

import _pytest.python
import pytest

import tokenpos
import tokenpos.numpy.token
from tests.frames import is_package_frame

CHECKOUT = Path("/home/u/tokenpos/src/tokenpos")                                   # pip install -e .
INSTALLED = Path("/home/u/tokenpos/.venv/lib/python3.12/site-packages/tokenpos")   # pip install .

CASES = [
    # (frame file, package folder, counts as a tokenpos frame)
    ("/home/u/tokenpos/.venv/lib/python3.12/site-packages/_pytest/python.py", CHECKOUT, False),
    ("/home/u/tokenpos/.venv/lib/python3.12/site-packages/numpy/core/numeric.py", CHECKOUT, False),
    ("/home/u/tokenpos/tests/numpy/test_token.py", CHECKOUT, False),
    ("/home/u/tokenpos/src/tokenpos_extra/token.py", CHECKOUT, False),
    ("/home/u/tokenpos/src/tokenpos/numpy/token.py", CHECKOUT, True),
    ("/home/u/tokenpos/src/tokenpos/__init__.py", CHECKOUT, True),
    ("/home/u/tokenpos/.venv/lib/python3.12/site-packages/tokenpos/numpy/token.py", INSTALLED, True),
    ("/home/u/tokenpos/.venv/lib/python3.12/site-packages/tokenpos/kernels/embedding.py", INSTALLED, True),
    ("/home/u/tokenpos/.venv/lib/python3.12/site-packages/_pytest/python.py", INSTALLED, False),
    ("/home/u/tokenpos/src/tokenpos/numpy/token.py", INSTALLED, False),
]


@pytest.mark.parametrize(("filename", "package", "counts"), CASES)
def test_package_frames_by_the_package_folder(filename: str, package: Path, counts: bool) -> None:
    assert is_package_frame(filename, package) is counts


def test_the_real_package_and_pytest() -> None:
    package = Path(tokenpos.__file__).resolve().parent
    assert is_package_frame(tokenpos.numpy.token.__file__, package)
    assert not is_package_frame(_pytest.python.__file__, package)
    assert not is_package_frame(__file__, package)
