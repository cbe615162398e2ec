"""The "dagtune" page for real: a study on the embedded Dask cluster feeds the page inside
Dask's dashboard, headless Chromium opens it while the study runs and after, and
``dagtune dashboard STORAGE`` serves the same page from storage afterwards."""

from __future__ import annotations

import asyncio
import threading

import pytest
from browser import chromium, missing_reason, rendered_when
from durable_helpers import SlowTrainer

import dagtune as dt
from dagtune.dashboard import attach, page_url

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


def non_blank(path: str) -> float:
    """The fraction of the screenshot's pixels that are not the page background."""
    import numpy as np
    from PIL import Image

    pixels = np.asarray(Image.open(path).convert("RGB")).reshape(-1, 3)
    colors, counts = np.unique(pixels, axis=0, return_counts=True)
    background = colors[counts.argmax()]
    return float((pixels != background).any(axis=1).mean())


def test_page_in_the_dask_dashboard_shows_the_running_study(tmp_path, capsys):
    study = dt.Study(
        SlowTrainer, trainer_kwargs={"delay": 0.25}, name="page", storage=tmp_path / "runs", workers=2
    )
    try:
        publisher = getattr(study, "_dashboard", None) or attach(study, interval=0.5)
        url = page_url(study.client)
        assert url is not None and url.startswith("http://127.0.0.1:") and url.endswith("/dagtune")
        assert f"live at {url}" in capsys.readouterr().out
        handles = [study.submit(config, STEPS) for config in SPACE]
        with chromium() as page:
            page.goto(url)
            live = page.wait_for(rendered_when("info.states.includes('running')"))
            assert "running" in live["states"] and live["critical"] > 0
            assert max(live["trials"]) == 4  # steps 0-6 are shared by all four trials
            for handle in handles:
                handle.result(timeout=120)
            publisher.publish()
            done = page.wait_for(rendered_when("info.counters.includes('4 completed')"))
            assert set(done["states"]) == {"done"} and done["lines"] == 4
            assert "merge rate" in done["counters"] and "best val_acc" in done["counters"]
            assert page.evaluate("!!document.querySelector('a[href$=\"dagtune\"]')")  # Dask's navigation
            shot = tmp_path / "page.png"
            page.screenshot(str(shot))
            assert non_blank(str(shot)) > 0.05
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
            stored = page.wait_for(rendered_when())
            assert set(stored["states"]) == {"done"} and stored["pieces"] == done["pieces"]
            assert "4 completed" in stored["counters"] and stored["lines"] == 4
    finally:
        servers[0].io_loop.add_callback(servers[0].io_loop.stop)
        thread.join(timeout=10)
