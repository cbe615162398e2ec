"""Many siblings under one plan node (issue 24, `perf/RESULTS.md` 9u): does a new sibling, or
an event on the node they branch off, cost the live stage tree work per sibling already there?

Two shapes of submissions, each submitted one trial at a time with the planner settled after
each (as a scheduling round between submissions does): ``same step``, N trials sharing a
one-step prefix and branching off it at step 1; ``distinct steps``, a long trial and N
siblings branching off it one step apart (sibling i at step i). Counted per sibling: the
branch points the live tree asked its answer at (`LiveStageTree._source_at`), the children it
relinked, the node updates and the wanted steps they decided (`LiveStageTree.walked`), the
stages the planner priced (`IncrementalPlanner.priced`); and the planner's CPU per sibling
(`IncrementalPlanner`: the live tree, its priorities, the ready queue), this process alone,
no executor.

A third, ``node events``: the distinct-steps shape submitted whole, then events on the long
trial, each settled on its own: with its stages waiting, a checkpoint committed at step 5 and
dropped (E times each); then its path launched as one task (not counted: it claims every
branch point), which passes E branch points, each an advance past a point the tree relies on
and then the checkpoint committed there. Counted per event: wanted steps decided, stages
priced, planner CPU.

    PYTHONPATH=$PWD python -m perf.siblings [--sizes 50,500,5000] [--distinct 250,500,1000,2000]
        [--events-at 250,500,1000,2000] [--events 20]

Not a section of `python -m perf`: a diagnostic that prints its figures.
"""

from __future__ import annotations

import argparse
import time

import dagtune as dt
from dagtune.config import normalize_config
from dagtune.plan import SearchPlan, _live
from dagtune.planner import IncrementalPlanner
from dagtune.records import CheckpointInfo
from dagtune.scheduling import CostModel, policy_named


def same_step(n: int) -> list[tuple[dict, int]]:
    return [({"x": dt.Steps([0, i + 1], [1])}, 2) for i in range(n + 1)]


def distinct_steps(n: int) -> list[tuple[dict, int]]:
    return [({"x": 0}, 1_000_000)] + [({"x": dt.Steps([0, -i], [i])}, i + 1) for i in range(1, n + 1)]


class Counts:
    """`LiveStageTree._source_at` and `_link` calls (the latter from `_relink_children` only)."""

    def __init__(self) -> None:
        self.asked = self.relinked = 0
        self._relinking = False
        tree = _live.LiveStageTree
        source_at, link, relink = tree._source_at, tree._link, tree._relink_children

        def counted_source_at(live, parent, step):
            self.asked += 1
            return source_at(live, parent, step)

        def counted_link(live, node, head, to):
            self.relinked += self._relinking
            return link(live, node, head, to)

        def counted_relink(live, node, state):
            self._relinking = True
            try:
                return relink(live, node, state)
            finally:
                self._relinking = False

        tree._source_at, tree._link, tree._relink_children = counted_source_at, counted_link, counted_relink


def run(shape, n: int, counts: Counts) -> str:
    trials = [(normalize_config(c), s) for c, s in shape(n)]
    plan = SearchPlan()
    planner = IncrementalPlanner(plan, CostModel(), policy_named("critical_path"))
    plan.add_request(*trials[0], waiter=0)  # the first trial: what the siblings branch off
    planner.settle()
    counts.asked = counts.relinked = 0
    live = planner.live
    rebuilds, walked, priced, cpu = live.rebuilds, live.walked, planner.priced, time.process_time()
    for i, (config, steps) in enumerate(trials[1:], 1):
        plan.add_request(config, steps, waiter=i)
        planner.settle()
    cpu = time.process_time() - cpu
    rebuilds, walked, priced = live.rebuilds - rebuilds, live.walked - walked, planner.priced - priced
    return (
        f"{shape.__name__.replace('_', ' ')}, {n} siblings: per sibling {counts.asked / n:.1f} points asked, "
        f"{counts.relinked / n:.2f} children relinked, {rebuilds / n:.2f} node updates "
        f"deciding {walked / n:.1f} wanted steps, {priced / n:.1f} stages priced, "
        f"{1e3 * cpu / n:.3f} ms of planner CPU"
    )


def node_events(n: int, events: int) -> str:
    """Checkpoint and task events on the long trial of `distinct_steps` (module docstring)."""
    trials = [(normalize_config(c), s) for c, s in distinct_steps(n)]
    plan = SearchPlan()
    planner = IncrementalPlanner(plan, CostModel(), policy_named("critical_path"))
    for i, (config, steps) in enumerate(trials):
        plan.add_request(config, steps, waiter=i)
    planner.settle()
    root, live = plan.locate(*trials[0]), planner.live
    checkpoint = CheckpointInfo(nbytes=1, sha256="0" * 64)
    walked, priced, cpu, counted = live.walked, planner.priced, 0.0, 0

    def event(change) -> None:
        nonlocal cpu, counted
        start = time.process_time()
        change()
        planner.settle()
        cpu += time.process_time() - start
        counted += 1

    for _ in range(events):  # stages waiting: a checkpoint splits the long chain, then goes
        event(lambda: plan.record_checkpoint(root, 5, checkpoint))
        event(lambda: plan.drop_checkpoint(root, 5))
    waiting = (live.walked - walked, planner.priced - priced, cpu, counted)
    (path,) = planner.pick(1)
    planner.task_launched("long", [(s.node, s.start, s.end) for s in path], path[0].start)
    planner.settle()
    walked, priced, cpu, counted = live.walked, planner.priced, 0.0, 0
    for step in range(1, events + 1):  # running: it passes a branch point, then saves there
        event(lambda step=step: planner.task_progressed("long", step))
        event(lambda step=step: plan.record_checkpoint(root, step, checkpoint))
    running = (live.walked - walked, planner.priced - priced, cpu, counted)
    return f"node events, {n} siblings: per event " + "; ".join(
        f"{what} {w / c:.1f} wanted steps decided, {p / c:.1f} stages priced, {1e3 * t / c:.3f} ms of planner CPU"
        for what, (w, p, t, c) in (("stages waiting:", waiting), ("task running:", running))
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="50,500,5000")
    parser.add_argument("--distinct", default="250,500,1000,2000")
    parser.add_argument("--events-at", default="250,500,1000,2000")
    parser.add_argument("--events", type=int, default=20)
    args = parser.parse_args()
    counts = Counts()
    for n in map(int, args.sizes.split(",")):
        print(run(same_step, n, counts), flush=True)
    for n in map(int, args.distinct.split(",")):
        print(run(distinct_steps, n, counts), flush=True)
    for n in map(int, args.events_at.split(",")):
        print(node_events(n, args.events), flush=True)


if __name__ == "__main__":
    main()
