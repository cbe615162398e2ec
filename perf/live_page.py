"""What a running study's page costs at N trials, mid-run (issue 24, RESULTS 9l), and what
reaching that state costs.

A simulated grid of N trials x 12 steps, 10 per shared prefix (N/10 constant learning rates,
each with 10 batch-size schedules that part at steps 1 to 10), submitted one by one with
`Study.submit` on `SimulatedExecutor` (100 virtual workers; memory path: a study given an
executor takes its store, here the simulator's `MemoryStore`, so it has no journals), then pumped
(`Coordinator.pump`) until 3N steps ran: mid-run, most trials pending. Then
`Study.view(schedule=True)` (taken under the study's lock) and
`dagtune.dashboard.snapshot.live_snapshot` (the page's snapshot, the view included) are
timed `--repeat` times in CPU seconds (median), with the cyclic garbage collector's share
of them (``view_gc_s``, ``snapshot_gc_s``: the median of its CPU inside each call; the full
collections in all, ``*_full_gcs``; a full collection walks every object the process tracks,
``objects_tracked`` at the end, the simulator's checkpoints included: `MemoryStore` keeps a
deep copy of each, its generators' states as Python objects). ``snapshot_kept_s`` is the
snapshot as the page's feed makes it (`SnapshotFeed`: the tree's labels kept from the earlier
snapshots of the study, so it labels only the nodes new since; ``snapshot_s`` labels every
node, as a first snapshot does). ``snapshot_feed_s`` is the snapshot the page's feed makes
of a study that goes on: `--repeat` times, `--pumps-between` pumps (default 100), then one
timed snapshot with what the feed keeps (`dagtune.dashboard.kept.KeptSnapshot`: the tree's
layout and the curves, so it redoes what changed; on code without it, the kept labels), its
first one timed apart (``snapshot_feed_first_s``: it lays out everything) and what the last one
walked (``feed_walked``: trials, segments, points, nodes cut, and the trials looked at: on
code whose views tell which trials changed, those only). ``view_feed_s`` is the view
alone taken the same way (`--pumps-between` pumps before each: on code that keeps the trials'
snapshots between views, it copies the trials that changed; ``view_s`` above is a view taken
again with nothing changed), with the trials its last one snapshotted (``view_feed_snapshotted``:
calls of `dagtune.records.Trial.snapshot` in it, counted by wrapping that public method, so on
any code) and the stages its schedule placed again or read on the critical path
(``view_feed_stages_read``: `IncrementalPlanner.view_reads`; None on code without).

Besides those, the script says what getting there cost, by phase, in CPU seconds: the
submissions (``submit_s``) and the pumps (``pump_s``, with the pumps' count and the CPU of
the first and the last tenth of them, ``pump_first_tenth_ms`` and ``pump_last_tenth_ms``
per pump: a pump whose cost grows with the trials done shows there). ``--workers`` changes
the virtual workers (more workers: fewer pumps to the same state).

    python perf/live_page.py 10000 [--workers 100] [--repeat 5] [--pumps-between 100]
        [--profile FILE] [--json]

``--profile FILE`` profiles the pumping phase only, ``--profile-view FILE`` one view after the
timed ones and ``--profile-snapshot FILE`` one feed's snapshot after the last pumps between
them (cProfile: shares, not figures).
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import inspect
import json
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import dagtune as dt
from dagtune.dashboard.snapshot import live_snapshot
from dagtune.records import Trial
from dagtune.sim import SimulatedExecutor, SyntheticTrainer
from perf.collector import Collections

STEPS = 12
BRANCHES = 10  # trials per shared prefix


def space(n: int) -> dt.Grid:
    """N trials: N/10 learning rates x 10 batch-size schedules parting at steps 1 to 10."""
    return dt.Grid(
        {
            "lr": [dt.Constant(0.001 * (i + 1)) for i in range(n // BRANCHES)],
            "batch_size": [dt.MultiStep(32, [s], 0.5) for s in range(1, BRANCHES + 1)],
        }
    )


def median_cpu(function: Callable[[], Any], repeat: int) -> tuple[float, float, int]:
    """The median CPU seconds of `repeat` calls of `function`, the median of the collector's
    share in them, and the full collections in all."""
    seconds, collected = [], []
    collections = Collections()
    try:
        for _ in range(repeat):
            before = collections.seconds
            began = time.process_time()
            function()
            seconds.append(time.process_time() - began)
            collected.append(collections.seconds - before)
    finally:
        collections.close()
    return statistics.median(seconds), statistics.median(collected), collections.full


def measure(
    n: int,
    workers: int,
    repeat: int,
    profile: str | None = None,
    profile_view: str | None = None,
    profile_snapshot: str | None = None,
    pumps_between: int = 100,
) -> dict[str, Any]:
    """The figures the module docstring names, for an N-trial study."""
    study = dt.Study(SyntheticTrainer, name="v", executor=SimulatedExecutor(workers))
    try:
        began = time.process_time()
        for config in space(n):
            study.submit(config, STEPS)
        submit_s = time.process_time() - began
        coordinator = study.coordinator
        profiler = cProfile.Profile() if profile else None
        pumps: list[float] = []
        began = time.process_time()
        if profiler is not None:
            profiler.enable()
        while coordinator.executed_steps < 3 * n:  # mid-run: some ended, most pending
            before = time.process_time()
            coordinator.pump()
            pumps.append(time.process_time() - before)
        if profiler is not None:
            profiler.disable()
            profiler.dump_stats(profile)
        pump_s = time.process_time() - began
        labels: dict[tuple[str, str | None], str] = {}
        live_snapshot(study, labels)  # its imports, and the labels a feed keeps
        tenth = max(1, len(pumps) // 10)
        view = median_cpu(lambda: study.view(schedule=True), repeat)
        snapshot = median_cpu(lambda: live_snapshot(study), repeat)
        kept = median_cpu(lambda: live_snapshot(study, labels), repeat)
        if profile_view is not None:
            cProfile.runctx("study.view(schedule=True)", {}, {"study": study}, profile_view)
        feed = feed_snapshot(labels)
        began = time.process_time()
        walked = feed(study)
        feed_first_s = time.process_time() - began
        feed_seconds: list[float] = []
        view_seconds: list[float] = []
        snapshotted = stages_read = None
        for _ in range(repeat):  # the study goes on between the feed's snapshots
            for _ in range(pumps_between):
                coordinator.pump()
            began = time.process_time()
            walked = feed(study)
            feed_seconds.append(time.process_time() - began)
            for _ in range(pumps_between):  # and between the views timed alone
                coordinator.pump()
            reads = getattr(coordinator.planner, "view_reads", None)
            with counting(Trial, "snapshot") as calls:
                began = time.process_time()
                study.view(schedule=True)
                view_seconds.append(time.process_time() - began)
            snapshotted = calls[0]
            stages_read = None if reads is None else coordinator.planner.view_reads - reads
        if profile_snapshot is not None:
            for _ in range(pumps_between):
                coordinator.pump()
            cProfile.runctx("feed(study)", {}, {"study": study, "feed": feed}, profile_snapshot)
        return {
            "trials": n,
            "workers": workers,
            "submit_s": round(submit_s, 2),
            "pumps": len(pumps),
            "pump_s": round(pump_s, 2),
            "pump_first_tenth_ms": round(sum(pumps[:tenth]) / tenth * 1e3, 2),
            "pump_last_tenth_ms": round(sum(pumps[-tenth:]) / tenth * 1e3, 2),
            "executed": coordinator.executed_steps,
            "view_s": round(view[0], 3),
            "view_gc_s": round(view[1], 3),
            "view_full_gcs": view[2],
            "snapshot_s": round(snapshot[0], 3),
            "snapshot_gc_s": round(snapshot[1], 3),
            "snapshot_full_gcs": snapshot[2],
            "snapshot_kept_s": round(kept[0], 3),
            "pumps_between": pumps_between,
            "snapshot_feed_first_s": round(feed_first_s, 3),
            "snapshot_feed_s": round(statistics.median(feed_seconds), 3),
            "feed_walked": walked,
            "view_feed_s": round(statistics.median(view_seconds), 3),
            "view_feed_snapshotted": snapshotted,
            "view_feed_stages_read": stages_read,
            "objects_tracked": len(gc.get_objects()),
        }
    finally:
        study.close()


@contextmanager
def counting(owner: type, name: str) -> Iterator[list[int]]:
    """Count the calls of `owner`'s method `name` while inside (the count in the list given)."""
    method = getattr(owner, name)
    calls = [0]

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        return method(*args, **kwargs)

    setattr(owner, name, counted)
    try:
        yield calls
    finally:
        setattr(owner, name, method)


def feed_snapshot(labels: dict) -> Callable[[Any], dict | None]:
    """The snapshot a `SnapshotFeed` makes, as a function of the study that returns what it
    walked: with a `KeptSnapshot` where the code has one, else with the labels kept."""
    if "kept" not in inspect.signature(live_snapshot).parameters:
        return lambda study: live_snapshot(study, labels) and None
    from dagtune.dashboard.kept import KeptSnapshot

    kept = KeptSnapshot()

    def snapshot(study: Any) -> dict | None:
        kept.walked.clear()
        live_snapshot(study, kept=kept)
        return dict(kept.walked)

    return snapshot


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trials", type=int)
    parser.add_argument("--workers", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--profile", metavar="FILE", help="profile the pumping phase, stats to FILE")
    parser.add_argument("--profile-view", metavar="FILE", help="profile one view at the end, stats to FILE")
    parser.add_argument(
        "--profile-snapshot",
        metavar="FILE",
        help="profile one feed's snapshot at the end, stats to FILE",
    )
    parser.add_argument("--pumps-between", type=int, default=100, help="pumps before each feed snapshot")
    parser.add_argument("--json", action="store_true", help="print one JSON line")
    args = parser.parse_args()
    row = measure(
        args.trials,
        args.workers,
        args.repeat,
        args.profile,
        args.profile_view,
        args.profile_snapshot,
        args.pumps_between,
    )
    print(json.dumps(row) if args.json else row, flush=True)


if __name__ == "__main__":
    main()
