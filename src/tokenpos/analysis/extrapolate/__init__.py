"""Train short, test long: the length-extrapolation study behind ``tokenpos extrapolate``.

Import-light: torch and matplotlib are imported inside the functions that need them.

    config = ExtrapolationConfig(seed=0)     # or .quick(), or .full() (seeds, both protocols, task)
    result = run_extrapolation(config, progress=None)
    write_json(result, "out.json"); markdown_table(result.to_dict(), "nonoverlap")
"""

from tokenpos.analysis.extrapolate.document import load_json, write_json
from tokenpos.analysis.extrapolate.experiment import (
    PROTOCOLS,
    ROPE_SCALINGS,
    SCHEMES,
    ExtrapolationConfig,
    ExtrapolationResult,
    ResultRow,
    SchemeRun,
    TaskRow,
    run_extrapolation,
)
from tokenpos.analysis.extrapolate.render import html_section, html_table, markdown_table, markdown_task_table
from tokenpos.analysis.extrapolate.tasks import TASKS, TaskConfig

__all__ = [
    "PROTOCOLS",
    "ROPE_SCALINGS",
    "SCHEMES",
    "TASKS",
    "ExtrapolationConfig",
    "ExtrapolationResult",
    "ResultRow",
    "SchemeRun",
    "TaskConfig",
    "TaskRow",
    "html_section",
    "html_table",
    "load_json",
    "markdown_table",
    "markdown_task_table",
    "run_extrapolation",
    "write_json",
]
