"""`PausedTrials`: the completed trials ending on each node, grouped by config, and the step
where each group would branch off its node if it were extended.

Completed trials ending on one node whose configs are equal branch off it at the same step:
each agrees with the node's config up to its own end (that is how the plan placed it on the
node), so the first step past one's end where their config leaves the node's is the first
past every one's end. A chain of trials extended a step at a time (each a new trial of the
same config, submitted with one more step) is then one group on its node, not one trial per
step already trained, and the search for that step is done once per group, resumed where the
last one stopped (a node's config never changes): finding where the paused trials branch off
a segment costs the same at any depth of the chain (issue 24), where comparing every paused
trial's config from its own end grew with the square of the depth.
"""

from __future__ import annotations

import bisect

from dagtune.config import Config, config_first_difference
from dagtune.records import Trial

__all__ = ["PausedTrials"]

_ConfigKey = tuple  # a config's items in order: equal configs (by canonical form), equal keys


class _Group:
    """The paused trials of one config on one node: ``(steps, id)`` of each, in order, and
    how far the search for the step where the config leaves the node's has gone."""

    __slots__ = ("config", "members", "checked", "branch")

    def __init__(self, config: Config, steps: int):
        self.config = config
        self.members: list[tuple[int, int]] = []
        self.checked = steps  # the configs agree on [a member's end, checked)
        self.branch: int | None = None  # the first step there where they differ, once found

    def branch_before(self, node_config: Config, end: int) -> int | None:
        """The step where this config leaves `node_config` (its node's) if it is before
        `end`, else None; the search goes on from where the last one stopped."""
        if self.branch is None and self.checked < end:
            first = config_first_difference(node_config, self.config, self.checked, end)
            if first < end:
                self.branch = first
            else:
                self.checked = end
        return self.branch if self.branch is not None and self.branch < end else None


class PausedTrials:
    """Completed trials by node and config (see the module docstring): `add` when a trial
    completes, `discard` before it is extended, `branches` where the trials paused on a
    node would branch off a stretch of it. Every operation costs the same however many
    trials of one config are paused on the node (`add` and `discard`: a bisection)."""

    def __init__(self) -> None:
        # node -> its one group, or its groups by config (most nodes hold one config's trials)
        self._groups: dict[str, _Group | dict[_ConfigKey, _Group]] = {}

    def add(self, trial: Trial) -> None:
        """`trial` completed: paused at its node after ``trial.steps`` steps."""
        group = self._group(trial.node, trial.config, create=trial.steps)
        bisect.insort(group.members, (trial.steps, trial.id))

    def discard(self, trial: Trial) -> None:
        """`trial` (paused with its node and steps as they are now) is paused no more."""
        group = self._group(trial.node, trial.config, create=None)
        if group is None:
            return
        members = group.members
        index = bisect.bisect_left(members, (trial.steps, trial.id))
        if index < len(members) and members[index] == (trial.steps, trial.id):
            del members[index]
        if not members:
            self._forget(trial.node, group)

    def branches(self, node: str, node_config: Config, start: int, end: int) -> set[int]:
        """Steps inside ``(start, end)`` where a trial paused on `node` (its config
        `node_config`) at step `start` or before would branch off if it were extended."""
        held = self._groups.get(node)
        if held is None:
            return set()
        groups = held.values() if isinstance(held, dict) else (held,)
        steps = set()
        for group in groups:
            if group.members[0][0] > start:  # every one ends inside the stretch or past it
                continue
            branch = group.branch_before(node_config, end)
            if branch is not None and start < branch:
                steps.add(branch)
        return steps

    def _group(self, node: str, config: Config, create: int | None) -> _Group | None:
        """The group of `config` on `node`; made (its search starting at step `create`) if
        there is none and `create` is given, else None."""
        held = self._groups.get(node)
        if isinstance(held, _Group):
            if held.config is config or held.config == config:
                return held
            if create is None:
                return None
            held = self._groups[node] = {_key(held.config): held}
        elif isinstance(held, dict):
            group = held.get(_key(config))
            if group is not None or create is None:
                return group
        elif create is None:
            return None
        group = _Group(config, create)
        if held is None:
            self._groups[node] = group
        else:
            held[_key(config)] = group
        return group

    def _forget(self, node: str, group: _Group) -> None:
        """`group` has no trial left: it goes, and a node left with one group holds it bare."""
        held = self._groups[node]
        if isinstance(held, dict):
            del held[_key(group.config)]
            if len(held) == 1:
                self._groups[node] = next(iter(held.values()))
        else:
            del self._groups[node]
            if not self._groups:  # drained: its table, sized for the busiest moment, goes
                self._groups = {}


def _key(config: Config) -> _ConfigKey:
    """A hashable key of `config` (its names come sorted: `normalize_config`); sequences hash
    and compare by their canonical forms, so equal keys are equal configs."""
    return tuple(config.items())
