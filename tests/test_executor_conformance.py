"""Executor conformance: the same scenarios on the simulated executor and on the Dask one (a
real LocalCluster, 2 worker processes) give the same trials, the same metrics, bit for bit,
and the same report figures.

The simulated executor is what the scheduling tests (and `perf/`) run on at cluster scale;
this suite is what lets them stand for Dask. Only what does not depend on timing is
compared: which trials there are, their status, cause and error, every metric of every
curve, and the step counts of the report (trial, unique and executed steps, merge rate,
reuse); not seconds, not which worker ran what. The scenarios are deterministic whatever
the timing: a grid with shared prefixes, synchronous successive halving (trials promoted by
`Extend` from their rung's checkpoint, the others left at their rung), a trial whose
trainer keeps failing (retried, then failed, while the others finish), and a study resumed
from storage (the trials of the first session adopted, the second training only what is new).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import pytest
from conformance_trainers import FailingTrainer

import dagtune as dt
from dagtune.algos import Algorithm, GridSearch, Submit, SuccessiveHalving
from dagtune.checkpoints import CheckpointStore
from dagtune.config import config_dumps
from dagtune.sim import SimulatedExecutor, SyntheticTrainer

pytestmark = pytest.mark.slow

EXECUTORS = ("simulated", "dask")
#: the report's figures that count steps and trials (not seconds)
COUNTS = ("trials", "trial_steps", "unique_steps", "executed_steps", "merge_rate", "reuse")

GRID = dt.Grid(
    {
        "lr": [dt.Constant(0.1), dt.MultiStep(0.1, [4, 6], 0.5)],
        "momentum": [0.0, dt.Steps([0.0, 0.9], [3])],
        "batch_size": [128, dt.Steps([128, 256], [5])],
    }
)


def open_study(
    kind: str, client: Any, storage: Any, trainer: type = SyntheticTrainer, **kwargs: Any
) -> dt.Study:
    """A study of `trainer` on the simulated executor or on the Dask client (each with 2
    workers), with storage on."""
    if kind == "simulated":
        executor = SimulatedExecutor(2, store=CheckpointStore(str(storage)))
        return dt.Study(trainer, storage=str(storage), executor=executor, **kwargs)
    return dt.Study(trainer, storage=str(storage), client=client, resources={"GPU": 1}, **kwargs)


def outcome(study: dt.Study, result: dt.Result | None = None) -> dict:
    """What must not depend on the executor: every trial (config, steps, status, cause, the
    last line of its error, its whole curve) and the report's counts."""
    view = study.view()
    trials = sorted(
        (
            t.id,
            config_dumps(t.config),
            t.steps,
            t.status,
            t.cause,
            t.error.strip().splitlines()[-1] if t.error else None,
            [(step, dict(metrics)) for step, metrics in t.curve],
        )
        for t in view.trials
    )
    report = result.report if result is not None else view.report
    return {"trials": trials, "report": {name: report[name] for name in COUNTS}}


def on_both(client: Any, tmp_path: Any, scenario: Callable[[str, Any], dict]) -> dict:
    """`scenario(kind, storage)` on each executor; the outcomes, which must be equal."""
    found = {kind: scenario(kind, tmp_path / kind) for kind in EXECUTORS}
    simulated, dask = found["simulated"], found["dask"]
    assert dask["report"] == simulated["report"]
    assert len(dask["trials"]) == len(simulated["trials"])
    for on_dask, simulated_trial in zip(dask["trials"], simulated["trials"]):
        assert on_dask == simulated_trial
    return simulated


def test_a_grid_with_shared_prefixes(client, tmp_path):
    def scenario(kind: str, storage: Any) -> dict:
        with open_study(kind, client, storage, name="grid") as study:
            result = study.run(GridSearch(GRID, metric="val_loss", mode="min", steps=8), timeout=300)
            return outcome(study, result)

    found = on_both(client, tmp_path, scenario)
    report = found["report"]
    assert report["trials"] == 8 and report["trial_steps"] == 64
    assert report["executed_steps"] == report["unique_steps"] < report["trial_steps"]
    assert {status for _, _, _, status, *_ in found["trials"]} == {"completed"}


def test_successive_halving_promotes_the_same_trials(client, tmp_path):
    def scenario(kind: str, storage: Any) -> dict:
        with open_study(kind, client, storage, name="halving") as study:
            algorithm = SuccessiveHalving(GRID, "val_loss", "min", min_steps=2, max_steps=8, eta=2)
            result = study.run(algorithm, timeout=300)
            return outcome(study, result) | {"best": result.best.id}

    found = on_both(client, tmp_path, scenario)
    reached = sorted(len(curve) for *_, curve in found["trials"])
    assert reached == [2, 2, 2, 2, 4, 4, 8, 8]  # 8 trials, 4 promoted to 4 steps, 2 of them to 8


class SubmitAll(Algorithm):
    """The given (config, steps) pairs, all at once."""

    def __init__(self, trials: list[tuple[dict, int]]):
        super().__init__("val_loss", "min")
        self.wanted = trials

    def start(self, ctx: Any) -> list[Submit]:
        return [Submit(config, steps) for config, steps in self.wanted]


FAILING = [
    ({"lr": dt.Steps([0.1, 0.05], [4])}, 6),
    ({"lr": dt.Steps([0.1, 0.02], [4])}, 6),
    ({"lr": 0.5}, 6),  # its trainer raises at step 3
]


def test_a_failing_trial_fails_the_same_way_and_the_others_finish(client, tmp_path):
    def scenario(kind: str, storage: Any) -> dict:
        with open_study(kind, client, storage, FailingTrainer, name="failing", max_retries=1) as study:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                result = study.run(SubmitAll(FAILING), timeout=300)
            assert any(issubclass(w.category, dt.TrialsFailedWarning) for w in caught)
            return outcome(study, result) | {"failed": [t.id for t in result.failed]}

    found = on_both(client, tmp_path, scenario)
    assert found["failed"] == [2]
    statuses = {config: (status, cause, error) for _, config, _, status, cause, error, _ in found["trials"]}
    assert sorted(status for status, _, _ in statuses.values()) == ["completed", "completed", "failed"]
    failed = next(v for v in statuses.values() if v[0] == "failed")
    assert failed[1] == "trainer" and "refused at step 3" in failed[2]


def test_a_study_resumed_from_storage_adopts_its_trials_and_trains_only_what_is_new(client, tmp_path):
    configs = list(GRID)

    def scenario(kind: str, storage: Any) -> dict:
        with open_study(kind, client, storage, name="resumed") as study:
            for handle in [study.submit(config, 8) for config in configs[:3]]:
                handle.result(timeout=300)
            first = outcome(study)
        with open_study(kind, client, storage, name="resumed") as study:
            result = study.run(GridSearch(GRID, metric="val_loss", mode="min", steps=8), timeout=300)
            return outcome(study, result) | {"first": first}

    found = on_both(client, tmp_path, scenario)
    assert found["first"]["report"]["trials"] == 3
    report = found["report"]
    assert report["trials"] == 8
    # the second session trains the steps the first one did not, and from the checkpoints it
    # left: the new configs' branch points inside the first session's paths have none, so
    # the steps from the checkpoint before each are trained again (on both executors alike)
    new = report["unique_steps"] - found["first"]["report"]["unique_steps"]
    assert new <= report["executed_steps"] < report["unique_steps"]
    assert found["trials"][:3] == found["first"]["trials"]  # adopted as they were
