"""A surrogate study on the command line and the views: ``dagtune run --surrogate S`` shows
the search's and the target's progress, ``dagtune status`` and the page say which study is
the surrogate and which the target."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from click.testing import CliRunner
from test_surrogate import ScaledSynthetic

import dagtune as dt
from dagtune.algos import GridSearch
from dagtune.catalog import load_study, open_storage
from dagtune.checkpoints import CheckpointStore
from dagtune.cli import main
from dagtune.dashboard.page import labels
from dagtune.dashboard.snapshot import live_snapshot, stored_snapshot
from dagtune.records import RecordError, StudyLink, parse_trial_record
from dagtune.sim import SimulatedExecutor

SPACE = dt.Grid({"lr": [0.005, 0.02]})


@pytest.fixture(scope="module")
def storage(tmp_path_factory):
    """Storage holding a finished simulated surrogate study "sur" (and "sur-target")."""
    path = str(tmp_path_factory.mktemp("surrogate") / "runs")
    store = CheckpointStore(path)
    with dt.SurrogateStudy(
        ScaledSynthetic,
        surrogate=dt.Surrogate(scale=4),
        name="sur",
        storage=path,
        executor=SimulatedExecutor(1, store=store),
        target_executor=SimulatedExecutor(1, store=store),
    ) as study:
        study.run(GridSearch(SPACE, "val_loss", "min", steps=4))
        assert live_snapshot(study.surrogate_study)["link"] == "surrogate (S=4) of sur-target"
    return path


def test_status_says_which_study_is_the_surrogate_and_which_the_target(storage):
    out = CliRunner().invoke(main, ["status", storage], catch_exceptions=False)
    assert out.exit_code == 0, out.output
    lines = out.output.splitlines()
    assert any("sur " in line and "surrogate (S=4) of sur-target" in line for line in lines), out.output
    assert any("sur-target" in line and "target of sur (S=4)" in line for line in lines), out.output


def test_the_page_labels_the_two_studies(storage):
    store = open_storage(storage)
    snapshots = {name: stored_snapshot(load_study(store, name)) for name in ("sur", "sur-target")}
    assert labels(snapshots) == [
        ("sur", "sur — surrogate (S=4) of sur-target"),
        ("sur-target", "sur-target — target of sur (S=4)"),
    ]


def test_a_resumed_surrogate_study_trains_nothing_again(storage):
    store = CheckpointStore(storage)
    with dt.SurrogateStudy(
        ScaledSynthetic,
        surrogate=dt.Surrogate(scale=4),
        name="sur",
        storage=storage,
        executor=SimulatedExecutor(1, store=store),
        target_executor=SimulatedExecutor(1, store=store),
    ) as study:
        result = study.run(GridSearch(SPACE, "val_loss", "min", steps=4))
    assert result.surrogate.report["executed_steps"] == 0 and result.target_report["executed_steps"] == 0
    assert result.target.metrics == dt.run_alone(ScaledSynthetic, result.config, 4)[-1]


def test_links_are_checked_when_read_back():
    opened = {
        "r": "open",
        "identity": "0123456789abcdef",
        "role": "surrogate",
        "partner": "a-target",
        "scale": 8,
    }
    assert parse_trial_record(opened).link == StudyLink("surrogate", "a-target", 8)
    with pytest.raises(RecordError, match=r"field 'scale' must be an int >= 2, got 1"):
        parse_trial_record({**opened, "scale": 1})
    with pytest.raises(RecordError, match=r"field 'role' must be one of surrogate, target, got 'boss'"):
        parse_trial_record({**opened, "role": "boss"})
    with pytest.raises(ValueError, match=r"StudyLink.partner must be a study name, got 'a b'"):
        StudyLink("target", "a b", 8)


SCRIPT = textwrap.dedent(
    """
    import dagtune as dt
    from dagtune.algos import GridSearch
    from dagtune.launch import StudySetup
    from dagtune.sim import SyntheticTrainer


    class Scaled(SyntheticTrainer):
        def __init__(self, scale=1, seed=0):
            super().__init__(noise=0.05 * scale, seed=seed)


    def study_setup():
        space = dt.Grid({"lr": [0.005, 0.02]})
        return StudySetup(trainer=Scaled, algorithm=GridSearch(space, "val_loss", "min", steps=5), name="tiny")
    """
)


def test_run_with_a_surrogate_shows_the_search_and_the_target(tmp_path):
    (tmp_path / "tiny.py").write_text(SCRIPT)
    runs = tmp_path / "runs"
    command = [
        sys.executable,
        "-m",
        "dagtune.cli",
        "run",
        "tiny.py",
        "--workers",
        "1",
        "--storage",
        str(runs),
    ]
    done = subprocess.run(
        [*command, "--surrogate", "4"], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "dagtune tiny (surrogate): 2/2 trials finished, 10 steps trained" in done.stderr
    assert "dagtune tiny-target (target): 1/1 trials finished, 5 steps trained" in done.stderr
    assert "2 trials: trained 10 steps for 10 trial steps" in done.stdout
    assert "target (S=1, transferred from S=4): val_loss = " in done.stdout
    assert "after 5 steps; trained 5 steps" in done.stdout
    status = CliRunner().invoke(main, ["status", str(runs)], catch_exceptions=False)
    assert "target of tiny (S=4)" in status.output
    bad = CliRunner().invoke(
        main, ["run", str(tmp_path / "tiny.py"), "--storage", str(runs), "--surrogate", "1"]
    )
    assert bad.exit_code == 2 and "--surrogate" in bad.output


def test_a_target_stopped_in_an_earlier_session_is_trained_anew(tmp_path):
    """An eager target stopped for a better config, when that config wins after all on resume."""
    path = str(tmp_path / "runs")
    store = CheckpointStore(path)
    config = {"lr": 0.01}
    link = StudyLink("target", "again", 2)
    with dt.Study(
        ScaledSynthetic,
        name="again-target",
        storage=path,
        executor=SimulatedExecutor(1, store=store),
        link=link,
    ) as target:
        target.submit(config, 4).stop()
    with dt.SurrogateStudy(
        ScaledSynthetic,
        surrogate=dt.Surrogate(scale=2),
        name="again",
        storage=path,
        executor=SimulatedExecutor(1, store=store),
        target_executor=SimulatedExecutor(1, store=store),
    ) as study:
        result = study.run(GridSearch([config], "val_loss", "min", steps=4))
    assert result.target.status == "completed" and result.target.steps == 4
    assert result.target.metrics == dt.run_alone(ScaledSynthetic, config, 4)[-1]
