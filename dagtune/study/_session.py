"""One algorithm's run: its callbacks routed from the coordinator, its decisions applied.

Nothing re-enters: applying a decision only changes the coordinator's trial ledger, which
queues what follows (known results, ends) and delivers it at its next `settle`, after the
decision is applied; each callback is answered, then applied, in the coordinator's loop."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from dagtune.algos import Algorithm, Decision, Extend, Stop, Submit
from dagtune.config import Config
from dagtune.coordinator import Coordinator
from dagtune.records import PENDING, Trial

__all__ = ["Session"]


class Session:
    """Routes one algorithm's callbacks and applies its decisions.

    `check_config` normalizes a submitted config (the study's names); `take_restored` hands
    back a trial restored from an earlier session for a config and steps, if there is one,
    so that submitting it again continues it."""

    def __init__(
        self,
        coordinator: Coordinator,
        algorithm: Algorithm,
        check_config: Callable[[Any], Config],
        take_restored: Callable[[Config, int], Trial | None],
    ):
        self.coordinator = coordinator
        self.algorithm = algorithm
        self.check_config = check_config
        self.take_restored = take_restored
        self.trials: dict[int, Trial] = {}
        self.error: BaseException | None = None
        self.finished = False
        self._pending: set[int] = set()  # its trials still pending: the run ends when none is

    def _adopt(self, trial: Trial) -> None:
        if trial.id not in self.trials:
            self.trials[trial.id] = trial
            self.algorithm.trials.append(trial)
            if trial.status == PENDING:
                self._pending.add(trial.id)

    def apply(self, decisions: Iterable[Decision] | None) -> None:
        coordinator = self.coordinator
        for decision in decisions or ():
            if isinstance(decision, Submit):
                config = self.check_config(decision.config)
                restored = self.take_restored(config, decision.steps)
                if restored is not None:
                    restored.tag = decision.tag
                    self._adopt(restored)
                    coordinator.ledger.replay(restored, self)  # what it reported, told in turn
                    continue
                self._adopt(coordinator.submit(config, decision.steps, decision.tag))
            elif isinstance(decision, Extend):
                trial = coordinator.extend(decision.trial, decision.steps)
                if trial.id in self.trials and trial.status == PENDING:  # known results may complete it
                    self._pending.add(trial.id)
            elif isinstance(decision, Stop):
                coordinator.stop(decision.trial)
            else:
                raise TypeError(f"{type(self.algorithm).__name__} returned {decision!r}, not a decision")

    def _callback(self, trial: Trial | None, method: str, *args: Any) -> None:
        """Ask the algorithm (`method`), then apply its decisions."""
        if self.error is not None or (trial is not None and trial.id not in self.trials):
            return
        try:
            decide = getattr(self.algorithm, method)
            self.apply(decide(*args) if trial is None else decide(trial, *args))
        except BaseException as error:  # surfaced by Study.run in the caller's thread
            self.error = error
            return
        self.check_end()

    def on_result(self, trial: Trial, step: int, metrics: dict[str, float]) -> None:
        self._callback(trial, "on_result", step, metrics)

    def on_complete(self, trial: Trial) -> None:
        self._pending.discard(trial.id)
        self._callback(trial, "on_complete")

    def on_end(self, trial: Trial) -> None:
        self._pending.discard(trial.id)
        self._callback(trial, "on_end")

    def on_idle(self, free: int) -> None:
        if not self.finished:
            self._callback(None, "on_idle", free)

    def check_end(self) -> None:
        """Stop what is pending once the algorithm is finished; `finished` once its trials ended."""
        if self.algorithm.is_finished():
            for trial_id in sorted(self._pending):
                self.coordinator.stop(trial_id)
        self.finished = not self._pending
