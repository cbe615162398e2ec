"""Failures and what a study opened again does with them: every failed trial's end record
says why it failed (``cause``); a trial that failed outside its trainer (storage) trains
again when the study is opened again, from its latest checkpoint, and ends as if nothing
had happened; one its trainer failed stays failed unless asked (``retry_failed=True``,
``dagtune run --retry-failed``). Also: a checkpoint carries the metrics the coordinator
may never have recorded, and a task resuming from it sends them first."""

from __future__ import annotations

import os
import textwrap

import pytest
from click.testing import CliRunner

import dagtune as dt
from dagtune.catalog import load_study, open_storage
from dagtune.checkpoints import CheckpointError, CheckpointStore
from dagtune.cli import main
from dagtune.config import config_to_json, normalize_config
from dagtune.durable import records_header
from dagtune.events import CheckpointSaved, MetricsReported, StateLoaded, StepDone
from dagtune.plan import Journal
from dagtune.records import RecordError, parse_trial_record, read_study_records
from dagtune.runner import PathRunner, checkpoint_parts
from dagtune.sim import SimulatedExecutor, SyntheticTrainer
from dagtune.study import Study, TrialError, run_alone
from dagtune.tasks import PathTask, Segment, TrainerSpec
from dagtune.trainer import capture_rng

CONFIG = {"lr": dt.MultiStep(0.1, [3], 0.5), "batch_size": 128}
JSON = config_to_json(normalize_config({"lr": 0.1}))
NODE = "00000000000000a1"


# --------------------------------------------------------------------------- records


def test_an_end_record_says_why_a_trial_failed_and_a_retry_record_makes_it_pending_again():
    lines = [
        {"r": "submit", "trial": 0, "config": JSON, "steps": 4},
        {
            "r": "end",
            "trial": 0,
            "status": "failed",
            "steps": 2,
            "metrics": None,
            "error": "x",
            "cause": "storage",
        },
        {"r": "retry", "trial": 0},
        {"r": "submit", "trial": 1, "config": JSON, "steps": 4},
        {
            "r": "end",
            "trial": 1,
            "status": "failed",
            "steps": 2,
            "metrics": None,
            "error": "y",
        },  # before causes
        {"r": "submit", "trial": 2, "config": JSON, "steps": 4},
        {"r": "end", "trial": 2, "status": "completed", "steps": 4, "metrics": {"loss": 0.5}},
        {"r": "retry", "trial": 2},  # 8: only a failed trial is retried
        {"r": "retry", "trial": 7},  # 9: never submitted
    ]
    folded = read_study_records((record, f"f:{i}") for i, record in enumerate(lines, start=1))
    assert [where for where, _ in folded.skipped] == ["f:8", "f:9"]
    assert "trial 2 is completed: only a failed trial is retried" in dict(folded.skipped)["f:8"]
    retried, old, done = folded.trials[0], folded.trials[1], folded.trials[2]
    assert (retried.status, retried.reached, retried.error, retried.cause) == ("pending", 0, None, None)
    assert (old.status, old.cause) == ("failed", None)
    assert done.status == "completed"


@pytest.mark.parametrize("cause", ["disk", 3, ""])
def test_an_unknown_failure_cause_is_refused(cause):
    record = {"r": "end", "trial": 0, "status": "failed", "steps": 1, "error": "x", "cause": cause}
    with pytest.raises(
        RecordError, match="end record field 'cause' must be one of trainer, timeout, workers, storage"
    ):
        parse_trial_record(record)


@pytest.mark.parametrize(
    ("cause", "retry_failed", "retried"),
    [
        ("workers", False, True),
        ("storage", False, True),
        ("trainer", False, False),
        (None, False, False),  # written before causes were
        ("trainer", True, True),
        ("timeout", True, True),
    ],
)
def test_opening_a_study_again_retries_the_failures_outside_the_trainer(
    tmp_path, cause, retry_failed, retried
):
    path = str(tmp_path / "runs")
    store = CheckpointStore(path)

    def study(**options) -> Study:
        return Study(
            SyntheticTrainer,
            name="again",
            storage=path,
            executor=SimulatedExecutor(1, store=store),
            **options,
        )

    with study() as first:
        first.submit(CONFIG, 4).result()
    ended = {"r": "end", "trial": 1, "status": "failed", "steps": 0, "metrics": None, "error": "it failed"}
    journal = Journal(store.fs, f"{store.root}/studies/again/journal", header=records_header("again"))
    journal.append(
        {"r": "submit", "trial": 1, "config": config_to_json(normalize_config(CONFIG)), "steps": 6}
    )
    journal.append({**ended, **({"cause": cause} if cause else {})}, sync=True)
    with study(retry_failed=retry_failed) as second:
        trial = second.trials[1]
        if retried:
            assert trial.result() == run_alone(SyntheticTrainer, CONFIG, 6)[-1]
        else:
            assert (trial.status, trial.trial.cause) == ("failed", cause)
    (_, stored) = load_study(open_storage(path), "again").trials
    assert stored.status == ("completed" if retried else "failed")


# --------------------------------------------------------------------------- carried metrics


def path_task(checkpoints, end: int = 6) -> PathTask:
    return PathTask(
        key="t",
        trainer=TrainerSpec(SyntheticTrainer, {}, 0, "a1b2c3d4e5f60718"),
        segments=(Segment(NODE, normalize_config(CONFIG), 0, end),),
        source=None,
        checkpoints=frozenset(checkpoints),
    )


def test_a_task_resuming_from_a_checkpoint_the_coordinator_never_heard_of_sends_what_it_covers(tmp_path):
    store = CheckpointStore(str(tmp_path / "runs"))
    lost = PathRunner(path_task([2, 4, 6]), store)  # its worker dies after saving step 4
    for events in lost.steps():
        if any(isinstance(e, CheckpointSaved) and e.step == 4 for e in events):
            break
    again = PathRunner(path_task([2, 4, 6]), store).run()
    kinds = [
        (e.kind, e.step)
        for e in again
        if isinstance(e, StateLoaded | MetricsReported | CheckpointSaved | StepDone)
    ]
    # first what the checkpoint at 4 covers (its metrics, then itself), then steps 5 and 6
    assert kinds[:6] == [("load", 4), *(("metrics", s) for s in (1, 2, 3, 4)), ("checkpoint", 4)]
    assert kinds[6:] == [("metrics", 5), ("step", 5), ("metrics", 6), ("checkpoint", 6), ("step", 6)]
    metrics = [e.metrics for e in again if isinstance(e, MetricsReported)]
    assert metrics == run_alone(SyntheticTrainer, CONFIG, 6)  # the whole curve, bit for bit


def test_a_checkpoint_whose_carried_metrics_are_not_what_dagtune_writes_is_corrupt():
    state = {"trainer": {}, "rng": capture_rng()}
    assert checkpoint_parts(state)[2] == []  # saved before checkpoints carried metrics
    for bad in (
        "x",
        [["../x", 1, {}]],
        [[NODE, 0, {}]],
        [[NODE, 1, {"a": "0.1"}]],
        [[NODE, True, {}]],
        [[NODE]],
    ):
        with pytest.raises(CheckpointError, match="not a training state: its 'metrics'"):
            checkpoint_parts({**state, "metrics": bad})


# --------------------------------------------------------------------------- storage failures


@pytest.mark.slow
def test_a_trial_storage_failed_trains_again_when_the_study_is_opened_again(client, tmp_path):
    storage = str(tmp_path / "runs")
    options = {"storage": storage, "client": client, "resources": {"GPU": 1}, "checkpoint_every": 2}
    with Study(SyntheticTrainer, name="full", **options) as study:
        blocked = os.path.join(storage, study.identity, "checkpoints")
        os.makedirs(os.path.dirname(blocked), exist_ok=True)
        with open(blocked, "w") as file:  # no checkpoint can be read or written under it
            file.write("in the way")
        handle = study.submit(CONFIG, 6)
        with pytest.raises(TrialError, match=r"NotADirectoryError|FileExistsError"):
            handle.result(timeout=300)
        assert (handle.status, handle.trial.cause) == ("failed", "storage")
    (stored,) = load_study(open_storage(storage), "full").trials
    assert (stored.status, stored.cause) == ("failed", "storage")
    os.remove(blocked)  # storage works again
    with Study(SyntheticTrainer, name="full", **options) as study:
        (trial,) = study.trials
        assert trial.result(timeout=300) == run_alone(SyntheticTrainer, CONFIG, 6)[-1]
        assert [metrics for _, metrics in trial.curve()] == run_alone(SyntheticTrainer, CONFIG, 6)
    (stored,) = load_study(open_storage(storage), "full").trials
    assert stored.status == "completed"


FLAKY = textwrap.dedent(
    """
    import os

    import dagtune as dt
    from dagtune.algos import GridSearch
    from dagtune.launch import StudySetup
    from dagtune.sim import SyntheticTrainer


    class Flaky(SyntheticTrainer):
        \"\"\"Fails at step 3 while the file BROKEN exists (a bug fixed later, a missing input).\"\"\"

        def __init__(self, broken: str = "", **kwargs):
            super().__init__(**kwargs)
            self.broken = broken

        def train(self):
            if self.step == 3 and os.path.exists(self.broken):
                raise RuntimeError("the input is broken")
            return super().train()


    def study_setup():
        space = dt.Grid({"lr": [0.1, 0.05]})
        return StudySetup(
            trainer=Flaky,
            trainer_kwargs={"broken": os.environ["FLAKY_BROKEN"]},
            algorithm=GridSearch(space, metric="val_loss", steps=6),
            name="flaky",
            options={"max_retries": 0, "checkpoint_every": 2},
        )
    """
)


@pytest.mark.slow
def test_trials_the_trainer_failed_train_again_only_with_retry_failed(tmp_path, monkeypatch):
    from distributed import LocalCluster

    (tmp_path / "flaky.py").write_text(FLAKY)
    broken = tmp_path / "BROKEN"
    broken.write_text("")
    monkeypatch.setenv("FLAKY_BROKEN", str(broken))
    runs = str(tmp_path / "runs")
    with LocalCluster(
        n_workers=1,
        threads_per_worker=1,
        processes=False,
        protocol="tcp://",
        host="127.0.0.1",
        dashboard_address="127.0.0.1:0",
    ) as cluster:
        args = [
            "run",
            str(tmp_path / "flaky.py"),
            "--scheduler",
            cluster.scheduler_address,
            "--storage",
            runs,
        ]

        def statuses() -> list[tuple[str, str | None]]:
            return [(t.status, t.cause) for t in load_study(open_storage(runs), "flaky").trials]

        first = CliRunner().invoke(main, args)
        assert statuses() == [("failed", "trainer")] * 2, first.output
        broken.unlink()  # fixed
        CliRunner().invoke(main, args)
        assert statuses() == [("failed", "trainer")] * 2  # the trainer failed them: not retried by itself
        out = CliRunner().invoke(main, [*args, "--retry-failed"])
        assert out.exit_code == 0, out.output
        assert statuses() == [("completed", None)] * 2
    curves = dt.open_results(runs, "flaky").curve("val_loss").to_numpy()
    for row, lr in zip(curves, [0.1, 0.05], strict=True):
        expected = [m["val_loss"] for m in run_alone(SyntheticTrainer, {"lr": lr}, 6)]
        assert row.tolist() == expected  # retried from their step-2 checkpoints: whole curves
