"""Test configuration: hypothesis profiles and import paths.

`tests/` (for `strategies.py`) and `examples/` (for the example trainers) go on sys.path before
any Dask worker process is spawned, so workers can import the trainers too.
"""

import os
import sys

from hypothesis import HealthCheck, settings

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples"))

# "default": fast enough for every commit; "thorough": HYPOTHESIS_PROFILE=thorough for a long soak.
settings.register_profile(
    "default", deadline=None, max_examples=100, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile(
    "thorough", deadline=None, max_examples=2000, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))
