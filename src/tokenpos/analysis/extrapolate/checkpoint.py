"""Resumable study runs: one checkpoint per unit of work (a scheme and seed, or a task, scheme and seed).

A checkpoint directory holds ``study.json`` (the fingerprint of the settings that define a unit's result)
and per unit ``<key>.safetensors`` (the trained weights), ``<key>.train.json`` (its training facts) and
``<key>.rows.json`` (its evaluated rows). Every file is written atomically (``tokenpos._files``), so an
interrupted run leaves whole files only; the next run with the same settings loads what is there and
continues: rows present -> nothing to do; weights present -> evaluate only; nothing -> train.
A directory written with other settings is refused (ConfigError), never mixed in.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tokenpos._files import atomic_write_bytes, atomic_write_text
from tokenpos.tables.errors import ConfigError

# settings that do not change a unit's result: which units run, threads, where checkpoints go
NOT_FINGERPRINTED = ("seed", "seeds", "schemes", "task_seeds", "threads", "checkpoint_dir")


def fingerprint(config: dict[str, Any]) -> dict[str, Any]:
    """The part of a plain config dict (``asdict`` of the study config) that fixes every unit's result."""
    return {k: v for k, v in sorted(config.items()) if k not in NOT_FINGERPRINTED}


class Checkpoints:
    """The checkpoint directory of one study (see the module docstring).

    Raises:
        ConfigError: the directory holds a study with other settings.
    """

    def __init__(self, directory: str | Path, config: dict[str, Any]) -> None:
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        marker = self.dir / "study.json"
        want = json.loads(json.dumps(fingerprint(config)))
        if marker.is_file():
            have = json.loads(marker.read_text(encoding="utf-8"))
            if have != want:
                diff = sorted(k for k in set(have) | set(want) if have.get(k) != want.get(k))
                raise ConfigError(f"checkpoint directory {self.dir} holds a study with other settings "
                                  f"(differing: {', '.join(diff)}); expected the same settings or a new directory")
        else:
            atomic_write_text(marker, json.dumps(want, indent=2, sort_keys=True) + "\n")

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
