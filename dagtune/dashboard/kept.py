"""What a running study's page keeps from one snapshot to the next, so that a snapshot redoes
only what changed since the last one (issue 24, perf/RESULTS.md section 9l).

A live snapshot (`dagtune.dashboard.snapshot.live_snapshot`) laid out the stage tree from every
trial's segments, cut every node into pieces, guessed the metric from every point and chose
the curves to send from every trial's points, each second: at 100,000 trials mid-run about 4 s
of CPU for a picture that changed in a few places. `KeptSnapshot` holds, for one feed of one
study, the path union (each node's spans with their multiplicities, parent, start, children
and which trial saw it first), each node's pieces, the metric names seen, each trial's last
value of the shown metric and its curve as sent. A snapshot then compares each trial with what
was kept (a constant per trial: its segments, the same tuples from view to view, and its last
point, by identity), walks only the trials that changed, and cuts again only the nodes whose
spans, children, running, queued, critical or trained state changed. The snapshot it gives is
the one made from scratch, piece for piece (tests/test_dashboard_kept.py checks it at every
moment of simulated studies).

`walked` counts what a snapshot walked (trials, segments, points, nodes cut), so a test can
show that it follows the changes, not the study's size.
"""

from __future__ import annotations

import bisect
import heapq
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from itertools import chain
from operator import itemgetter
from typing import Any

from dagtune.dashboard.tree import (
    DONE,
    QUEUED,
    RUNNING,
    UNTRAINED,
    TreeLayout,
    assign_rows,
    cut_node,
    overlaps,
)
from dagtune.records import TrialChanges
from dagtune.summary import config_text, finite, pick_metric

__all__ = ["KeptCurves", "KeptSnapshot", "KeptTree", "spans_by_node"]

Span = tuple[str, int, int]
#: a piece of one node, as kept: ``(start, end, trials, state, critical)``
KeptPiece = tuple[int, int, int, str, bool]
#: the snapshot's ``tree`` columns, in the order `KeptTree` keeps them per node
COLUMNS = ("node", "start", "end", "row", "trials", "state", "critical", "label")


def spans_by_node(spans: Iterable[Span]) -> dict[str, tuple[tuple[int, int], ...]]:
    """``(node, start, end)`` spans grouped by node, each node's as a tuple (compared between
    snapshots): a piece looks up its own node's, not every span."""
    found: dict[str, list[tuple[int, int]]] = {}
    for node, start, end in spans:
        found.setdefault(node, []).append((start, end))
    return {node: tuple(found[node]) for node in found}


class KeptTree:
    """The stage tree's layout (`dagtune.dashboard.tree.layout` of the trials' paths), kept and
    redone node by node as trials and the schedule change."""

    def __init__(self, walked: Counter[str]) -> None:
        self.walked = walked
        self._reset()

    def _reset(self) -> None:
        self.seen: dict[int, tuple] = {}  # trial id -> its segments when last walked
        self.spans: dict[str, Counter[tuple[int, int]]] = {}  # node -> (start, end) -> trials
        self.first: dict[str, tuple[int, int]] = {}  # node -> (trial id, segment index) first seen
        self.parents: dict[str, str | None] = {}
        self.starts: dict[str, int] = {}
        self.children: dict[str, set[str]] = {}
        self.pieces: dict[str, list[KeptPiece]] = {}
        self.inputs: dict[str, tuple] = {}  # node -> (running, queued, critical, trained) cut with
        self.order: list[str] = []  # nodes by row
        self.ordered_parents: dict[str, str | None] = {}  # as first seen in trial order
        self.rows: dict[str, int] = {}
        self.position: dict[str, int] = {}  # node -> its index in `order`
        self.links: list[tuple[int, int, int]] = []
        self.new_nodes: list[str] = []  # nodes added by the last update (to be labelled)
        self.trained: dict[str, int] = {}  # the steps trained the pieces were cut with
        self.scheduled: set[str] = set()  # nodes with running, queued or critical spans then
        self.blocks: list[tuple[tuple, ...]] = []  # each node's columns, nodes by row (`columns`)
        self.cut_since: set[str] = set()  # nodes cut since `blocks` were made

    def update(
        self,
        trials: Sequence[Any],
        changed_ids: Mapping[int, Any] | None,
        trained: Mapping[str, int],
        running: Iterable[Span],
        queued: Iterable[Span],
        critical: Iterable[Span],
    ) -> None:
        """Bring the layout to `trials` (their snapshots, any order) and the schedule;
        `changed_ids`: the trials that may have changed since the last update, by id (None:
        any may have, and every trial is looked at)."""
        self.new_nodes = []
        looked = trials if changed_ids is None else changed_ids.values()
        self.walked["looked"] += len(looked)
        seen = self.seen  # a trial's segments are the same tuples from view to view: compared by
        changed = [t for t in looked if seen.get(t.id) != t.segments]  # identity, at a small cost
        dirty: set[str] = set()  # nodes whose spans or children changed
        structure = self._walk(changed, dirty)
        if structure is None or len(self.seen) != len(trials):  # a trial left a node, or the study one
            self._reset()
            dirty.clear()
            structure = self._walk(trials, dirty)
            if structure is None:
                raise AssertionError("a layout from scratch lost a node")
        running_on, queued_on, critical_on = (
            spans_by_node(running),
            spans_by_node(queued),
            spans_by_node(critical),
        )
        scheduled = {*running_on, *queued_on, *critical_on}
        moved = {node for node, _ in trained.items() ^ self.trained.items()}
        for node in dirty | ((scheduled | self.scheduled | moved) & self.spans.keys()):
            inputs = (
                running_on.get(node, ()),
                queued_on.get(node, ()),
                critical_on.get(node, ()),
                trained.get(node),
            )
            if node not in dirty and self.inputs.get(node) == inputs:
                continue
            self.inputs[node] = inputs
            self.pieces[node] = self._cut(node, *inputs)
            self.cut_since.add(node)
        self.trained, self.scheduled = dict(trained), scheduled
        if structure:
            self._order()

    def _walk(self, changed: Sequence[Any], dirty: set[str]) -> bool | None:
        """Apply the changed trials' segments to the path union; whether the nodes or their
        order changed, None if a trial left a node (the caller starts again)."""
        structure = False
        for trial in changed:
            self.walked["trials"] += 1
            old = self._nonempty(self.seen.get(trial.id, ()))
            new = self._nonempty(trial.segments)
            self.walked["segments"] += len(trial.segments)
            if not old.keys() <= new.keys():
                return None
            parent: str | None = None
            for node, (start, end, index) in new.items():
                before = old.get(node)
                if before is not None and before[:2] == (start, end):
                    parent = node
                    continue
                spans = self.spans.get(node)
                if spans is None:
                    spans = self.spans[node] = Counter()
                    self.parents[node], self.starts[node] = parent, start
                    self.children[node] = set()
                    if parent is not None:
                        self.children[parent].add(node)
                        dirty.add(parent)
                    self.new_nodes.append(node)
                    structure = True
                if before is not None:
                    spans[before[:2]] -= 1
                    if not spans[before[:2]]:
                        del spans[before[:2]]
                spans[start, end] += 1
                if node not in self.first or (trial.id, index) < self.first[node]:
                    self.first[node] = (trial.id, index)
                    structure = True
                dirty.add(node)
                parent = node
            self.seen[trial.id] = tuple(trial.segments)
        return structure

    @staticmethod
    def _nonempty(segments: Iterable[Span]) -> dict[str, tuple[int, int, int]]:
        return {node: (start, end, i) for i, (node, start, end) in enumerate(segments) if start < end}

    def _cut(
        self,
        node: str,
        running: Sequence[tuple[int, int]],
        queued: Sequence[tuple[int, int]],
        critical: Sequence[tuple[int, int]],
        trained: int | None,
    ) -> list[KeptPiece]:
        """The node's pieces, cut as `dagtune.dashboard.tree.layout` cuts a node (`cut_node`),
        each in its state from what was trained, runs and waits there."""
        self.walked["nodes"] += 1
        spans, first = self.spans[node], self.starts[node]
        cuts = {first, *(end for _, end in spans)}
        cuts.update(self.starts[child] for child in self.children[node])
        for a, b in (*running, *queued):
            cuts.update((a, b))
        if trained is not None:
            cuts.add(trained)
        done = -1 if trained is None else trained

        def state(start: int, end: int) -> str:
            if end <= done:
                return DONE
            if overlaps(running, start, end):
                return RUNNING
            return QUEUED if overlaps(queued, start, end) else UNTRAINED

        return cut_node(spans, cuts, first, state, critical)

    def _order(self) -> None:
        """Rows, links and the parents in first-seen order again (nodes were added, or one
        was first seen by an earlier trial): `assign_rows` over the nodes."""
        self.walked["orders"] += 1
        ordered = sorted(self.parents, key=self.first.__getitem__)
        shape = TreeLayout(parents={n: self.parents[n] for n in ordered}, starts=self.starts)
        assign_rows(shape)
        self.ordered_parents, self.rows = shape.parents, shape.rows
        self.order = sorted(self.rows, key=self.rows.__getitem__)
        self.links = [
            (self.starts[node], self.rows[parent], self.rows[node])
            for node in self.order
            if (parent := self.parents[node]) is not None
        ]
        self.blocks = []  # the rows changed: every node's columns again

    def columns(self, labels: Mapping[tuple[str, str | None], str]) -> dict[str, list]:
        """The snapshot's ``tree`` columns, nodes by row: each node's block of columns is made
        again when it was cut, every node's when the rows changed, and the columns are joined
        from the blocks (no Python step per piece)."""
        if not self.blocks:
            self.position = {node: i for i, node in enumerate(self.order)}
            self.blocks = [self._block(node, labels) for node in self.order]
        else:
            for node in self.cut_since:
                self.blocks[self.position[node]] = self._block(node, labels)
        self.cut_since = set()
        return {
            name: list(chain.from_iterable(map(itemgetter(i), self.blocks))) for i, name in enumerate(COLUMNS)
        }

    def _block(self, node: str, labels: Mapping[tuple[str, str | None], str]) -> tuple[tuple, ...]:
        """One node's pieces as columns, in `COLUMNS` order."""
        pieces = self.pieces[node]
        k = len(pieces)
        starts, ends, trials, states, critical = zip(*pieces, strict=True) if pieces else ((),) * 5
        label = labels.get((node, self.parents[node]), "")
        return ((node,) * k, starts, ends, (self.rows[node],) * k, trials, states, critical, (label,) * k)


class KeptCurves:
    """The guessed metric, which trials have a curve of the shown one, their last values and
    the curves sent, kept and brought up to date from the trials whose points changed."""

    def __init__(self, walked: Counter[str]) -> None:
        self.walked = walked
        self._reset()

    def _reset(self) -> None:
        self.names: set[str] = set()
        self.counted: dict[int, tuple[int, Any]] = {}  # trial id -> (points, last point) seen
        self.metric: str | None = None  # the metric `last` holds values of
        self.last: dict[int, float] = {}  # trial id -> its last finite value of `metric`
        self.drawn: list[int] = []  # ids of the trials with a finite value, sorted
        self.sent: dict[int, tuple[tuple, tuple]] = {}  # trial id -> (its key, its curve row)
        self.by_id: dict[int, Any] = {}  # trial id -> its snapshot as last looked at

    def update(
        self, trials: Sequence[Any], changed: Mapping[int, Any] | None, metric: str | None, mode: str
    ) -> tuple[str | None, str]:
        """Bring the names and last values to `trials`; the metric shown and its mode (guessed
        from every metric reported, `dagtune.summary.metric_of`, if `metric` is None).
        `changed`: the trials that may have changed since the last update, by id (None: any
        may have, and every trial is looked at)."""
        grown: list[tuple[Any, int]] = []  # (trial, the points walked already)
        rewritten = False
        if changed is None:
            looked: Iterable[Any] = trials
            self.by_id = {t.id: t for t in trials}
        else:
            looked = changed.values()
            self.by_id.update(changed)
        self.walked["looked"] += len(self.by_id) if changed is None else len(changed)
        for trial in looked:
            points = trial.points
            seen = self.counted.get(trial.id)
            if seen is not None and seen[0] == len(points) and (not points or points[-1] is seen[1]):
                continue
            if (
                seen is not None
                and seen[0]
                and not (seen[0] <= len(points) and points[seen[0] - 1] is seen[1])
            ):
                rewritten = True  # not the same points and more: start this trial again
                grown.append((trial, 0))
            else:
                grown.append((trial, 0 if seen is None else seen[0]))
            self.counted[trial.id] = (len(points), points[-1] if points else None)
        if rewritten or len(self.counted) != len(trials):
            self._reset()  # a trial's points were replaced (or the study lost a trial)
            return self.update(trials, None, metric, mode)
        for trial, done in grown:
            self.walked["points"] += len(trial.points) - done
            for point in trial.points[done:]:
                self.names.update(point.names)
        if metric is None:
            metric, mode = pick_metric(self.names)
        if metric != self.metric:  # every trial's last value again
            self.metric, self.last, self.drawn, self.sent = metric, {}, [], {}
            grown = [(trial, 0) for trial in trials]
        for trial, done in grown:
            self.walked["trials"] += 1
            self.walked["points"] += len(trial.points) - done
            value = next((v for p in reversed(trial.points[done:]) if finite(v := p.get(metric))), None)
            if value is not None:
                if trial.id not in self.last:
                    bisect.insort(self.drawn, trial.id)
                self.last[trial.id] = value
        return metric, mode

    def chosen(self, limit: int, mode: str) -> list[int]:
        """The ids of the trials whose curves a snapshot carries, sorted (all of them up to
        `limit`: then the best half by the last value, then trials evenly spaced by id)."""
        if len(self.drawn) <= limit:
            return list(self.drawn)
        sign = -1.0 if mode == "max" else 1.0
        best = heapq.nsmallest(limit // 2, ((sign * v, i) for i, v in self.last.items()))
        taken = {i for _, i in best}
        rest = [i for i in self.drawn if i not in taken]
        count = limit - len(best)
        return sorted([*taken, *(rest[k * len(rest) // count] for k in range(count))])

    def curves(self, ids: Iterable[int], metric: str | None) -> dict[str, list]:
        """The snapshot's ``curves`` columns for the trials `ids` (as of the last `update`),
        each row made again only if its trial's points, status or config changed."""
        curves: dict[str, list] = {k: [] for k in ("trial", "status", "final", "config", "steps", "values")}
        sent = {}
        for i in ids:
            trial = self.by_id[i]
            key = (self.counted[i], trial.status, trial.config)
            kept = self.sent.get(i)
            if kept is None or kept[0][0] != key[0] or kept[0][1] != key[1] or kept[0][2] is not key[2]:
                self.walked["points"] += len(trial.points)
                points = [(p.step, p.get(metric)) for p in trial.points if finite(p.get(metric))]
                row = (
                    trial.status,
                    points[-1][1],
                    config_text(trial.config),
                    [s for s, _ in points],
                    [float(v) for _, v in points],
                )
                kept = (key, row)
            sent[i] = kept
            for name, value in zip(
                ("trial", "status", "final", "config", "steps", "values"), (i, *kept[1]), strict=True
            ):
                curves[name].append(value)
        self.sent = sent
        return curves


class KeptSnapshot:
    """What one feed of one running study keeps between its snapshots: the tree's labels, its
    layout and the curves (`live_snapshot(study, kept=...)`), and which of the study's views
    they were last brought to (its keeper and version, `dagtune.records.TrialChanges`), so
    that the next looks only at the trials changed since."""

    def __init__(self) -> None:
        self.walked: Counter[str] = Counter()
        self.labels: dict[tuple[str, str | None], str] = {}
        self.tree = KeptTree(self.walked)
        self.curves = KeptCurves(self.walked)
        self.keeper: object | None = None  # the view's keeper and version last brought to
        self.version = 0

    def changed_since(self, changes: TrialChanges | None) -> dict[int, Any] | None:
        """The trials that changed since the view this feed last was brought to, by id, up to
        the view whose `changes` these are; None (look at every trial) where that is not known.
        Until `brought_to` is called, the feed counts as brought to no view (an update that
        stops half way is not patched later)."""
        changed = None if changes is None else changes.since(self.keeper, self.version)
        self.keeper, self.version = None, 0
        return changed

    def brought_to(self, changes: TrialChanges | None) -> None:
        """What is kept now holds the view whose `changes` these are (None: trials from
        elsewhere, not patched later)."""
        if changes is not None:
            self.keeper, self.version = changes.keeper, changes.version
