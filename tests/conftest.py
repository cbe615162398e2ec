"""Test configuration: hypothesis profiles and import paths.

`tests/` (for `strategies.py`) and `examples/` (for the example trainers) go on sys.path before
any Dask worker process is spawned, so workers can import the trainers too.
"""

import os
import sys
import warnings

import dask
import pytest
from hypothesis import HealthCheck, settings

from dagtune.execution.dask import DASK_TRIM

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


# --------------------------------------------------------------------------- a Dask cluster

# The test clusters' workers keep glibc's malloc thresholds, as dagtune's embedded cluster
# does (`dagtune.execution.dask.glibc_thresholds`): Dask's 64 KiB trim threshold slows training.
dask.config.set({DASK_TRIM: None})


@pytest.fixture(scope="session")
def shared_cluster():
    """One real 2-worker LocalCluster (each worker offers GPU=1) shared by the integration tests."""
    from clusters import local_client

    with local_client(resources={"GPU": 1}) as client:
        yield client


@pytest.fixture
def client(shared_cluster, request):
    """The shared cluster's client; a test that leaves it busy (a task still running, a worker
    short) gets a warning, and its workers are restarted so that no later test inherits it."""
    from clusters import leftover_work

    yield shared_cluster
    left = leftover_work(shared_cluster, workers=2, settle=30)
    if left:
        shared_cluster.restart(wait_for_workers=True, timeout=120)
        warnings.warn(
            f"{request.node.nodeid} left the shared cluster busy ({left}): its workers restarted",
            stacklevel=2,
        )


# --------------------------------------------------------------------------- durability storage


@pytest.fixture(scope="session")
def s3_options():
    """A loopback S3 endpoint (moto's server on 127.0.0.1) for the whole session."""
    from durable_helpers import loopback_s3

    with loopback_s3() as options:
        yield options


@pytest.fixture(params=["local", "s3"])
def storage(request, tmp_path):
    """Where a durability test keeps its studies: a local directory, or a fresh bucket on
    the loopback S3 endpoint."""
    from durable_helpers import Storage, new_bucket

    if request.param == "local":
        return Storage("local", str(tmp_path / "runs"))
    options = request.getfixturevalue("s3_options")
    return Storage("s3", f"s3://{new_bucket(options)}/runs", dict(options))
