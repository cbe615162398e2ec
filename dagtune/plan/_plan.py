"""The search plan (Hippo §3.2): every config segment ever requested for one model identity.

A *node* is a config followed from a branch step: the root nodes start at step 0 from a
freshly built trainer; a child node starts at step ``start`` from its parent's state after
``start`` steps. A trial is a path from a root to the node that holds its last step. Nodes
are append-only and never rewritten; adding a trial walks down the plan as long as the
trial's values agree with the nodes' and creates one node where it branches off (if it does).

A *point* ``(node, step)`` is the training state after ``step`` steps along the node's path.
It is owned by the deepest node of the path that started before it, so the state at a
branch step belongs to the parent, and a checkpoint at a branch step serves every child
branching there. Checkpoints and metrics are recorded at points.

Node ids are content hashes of (parent, start, config), so two processes that create the
same node agree on its id; that makes journals of concurrent writers mergeable and gives
checkpoints an address that no user text enters.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dagtune.config import (
    Config,
    check_config_finite,
    config_first_difference,
    config_from_json,
    config_to_json,
    normalize_config,
    value_key,
)
from dagtune.records import CheckpointInfo, MetricsPoint, node_id
from dagtune.validation import check_int

__all__ = ["NO_ENTRIES", "Node", "SearchPlan"]


class _Nothing(Mapping):
    """The read-only empty mapping a node holds where it holds nothing (`NO_ENTRIES`): one shared
    object rather than an empty dict per node and table (64 bytes each; most nodes are
    leaves that never have children, and keep no requests once trained). The plan gives a
    node its own dict when it first writes there (`_own`); readers see a mapping either way.
    It pickles as the one shared object."""

    __slots__ = ()

    def __getitem__(self, key: Any) -> Any:
        raise KeyError(key)

    def __iter__(self) -> Iterator[Any]:
        return iter(())

    def __len__(self) -> int:
        return 0

    def __contains__(self, key: object) -> bool:  # the mixin's raises and catches a KeyError
        return False

    def get(self, key: Any, default: Any = None) -> Any:
        return default

    def __repr__(self) -> str:
        return "{}"

    def __reduce__(self) -> str:
        return "NO_ENTRIES"


NO_ENTRIES: Mapping[Any, Any] = _Nothing()


def _nothing() -> Mapping[Any, Any]:
    return NO_ENTRIES


@dataclass(eq=False, slots=True)
class Node:
    """A plan node (see the module docstring). Its four tables start as the shared empty
    mapping; only `SearchPlan` writes them, through `_own`."""

    id: str
    parent: str | None
    start: int
    config: Config
    order: int
    depth: int
    children: Mapping[int, dict[tuple, str | list[str]]] = field(default_factory=_nothing)  # see `_add_id`
    requests: Mapping[int, set[Hashable]] = field(default_factory=_nothing)
    checkpoints: Mapping[int, CheckpointInfo] = field(default_factory=_nothing)
    metrics: Mapping[int, MetricsPoint] = field(default_factory=_nothing)


def _own(node: Node, name: str) -> dict:
    """`node`'s table `name`, made its own dict first if it is the shared empty one."""
    table = getattr(node, name)
    if table is NO_ENTRIES:
        table = {}
        setattr(node, name, table)
    return table


class SearchPlan:
    """Nodes, requests, checkpoints and metrics of one model identity.

    Every change is an event (a plain JSON-ready dict) applied by `apply`; `listeners` see each
    new event, which is how the journal persists the plan. Requests are transient: they are
    the trials waiting right now, re-made by a study when it resumes.

    `observers` are told of every change, whoever makes it (this process, or events read from
    other writers' journals, which listeners do not see), as ``(kind, node, step)``: kind is
    ``"request"`` (point ``(node, step)`` became active or inactive), ``"metrics"``,
    ``"checkpoint"`` (recorded or dropped) or ``"node"`` (a new node; step is None). This is
    how an incremental stage tree (`LiveStageTree`) stays in step with the plan.
    """

    def __init__(self) -> None:
        self.nodes: dict[str, Node] = {}
        self.order: list[str] = []
        self._roots: dict[tuple, str | list[str]] = {}  # see `_add_id`
        self.active: dict[tuple[str, int], set[Hashable]] = {}
        self.request_rank: dict[tuple[str, int], int] = {}
        self._requests_made = 0
        #: nodes added beside an equal-valued one (the same parent, start and values there:
        #: only journals of concurrent writers bring those); where `locate` finds a config
        #: changes only when this grows, or by a node where it found none (it creates that one)
        self.siblings = 0
        self.listeners: list[Callable[[dict], None]] = []
        self.observers: list[Callable[[str, str, int | None], None]] = []

    def __getstate__(self) -> dict[str, Any]:
        """The plan without its listeners and observers: they belong to the live study that
        holds it (its journal, its stage tree), not to the plan's state."""
        return {**self.__dict__, "listeners": [], "observers": []}

    # ------------------------------------------------------------------ events

    def apply(self, event: dict, *, emit: bool = True, live_config: Config | None = None) -> bool:
        """Apply one event; returns False if it changed nothing (a duplicate).

        `live_config` is the already-parsed config of a node event, to skip parsing its JSON.
        """
        kind = event["e"]
        if kind in ("checkpoint", "metrics") and event["step"] <= self.nodes[event["node"]].start:
            raise ValueError(
                f"{kind} at step {event['step']} of node {event['node']}, which starts at step "
                f"{self.nodes[event['node']].start}: a point belongs to the node that trained it"
            )
        if kind == "node":
            changed = self._apply_node(event, live_config)
        elif kind == "checkpoint":
            node = self.nodes[event["node"]]
            info = CheckpointInfo(event.get("nbytes", 0), event.get("sha256", ""))
            changed = node.checkpoints.get(event["step"]) != info
            _own(node, "checkpoints")[event["step"]] = info
        elif kind == "drop_checkpoint":
            node = self.nodes[event["node"]]
            changed = event["step"] in node.checkpoints
            if changed:
                del _own(node, "checkpoints")[event["step"]]
                if not node.checkpoints:
                    node.checkpoints = NO_ENTRIES
        elif kind == "metrics":
            node, step = self.nodes[event["node"]], event["step"]
            known = node.metrics.get(step)
            changed = known is None or not known.same(event["metrics"])
            _own(node, "metrics")[step] = MetricsPoint.of(step, event["metrics"])
        else:
            raise ValueError(f"unknown search plan event {kind!r}")
        if changed:
            self._tell(kind, event)
            if emit:
                for listener in self.listeners:
                    listener(event)
        return changed

    def _tell(self, kind: str, event: dict) -> None:
        if not self.observers:
            return
        if kind == "node":
            what, node, step = "node", event["id"], None
        else:
            what = "checkpoint" if kind == "drop_checkpoint" else kind
            node, step = event["node"], event["step"]
        for observer in self.observers:
            observer(what, node, step)

    def _apply_node(self, event: dict, live_config: Config | None) -> bool:
        if event["id"] in self.nodes:
            return False
        config = live_config if live_config is not None else config_from_json(event["config"])
        parent = event["parent"]
        if parent is not None and parent not in self.nodes:
            raise ValueError(f"search plan node {event['id']} names unknown parent {parent}")
        start = event["start"]
        if parent is not None and start <= self.nodes[parent].start:
            raise ValueError(
                f"search plan node {event['id']} branches at step {start}, not after its parent "
                f"{parent} starts (step {self.nodes[parent].start})"
            )
        depth = 0 if parent is None else self.nodes[parent].depth + 1
        node = Node(event["id"], parent, start, config, len(self.order), depth)
        self.nodes[node.id] = node
        self.order.append(node.id)
        key = value_key(config, start)
        if parent is None:
            if not event.get("private"):  # a salted root is matched by no other trial
                self.siblings += _add_id(self._roots, key, node.id)
        else:
            self.siblings += _add_id(_own(self.nodes[parent], "children").setdefault(start, {}), key, node.id)
        return True

    # ------------------------------------------------------------------ trials

    def locate(self, config: Config, steps: int, *, create: bool = False, salt: str = "") -> str | None:
        """The node holding step ``steps - 1`` of the trial `config`, or None if the plan has
        no such path (and `create` is false). With `create`, the missing node is added.

        A non-empty `salt` makes a private root that nothing else shares (trial-based runs).
        A config with a value that is not finite before `steps` is a ValueError.
        """
        check_config_finite(config, steps)
        if salt:
            private = node_id(None, 0, config, salt)
            if private in self.nodes:
                return private
            return self._create(None, 0, config, salt) if create else None
        candidates = _ids(self._roots.get(value_key(config, 0)))
        node = self._best_match(candidates, config, steps)
        if node is None:
            return self._create(None, 0, config) if create else None
        while True:
            diverge = _agreement(node, config, steps)
            if diverge >= steps:
                return node.id
            branches = _ids(node.children.get(diverge, {}).get(value_key(config, diverge)))
            child = self._best_match(branches, config, steps)
            if child is None:
                return self._create(node.id, diverge, config) if create else None
            node = child

    def _best_match(self, ids: Sequence[str], config: Config, steps: int) -> Node | None:
        """The candidate agreeing with `config` the longest (there is one unless journals of
        concurrent writers brought in equal-valued siblings)."""
        if not ids:
            return None
        if len(ids) == 1:
            return self.nodes[ids[0]]
        nodes = [self.nodes[i] for i in ids]
        return max(nodes, key=lambda n: _agreement(n, config, steps))

    def _create(self, parent: str | None, start: int, config: Config, salt: str = "") -> str:
        as_json = config_to_json(config)  # hashed into the id and written in the event
        identifier = node_id(parent, start, config, salt, as_json)
        event = {
            "e": "node",
            "id": identifier,
            "parent": parent,
            "start": start,
            "config": as_json,
        }
        if salt:
            event["private"], event["salt"] = True, salt
        self.apply(event, live_config=config)
        return identifier

    def add_request(self, config: Config, steps: int, waiter: Hashable, *, salt: str = "") -> str:
        """Record that `waiter` needs the metrics of `config` after `steps` steps; returns the
        node holding that point (created if new)."""
        check_int("steps", steps, minimum=1)
        node = self.locate(config, steps, create=True, salt=salt)
        self.request_at(node, steps, waiter)
        return node

    def request_at(self, node: str, steps: int, waiter: Hashable) -> None:
        """Record that `waiter` needs the metrics at point ``(node, steps)`` of a located trial."""
        _own(self.nodes[node], "requests").setdefault(steps, set()).add(waiter)
        if (node, steps) not in self.active:
            self.active[(node, steps)] = set()
            self.request_rank[(node, steps)] = self._requests_made
            self._requests_made += 1
            for observer in self.observers:
                observer("request", node, steps)
        self.active[(node, steps)].add(waiter)

    def remove_request(self, node: str, steps: int, waiter: Hashable) -> None:
        """Forget that `waiter` waits for ``(node, steps)`` (cancelled, or served)."""
        requests = self.nodes[node].requests
        waiters = requests.get(steps)
        if waiters is not None:
            waiters.discard(waiter)
            if not waiters:
                del _own(self.nodes[node], "requests")[steps]
                if not requests:  # an emptied dict keeps its table: most nodes end with none
                    self.nodes[node].requests = NO_ENTRIES
        active = self.active.get((node, steps))
        if active is not None:
            active.discard(waiter)
            if not active:
                del self.active[(node, steps)]
                del self.request_rank[(node, steps)]
                if not self.active:  # drained: their tables, sized for the busiest moment, go
                    self.active, self.request_rank = {}, {}
                for observer in self.observers:
                    observer("request", node, steps)

    # ------------------------------------------------------------------ points

    def owner(self, node: str, step: int) -> str | None:
        """The node owning point ``(node, step)``: the deepest on the path starting before
        `step`. Step 0 (a fresh trainer) belongs to no node."""
        if step <= 0:
            return None
        current = self.nodes[node]
        while current.start >= step:
            current = self.nodes[current.parent]
        return current.id

    def path(self, node: str) -> list[str]:
        """Node ids from the root to `node`."""
        ids = []
        current: str | None = node
        while current is not None:
            ids.append(current)
            current = self.nodes[current].parent
        return ids[::-1]

    def segments(self, node: str, steps: int) -> list[tuple[str, int, int]]:
        """The trial path to ``(node, steps)`` as ``(node, start, end)`` pieces (a list of
        exactly their number: a trial keeps it, and a comprehension's list of one holds four)."""
        ids = self.path(node)
        bounds = [self.nodes[i].start for i in ids[1:]] + [steps]
        return list(tuple((i, self.nodes[i].start, end) for i, end in zip(ids, bounds)))

    def metrics_at(self, node: str, step: int) -> dict[str, float] | None:
        """The metrics recorded at point ``(node, step)`` (a new dict), or None."""
        point = self.point_at(node, step)
        return None if point is None else point.as_dict()

    def point_at(self, node: str, step: int) -> MetricsPoint | None:
        """`metrics_at` as the plan keeps it, the point its trials share."""
        owner = self.owner(node, step)
        return None if owner is None else self.nodes[owner].metrics.get(step)

    def checkpoint_at(self, node: str, step: int) -> CheckpointInfo | None:
        owner = self.owner(node, step)
        return None if owner is None else self.nodes[owner].checkpoints.get(step)

    def latest_checkpoint(self, node: str, step: int) -> tuple[str, int] | None:
        """The latest committed checkpoint on the path to ``(node, step)`` at or before `step`,
        as an owned point, or None (start from scratch)."""
        current: Node | None = self.nodes[node]
        limit = step
        while current is not None:
            best = max((s for s in current.checkpoints if current.start < s <= limit), default=None)
            if best is not None:
                return current.id, best
            limit = current.start
            current = self.nodes[current.parent] if current.parent is not None else None
        return None

    def curve(self, node: str, steps: int) -> list[tuple[int, dict[str, float]]]:
        """The metrics recorded after steps 1 .. `steps` along the path, as ``(step, metrics)``
        pairs by step: as long as the points recorded, whatever `steps` is."""
        return [(point[0], point.as_dict()) for point in self.points_along(self.segments(node, steps))]

    def points_along(self, segments: Iterable[tuple[str, int, int]]) -> list[MetricsPoint]:
        """`curve` of the path whose `segments` are given (a trial keeps them: not walked
        again), as the points the plan keeps (its trials share them)."""
        points: list[MetricsPoint] = []
        nodes = self.nodes
        for owner, start, end in segments:
            metrics = nodes[owner].metrics
            if metrics:
                points.extend(metrics[s] for s in sorted(s for s in metrics if start < s <= end))
        return points

    def record_metrics(self, node: str, step: int, metrics: dict[str, float]) -> bool:
        owner = self.owner(node, step)
        if owner is None:
            raise ValueError(f"metrics need at least one trained step, got step {step}")
        return self.apply({"e": "metrics", "node": owner, "step": step, "metrics": metrics})

    def record_checkpoint(self, node: str, step: int, info: CheckpointInfo) -> bool:
        owner = self.owner(node, step)
        if owner is None:
            raise ValueError(f"a checkpoint needs at least one trained step, got step {step}")
        event = {"e": "checkpoint", "node": owner, "step": step, "nbytes": info.nbytes, "sha256": info.sha256}
        return self.apply(event)

    def drop_checkpoint(self, node: str, step: int) -> bool:
        return self.apply({"e": "drop_checkpoint", "node": node, "step": step})


def _agreement(node: Node, config: Config, steps: int) -> int:
    """The first step in ``[node.start, steps)`` where `config` leaves `node`'s config, or
    `steps`. A step where the node's config has no finite value is one where they part: a
    node is trained only where its config is finite (its value at its start is, or the plan
    refuses the node), whatever journal line brought it in."""
    limit = steps
    for sequence in node.config.values():
        bad = sequence.first_nonfinite(limit)
        if bad is not None:
            limit = bad
    return config_first_difference(node.config, config, node.start, limit)


def unique_steps(trials) -> int:
    """The least number of steps that trains every trial: distinct (prefix, step) pairs.

    `trials` is an iterable of ``(config, steps)``; configs may hold plain values.
    """
    plan, requested = _plan_of(trials)
    return _unique(plan, requested)


def trial_steps(trials) -> int:
    return sum(_check_steps(steps) for _, steps in trials)


def merge_rate(trials) -> float:
    """Trial steps / unique steps: how many times over a trial-based system trains the
    average step (Hippo's p; over several studies' trials, q). No trials is a ValueError:
    the rate of nothing is undefined."""
    trials = list(trials)
    if not trials:
        raise ValueError("merge_rate needs trials, got no trials")
    return trial_steps(trials) / unique_steps(trials)  # > 0: every trial has steps > 0


def _check_steps(steps: Any) -> int:
    return check_int("steps", steps, minimum=1)


class _CountingPlan(SearchPlan):
    """A search plan built only to count steps (`unique_steps`): the same nodes, named by
    their order instead of a content hash (an id no one else reads need not be agreed on:
    hashing each config's JSON text was most of a study report's cost), with no JSON event."""

    def _create(self, parent: str | None, start: int, config: Config, salt: str = "") -> str:
        identifier = str(len(self.order))
        self.apply({"e": "node", "id": identifier, "parent": parent, "start": start}, live_config=config)
        return identifier


def _plan_of(trials) -> tuple[SearchPlan, dict[str, set[int]]]:
    plan = _CountingPlan()
    requested: dict[str, set[int]] = {}
    names = None
    for config, steps in trials:
        config = normalize_config(config, owner="trial config")
        if names is None:
            names = config.keys()
        elif config.keys() != names:
            raise ValueError(
                f"trial configs must name the same hyper-parameters, got {sorted(names)} and {sorted(config)}"
            )
        node = plan.locate(config, _check_steps(steps), create=True)
        requested.setdefault(node, set()).add(steps)
    return plan, requested


def _unique(plan: SearchPlan, requested: dict[str, set[int]]) -> int:
    """Steps of the union of the requested paths: a node is trained to its last request or
    to its last child's branch step, whichever is later."""
    total = 0
    for node in plan.nodes.values():
        end = max(requested.get(node.id, ()), default=node.start)
        end = max(end, max(node.children, default=node.start))
        total += end - node.start
    return total


def _add_id(table: dict[tuple, str | list[str]], key: tuple, node: str) -> bool:
    """Add `node` under `key`: the bare id while it is the only one (a list per root costs
    more than the id), a list from the second (concurrent writers' equal-valued siblings).
    Whether another was there (`node` is a sibling)."""
    held = table.get(key)
    if held is None:
        table[key] = node
        return False
    if isinstance(held, str):
        table[key] = [held, node]
    else:
        held.append(node)
    return True


def _ids(held: str | list[str] | None) -> Sequence[str]:
    """The node ids `_add_id` keeps under a key."""
    if held is None:
        return ()
    return (held,) if isinstance(held, str) else held
