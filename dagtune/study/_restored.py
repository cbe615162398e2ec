"""The trials restored from earlier sessions that no algorithm has been handed yet.

A study resumed from storage keeps its earlier trials; when an algorithm submits a config
and steps an earlier trial had, the study hands it that trial rather than a new one
(`Study._take_restored`). Looking one up must not cost a walk of every restored trial, nor
a serialization of each one's config, on every submit: a resumed 100,000-trial study would
otherwise spend minutes before it starts new work. So the trials are indexed once by their
canonical config text and steps, and each submit is one dictionary look-up. A resumed
study's texts come from its resume state where it has them (`dagtune.resume_state`), so
opening it serializes no config it kept.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping

from dagtune.config import config_dumps
from dagtune.records import Trial

__all__ = ["RestoredTrials"]


class RestoredTrials:
    """Restored trials by (canonical config text, steps), each key's in the order added.
    `texts` gives the `config_dumps` of trials' configs where they are known (trial id ->
    text), so those are not serialized again.

    `dumps` counts the configs serialized (one per trial added without a known text and one
    per `take` while any is kept), so a test can check that a look-up does not grow with the
    trials restored."""

    def __init__(self, trials: list[Trial] | None = None, texts: Mapping[int, str] | None = None):
        self._by_key: dict[tuple[str, int], deque[Trial]] = {}
        self._ids: dict[int, tuple[str, int]] = {}
        self.dumps = 0
        for trial in trials or ():
            self.add(trial, None if texts is None else texts.get(trial.id))

    def _key(self, config, steps: int) -> tuple[str, int]:
        self.dumps += 1
        return config_dumps(config), steps

    def add(self, trial: Trial, text: str | None = None) -> None:
        """Keep `trial` (once: a trial already kept is left where it is); `text` is its
        config's `config_dumps`, if known."""
        if trial.id in self._ids:
            return
        key = self._key(trial.config, trial.steps) if text is None else (text, trial.steps)
        self._ids[trial.id] = key
        self._by_key.setdefault(key, deque()).append(trial)

    def take(self, config, steps: int) -> Trial | None:
        """The first trial kept with `config` and `steps`, removed; None if there is none
        (without serializing `config` when none is kept: a fresh study's every submit)."""
        if not self._ids:
            return None
        key = self._key(config, steps)
        waiting = self._by_key.get(key)
        if not waiting:
            return None
        trial = waiting.popleft()
        if not waiting:
            del self._by_key[key]
        del self._ids[trial.id]
        return trial

    def __contains__(self, trial_id: int) -> bool:
        return trial_id in self._ids

    def __len__(self) -> int:
        return len(self._ids)
