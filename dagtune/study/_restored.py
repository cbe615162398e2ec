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

from dagtune.config import Config, config_dumps
from dagtune.records import Trial

__all__ = ["RestoredTrials"]


class RestoredTrials:
    """Restored trials by steps and canonical config text, each key's in the order added.
    `texts` gives the `config_dumps` of trials' configs where they are known (trial id ->
    text), so those are not serialized again. A key holds its trial itself, a queue only
    from the second (a resumed study's index holds no object of its own per trial: each
    would be one more for the garbage collector to walk).

    `dumps` counts the configs serialized (one per trial added without a known text and at
    most one per `take` while any is kept), so a test can check that a look-up does not grow
    with the trials restored."""

    def __init__(self, trials: list[Trial] | None = None, texts: Mapping[int, str] | None = None):
        self._by_steps: dict[int, dict[str, Trial | deque[Trial]]] = {}
        self._ids: set[int] = set()
        self.dumps = 0
        for trial in trials or ():
            self.add(trial, None if texts is None else texts.get(trial.id))

    def _text(self, config: Config) -> str:
        self.dumps += 1
        return config_dumps(config)

    def add(self, trial: Trial, text: str | None = None) -> None:
        """Keep `trial` (once: a trial already kept is left where it is); `text` is its
        config's `config_dumps`, if known."""
        if trial.id in self._ids:
            return
        if text is None:
            text = self._text(trial.config)
        self._ids.add(trial.id)
        by_text = self._by_steps.setdefault(trial.steps, {})
        held = by_text.get(text)
        if held is None:
            by_text[text] = trial
        elif isinstance(held, deque):
            held.append(trial)
        else:
            by_text[text] = deque((held, trial))

    def take(self, config: Config, steps: int) -> Trial | None:
        """The first trial kept with `config` and `steps`, removed; None if there is none
        (without serializing `config` when none with those steps is kept: a fresh study's
        every submit)."""
        by_text = self._by_steps.get(steps)
        if not by_text:
            return None
        text = self._text(config)
        held = by_text.get(text)
        if held is None:
            return None
        if isinstance(held, deque):
            trial = held.popleft()
            if len(held) == 1:
                by_text[text] = held[0]
        else:
            trial = held
            del by_text[text]
            if not by_text:
                del self._by_steps[steps]
        self._ids.discard(trial.id)
        return trial

    def __contains__(self, trial_id: int) -> bool:
        return trial_id in self._ids

    def __len__(self) -> int:
        return len(self._ids)
