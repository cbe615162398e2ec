"""Surrogate studies (Hydro §4.1): tune a width-scaled model, train the full one once.

A `SurrogateStudy` holds two studies of one trainer: the *surrogate*, the trainer with its
width argument (`Surrogate.argument`, ``scale`` by default) set to `Surrogate.scale`, and
the *target*, the trainer as given. An algorithm searches on the surrogate (an ordinary
study of its own model identity: stage tree, reuse and resume as for any study); the best
configuration it finds is then trained once on the target. Under muP (`dagtune.mup`) the
learning rate, its schedule, momentum and batch size that are best at width ``base / S``
are best at ``base`` too; regularization (weight decay, dropout) is not, so a search that
varies it is warned about.

*Eager transfer* (Hydro §4.3): with ``Surrogate(eager=share)``, once `share` of the
surrogate trials submitted so far have ended, the target starts training the current best
on the first worker slot the search leaves idle (the search's coordinator has nothing ready
for it and the algorithm adds nothing when told), so that it overlaps the end of the search
without taking a slot the search could use; it starts again (on its own slot) whenever the
best configuration changes, and if the search's final best is the one the target trains
already, it is not trained again.

Building a surrogate study builds the surrogate trainer once, in this process, so that a
width that does not scale (``Surrogate(scale=3)`` of a base width of 512: ``512 / 3 is not a
whole width``) is refused at once, with its cause, instead of failing every trial.
"""

from __future__ import annotations

import inspect
import math
import time
import warnings
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from dagtune.algos import Algorithm, Context, Decision, Submit
from dagtune.config import Config, config_dumps, normalize_config
from dagtune.execution import Executor
from dagtune.records import PENDING, STOPPED, StudyLink, Trial, is_study_name
from dagtune.study._results import Result, TrialResult
from dagtune.study._study import Study, TrialHandle
from dagtune.trainer import Trainer, build_trainer, isolated_rng
from dagtune.validation import check_int, check_number

__all__ = ["NOT_TRANSFERRED", "Surrogate", "SurrogateResult", "SurrogateStudy"]

#: Hyper-parameters whose best value depends on the model's width (Hydro §4.1, TP5): a
#: surrogate search that varies them is warned about (`Surrogate.not_transferred`).
NOT_TRANSFERRED: tuple[str, ...] = ("weight_decay", "dropout")

TARGET_SUFFIX = "-target"


@dataclass(frozen=True)
class Surrogate:
    """How to scale the model for a surrogate search.

    `scale`: the width divisor S (an int >= 2), passed to the trainer as `argument` (the
    trainer builds its model at ``base / S``, e.g. with `dagtune.mup.build`). `eager`: None
    (train the target once the search has ended) or a share in (0, 1]: once that share of
    the surrogate trials submitted so far have ended, start the target with the current
    best on the first slot the search leaves idle, and restart it when the best changes. `steps`: the target's training steps
    (default: the steps the best surrogate trial reached). `not_transferred`: the
    hyper-parameters whose variation in the search is warned about, as they do not
    transfer across width (default `NOT_TRANSFERRED`).
    """

    scale: int = 8
    argument: str = "scale"
    eager: float | None = None
    steps: int | None = None
    not_transferred: tuple[str, ...] = NOT_TRANSFERRED

    def __post_init__(self) -> None:
        check_int("Surrogate.scale", self.scale, minimum=2, note="1 is the target itself")
        if not isinstance(self.argument, str) or not self.argument.isidentifier():
            raise ValueError(f"Surrogate.argument must name a trainer argument, got {self.argument!r}")
        if self.eager is not None:
            check_number(
                "Surrogate.eager", self.eager, above=0, maximum=1, expected="None or a share in (0, 1]"
            )
        check_int("Surrogate.steps", self.steps, minimum=1, optional=True)
        names = self.not_transferred
        if isinstance(names, str) or not isinstance(names, Iterable):
            raise ValueError(
                f"Surrogate.not_transferred must be a tuple of hyper-parameter names, got {names!r}"
            )
        names = tuple(names)
        for name in names:
            if not isinstance(name, str) or not name:
                raise ValueError(f"Surrogate.not_transferred holds {name!r}, not a hyper-parameter name")
        object.__setattr__(self, "not_transferred", names)


@dataclass(frozen=True)
class SurrogateResult:
    """What a surrogate study gave: the search on the surrogate (`surrogate`, a `Result`),
    the configuration transferred (`config`), the target trained with it (`target`, its
    final metrics in ``target.metrics``), the target study's `target_report` (the figures
    of `dagtune.coordinator.report_figures`) and `restarts`: eager target trainings started
    with a configuration the search later beat, and stopped."""

    surrogate: Result
    config: Config
    target: TrialResult
    target_report: dict
    scale: int
    restarts: int = 0

    @property
    def metric(self) -> str | None:
        return self.surrogate.metric

    def __repr__(self) -> str:
        value = self.target.metrics.get(self.metric or "")
        shown = "no metric" if value is None else f"{self.metric}={value:.4g}"
        return (
            f"<SurrogateResult S={self.scale}: {len(self.surrogate.trials)} surrogate trials, "
            f"target {shown} after {self.target.steps} steps, {self.restarts} restarts>"
        )


class _Watched(Algorithm):
    """An algorithm as the surrogate search runs it: every decision and callback is the
    wrapped algorithm's; it also checks submitted configs for hyper-parameters that do not
    transfer, and tells the study when a trial ended (for eager transfer)."""

    def __init__(self, inner: Algorithm, owner: SurrogateStudy):
        self.inner = inner
        self.metric, self.mode = inner.metric, inner.mode
        self.trials = inner.trials  # the session appends to the wrapped algorithm's list
        self._owner = owner
        self._first: Config | None = None
        self._warned: set[str] = set()
        self.starting = False  # the first decisions are being applied

    def _watch(self, decisions: Iterable[Decision] | None) -> Iterable[Decision] | None:
        if decisions is None:
            return None
        return (self._check(d) for d in decisions)  # lazily: a grid's submissions stream

    def _check(self, decision: Decision) -> Decision:
        if isinstance(decision, Submit):
            config = normalize_config(decision.config, owner="config")
            if self._first is None:
                self._first = config
            first = self._first
            varied = [
                name
                for name in self._owner.surrogate.not_transferred
                if name not in self._warned
                and name in config
                and name in first
                and config_dumps({name: config[name]}) != config_dumps({name: first[name]})
            ]
            if varied:
                self._warned.update(varied)
                verb = "does" if len(varied) == 1 else "do"
                warnings.warn(
                    f"the surrogate search varies {', '.join(varied)}, which {verb} not transfer across "
                    "width (Hydro §4.1): the value best for the surrogate need not be best for the target; "
                    "fix it in the search and tune it on the target",
                    UserWarning,
                    stacklevel=2,
                )
        return decision

    def start(self, ctx: Context):
        return self._starting(self.inner.start(ctx))

    def _starting(self, decisions: Iterable[Decision] | None) -> Iterator[Decision]:
        """The first decisions; trials ending while they are applied (results known already,
        trials restored from an earlier session) move the target once, after the last."""
        self.starting = True
        try:
            yield from self._watch(decisions) or ()
        finally:
            self.starting = False
        self._owner._surrogate_progress(self)

    def on_result(self, trial: Trial, step: int, metrics: dict[str, float]):
        return self._watch(self.inner.on_result(trial, step, metrics))

    def on_complete(self, trial: Trial):
        decisions = self._watch(self.inner.on_complete(trial))
        self._owner._surrogate_progress(self)
        return decisions

    def on_end(self, trial: Trial):
        decisions = self._watch(self.inner.on_end(trial))
        self._owner._surrogate_progress(self)
        return decisions

    def on_idle(self, free: int):
        decisions = list(self._watch(self.inner.on_idle(free)) or ())
        if not decisions:  # the search leaves slots idle: the eager target may take one
            self._owner._surrogate_idle(self)
        return decisions

    def prospects(self):
        return self.inner.prospects()

    def best_trial(self) -> Trial | None:
        return self.inner.best_trial()

    def is_finished(self) -> bool:
        return self.inner.is_finished()

    def best_so_far(self) -> TrialResult | None:
        """The configuration the search would answer with now (as `Result.best` picks it)."""
        return Result(list(self.trials), {}, self.metric, self.mode, self.inner.best_trial()).best


def _check_surrogate_builds(
    trainer: type[Trainer], kwargs: Mapping[str, Any], surrogate: Surrogate, seed: int
) -> None:
    """Build the surrogate trainer once (in isolation from the global random generators) and
    raise a ValueError with the cause if it cannot be built at its scale."""
    try:
        with isolated_rng():
            build_trainer(trainer, {**kwargs, surrogate.argument: surrogate.scale}, seed)
    except Exception as error:
        raise ValueError(
            f"{trainer.__name__} cannot be built as a surrogate of Surrogate(scale={surrogate.scale}) "
            f"({surrogate.argument}={surrogate.scale}): {type(error).__name__}: {error}"
        ) from error


def _check_scale_argument(trainer: type[Trainer], kwargs: Mapping[str, Any], argument: str) -> None:
    """`argument` must be an argument of the trainer; the target's value, if given, is 1."""
    parameters = inspect.signature(trainer.__init__).parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
    if argument not in parameters and not takes_any:
        raise ValueError(
            f"Surrogate.argument={argument!r} is not an argument of {trainer.__name__} "
            f"(it takes {[p for p in parameters if p != 'self']})"
        )
    if argument in kwargs and kwargs[argument] != 1:
        raise ValueError(
            f"trainer_kwargs[{argument!r}] = {kwargs[argument]!r}: the trainer arguments are the "
            f"target's (width scale 1); the surrogate's scale is Surrogate.scale"
        )


class SurrogateStudy:
    """A surrogate study of `trainer`: search on the trainer at width ``base / scale``,
    train the best configuration once on the trainer as given (Hydro §4.1; `dagtune.mup`).

    The surrogate study is named `name` (trainer arguments plus ``{argument: scale}``), the
    target study ``name + "-target"`` (the trainer arguments as given); both keep their
    trials, plans and checkpoints in `storage` as any study does, so running the same
    script again resumes both. On Dask they share one cluster (the embedded one or
    `client`); a simulation gives each its executor (`executor`, `target_executor`).
    The other keyword arguments are `Study`'s, for both.
    """

    def __init__(
        self,
        trainer: type[Trainer],
        trainer_kwargs: Mapping[str, Any] | None = None,
        surrogate: Surrogate | None = None,
        name: str = "study",
        *,
        client: Any = None,
        workers: int | None = None,
        executor: Executor | None = None,
        target_executor: Executor | None = None,
        **options: Any,
    ):
        surrogate = Surrogate() if surrogate is None else surrogate
        if not isinstance(surrogate, Surrogate):
            raise TypeError(f"surrogate must be a dagtune.Surrogate, got {surrogate!r}")
        if not isinstance(trainer, type) or not issubclass(trainer, Trainer):
            raise TypeError(f"trainer must be a dagtune.Trainer subclass, got {trainer!r}")
        if not is_study_name(name) or not is_study_name(name + TARGET_SUFFIX):
            raise ValueError(
                f"name must be 1-{128 - len(TARGET_SUFFIX)} letters, digits, '.', '_' or '-' "
                f"(the target study is name + {TARGET_SUFFIX!r}), got {name!r}"
            )
        if (executor is None) != (target_executor is None):
            given, missing = (
                ("executor", "target_executor") if executor is not None else ("target_executor", "executor")
            )
            raise ValueError(
                f"{given} is given but {missing} is None: the surrogate and the target "
                "each need their executor in a simulation"
            )
        kwargs = dict(trainer_kwargs or {})
        _check_scale_argument(trainer, kwargs, surrogate.argument)
        _check_surrogate_builds(trainer, kwargs, surrogate, options.get("seed", 0))
        self.surrogate = surrogate
        self.name = name
        target_name = name + TARGET_SUFFIX
        self.surrogate_study = Study(
            trainer,
            {**kwargs, surrogate.argument: surrogate.scale},
            name=name,
            client=client,
            workers=workers,
            executor=executor,
            link=StudyLink("surrogate", target_name, surrogate.scale),
            **options,
        )
        try:
            shared = getattr(self.surrogate_study, "client", None)
            self.target_study = Study(
                trainer,
                kwargs,
                name=target_name,
                client=shared,
                executor=target_executor,
                link=StudyLink("target", name, surrogate.scale),
                **{k: v for k, v in options.items() if k != "security"},  # the cluster's already
            )
        except BaseException:
            self.surrogate_study.close()
            raise
        self._target: TrialHandle | None = None
        self._restarts = 0

    # ------------------------------------------------------------------ eager transfer

    def _eager_best(self, watched: _Watched) -> TrialResult | None:
        """With eager transfer, once enough surrogate trials have ended, the best so far."""
        share = self.surrogate.eager
        trials = watched.trials
        if share is None or not trials or watched.starting:
            return None
        ended = sum(1 for t in trials if t.status != PENDING)
        if ended < math.ceil(share * len(trials)):
            return None
        return watched.best_so_far()  # an error here is the algorithm's: `Study.run` raises it

    def _surrogate_progress(self, watched: _Watched) -> None:
        """A surrogate trial ended: with eager transfer, a target that trains already moves
        to a better configuration (on its slot); one not started yet waits for an idle slot.
        Runs under the surrogate study's lock, in its driver thread."""
        if self._target is None:
            return
        best = self._eager_best(watched)
        if best is not None:
            self._train_target(best)

    def _surrogate_idle(self, watched: _Watched) -> None:
        """The search leaves slots idle: with eager transfer due, start the target there."""
        if self._target is not None:
            return
        best = self._eager_best(watched)
        if best is not None:
            self._train_target(best)

    def _train_target(self, best: TrialResult) -> TrialHandle:
        """The target's trial of `best`'s config: the current one if it trains that config for
        those steps already, else a new one (the current one stopped: a restart)."""
        steps = self.surrogate.steps or best.steps
        current = self._target
        if current is not None:
            same = config_dumps(current.trial.config) == config_dumps(best.config)
            if same and current.trial.steps == steps:
                return current
            current.stop()  # nothing if it completed already
            self._restarts += 1
        handle = self.target_study.submit(best.config, steps)
        if handle.status == STOPPED:  # an eager target of an earlier session, restored stopped
            handle = self.target_study.submit(best.config, steps)  # a new trial: it trains on
        self._target = handle
        return handle

    # ------------------------------------------------------------------ running

    def run(self, algorithm: Algorithm, timeout: float | None = None) -> SurrogateResult:
        """Search with `algorithm` on the surrogate, then train its best configuration on the
        target (unless eager transfer trains it already); `timeout` bounds both."""
        if not isinstance(algorithm, Algorithm):
            raise TypeError(f"run needs a dagtune.algos.Algorithm, got {algorithm!r}")
        deadline = None if timeout is None else time.monotonic() + timeout
        self._target, self._restarts = None, 0
        watched = _Watched(algorithm, self)
        searched = self.surrogate_study.run(watched, timeout)  # then no callback comes any more
        best = searched.best
        if best is None:
            raise RuntimeError(
                f"the surrogate search of study {self.name!r} found no configuration: no trial "
                f"reported {algorithm.metric!r} (see its trials: {len(watched.trials)})"
            )
        handle = self._train_target(best)
        remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
        handle.result(remaining)
        target = self.target_study.trial_result(handle.id)
        return SurrogateResult(
            searched, best.config, target, self.target_study.report, self.surrogate.scale, self._restarts
        )

    # ------------------------------------------------------------------ lifetime

    def close(self) -> None:
        """Close the target study, then the surrogate study (which owns an embedded cluster)."""
        try:
            self.target_study.close()
        finally:
            self.surrogate_study.close()

    def __enter__(self) -> SurrogateStudy:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"<SurrogateStudy {self.name!r} S={self.surrogate.scale} "
            f"trainer={self.surrogate_study.trainer.__name__}>"
        )
