"""Resumable study runs: one checkpoint per unit of work (a scheme and seed, or a task, scheme and seed).

Units are kept by the settings that fix their result, one folder per kind and settings:
``<dir>/lm-<digest>/`` for the language models and ``<dir>/task-<digest>/`` for the task models, where
``<digest>`` is a hash of those settings (``lm_settings`` / ``task_settings``) and the folder's
``settings.json`` spells them out. A folder holds per unit ``<key>.safetensors`` (the trained weights),
``<key>.train.json`` (its training facts) and ``<key>.rows.json`` (its evaluated rows). Every file is
written atomically (``tokenpos._files``), so an interrupted run leaves whole files only; the next run with
the same settings loads what is there and continues: rows present -> nothing to do; weights present ->
evaluate only; nothing -> train. A run with other settings writes to another folder, so units trained
with different settings are never mixed, and changing only the task settings keeps every language model.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from tokenpos._files import atomic_write_bytes, atomic_write_text
from tokenpos.tables.errors import ConfigError

# settings that do not change a unit's result: which units run, threads, where checkpoints go
NOT_FINGERPRINTED = ("seed", "seeds", "schemes", "task_seeds", "threads", "checkpoint_dir")


def lm_settings(config: dict[str, Any]) -> dict[str, Any]:
    """The part of a plain study config (``asdict``) that fixes a language-model unit's result."""
    return {k: v for k, v in sorted(config.items()) if k not in NOT_FINGERPRINTED and k != "task"}


def task_settings(config: dict[str, Any]) -> dict[str, Any]:
    """The part of a plain study config that fixes a task unit's result: the task settings and the RoPE base."""
    return {"base": config["base"], "task": config["task"]}


def unit_folder(root: str | Path, kind: str, settings: dict[str, Any]) -> Checkpoints:
    """The checkpoints of ``kind`` ("lm" or "task") units trained with ``settings``: ``root/<kind>-<digest>``."""
    plain = json.dumps(settings, sort_keys=True, allow_nan=False)
    digest = hashlib.sha256(plain.encode()).hexdigest()[:12]
    return Checkpoints(Path(root) / f"{kind}-{digest}", json.loads(plain))


class Checkpoints:
    """One folder of unit checkpoints, written with ``settings`` (see the module docstring).

    Raises:
        ConfigError: the folder's ``settings.json`` names other settings (edited by hand, or a digest
            collision): it is never mixed in.
    """

    def __init__(self, directory: str | Path, settings: dict[str, Any]) -> None:
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        marker = self.dir / "settings.json"
        if marker.is_file():
            have = json.loads(marker.read_text(encoding="utf-8"))
            if have != settings:
                diff = sorted(k for k in set(have) | set(settings) if have.get(k) != settings.get(k))
                raise ConfigError(f"checkpoint folder {self.dir} holds units trained with other settings "
                                  f"(differing: {', '.join(diff)}); expected {marker} to name these settings")
        else:
            atomic_write_text(marker, json.dumps(settings, indent=2, sort_keys=True) + "\n")

    def load(self, key: str, kind: str) -> Any | None:
        """The JSON saved under ``<key>.<kind>.json``, or None."""
        path = self.dir / f"{key}.{kind}.json"
        return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None

    def save(self, key: str, kind: str, value: Any) -> None:
        atomic_write_text(self.dir / f"{key}.{kind}.json", json.dumps(value, allow_nan=False) + "\n")

    def save_model(self, key: str, model: Any) -> None:
        """The model's state dict as ``<key>.safetensors`` (contiguous copies, shared tensors kept once)."""
        from safetensors.torch import save

        state: dict[str, Any] = {}
        seen: dict[int, str] = {}
        for name, tensor in model.state_dict().items():
            if tensor.data_ptr() in seen:             # a tied tensor: stored once, restored by load_state_dict
                continue
            seen[tensor.data_ptr()] = name
            state[name] = tensor.detach().contiguous().clone()
        atomic_write_bytes(self.dir / f"{key}.safetensors", save(state))

    def load_model(self, key: str, model: Any) -> bool:
        """Load ``<key>.safetensors`` into ``model`` (strict apart from tied copies); False when absent."""
        from safetensors.torch import load

        path = self.dir / f"{key}.safetensors"
        if not path.is_file():
            return False
        state = load(path.read_bytes())
        missing, unexpected = model.load_state_dict(state, strict=False)
        if unexpected or any(not _tied(model, m) for m in missing):
            raise ConfigError(f"checkpoint {path} does not fit the model (missing {missing}, unexpected "
                              f"{unexpected}); expected weights saved by this study")
        return True


def _tied(model: Any, name: str) -> bool:
    """True when state entry ``name`` shares its storage with another entry (saved once under that name)."""
    state = model.state_dict()
    ptr = state[name].data_ptr()
    return any(other != name and t.data_ptr() == ptr for other, t in state.items())
