"""Which tokenpos functions are on the stack when a compiled core is called (the frame-count tests
of docs/DESIGN.md, both backends)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import tokenpos


def is_package_frame(filename: str, package: Path) -> bool:
    """Whether a frame's file is tokenpos's own code: inside the imported package's folder, whatever
    the checkout or a virtual environment inside it is called."""
    return Path(filename).resolve().is_relative_to(package)


def tokenpos_frames_above(monkeypatch: Any, module: ModuleType, cores: tuple[str, ...],
                          run: Callable[[], Any]) -> list[list[str]]:
    """Spy on ``module``'s compiled ``cores`` while ``run()`` runs; for each call of one, the tokenpos
    frames on the stack above it as ``"file.py:function"``, innermost first."""
    package = Path(tokenpos.__file__).resolve().parent
    chains: list[list[str]] = []

    def spy(*args: Any, _real: Callable[..., Any], **kwargs: Any) -> Any:
        chain, frame = [], sys._getframe(1)
        while frame is not None:
            if is_package_frame(frame.f_code.co_filename, package):
                chain.append(f"{Path(frame.f_code.co_filename).name}:{frame.f_code.co_name}")
            frame = frame.f_back
        chains.append(chain)
        return _real(*args, **kwargs)

    for core in cores:
        real = getattr(module, core)
        monkeypatch.setattr(module, core, lambda *a, _real=real, **k: spy(*a, _real=_real, **k))
    run()
    return chains
