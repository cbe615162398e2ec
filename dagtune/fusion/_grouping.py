"""Which path tasks may train as one fused group: a pure predicate and a grouping.

Two tasks may be fused when they build the same trainer (class, arguments, seed: the model
identity), that trainer is a `FusibleTrainer`, they start at the same step, and every
non-fusible hyper-parameter (everything but the trainer's `FusibleTrainer.fusible` names:
the batch size, a dropout probability, ...) has the same value at every step of their common
range ``[start, min(end))``. Where they diverge later is fine: a member leaves the group when
its own task ends. Equal RNG and data order states at the start are checked when the states
are loaded (`FusedPathRunner` trains members whose states differ as separate cohorts).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from dagtune.fusion._trainer import FusibleTrainer
from dagtune.sequences import first_difference
from dagtune.tasks import PathTask, Segment
from dagtune.validation import check_int

__all__ = ["can_fuse", "fusion_conflict", "fusion_groups"]


def _overlaps(a: PathTask, b: PathTask, hi: int) -> Iterator[tuple[int, int, Segment, Segment]]:
    """``(lo, hi, segment of a, segment of b)`` for each range of steps below `hi` where both
    tasks train one segment each."""
    i = j = 0
    x = max(a.start, b.start)
    while x < hi and i < len(a.segments) and j < len(b.segments):
        sa, sb = a.segments[i], b.segments[j]
        if sa.end <= x:
            i += 1
            continue
        if sb.end <= x:
            j += 1
            continue
        y = min(sa.end, sb.end, hi)
        yield x, y, sa, sb
        x = y


def fusion_conflict(a: PathTask, b: PathTask) -> str | None:
    """Why `a` and `b` cannot train in one fused group, or None when they can."""
    if a.key == b.key:
        return f"{a.key!r} is one task"
    cls = a.trainer.cls
    if not (isinstance(cls, type) and issubclass(cls, FusibleTrainer)):
        return f"{getattr(cls, '__qualname__', cls)!r} is not a FusibleTrainer"
    if a.trainer != b.trainer:
        return "they build different trainers (class, arguments, seed or model identity)"
    if a.start != b.start:
        return f"they start at different steps ({a.start} and {b.start})"
    fusible = cls.fusible_names()
    for lo, hi, sa, sb in _overlaps(a, b, min(a.end, b.end)):
        names_a = {n for n in sa.config if n not in fusible}
        names_b = {n for n in sb.config if n not in fusible}
        if names_a != names_b:
            return f"non-fusible hyper-parameters {sorted(names_a ^ names_b)} are set for one only (steps {lo}-{hi})"
        for name in sorted(names_a):
            step = first_difference(sa.config[name], sb.config[name], lo, hi)
            if step < hi:
                return (
                    f"non-fusible hyper-parameter {name!r} differs at step {step}: "
                    f"{sa.config[name](step)!r} != {sb.config[name](step)!r}"
                )
    return None


def can_fuse(a: PathTask, b: PathTask) -> bool:
    """Whether `a` and `b` may train in one fused group (see `fusion_conflict`)."""
    return fusion_conflict(a, b) is None


def fusion_groups(tasks: Iterable[PathTask], max_size: int) -> list[list[PathTask]]:
    """`tasks` in groups of at most `max_size` pairwise fusible tasks, first fit in the order
    given (so the order, e.g. by priority, decides who goes together). A task nothing can
    fuse with is a group of its own."""
    check_int("max_size", max_size, minimum=1)
    groups: list[list[PathTask]] = []
    for task in tasks:
        for group in groups:
            if len(group) < max_size and all(can_fuse(task, other) for other in group):
                group.append(task)
                break
        else:
            groups.append([task])
    return groups
