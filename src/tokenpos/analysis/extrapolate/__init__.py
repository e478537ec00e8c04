"""Train short, test long: the length-extrapolation experiment behind ``tokenpos extrapolate``.

Import-light: torch and matplotlib are imported inside the functions that need them.

    config = ExtrapolationConfig(seed=0)            # or ExtrapolationConfig.quick()
    result = run_extrapolation(config, progress=None)
    write_json(result, "out.json"); markdown_table(result.to_dict())
"""

from tokenpos.analysis.extrapolate.experiment import (
    ROPE_SCALINGS,
    SCHEMES,
    ExtrapolationConfig,
    ExtrapolationResult,
    ResultRow,
    SchemeRun,
    run_extrapolation,
)
from tokenpos.analysis.extrapolate.results import html_section, html_table, load_json, markdown_table, write_json

__all__ = [
    "ROPE_SCALINGS",
    "SCHEMES",
    "ExtrapolationConfig",
    "ExtrapolationResult",
    "ResultRow",
    "SchemeRun",
    "html_section",
    "html_table",
    "load_json",
    "markdown_table",
    "run_extrapolation",
    "write_json",
]
