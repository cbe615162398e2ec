"""The stage tree as a picture: trial paths cut into pieces, laid out in rows.

Every view of dagtune's sharing (the dashboard page, `Result.plot_tree`, the notebook
tree, `dagtune tree`) draws the same thing: the union of the trials' paths through the
search plan. A *piece* is a run of steps ``[start, end)`` on one plan node between two
boundaries (where a trial ends, another branches off, or a stage starts or ends); it says
how many trials pass through it (more than one: shared training) and what state it is in.
Nodes get one row each, a child below its parent, so branches read like a git graph.

This module only lays out; the callers say what state each piece is in.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import pairwise

__all__ = [
    "DONE",
    "QUEUED",
    "RUNNING",
    "STATES",
    "UNTRAINED",
    "Piece",
    "TreeLayout",
    "TrialPath",
    "assign_rows",
    "cut_node",
    "layout",
    "overlaps",
]

DONE, RUNNING, QUEUED, UNTRAINED = "done", "running", "queued", "untrained"
#: Every piece state, in legend order.
STATES = (DONE, RUNNING, QUEUED, UNTRAINED)

Span = tuple[str, int, int]  # (node, start, end)


@dataclass(frozen=True)
class TrialPath:
    """One trial's way through the plan: its ``(node, start, end)`` segments, root first."""

    id: int
    segments: Sequence[Span]


@dataclass(frozen=True)
class Piece:
    node: str
    start: int
    end: int
    row: int
    trials: int
    state: str
    critical: bool = False


@dataclass
class TreeLayout:
    """Pieces, the connectors from a parent's row to a child's at its branch step, each
    node's row, parent and start, and which rows hold which trials' last segments."""

    pieces: list[Piece] = field(default_factory=list)
    links: list[tuple[int, int, int]] = field(default_factory=list)  # (step, parent row, child row)
    rows: dict[str, int] = field(default_factory=dict)
    parents: dict[str, str | None] = field(default_factory=dict)
    starts: dict[str, int] = field(default_factory=dict)

    def children(self, node: str | None) -> list[str]:
        """The nodes branching off `node` (the roots for None), in row order."""
        found = [n for n, p in self.parents.items() if p == node]
        return sorted(found, key=self.rows.__getitem__)


def overlaps(spans: Iterable[tuple[int, int]], start: int, end: int) -> bool:
    """Whether any ``(a, b)`` of `spans` overlaps the steps ``[start, end)``."""
    return any(a < end and start < b for a, b in spans)


def cut_node(
    spans: Mapping[tuple[int, int], int],
    cuts: Iterable[int],
    first: int,
    state: Callable[[int, int], str],
    critical: Sequence[tuple[int, int]] = (),
) -> list[tuple[int, int, int, str, bool]]:
    """One node's pieces, as ``(start, end, trials, state, critical)``: its steps from its
    `first` step to the furthest end of its `spans` (``(start, end)`` -> how many trials
    cover it), cut at each of `cuts` in that range; each piece with the trials whose spans
    cover it, its `state(start, end)` and whether a `critical` span overlaps it. The one
    cutter of `layout` and of the page's kept tree (`dagtune.dashboard.kept.KeptTree`)."""
    last = max(end for _, end in spans)
    steps = sorted(s for s in set(cuts) if first <= s <= last)
    return [
        (
            start,
            end,
            sum(n for (a, b), n in spans.items() if a <= start and end <= b),
            state(start, end),
            overlaps(critical, start, end),
        )
        for start, end in pairwise(steps)
    ]


def layout(
    trials: Iterable[TrialPath],
    state: Callable[[str, int, int], str],
    *,
    boundaries: Mapping[str, Iterable[int]] | None = None,
    critical: Iterable[Span] = (),
) -> TreeLayout:
    """Lay out the union of `trials`' paths.

    `state(node, start, end)` names a piece's state; `boundaries` adds cut points per node
    (e.g. stage ends, so a running stage shows apart from what is queued after it);
    `critical` spans mark the pieces they overlap as on the critical path.
    """
    spans: dict[str, list[tuple[int, int]]] = {}
    result = TreeLayout()
    for trial in trials:
        parent: str | None = None
        for node, start, end in trial.segments:
            if end <= start:
                continue
            spans.setdefault(node, []).append((start, end))
            result.parents.setdefault(node, parent)
            result.starts.setdefault(node, start)
            parent = node
    cuts: dict[str, set[int]] = {node: {result.starts[node]} for node in spans}
    for node, covered in spans.items():
        cuts[node].update(end for _, end in covered)
        parent = result.parents[node]
        if parent is not None:
            cuts[parent].add(result.starts[node])
    for node, extra in (boundaries or {}).items():
        if node in cuts:
            cuts[node].update(extra)
    assign_rows(result)
    critical_spans: dict[str, list[tuple[int, int]]] = {}
    for node, start, end in critical:
        critical_spans.setdefault(node, []).append((start, end))
    for node in sorted(spans, key=result.rows.__getitem__):
        row = result.rows[node]
        pieces = cut_node(
            Counter(spans[node]),
            cuts[node],
            result.starts[node],
            lambda start, end, node=node: state(node, start, end),
            critical_spans.get(node, ()),
        )
        result.pieces.extend(Piece(node, start, end, row, *rest) for start, end, *rest in pieces)
        parent = result.parents[node]
        if parent is not None:
            result.links.append((result.starts[node], result.rows[parent], result.rows[node]))
    return result


def assign_rows(result: TreeLayout) -> None:
    """Fill `result.rows` from its parents and starts, depth first: a node's row, then its
    children's subtrees, earliest branch first (ties: the node first in `result.parents`)."""
    kids: dict[str | None, list[str]] = {}
    for node, parent in result.parents.items():
        kids.setdefault(parent, []).append(node)
    order = {node: i for i, node in enumerate(result.parents)}  # first seen first on ties
    stack = sorted(kids.get(None, []), key=lambda n: -order[n])
    while stack:
        node = stack.pop()
        result.rows[node] = len(result.rows)
        stack.extend(sorted(kids.get(node, []), key=lambda n: (-result.starts[n], -order[n])))
