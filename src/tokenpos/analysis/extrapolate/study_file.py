"""``--config study.toml``: a study's every setting in one file (read with the standard library's tomllib).

Top-level keys are ``ExtrapolationConfig`` fields; ``preset = "default" | "quick" | "full"`` picks the
starting point (default ``"default"``); a ``[task]`` table holds ``TaskConfig`` fields (its absence keeps
the preset's task; ``task = false`` removes it). Arrays become tuples. An unknown key or a value of the
wrong kind is refused with ConfigError naming it.

    preset = "full"
    steps = 1000
    seeds = [0, 1, 2, 3, 4]
    [task]
    tasks = ["copy", "passkey"]
    steps = 20000
"""

from __future__ import annotations

from dataclasses import fields, replace
from pathlib import Path
from typing import Any

import tomllib

from tokenpos.tables.errors import ConfigError

PRESETS = ("default", "quick", "full")


def _plain(value: Any) -> Any:
    return tuple(_plain(v) for v in value) if isinstance(value, list) else value


def _checked(cls: Any, table: dict[str, Any], where: str) -> dict[str, Any]:
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(table) - known)
    if unknown:
        raise ConfigError(f"{where}: unknown keys {unknown}; expected some of {sorted(known)}")
    return {k: _plain(v) for k, v in table.items()}


def load_study(path: str | Path) -> Any:
    """The ``ExtrapolationConfig`` a TOML file describes (validated).

    Raises:
        ConfigError: not TOML, an unknown preset or key, or settings that cannot run.
        OSError: the file cannot be read.
    """
    from tokenpos.analysis.extrapolate.experiment import ExtrapolationConfig
    from tokenpos.analysis.extrapolate.tasks import TaskConfig

    try:
        table = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path} is not valid TOML: {exc}") from None
    preset = table.pop("preset", "default")
    if preset not in PRESETS:
        raise ConfigError(f"{path}: preset must be one of {list(PRESETS)}, got {preset!r}")
    if preset == "full":
        base = ExtrapolationConfig.full()
    else:
        base = ExtrapolationConfig.quick() if preset == "quick" else ExtrapolationConfig()
    task = table.pop("task", None)
    overrides = _checked(ExtrapolationConfig, table, str(path))
    if task is False:
        overrides["task"] = None
    elif isinstance(task, dict):
        overrides["task"] = replace(base.task or TaskConfig(), **_checked(TaskConfig, task, f"{path} [task]"))
    elif task is not None:
        raise ConfigError(f"{path}: task must be a table or false, got {task!r}")
    try:
        config = replace(base, **overrides)
    except TypeError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    return config.validate()
