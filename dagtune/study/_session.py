"""One algorithm's run: its callbacks routed from the coordinator, its decisions applied."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from dagtune.algos import Algorithm, Decision, Extend, Stop, Submit
from dagtune.config import Config
from dagtune.coordinator import Coordinator
from dagtune.records import COMPLETED, PENDING, Trial

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
        self.started = False  # the algorithm's first decisions are all applied
        self._applying = False
        self._depth = 0  # nested callbacks: known results arrive while decisions are applied
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
                    self._replay(restored)
                    continue
                self._applying = True  # results known already arrive inside submit
                try:
                    self._adopt(coordinator.submit(config, decision.steps, decision.tag))
                finally:
                    self._applying = False
            elif isinstance(decision, Extend):
                trial = coordinator.extend(decision.trial, decision.steps)
                if trial.id in self.trials and trial.status == PENDING:  # known results may complete it
                    self._pending.add(trial.id)
            elif isinstance(decision, Stop):
                coordinator.stop(decision.trial)
            else:
                raise TypeError(f"{type(self.algorithm).__name__} returned {decision!r}, not a decision")

    def _replay(self, trial: Trial) -> None:
        """Tell the algorithm what a trial restored from an earlier session already reported."""
        for step, metrics in list(trial.curve):
            self.on_result(trial, step, metrics)
        if trial.status == COMPLETED:
            self.on_complete(trial)
        elif trial.status != PENDING:
            self.on_end(trial)

    def _callback(self, trial: Trial | None, method: str, *args: Any) -> None:
        if trial is not None and self._applying:
            self._adopt(trial)
        if self.error is not None or (trial is not None and trial.id not in self.trials):
            return
        self._depth += 1
        try:
            decide = getattr(self.algorithm, method)
            self.apply(decide(*args) if trial is None else decide(trial, *args))
        except BaseException as error:  # surfaced by Study.run in the caller's thread
            self.error = error
        finally:
            self._depth -= 1
        if self._depth == 0 and self.error is None:
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
        if self.started and not self.finished:
            self._callback(None, "on_idle", free)

    def check_end(self) -> None:
        """Stop what is pending once the algorithm is finished; `finished` once its trials ended."""
        if self.algorithm.is_finished():
            for trial_id in sorted(self._pending):
                self.coordinator.stop(trial_id)
        if self.started:
            self.finished = not self._pending
