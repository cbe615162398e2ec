"""Where trials that may come later would branch off a path, so that a task passing there
saves a checkpoint on its way: a save now instead of retraining the shared prefix later.

Two kinds are known in advance: completed trials paused at a rung, which an algorithm may
extend (ASHA promotes them later), and the configs an algorithm announced it may submit
(`Algorithm.prospects`).
"""

from __future__ import annotations

from collections.abc import Iterable

from dagtune.config import Config, config_first_difference, value_key
from dagtune.coordinator._paused import PausedTrials
from dagtune.plan import SearchPlan
from dagtune.records import Trial
from dagtune.tasks import Segment

__all__ = ["LaterBranches"]


class LaterBranches:
    """The paused trials and the announced configs of one coordinator (see the module
    docstring); `within` gives the steps of a segment where one of them would branch off."""

    def __init__(self, plan: SearchPlan):
        self.plan = plan
        self._paused = PausedTrials()  # completed trials by node and config
        # configs an algorithm may submit later, by their values at step 0: only those agreeing
        # there with a path can branch off it later (no scan of every prospect per segment)
        self._prospects: dict[tuple, list[Config]] = {}
        # those of one step-0 group by their values at a node's start, made once per group and
        # start: a prospect branching inside a node agrees with it there too
        self._prospects_at: dict[tuple[tuple, int], dict[tuple, list[Config]]] = {}
        self._prospect_branches: dict[tuple[str, int], set[int]] = {}

    def pause(self, trial: Trial) -> None:
        """`trial` completed: it may be extended from its node later."""
        self._paused.add(trial)

    def resume(self, trial: Trial) -> None:
        """`trial` is extended: it branches no more from where it paused."""
        self._paused.discard(trial)

    def expect(self, configs: Iterable[Config]) -> None:
        """The configs an algorithm may submit later (none: forget the earlier ones)."""
        self._prospects = {}
        for config in configs:
            self._prospects.setdefault(value_key(config, 0), []).append(config)
        self._prospects_at.clear()
        self._prospect_branches.clear()

    def within(self, segment: Segment) -> set[int]:
        """The steps inside `segment` where a paused trial or an expected config would branch off."""
        return self._of_paused(segment) | self._of_prospects(segment)

    def _of_paused(self, segment: Segment) -> set[int]:
        """Steps inside `segment` where a completed trial on its node, ending at its start or
        before, would branch off if it were extended (found per config, not per trial:
        `dagtune.coordinator._paused`)."""
        node_config = self.plan.nodes[segment.node].config
        return self._paused.branches(segment.node, node_config, segment.start, segment.end)

    def _of_prospects(self, segment: Segment) -> set[int]:
        """Steps inside `segment` where an expected config would branch off its path (a node's
        config agrees with its whole path, so one comparison from step 0 finds the branch).
        Only the prospects agreeing with the node at step 0 and at its start are compared:
        where many share their first values (a common warm-up), comparing all of them on
        every segment made each trial's work grow with the number of prospects."""
        if not self._prospects:
            return set()
        key = (segment.node, segment.end)
        found = self._prospect_branches.get(key)
        if found is None:
            node = self.plan.nodes[segment.node]
            found = set()
            for config in self._agreeing(node.config, node.start):
                branch = config_first_difference(node.config, config, 0, segment.end)
                if node.start < branch < segment.end:
                    found.add(branch)
            if found:  # most paths have none: kept for those only (no set per segment launched)
                self._prospect_branches[key] = found
        return {step for step in found if step > segment.start}

    def _agreeing(self, config: Config, start: int) -> list[Config]:
        """The prospects whose values at step 0 and at step `start` are `config`'s."""
        first = value_key(config, 0)
        group = self._prospects.get(first, [])
        if start == 0 or not group:
            return group
        index = self._prospects_at.get((first, start))
        if index is None:
            index = self._prospects_at[first, start] = {}
            for prospect in group:
                index.setdefault(value_key(prospect, start), []).append(prospect)
        return index.get(value_key(config, start), [])
