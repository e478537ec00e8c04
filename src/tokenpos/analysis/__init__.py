"""Analysis tools behind the ``tokenpos`` CLI: memory, plots, the HTML report (bench, extrapolation).

Import-light: only the memory arithmetic is imported here. ``tokenpos.analysis.plots`` (matplotlib)
and ``tokenpos.analysis.report`` are imported on demand. Nothing here prints; functions return data
(dataclasses) or the paths they wrote, and report progress through ``progress(step, done, total)``.
"""

from tokenpos.analysis.memory import (
    MB,
    MIB,
    PRECISIONS,
    PRESETS,
    SEED_SCENARIOS,
    MemoryReport,
    ModelConfig,
    TableMemory,
    embedding_memory,
    get_preset,
    position_alternatives,
    scenario_reports,
)

__all__ = [
    "MB",
    "MIB",
    "PRECISIONS",
    "PRESETS",
    "SEED_SCENARIOS",
    "MemoryReport",
    "ModelConfig",
    "TableMemory",
    "embedding_memory",
    "get_preset",
    "position_alternatives",
    "scenario_reports",
]
