"""A trial's model back after a study: its trainer state at the trial's last step, loaded
from its checkpoint or, where there is none, rebuilt by training.

Every trial's last step is a point of the search plan. If a committed checkpoint sits
there (a completed trial's is kept by garbage collection, and the best trials' too), the
state is loaded from it, verified and with ``weights_only=True``. If not (garbage
collection removed it, or the trial stopped between checkpoints), the state is rebuilt from
the nearest checkpoint before it on the trial's path (from scratch if none is left) by
training the missing steps **in this process**, exactly as a resumed stage trains them
(`dagtune.runner.PathRunner`; `dagtune.fusion.FusedPathRunner` for a fused study): the
same ``setup`` calls, the RNG states saved with the checkpoint, the trainer's own data
order. The rebuilt state is therefore the trial's, bit for bit, wherever this process
computes as the study's workers did (the same kind of device and library versions).
Nothing is written to storage; a warning says how many steps are trained.

`Restorer` does this for one model identity; `stored_model` reads what it needs from
storage alone (the study's records: the trial, its trainer, seed and arguments; the
model's search plan: the path and its checkpoints).
"""

from __future__ import annotations

import dataclasses
import importlib
import io
import logging
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from dagtune.checkpoints import CheckpointError, CheckpointStore
from dagtune.events import TaskFailed
from dagtune.fusion import FusedPathRunner
from dagtune.identity import main_module_name, model_identity, trainer_name
from dagtune.plan import Journal, PlanJournal, SearchPlan, plan_header, records_header
from dagtune.records import PENDING, CheckpointInfo, Opened, TrialState, is_study_name, read_study_records
from dagtune.resumecheck import load_state
from dagtune.runner import CheckpointBackend, PathRunner, checkpoint_parts
from dagtune.tasks import PathTask, Segment, TrainerSpec
from dagtune.trainer import Trainer, build_trainer, capture_rng, isolated_rng, restore_rng

__all__ = ["Restorer", "TrialPath", "import_trainer", "stored_model", "trial_path"]

log = logging.getLogger("dagtune")

Point = tuple[str, int]


@dataclass(frozen=True)
class TrialPath:
    """A point of the search plan and the way to it: the segments over steps ``[0, step)``
    (each with its node's config) and the committed checkpoints on them, latest first."""

    step: int
    segments: tuple[Segment, ...]
    checkpoints: tuple[Point, ...]


def trial_path(plan: SearchPlan, node: str, step: int) -> TrialPath:
    """The path to point ``(node, step)`` of `plan` (step 0: a fresh trainer, no path)."""
    if step <= 0:
        return TrialPath(0, (), ())
    owner = plan.owner(node, step)
    pieces = [(n, a, b) for n, a, b in plan.segments(owner, step) if a < b]
    segments = tuple(Segment(n, plan.nodes[n].config, a, b) for n, a, b in pieces)
    points = [(n, s) for n, a, b in pieces for s in plan.nodes[n].checkpoints if a < s <= b]
    return TrialPath(step, segments, tuple(sorted(points, key=lambda p: p[1], reverse=True)))


class _Capture:
    """The store a rebuilding runner sees: the source state already loaded, and the state
    saved at the target kept here (round-tripped as a checkpoint would be), never written."""

    def __init__(self, source: Point | None, state: dict | None):
        self.source, self.state = source, state
        self.saved: dict | None = None

    def load(self, identity: str, node: str, step: int) -> dict:
        if (node, step) != self.source or self.state is None:
            raise CheckpointError(f"no checkpoint at ({node}, {step}) to rebuild from")
        return self.state

    def info(self, identity: str, node: str, step: int) -> CheckpointInfo | None:
        return None

    def save(self, identity: str, node: str, step: int, state: dict) -> CheckpointInfo:
        buffer = io.BytesIO()
        torch.save(state, buffer)
        data = buffer.getvalue()
        self.saved = torch.load(io.BytesIO(data), weights_only=True)
        return CheckpointInfo(len(data), "")


class Restorer:
    """Trainer states of one model identity at points of its search plan (see the module
    docstring). `spec` gives the trainer's class, arguments and seed, called only when a
    trainer must be built (loading a checkpoint's state needs none); `fused`: the study
    trained through the fused code path, so a rebuild does too."""

    def __init__(
        self,
        store: CheckpointBackend | None,
        identity: str,
        spec: Callable[[], TrainerSpec],
        *,
        fused: bool = False,
        torch_threads: int | None = 1,
    ):
        self.store, self.identity, self.fused = store, identity, fused
        self.torch_threads = torch_threads
        self._make_spec, self._spec_made = spec, None

    def _spec(self) -> TrainerSpec:
        if self._spec_made is None:
            self._spec_made = self._make_spec()
        return self._spec_made

    def _load(self, point: Point) -> dict | None:
        """The checkpoint at `point`, verified; None if it is gone or unusable (said why)."""
        if self.store is None:
            return None
        try:
            if isinstance(self.store, CheckpointStore):
                here = None if torch.cuda.is_available() else "cpu"
                state = self.store.load(self.identity, *point, map_location=here)
            else:
                state = self.store.load(self.identity, *point)
            checkpoint_parts(state)
        except (CheckpointError, KeyError) as error:
            log.warning(
                "dagtune: the checkpoint at %s can't be used (%s); an earlier one is tried", point, error
            )
            return None
        return state

    def state(self, path: TrialPath, what: str = "the point") -> dict:
        """The training state (``{"trainer": ..., "rng": ...}``) at the end of `path`:
        loaded from its checkpoint, or rebuilt from the latest usable one before it.
        `what` names the point in the warning a rebuild gives."""
        if path.step == 0:
            return self._fresh()
        for point in path.checkpoints:
            loaded = self._load(point)
            if loaded is None:
                continue
            if point[1] == path.step:
                return loaded
            return self._rebuild(path, point, loaded, what)
        return self._rebuild(path, None, None, what)

    def _fresh(self) -> dict:
        spec = self._spec()
        with isolated_rng():
            trainer = build_trainer(spec.cls, spec.kwargs, spec.seed)
            return {"trainer": trainer.state_dict(), "rng": capture_rng()}

    def _rebuild(self, path: TrialPath, source: Point | None, state: dict | None, what: str) -> dict:
        start = 0 if source is None else source[1]
        segments = tuple(
            dataclasses.replace(s, start=max(s.start, start)) for s in path.segments if s.end > start
        )
        log.warning(
            "dagtune: no checkpoint at %s (step %d): rebuilding it by training %d steps in this process, "
            "from %s",
            what,
            path.step,
            path.step - start,
            f"the checkpoint at step {start}" if source else "scratch",
        )
        spec = self._spec()
        task = PathTask(
            key=f"dagtune-restore-{segments[-1].node[:8]}-{path.step}",
            trainer=spec,
            segments=segments,
            source=source,
            checkpoints=frozenset({path.step}),
            eval_every=path.step + 1,
            torch_threads=self.torch_threads,
        )
        capture = _Capture(source, state)
        with isolated_rng():  # the caller's generators are not this training's
            runner = FusedPathRunner([task], capture) if self.fused else PathRunner(task, capture)
            events = runner.run()
        for event in events:
            if isinstance(event, TaskFailed):
                raise RuntimeError(
                    f"rebuilding {what} failed at step {event.step}:\n{event.traceback or event.error}"
                )
        if capture.saved is None:
            raise RuntimeError(f"rebuilding {what} ended before step {path.step}")
        return capture.saved

    def trainer(self, path: TrialPath, *, rng: bool = True, what: str = "the point") -> Trainer:
        """A trainer built here and restored at the end of `path`. With `rng`, python's,
        numpy's and torch's global generators are put in the state they had there (as
        dagtune does when it resumes), so `train()` continues the trial exactly and an
        `evaluate()` that draws random numbers gives the trial's metrics."""
        state = self.state(path, what)
        spec = self._spec()
        with isolated_rng():
            trainer = build_trainer(spec.cls, spec.kwargs, spec.seed)
            if path.step > 0:
                load_state(trainer, checkpoint_parts(state)[0])
        if rng:
            restore_rng(state["rng"])
        return trainer


# --------------------------------------------------------------------------- from storage


def import_trainer(name: str) -> type[Trainer]:
    """The trainer class a study recorded as ``module.qualname``, imported here (the module
    is the longest importable prefix, as pickle finds a class; in the script running as
    ``__main__``, its own module name stands for it, not for a second import of its file).
    A class recorded as ``__main__``'s is found only in that script's process. ImportError
    says what to do otherwise."""
    parts = name.split(".")
    main = main_module_name()
    for cut in range(len(parts) - 1, 0, -1):
        module_name = ".".join(parts[:cut])
        if module_name == main and module_name not in sys.modules:
            module_name = "__main__"
        try:
            module = sys.modules.get(module_name) or importlib.import_module(module_name)
        except ImportError:
            continue
        found: Any = module
        for attribute in parts[cut:]:
            found = getattr(found, attribute, None)
        if isinstance(found, type) and issubclass(found, Trainer):
            return found
        break
    where = (
        "it is defined in the script that ran the study, and this is another process"
        if name.startswith("__main__.")
        else "it is not importable here"
    )
    raise ImportError(
        f"the study's trainer {name} can't be found ({where}); pass trainer=TheTrainerClass "
        "(it is checked against the study's model identity)"
    )


def _spec_of(
    opened: Opened, identity: str, trainer: type[Trainer] | None, trainer_kwargs: Mapping[str, Any] | None
) -> TrainerSpec:
    """The study's trainer spec: the recorded trainer and arguments unless given, checked to
    make the study's model identity (a given class must bear the recorded class name; it may
    come from another module, as a class of the script that ran the study does)."""
    if trainer is None:
        if not opened.trainer:
            raise ValueError("the study's records do not name its trainer: pass trainer=")
        trainer = import_trainer(opened.trainer)
    elif opened.trainer and not opened.trainer.endswith(f".{trainer.__qualname__}"):
        raise ValueError(
            f"trainer={trainer_name(trainer)} is not the study's trainer {opened.trainer}: give that class"
        )
    if trainer_kwargs is None:
        if opened.trainer_kwargs is None:
            raise ValueError(
                "the study did not record its trainer arguments (they do not survive JSON, or a dagtune "
                "before 0.2 wrote it): pass trainer_kwargs="
            )
        trainer_kwargs = opened.trainer_kwargs
    seed = opened.seed or 0
    # under the recorded name: a class may be imported from another module than the one the
    # study ran it from (its script's __main__)
    made = model_identity(
        trainer,
        dict(trainer_kwargs),
        seed,
        opened.version or "",
        name=opened.trainer,
        torch_threads=opened.torch_threads,
    )
    if made != identity:
        raise ValueError(
            f"trainer {trainer_name(trainer)} with trainer_kwargs={dict(trainer_kwargs)!r} and seed {seed} "
            f"is model {made}, but the study trained model {identity} (trainer {opened.trainer}): give "
            "the study's trainer class and arguments"
        )
    return TrainerSpec(trainer, dict(trainer_kwargs), seed, identity)


def stored_model(
    store: CheckpointStore,
    name: str,
    trial_id: int,
    *,
    trainer: type[Trainer] | None = None,
    trainer_kwargs: Mapping[str, Any] | None = None,
) -> tuple[Restorer, TrialPath, TrialState]:
    """What restoring trial `trial_id` of study `name` needs, read from `store` alone: a
    `Restorer` for the study's model, the path to the trial's last step (for a pending trial,
    the last step it has metrics for) and the trial as its records tell it. The trainer is
    the recorded one unless `trainer` is given, built with the recorded arguments unless
    `trainer_kwargs` are given; either way it must make the study's model identity."""
    if not is_study_name(name):
        raise ValueError(f"{name!r} is not a study name (1-128 letters, digits, '.', '_' or '-')")
    journal = Journal(store.fs, f"{store.root}/studies/{name}/journal", header=records_header(name))
    records = read_study_records((entry.record, entry.where) for entry in journal.read_new())
    if not records.opened:
        raise ValueError(f"no study {name!r} in {store.url}")
    if trial_id not in records.trials:
        known = sorted(records.trials)
        shown = f"{known[0]}..{known[-1]}" if known else "none"
        raise KeyError(f"study {name!r} has no trial {trial_id!r} (its trial ids: {shown})")
    opened, state = records.opened[-1], records.trials[trial_id]
    identity = opened.identity
    plan_journal = PlanJournal(
        SearchPlan(), Journal(store.fs, f"{store.root}/{identity}/plan", header=plan_header(identity))
    )
    plan_journal.load()
    plan = plan_journal.plan
    node = plan.locate(state.config, state.steps, salt=state.salt)  # reading creates nothing
    reached = state.reached
    if node is None:
        if reached > 0 or state.status == PENDING:
            raise ValueError(f"trial {trial_id} of study {name!r} is not in its model's search plan")
        path = TrialPath(0, (), ())
    else:
        if state.status == PENDING:  # as far as the plan has metrics, without a gap
            known = plan.curve(node, state.steps)
            reached = next((i for i, (step, _) in enumerate(known) if step != i + 1), len(known))
        path = trial_path(plan, node, reached)

    def spec() -> TrainerSpec:
        return _spec_of(opened, identity, trainer, trainer_kwargs)

    return (
        Restorer(store, identity, spec, fused=opened.fused, torch_threads=opened.torch_threads),
        path,
        state,
    )
