"""One step's metrics, kept compact: what the search plan and its trials hold per point.

A study keeps every learning-curve point its trials reached (the search plan's record of the
step, and each trial's curve and last metrics point at it). As dicts they were about 250
bytes a point on CPython 3.11 (the dict and its own key table), the largest share of a
coordinator's memory per trial (issue 24). A `MetricsPoint` is a tuple ``(step, names,
*values)`` whose `names` tuple is shared by every point reporting the same metric names in
the same order: 80 bytes a point for three metrics. The dict a trial's reader sees is built
from it on access (`as_dict`): the same names in the same order with the very value objects
reported, so it compares, prints and serializes exactly as the reported dict did.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

__all__ = ["MetricsPoint"]

#: the names tuples points share, by themselves; cleared when full (sharing is only a saving)
_NAMES: dict[tuple[str, ...], tuple[str, ...]] = {}
_NAMES_HELD = 4096


class MetricsPoint(tuple):
    """The metrics reported after step `step`, as ``(step, names, *values)`` (see the module
    docstring). Immutable; `as_dict` gives them as the dict they were reported as."""

    __slots__ = ()  # no __dict__: as small as a plain tuple

    @classmethod
    def of(cls, step: int, metrics: Mapping[str, float]) -> MetricsPoint:
        """The point of `metrics` (a dict of names to numbers) reported after `step`."""
        names = tuple(metrics)
        shared = _NAMES.get(names)
        if shared is None:
            if len(_NAMES) >= _NAMES_HELD:
                _NAMES.clear()
            shared = _NAMES[names] = names
        return cls((step, shared, *metrics.values()))

    @property
    def step(self) -> int:
        """The step these metrics were reported after."""
        return self[0]

    @property
    def names(self) -> tuple[str, ...]:
        """The metric names, in the order they were reported."""
        return self[1]

    def values(self) -> Iterator[float]:
        """The metric values, in the order of `names`."""
        return iter(self[2:])

    def get(self, name: str, default: float | None = None) -> float | None:
        """The value of metric `name`, or `default` if it was not reported (as `dict.get`)."""
        names = self[1]
        return self[2 + names.index(name)] if name in names else default

    def as_dict(self) -> dict[str, float]:
        """A new dict of the metrics: equal, in order and with the same value objects, to the
        one reported."""
        return dict(zip(self[1], self[2:]))

    def same(self, metrics: Mapping[str, float]) -> bool:
        """Whether `metrics` are these (as dicts compare: names and values, in any order)."""
        return self.as_dict() == metrics
