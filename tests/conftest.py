"""Suite-wide test settings.

Hypothesis: no per-example deadline (a first call may compile a numba kernel) and, under CI, a
derandomized search so a CI run is reproducible; locally every run explores new examples.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

settings.register_profile("tokenpos", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("ci", parent=settings.get_profile("tokenpos"), derandomize=True, print_blob=True)
settings.load_profile("ci" if os.environ.get("CI") else "tokenpos")
