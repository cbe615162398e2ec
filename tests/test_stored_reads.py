"""Reading a large stored study (issue 24) on a small one written the way the perf store is
(`perf.stored_study`: dagtune's own writers; 100 shared prefixes, 3 branches each): the
figures `dagtune status` reads off the trials' paths are the coordinator's, and `dagtune
tree` folds what it does not show, saying how much and how to see it."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

import dagtune as dt
from dagtune.catalog import load_study, open_storage
from dagtune.cli import main
from dagtune.coordinator import trial_figures
from dagtune.plan import unique_steps
from perf.stored_study import generate


@pytest.fixture(scope="module")
def storage(tmp_path_factory) -> str:
    return f"{generate(300, tmp_path_factory.mktemp('stores'))}/runs"


def invoke(*args: str):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def by_configs(trials) -> int:
    """The unique steps of `trials` as defined: counted from their configs and reached steps."""
    return unique_steps([(t.config, t.reached) for t in trials if t.reached > 0])


def test_the_figures_off_the_paths_are_the_definitions(storage):
    stored = load_study(open_storage(storage), "big")
    report = stored.report()
    assert report["unique_steps"] == by_configs(stored.trials)
    ended = [t for t in stored.trials if t.done]
    assert trial_figures(ended)["unique_steps"] == by_configs(ended) < report["unique_steps"]
    assert report["trials"] == 300 and 2 * 100 < report["unique_steps"] < report["trial_steps"]
    private = stored.trials[:5]
    for trial in private:
        trial.salt = f"big/{trial.id}"  # a trial-based study's paths: counted by configs
    assert trial_figures(private)["unique_steps"] == by_configs(private)


def test_status_shows_the_counts_the_best_and_the_top_trials(storage):
    out = invoke("status", storage, "--study", "big", "--top", "3")
    assert out.exit_code == 0, out.output
    row = next(line for line in out.output.splitlines() if line.startswith("│ big"))
    assert [cell.strip() for cell in row.split("│")[2:7]] == ["300", "291", "3", "3", "3"]
    assert "best 3 trials by val_loss" in out.output
    best = dt.open_results(storage, "big").trials["val_loss"].min()
    assert f"val_loss {best:.4g}" in out.output


def test_tree_is_folded_and_says_how_to_see_more(storage):
    folded = invoke("tree", storage)
    assert folded.exit_code == 0
    assert "… 92 more branches (276 trial paths): --width 100" in folded.output
    assert "`--depth 0 --width 0` shows the whole tree" in folded.output
    assert folded.output.count("#") < 50
    shallow = invoke("tree", storage, "--depth", "1")
    assert "… 2 branches below (2 trial paths): --depth 2" in shallow.output
    whole = invoke("tree", storage, "--depth", "0", "--width", "0")
    assert whole.output.count("→ #") + whole.output.count(", #") == 300  # every trial ends somewhere
    assert "folded" not in whole.output
    refused = invoke("tree", storage, "--width", "-1")
    assert refused.exit_code == 2 and "--width must be 0 (all) or more, got -1" in refused.output
