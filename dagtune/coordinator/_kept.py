"""The checkpoints a study must keep, kept up to date as things happen rather than recomputed.

Three sets make up what a live study needs kept (its lease, and what its own garbage
collection protects): every point a running task starts from or may resume from
(the dispatcher's `RunningTasks` keeps it), the latest checkpoint before each waiting request
and each interrupted trial's point (where they resume), and the latest checkpoint of each
completed trial (where an extension resumes): the trial ledger's `TrialPoints` keeps these
two. `KeptPoints` joins the three for the coordinator. Each set is a `HeldPoints`: a multiset of points with a
`version` that changes whenever a point enters or leaves it, so a reader learns in O(1)
whether anything changed since it last looked, and, once followed, a log of the points that
entered it, so the study's lease publishes what changed without gathering every point.

`LatestCheckpoints` follows the latest checkpoint before each target point: a target is
registered on every node of its path, and a checkpoint recorded or dropped on a node
(`SearchPlan.observers`, whoever changed the plan) looks again at the targets registered
there only. Each event costs work proportional to the targets whose path it touches, never
a walk of every request, running task and trial.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from dagtune.plan import SearchPlan

__all__ = ["HeldPoints", "KeptPoints", "LatestCheckpoints", "TrialPoints"]

Point = tuple[str, int]


class HeldPoints:
    """A multiset of points (each held by how many reasons), iterated as a set; `version`
    counts the times a point entered or left it, `left` the times one left it. Once
    `entered` is a list (whoever publishes the points sets it: `KeptPoints.follow`), each
    point that enters is appended to it, for that reader to take."""

    def __init__(self) -> None:
        self._counts: dict[Point, int] = {}
        self.version = 0
        self.left = 0
        self.entered: list[Point] | None = None

    def add(self, point: Point) -> None:
        count = self._counts.get(point, 0)
        self._counts[point] = count + 1
        if not count:
            self.version += 1
            if self.entered is not None:
                self.entered.append(point)

    def remove(self, point: Point) -> None:
        count = self._counts[point]
        if count == 1:
            del self._counts[point]
            self.version += 1
            self.left += 1
            if not self._counts:  # drained: its table, sized for the busiest moment, goes
                self._counts = {}
        else:
            self._counts[point] = count - 1

    def __contains__(self, point: object) -> bool:
        return point in self._counts

    def __iter__(self) -> Iterator[Point]:
        return iter(self._counts)

    def __len__(self) -> int:
        return len(self._counts)


class LatestCheckpoints:
    """The latest committed checkpoint at or before each target point on its path (what
    `SearchPlan.latest_checkpoint` answers), held in `held` as targets come and go and as
    checkpoints are recorded or dropped. A target may be added several times (several
    reasons); it is followed until it is removed as often.

    A study follows one target per completed trial, so each is kept lean: a target's latest
    checkpoint that is the target itself is held as the target's own tuple, the reasons
    beyond the first are counted only where there are some (`_more`), and a node holds the
    bare target where its range there ends at the target (see `_on_node`)."""

    def __init__(self, plan: SearchPlan, held: HeldPoints):
        self.plan = plan
        self.held = held
        self._more: dict[Point, int] = {}  # a target's reasons beyond its first, where it has any
        self._latest: dict[Point, Point | None] = {}  # every target followed
        # node -> the targets whose path passes it, with the last step of their range there:
        # where there is one (most nodes: a dict costs 232 bytes), the bare target if its range
        # ends at it there (the target's own node), else a ``(target, step)`` pair; a dict
        # from the second
        self._on_node: dict[str, Point | tuple[Point, int] | dict[Point, int]] = {}
        self.lookups = 0  # calls of `SearchPlan.latest_checkpoint` (tests count them)

    def add(self, target: Point, segments: Iterable[tuple[str, int, int]] | None = None) -> None:
        """Follow `target` (once more if followed already). `segments` is its path as
        `SearchPlan.segments` gives it, where the caller has it (not walked again)."""
        if target in self._latest:
            self._more[target] = self._more.get(target, 0) + 1
            return
        on_node = self._on_node
        ranges = self._ranges(target) if segments is None else [(node, end) for node, _, end in segments]
        for node, limit in ranges:
            held = on_node.get(node)
            if held is None or (not isinstance(held, dict) and _one(held)[0] == target):
                on_node[node] = target if (node, limit) == target else (target, limit)
            elif isinstance(held, dict):
                held[target] = limit
            else:
                on_node[node] = dict((_one(held), (target, limit)))
        latest = self._lookup(target)
        self._latest[target] = latest
        if latest is not None:
            self.held.add(latest)

    def remove(self, target: Point) -> None:
        more = self._more.get(target)
        if more is not None:
            if more > 1:
                self._more[target] = more - 1
            else:
                del self._more[target]
            return
        for node, _ in self._ranges(target):
            targets = self._on_node[node]
            if isinstance(targets, dict):
                del targets[target]
                if targets:
                    continue
            del self._on_node[node]  # a lone entry is this target's
        latest = self._latest.pop(target)
        if latest is not None:
            self.held.remove(latest)
        if not self._latest:  # drained: the tables, sized for the busiest moment, go
            self._latest, self._more, self._on_node = {}, {}, {}

    def checkpoint_changed(self, node: str, step: int) -> None:
        """A checkpoint at ``(node, step)`` was recorded or dropped: the targets below it
        whose range on `node` reaches `step` look again."""
        held = self._on_node.get(node)
        if held is None:
            return
        for target, limit in held.items() if isinstance(held, dict) else (_one(held),):
            if step > limit:
                continue  # past where its path leaves `node`
            latest = self._latest[target]
            if latest is not None and latest != (node, step) and self._after(latest, node, step):
                continue  # a later checkpoint on its path already serves it
            found = self._lookup(target)
            if found != latest:
                self._latest[target] = found
                if latest is not None:
                    self.held.remove(latest)
                if found is not None:
                    self.held.add(found)

    def _ranges(self, target: Point) -> list[tuple[str, int]]:
        """Each node on `target`'s path with the last step of the target's range on it."""
        nodes = self.plan.nodes
        ids = self.plan.path(target[0])
        return [(i, end) for i, end in zip(ids, [*(nodes[i].start for i in ids[1:]), target[1]])]

    def _after(self, latest: Point, node: str, step: int) -> bool:
        """Whether `latest`, a target's latest checkpoint on a path through `node`, comes
        after point ``(node, step)`` on that path (so that point cannot replace it)."""
        if latest[0] == node:
            return latest[1] > step
        return self.plan.nodes[latest[0]].depth > self.plan.nodes[node].depth

    def _lookup(self, target: Point) -> Point | None:
        """The target's latest checkpoint: the target's own tuple where it is the target."""
        self.lookups += 1
        found = self.plan.latest_checkpoint(*target)
        return target if found == target else found


def _one(held: Point | tuple[Point, int]) -> tuple[Point, int]:
    """A node's lone entry as ``(target, last step of its range there)``."""
    return (held, held[1]) if isinstance(held[0], str) else held  # type: ignore[return-value]


class TrialPoints:
    """What a study's trials need kept (the `TrialLedger`'s part, see the module docstring):
    the latest checkpoint before each waiting request (followed through the plan's
    observers) and each interrupted trial's point (`waiting`), and the latest checkpoint of
    each completed trial (`completed`); the ledger tells it of interrupts, resumes,
    completions and extensions."""

    def __init__(self, plan: SearchPlan):
        self.plan = plan
        self.waiting = HeldPoints()
        self.completed = HeldPoints()
        self._waiting = LatestCheckpoints(plan, self.waiting)
        self._completed = LatestCheckpoints(plan, self.completed)
        self._requested: set[Point] = set()
        for point in plan.active:
            self._request_changed(*point)
        plan.observers.append(self._plan_changed)

    @property
    def lookups(self) -> int:
        """Latest-checkpoint lookups so far (tests count them per event)."""
        return self._waiting.lookups + self._completed.lookups

    def interrupted(self, point: Point) -> None:
        """A trial waiting at `point` was interrupted (it resumes from there later)."""
        self._waiting.add(point)

    def resumed(self, point: Point) -> None:
        """An interrupted trial at `point` was requested again, or forgotten."""
        self._waiting.remove(point)

    def completed_at(self, point: Point, segments: Iterable[tuple[str, int, int]] | None = None) -> None:
        """A trial completed at `point` (an extension resumes from there); `segments`: the
        path to it (`SearchPlan.segments`), if the caller has it."""
        self._completed.add(point, segments)

    def reopened(self, point: Point) -> None:
        """A trial completed at `point` is pending again (extended)."""
        self._completed.remove(point)

    def _plan_changed(self, kind: str, node: str, step: int | None) -> None:
        if kind == "request" and step is not None:
            self._request_changed(node, step)
        elif kind == "checkpoint" and step is not None:
            self._waiting.checkpoint_changed(node, step)
            self._completed.checkpoint_changed(node, step)

    def _request_changed(self, node: str, step: int) -> None:
        point = (node, step)
        if point in self.plan.active and point not in self._requested:
            self._requested.add(point)
            self._waiting.add(point)
        elif point not in self.plan.active and point in self._requested:
            self._requested.discard(point)
            self._waiting.remove(point)
            if not self._requested:  # drained: its table, sized for the busiest moment, goes
                self._requested = set()


class KeptPoints:
    """What a live study needs kept (see the module docstring), joined from its two parts:
    the running tasks' points (`running`, kept by the dispatcher's `RunningTasks`) and its
    trials' (`trials`, kept by the `TrialLedger`)."""

    def __init__(self, running: HeldPoints, trials: TrialPoints):
        self.running = running
        self.trials = trials

    @property
    def version(self) -> int:
        """Changes whenever a point enters or leaves any of the sets."""
        return self.running.version + self.trials.waiting.version + self.trials.completed.version

    @property
    def lookups(self) -> int:
        """Latest-checkpoint lookups so far (tests count them per event)."""
        return self.trials.lookups

    @property
    def left(self) -> int:
        """The times a point left one of the sets (it may still be in another)."""
        return self.running.left + self.trials.waiting.left + self.trials.completed.left

    def follow(self) -> None:
        """Log the points that enter any of the sets from now on, for `take_entered`: what
        a lease publishes as it changes, without gathering every point (`dagtune.durable`)."""
        for held in self._sets():
            if held.entered is None:
                held.entered = []

    def take_entered(self) -> list[Point]:
        """The points that entered any of the sets since the last call (since `follow` for
        the first; a point may come more than once, or be in another set already)."""
        taken: list[Point] = []
        for held in self._sets():
            if held.entered:
                taken += held.entered
                held.entered = []
        return taken

    def _sets(self) -> tuple[HeldPoints, HeldPoints, HeldPoints]:
        return self.running, self.trials.waiting, self.trials.completed

    def protected(self) -> set[Point]:
        """Checkpoints running or queued stages need (see `Coordinator.protected_points`)."""
        return {*self.running, *self.trials.waiting}

    def of_completed(self) -> set[Point]:
        """The latest checkpoint of each completed trial."""
        return set(self.trials.completed)
