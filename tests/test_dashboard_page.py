"""The "dagtune" page for real: a study on the embedded Dask cluster feeds the page inside
Dask's dashboard, headless Chromium opens it while the study runs and after, and
``dagtune dashboard STORAGE`` serves the same page from storage afterwards."""

from __future__ import annotations

import asyncio
import threading

import pytest
from browser import FRAMES, chromium, missing_reason, rendered_when
from durable_helpers import SlowTrainer

import dagtune as dt
from dagtune.dashboard import page_url
from dagtune.dashboard.figures import COLORS, _width
from dagtune.dashboard.snapshot import live_snapshot

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(missing_reason() is not None, reason=missing_reason() or ""),
]

SPACE = dt.Grid(
    {
        "lr": [dt.Constant(0.1), dt.MultiStep(0.1, [10, 15], 0.1)],
        "momentum": [0.9, dt.Steps([0.9, 0.5], [6])],
    }
)
STEPS = 20


def inside(path: str, frame: dict):
    """The screenshot's pixels inside a figure's plotting area (RGB, rows by columns)."""
    import numpy as np
    from PIL import Image

    image = np.asarray(Image.open(path).convert("RGB")).astype(int)
    top, left = round(frame["top"]) + 1, round(frame["left"]) + 1
    return image[top : top + int(frame["height"]) - 2, left : left + int(frame["width"]) - 2]


def count(pixels, color: str) -> int:
    """How many pixels have exactly this colour (``#rrggbb``)."""
    import numpy as np

    rgb = [int(color[i : i + 2], 16) for i in (1, 3, 5)]
    return int((pixels == np.array(rgb)).all(axis=-1).sum())


def colourful(pixels) -> int:
    """How many pixels are saturated colours (curves), not white, grey grid lines or text."""
    return int((pixels.max(axis=-1) - pixels.min(axis=-1) > 60).sum())


def bar_pixels(snapshot: dict, frame: dict, state: str) -> float:
    """The area the bars in `state` cover in the tree's plotting area, in pixels."""
    tree = snapshot["tree"]
    per_step = frame["width"] / (frame["x_end"] - frame["x_start"])
    return sum(
        (tree["end"][i] - tree["start"][i]) * per_step * _width(tree["trials"][i])
        for i in range(len(tree["node"]))
        if tree["state"][i] == state
    )


def test_page_in_the_dask_dashboard_shows_the_running_study(tmp_path, capsys):
    study = dt.Study(
        SlowTrainer, trainer_kwargs={"delay": 0.25}, name="page", storage=tmp_path / "runs", workers=2
    )
    try:
        publisher = study._dashboard  # the embedded cluster serves the page, no extra step
        assert publisher is not None
        url = page_url(study.client)
        assert url is not None and url.startswith("http://127.0.0.1:") and url.endswith("/dagtune")
        assert f"live at {url}" in capsys.readouterr().out
        handles = [study.submit(config, STEPS) for config in SPACE]
        with chromium() as page:
            page.goto(url)
            live = page.wait_for(rendered_when("info.states.includes('running') && info.figures == 2"))
            shot = tmp_path / "live.png"
            page.screenshot(str(shot))
            frames = page.evaluate(FRAMES)
            assert frames["scale"] == 1
            assert "running" in live["states"] and live["critical"] > 0
            assert max(live["trials"]) == 4  # steps 0-6 are shared by all four trials
            assert count(inside(str(shot), frames["dagtune-tree"]), COLORS["running"]) >= 40  # a running bar
            for handle in handles:
                handle.result(timeout=120)
            publisher.publish()
            done = page.wait_for(rendered_when("info.counters.includes('4 completed') && info.figures == 2"))
            assert set(done["states"]) == {"done"} and done["lines"] == 4
            assert "merge rate" in done["counters"] and "best val_acc" in done["counters"]
            assert page.evaluate("!!document.querySelector('a[href$=\"dagtune\"]')")  # Dask's navigation
            shot = tmp_path / "page.png"
            page.screenshot(str(shot))
            frames = page.evaluate(FRAMES)
            tree = inside(str(shot), frames["dagtune-tree"])
            expected = bar_pixels(live_snapshot(study), frames["dagtune-tree"], "done")
            assert 0.5 * expected <= count(tree, COLORS["done"]) <= 1.5 * expected  # every bar drawn
            assert count(tree, COLORS["running"]) == count(tree, COLORS["queued"]) == 0
            assert colourful(inside(str(shot), frames["dagtune-curves"])) >= 1500  # the four curves
    finally:
        study.close()

    # the same page from storage alone
    from dagtune.dashboard.server import free_port, serve

    port, started, servers = free_port(), threading.Event(), []

    def run() -> None:
        asyncio.set_event_loop(asyncio.new_event_loop())
        servers.append(serve(str(tmp_path / "runs"), port=port, refresh=0.5))
        started.set()
        servers[0].io_loop.start()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert started.wait(30)
    try:
        with chromium() as page:
            page.goto(f"http://127.0.0.1:{port}/dagtune")
            stored = page.wait_for(rendered_when("info.figures == 2"))
            assert set(stored["states"]) == {"done"} and stored["pieces"] == done["pieces"]
            assert "4 completed" in stored["counters"] and stored["lines"] == 4
            executed = study.coordinator.executed_steps  # recorded by the study's session
            assert f"executed <b>{executed}</b>" in stored["counters"]
    finally:
        servers[0].io_loop.add_callback(servers[0].io_loop.stop)
        thread.join(timeout=10)
