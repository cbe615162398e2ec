"""The running page's benchmark (`perf.live_page`, RESULTS 9l): it reaches the mid-run state
it names (3N steps of N trials, most pending) and reports each phase's figures."""

from __future__ import annotations

from perf.live_page import BRANCHES, STEPS, measure, space


def test_the_space_has_n_trials_of_ten_schedules_per_rate():
    configs = list(space(40))
    assert len(configs) == 40
    assert len({c["lr"] for c in configs}) == 40 // BRANCHES


def test_measure_stops_mid_run_with_every_figure():
    row = measure(40, workers=8, repeat=1)
    assert 3 * 40 <= row["executed"] < 40 * STEPS  # mid-run: not every step trained
    assert row["pumps"] >= row["executed"] // 8 and row["pump_s"] >= 0
    for key in ("submit_s", "view_s", "view_gc_s", "snapshot_s", "snapshot_gc_s", "snapshot_kept_s"):
        assert row[key] >= 0
    assert row["view_full_gcs"] >= 0 and row["objects_tracked"] > 0
