"""The read index a study's writer leaves when it closes (`dagtune.study_index`, issue 24) is
built from what the session holds (`Persistence.session_study`), not by reading its journals
back: it is exactly the index `rebuild_index` reads from the same store (the same decoded
content, the page snapshot's time stamp aside), for a fresh study, a resumed one, two studies
of one model sharing the plan (one writing it while the other is open), and trials completed,
failed, diverged, stopped and pending (one extended after it completed, training on when the
study closed); and closing decodes no journal line, however many trials the study holds."""

from __future__ import annotations

import json
import zlib

import pytest
from durable_helpers import SlowTrainer, count_counting_plans, count_lines

import dagtune as dt
from dagtune.algos import GridSearch, SuccessiveHalving
from dagtune.checkpoints import CheckpointStore
from dagtune.durable import Persistence, index_path
from dagtune.records import COMPLETED, DIVERGED, FAILED, PENDING, STOPPED
from dagtune.sim import SimulatedExecutor
from dagtune.study_index import read_index, rebuild_index


class FailingTrainer(SlowTrainer):
    """`SlowTrainer` whose trainer raises at its third step for a learning rate of 0.3."""

    def train(self) -> dict:
        if float(self.hp["lr"]) == 0.3 and self.step == 2:
            raise RuntimeError("the trainer failed at step 3")
        return super().train()


def opened(path: str, name: str = "s") -> dt.Study:
    return dt.Study(
        FailingTrainer,
        name=name,
        trainer_kwargs={"delay": 0.002},  # slow enough to stop or close mid-training
        executor=SimulatedExecutor(4, store=CheckpointStore(path)),
    )


def stored_index(store: CheckpointStore, name: str) -> dict:
    """Study `name`'s index as stored, decoded, without the page snapshot's time stamp."""
    index = json.loads(zlib.decompress(store.fs.cat_file(index_path(store.root, name))))
    del index["snapshot"]["time"]
    return index


def assert_as_rebuilt(path: str, name: str = "s") -> dict:
    """The index the closing writer left is the one `rebuild_index` reads from the journals."""
    store = CheckpointStore(path)
    written = stored_index(store, name)
    rebuild_index(store, name)
    rebuilt = stored_index(store, name)
    assert written == rebuilt
    return written


def wait_for(study: dt.Study, condition) -> None:
    """Turn the simulated study (its waiters turn it) until `condition` holds."""
    study._loop.wait(condition, 60.0)
    assert condition(), "the simulated study did not get there"


def extend(study: dt.Study, trial_id: int, steps: int) -> None:
    study._loop.call(study.coordinator.extend, trial_id, steps)


def mixed_session(study: dt.Study, offset: float) -> dict[str, int]:
    """Trials of every status in one session of `study` (ids by what they end as)."""
    done = [study.submit({"lr": 0.01 + offset * k, "momentum": 0.9}, 4) for k in range(3)]
    failed = study.submit({"lr": 0.3, "momentum": 0.9}, 5)
    diverged = study.submit({"lr": 1e6 + offset, "momentum": 0.9}, 5)
    for handle in [*done, diverged]:
        handle.result()
    with pytest.raises(dt.TrialError):
        failed.result()
    stopped = study.submit({"lr": 0.02 + offset, "momentum": 0.0}, 400)
    wait_for(study, lambda: stopped.trial.reported >= 2)
    stopped.stop()
    extend(study, done[0].id, 400)  # completed, then extended: pending, training on at close
    wait_for(study, lambda: done[0].trial.reported >= 6)
    pending = study.submit({"lr": 0.05 + offset, "momentum": 0.5}, 400)
    wait_for(study, lambda: pending.trial.reported >= 1)
    statuses = {
        "completed": done[1].trial.status,
        "failed": failed.trial.status,
        "diverged": diverged.trial.status,
        "stopped": stopped.trial.status,
        "extended": done[0].trial.status,
        "pending": pending.trial.status,
    }
    assert statuses == {
        "completed": COMPLETED,
        "failed": FAILED,
        "diverged": DIVERGED,
        "stopped": STOPPED,
        "extended": PENDING,
        "pending": PENDING,
    }
    return {"extended": done[0].id, "pending": pending.id}


@pytest.mark.slow
def test_the_closing_index_of_a_fresh_and_a_resumed_study_is_the_rebuilt_one(tmp_path, monkeypatch):
    path = str(tmp_path / "runs")
    built = []
    original = Persistence.session_study

    def session_study(self):
        held = original(self)
        built.append(held is not None)
        return held

    monkeypatch.setattr(Persistence, "session_study", session_study)
    with opened(path) as study:
        ids = mixed_session(study, 0.0)
    first = assert_as_rebuilt(path)
    assert first["status"]["counters"]["pending"] == 2 and first["trials"] == 7
    assert "detail" in first and first["detail"]["incidents"] == []
    with opened(path) as study:  # resumed: the pending trials go on, more are added
        restored = {t.id: t for t in study.coordinator.trials.values()}
        wait_for(study, lambda: restored[ids["pending"]].reported >= 2)
        handle = study.submit({"lr": 0.01, "momentum": 0.9}, 4)  # a restored trial's config
        assert handle.id in restored
        mixed_session(study, 0.001)
        study.submit({"lr": 0.05, "momentum": 0.5}, 400)  # the pending restored trial, taken
    second = assert_as_rebuilt(path)
    assert second["trials"] == 12 and second["status"]["counters"]["pending"] == 4
    with opened(path) as study:  # a third session that adds nothing
        pass
    assert_as_rebuilt(path)
    assert built == [True, True, True]  # every index built from what the session held


@pytest.mark.slow
def test_the_closing_index_of_two_studies_sharing_the_plan_is_the_rebuilt_one(tmp_path):
    path = str(tmp_path / "runs")
    space = dt.Grid({"lr": [0.01, dt.Steps([0.01, 0.02], [3]), 0.3], "momentum": [0.0, 0.9]})
    with opened(path, "s") as first:  # "h" writes the shared plan while "s" is open
        first.submit({"lr": 0.01, "momentum": 0.0}, 6).result()
        with opened(path, "h") as second:
            second.run(
                SuccessiveHalving(list(space), metric="val_loss", mode="min", min_steps=2, max_steps=8)
            )
        first.run(GridSearch(list(space), metric="val_loss", mode="min", steps=6))
    store = CheckpointStore(path)
    assert "detail" in assert_as_rebuilt(path, "s")  # its plan read afresh: its incidents known
    assert stored_index(store, "h")["covers"] != stored_index(store, "s")["covers"]  # "s" wrote since
    with opened(path, "h") as again:  # resumed after "s" wrote the plan: its plan as it opened
        again.submit({"lr": 0.01, "momentum": 0.5}, 3).result()
    assert_as_rebuilt(path, "h")
    assert read_index(store, "s") is None  # "h" wrote the plan since "s" closed: stale


def test_closing_decodes_no_journal_line_however_many_trials_the_study_holds(tmp_path, monkeypatch):
    decoded = count_lines(monkeypatch)
    counts = {}
    for n in (4, 16):
        path = str(tmp_path / f"runs{n}")
        counts[n] = closed_grid_counting(path, n, decoded)
        assert stored_index(CheckpointStore(path), "s")["trials"] == n
    assert counts == {4: 0, 16: 0}


def closed_grid_counting(path: str, n: int, counter: list[int]) -> int:
    """Run an `n`-trial grid in a study at `path`, then close it: what `counter` counted
    while it closed."""
    study = opened(path)
    study.run(GridSearch([{"lr": 0.01 * (k + 1)} for k in range(n)], metric="val_loss", mode="min", steps=3))
    counter[0] = 0
    study.close()
    return counter[0]


def test_closing_builds_no_counting_plan_of_the_ended_trials(tmp_path, monkeypatch):
    """The report's unique steps and the page snapshot's merge rate so far are read off the
    plan's paths at close, not from a counting plan of every ended trial's config built again
    (`unique_steps`): the configs counted at close stay 0 however many trials the study holds
    (they were 4 and 16 for the snapshot alone)."""
    counted = count_counting_plans(monkeypatch)
    counts = {}
    for n in (4, 16):
        path = str(tmp_path / f"runs{n}")
        counts[n] = closed_grid_counting(path, n, counted)
        index = assert_as_rebuilt(path)
        assert (
            index["snapshot"]["counters"]["merge_rate_ended"]
            == index["status"]["counters"]["merge_rate_ended"]
        )
        assert index["snapshot"]["counters"]["ended"] == n
    assert counts == {4: 0, 16: 0}
