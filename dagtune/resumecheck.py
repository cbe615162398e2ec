"""Checking that a trainer loaded from a checkpoint trains on as the one that saved it.

In dagtune every branch is a resume: trials that share a prefix continue from its checkpoint,
in a trainer built afresh (`Trainer.load_state_dict`), often on another worker. A
``state_dict()`` that leaves something out (the optimizer, so its momentum starts over; a
learning-rate scheduler; a private generator) makes every branched trial train differently
from training it alone, silently. A worker therefore checks resuming at its first
checkpoints of each model (`ResumeChecks`): a fresh trainer loaded from the checkpoint just
written trains the next step, and what it has then (`StepOutcome`: every ``state_dict()``
leaf, the state of the optimizers, schedulers, modules, generators and data orders the
trainer holds in attributes, the metrics ``train()`` returned, numpy's and torch's global
random generators)
is compared with what the trainer that saved the checkpoint has after the same step. A
difference fails the trial with `ResumeChangedTrainingError`, naming the entries that differ
and the likely cause (`likely_causes`).

The check never changes what a trial computes: the fresh trainer is a second one, trained
inside `isolated_rng`, and the trainer that saved the checkpoint trains on untouched (see
`dagtune.runner`). Where the same step from the same checkpoint trained twice differs,
training itself is not deterministic (some GPU kernels): the check cannot tell, and says so
with a warning instead of failing the trial.
"""

from __future__ import annotations

import contextlib
import hashlib
import random
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from dagtune.errors import TrainerCheckError
from dagtune.evalcheck import state_digests
from dagtune.trainer import ResumableBatches, Trainer, capture_rng

__all__ = [
    "LoadStateError",
    "ResumeChangedTrainingError",
    "ResumeChecks",
    "StepOutcome",
    "differences",
    "failed_outcome",
    "held_state",
    "likely_causes",
    "load_state",
    "out_of_memory",
    "resumed_setup",
    "step_outcome",
    "trainer_outcome",
]

_SHOWN = 6  # differing entries named in the message; the rest are counted

_SCHEDULER = torch.optim.lr_scheduler.LRScheduler


class ResumeChangedTrainingError(TrainerCheckError, RuntimeError):
    """A trainer loaded from the checkpoint at step `step` trained the next step differently
    from the trainer that saved it; `keys` names what differs, `causes` what probably does it.
    `past_end`: the checkpoint is where the stage ends, so the step compared is one trained
    past it for the check alone (the trials ending there never train it)."""

    def __init__(self, step: int, keys: list[str], causes: list[str], checks: int, past_end: bool = False):
        self.step, self.keys, self.causes, self.past_end = step, keys, causes, past_end
        shown = ", ".join(keys[:_SHOWN]) + (f" and {len(keys) - _SHOWN} more" if len(keys) > _SHOWN else "")
        # the likely cause first: a failed trial is shown by the first 300 characters of this line
        likely = "".join(f" Likely cause: {cause}" for cause in causes)
        compared = (
            f"A trainer loaded from the checkpoint at step {step}, where this stage ends, and the "
            f"trainer that saved it each trained one step more (step {step + 1}, trained for this "
            "check alone and discarded), and they differ"
            if past_end
            else f"After step {step + 1}, a trainer loaded from the checkpoint at step {step} differs "
            "from the trainer that saved it and trained on"
        )
        super().__init__(
            f"resuming from a checkpoint changes training.{likely} {compared}: {shown}. dagtune "
            "resumes every branch from a checkpoint, so trials would differ from training them "
            "alone (run_alone): state_dict() must hold everything later steps depend on, and "
            "load_state_dict() must restore it. "
            f"(Each worker checks resuming at its first {_count(checks, 'checkpoint')} of a model; "
            "check_resume=0 turns the check off. The stage is not retried: it would fail the "
            "same way.)"
        )


class LoadStateError(TrainerCheckError, RuntimeError):
    """``load_state_dict`` raised on a trainer that ``__init__`` had just built. dagtune
    resumes a stage (and checks resuming) by building a fresh trainer, loading the checkpoint
    into it, and only then calling ``setup`` with every value, so the trainer's state must be
    built in ``__init__``. `trainer` names the class, `error` is what it raised."""

    def __init__(self, trainer: str, error: BaseException):
        self.trainer, self.error = trainer, error
        super().__init__(
            f"{trainer}.load_state_dict() failed on a trainer that {trainer}.__init__ had just built: "
            "build what state_dict() holds (model, optimizer, data order) in __init__, not in setup() "
            f"({type(error).__name__}: {error}). dagtune resumes a stage from a checkpoint by building a "
            "fresh trainer, calling load_state_dict() and only then setup() with every value. A "
            "hyper-parameter that decides the model's shape can't be applied after loading: make it a "
            "trainer argument (trainer_kwargs), one study per shape. (The stage is not retried: it "
            "would fail the same way.)"
        )


def load_state(trainer: Trainer, state: Mapping[str, Any]) -> None:
    """Load a checkpoint's trainer `state` into `trainer`, which ``__init__`` has just built:
    a failure is the trainer's code, told as such (`LoadStateError`); running out of memory
    is not, and is raised as it came."""
    try:
        trainer.load_state_dict(state)  # type: ignore[arg-type]
    except Exception as error:
        if out_of_memory(error):
            raise
        raise LoadStateError(getattr(type(trainer), "__qualname__", repr(type(trainer))), error) from error


def _count(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


@dataclass(frozen=True)
class StepOutcome:
    """What a trainer has after a training step, as digests per entry: `state` (its
    ``state_dict()`` leaves and the state of what it holds, `held_state`), the `metrics`
    ``train()`` returned, the global generators' states (`rng`). `error`: what the step
    raised instead (then the rest is empty)."""

    state: dict[str, str]
    metrics: dict[str, float]
    rng: dict[str, str]
    error: str | None = None
    setup_changed: tuple[str, ...] = ()  # what a resumed trainer's setup() changed (`resumed_setup`)


def step_outcome(
    saved: Mapping[str, Any], attributes: Mapping[str, Any], metrics: Mapping[str, float]
) -> StepOutcome:
    """The outcome of a step a trainer just trained: `saved` is its ``state_dict()`` now,
    `attributes` its attributes (``vars(trainer)``), `metrics` what ``train()`` returned."""
    state: dict[str, str] = {}
    for path, value in held_state(attributes).items():
        state.update(state_digests(value, path))
    state.update(state_digests(saved))
    return StepOutcome(state, dict(metrics), _rng_digests(capture_rng()))


def trainer_outcome(trainer: Trainer, metrics: Mapping[str, float]) -> StepOutcome:
    """The outcome of the step `trainer` just trained (which returned `metrics`)."""
    return step_outcome(trainer.state_dict(), getattr(trainer, "__dict__", {}), metrics)


def failed_outcome(error: BaseException) -> StepOutcome:
    """The outcome of a step that raised `error`."""
    return StepOutcome({}, {}, {}, f"{type(error).__name__}: {error}")


def resumed_setup(trainer: Trainer, values: Mapping[str, Any]) -> tuple[str, ...]:
    """Call ``trainer.setup(values)`` on a trainer just loaded from a checkpoint (its random
    generators restored); what it changed of the loaded state: ``state_dict()`` entries and
    numpy's and torch's global generators. A resumed trainer's ``setup()`` gets every value,
    the trainer that saved the checkpoint only the changed ones (often none), so a ``setup()``
    that reseeds (``torch.manual_seed(hp["seed"])``) or sets again what training moved since
    (a learning rate a scheduler decayed) makes the two train differently: `likely_causes`
    names it. Costs two digests of ``state_dict()``; only the resume check calls it. A
    trainer whose ``state_dict()`` works only once ``setup()`` has built what it holds (a
    scheduler whose length is a hyper-parameter) is compared by its generators alone."""
    before = {**_state_before_setup(trainer), **_rng_digests(capture_rng())}
    trainer.setup(values)
    after = {**_rng_digests(capture_rng()), **_held_digests(trainer)}
    if any(key.startswith("state_dict()") for key in before):
        after.update(state_digests(trainer.state_dict()))
    changed = [key for key in after if key in before and before[key] != after[key]]
    if any(key.startswith("self.") for key in changed):  # the same entries, by attribute
        changed = [key for key in changed if not key.startswith("state_dict()")]
    return tuple(changed)


def _state_before_setup(trainer: Trainer) -> dict[str, str]:
    """Digests of `trainer`'s state as loaded, before ``setup()``: what it holds in attributes
    (optimizers, schedulers, modules, generators, data orders) and its ``state_dict()``,
    where it can give one yet."""
    digests = _held_digests(trainer)
    with contextlib.suppress(Exception):  # its parts are built by setup(): its attributes tell
        digests.update(state_digests(trainer.state_dict()))
    return digests


def _held_digests(trainer: Trainer) -> dict[str, str]:
    digests: dict[str, str] = {}
    for path, value in held_state(getattr(trainer, "__dict__", {})).items():
        digests.update(state_digests(value, path))
    return digests


_SETUP_MOVED_RNG = (
    "setup() changes the global random generators (it reseeds them, e.g. "
    "torch.manual_seed(hp['seed']), or draws from them) when a resumed trainer calls it with every "
    "value, where the trainer that saved the checkpoint had no such call: dagtune seeds and restores "
    "the global generators itself (a seed goes to __init__ as seed=, Study(seed=...)); in setup(), "
    "draw only when a value changes, from a generator kept in state_dict()."
)


def _setup_changed_state(keys: list[str]) -> str:
    shown = ", ".join(keys[:3]) + (f" and {_count(len(keys) - 3, 'more')}" if len(keys) > 3 else "")
    return (
        f"setup() changes what load_state_dict() restored ({shown}) when a resumed trainer calls it "
        "with every value, where the trainer that saved the checkpoint had kept it (a learning rate "
        "a scheduler had moved, set again from hp['lr']?): setup() must leave as it is what a value "
        "that did not change set before (give a scheduler the value, as its base_lrs, not the optimizer)."
    )


def _rng_digests(rng: Mapping[str, Any]) -> dict[str, str]:
    """Digests of numpy's and torch's global generators. Not python's: a Dask worker's own
    threads draw from it while a step runs, so it differs between runs of the same step."""
    digests = {}
    for name, part in rng.items():
        if name == "python":
            continue
        text = "".join(f"{k}={v};" for k, v in sorted(state_digests(part, "").items()))
        digests[f"the global {name} random generator"] = hashlib.sha256(text.encode()).hexdigest()
    return digests


def held_state(attributes: Mapping[str, Any]) -> dict[str, Any]:
    """The state of the stateful objects a trainer holds in `attributes` (directly or in a
    list, tuple or dict attribute), keyed by how to read it: ``self.optimizer.state_dict()``,
    ``self.scheduler.state_dict()``, ``self.model.state_dict()``, ``self.gen.get_state()``,
    ``self.batches.state_dict()``, numpy's and python's generators' states. Modules come
    last: their weights differ whenever anything else does, so the others name a cause."""
    found: dict[str, Any] = {}
    for name, value in sorted(_attributes(attributes), key=lambda item: isinstance(item[1], torch.nn.Module)):
        if isinstance(value, (torch.nn.Module, torch.optim.Optimizer, _SCHEDULER, ResumableBatches)):
            found[f"self.{name}.state_dict()"] = value.state_dict()
        elif isinstance(value, torch.Generator):
            found[f"self.{name}.get_state()"] = value.get_state()
        elif isinstance(value, np.random.Generator):
            found[f"self.{name}.bit_generator.state"] = value.bit_generator.state
        elif isinstance(value, np.random.RandomState):
            found[f"self.{name}.get_state()"] = value.get_state(legacy=False)
        elif isinstance(value, random.Random):
            found[f"self.{name}.getstate()"] = value.getstate()
    return found


def _attributes(attributes: Mapping[str, Any]) -> Iterator[tuple[str, Any]]:
    for name, value in attributes.items():
        if isinstance(value, dict):
            for key, item in value.items():
                yield f"{name}[{key!r}]", item
        elif isinstance(value, (list, tuple)):
            for index, item in enumerate(value):
                yield f"{name}[{index}]", item
        else:
            yield name, value


def differences(live: StepOutcome, resumed: StepOutcome) -> list[str]:
    """The entries in which the resumed trainer's outcome differs from the live one's:
    attributes' state first (they name the cause best: optimizers, schedulers and
    generators before modules), then ``state_dict()`` leaves, then ``train()`` metrics,
    then the global generators."""
    if live.error is not None or resumed.error is not None:
        if live.error == resumed.error:
            return []
        return [
            f"train() raised {error} in the {who} trainer"
            for who, error in (("resumed", resumed.error), ("live", live.error))
            if error is not None
        ]
    keys = dict.fromkeys([*live.state, *resumed.state])  # in `step_outcome`'s order
    changed = [key for key in keys if live.state.get(key) != resumed.state.get(key)]
    metrics = dict.fromkeys([*live.metrics, *resumed.metrics])
    changed += [
        f"train() metrics[{name!r}]"
        for name in metrics
        if not _same_number(live.metrics.get(name), resumed.metrics.get(name))
    ]
    changed += [name for name in live.rng if live.rng[name] != resumed.rng.get(name)]
    return changed


def _same_number(a: float | None, b: float | None) -> bool:
    return a == b or (a is not None and b is not None and a != a and b != b)  # NaN == NaN here


def likely_causes(
    attributes: Mapping[str, Any],
    saved: Any,
    keys: list[str],
    setup_changed: tuple[str, ...] = (),
    defaulted: list[str] | tuple[str, ...] = (),
) -> list[str]:
    """What probably makes a resumed trainer (with `attributes`, ``vars(trainer)``, whose
    checkpoint held `saved`, its ``state_dict()``) train differently, given the differing `keys`: an optimizer, scheduler,
    generator, data order or module it holds that `saved` does not hold (a module whose
    weights differ only because of one of those is not blamed), else one that `saved` holds
    but loading did not restore; else the general suspects. What the resumed trainer's
    ``setup()`` changed of the loaded state (`setup_changed`, `resumed_setup`: the global
    generators, ``state_dict()`` entries) comes first: it makes the weights differ, so the
    modules and optimizers it made differ are not blamed for not loading. What ``setup()``
    changed of an object `saved` does not hold is not named so: loading never restored it
    (an optimizer left out of ``state_dict()`` whose learning rate ``setup()`` sets), and
    `_causes` names it as missing. A default the saving trainer's ``setup()`` applied instead
    of the config's value (`defaulted`: the `DefaultedHyperparameterWarning` messages; the
    resumed trainer is handed the value) comes first of all, for the same reason."""
    moved = [key for key in setup_changed if key.startswith("the global ")]
    unsaved = [
        f"self.{name}."
        for name, value in _attributes(attributes)
        if _describe(value) is not None and not _saved_somewhere(value, saved)
    ]
    changed = [
        key
        for key in setup_changed
        if not key.startswith("the global ") and not any(key.startswith(prefix) for prefix in unsaved)
    ]
    first = (
        [f"{message} (DefaultedHyperparameterWarning)" for message in defaulted]
        + ([_SETUP_MOVED_RNG] if moved else [])
        + ([_setup_changed_state(changed)] if changed else [])
    )
    if first:
        return [*first, *_causes(attributes, saved, keys, blame_loaded=False)]
    return _causes(attributes, saved, keys, blame_loaded=True)


def _causes(attributes: Mapping[str, Any], saved: Any, keys: list[str], blame_loaded: bool) -> list[str]:
    """`likely_causes` past what a resumed ``setup()`` changed (`blame_loaded`: False to
    leave out what state_dict() holds, which such a setup() makes differ anyway, and the
    general suspects)."""
    missing, unrestored = [], []
    for name, value in _attributes(attributes):
        kind = _describe(value)
        if kind is None or not any(key.startswith(f"self.{name}.") for key in keys):
            continue
        if not _saved_somewhere(value, saved):
            missing.append(
                f"self.{name} ({kind}) is not in state_dict(), so a resumed trainer starts it over"
                f"{_what_restarts(value)}: is it in state_dict(), and loaded in load_state_dict()?"
            )
        else:
            unrestored.append(
                f"self.{name} ({kind}) is in state_dict() but a resumed trainer's differs: does "
                "load_state_dict() load it?"
            )
    if missing or not blame_loaded:
        return missing
    if unrestored:
        return unrestored
    if not state_digests(saved):
        return ["state_dict() holds nothing."]
    if any(key.startswith("train() raised") for key in keys):
        return [
            "train() fails in one of the two trainers: it depends on something state_dict() does not hold."
        ]
    if any(key.startswith("state_dict()") for key in keys):
        return [
            "train() depends on something state_dict() does not hold (a step counter, a private "
            "generator, a data loader's position, a value set in __init__ and changed since), or "
            "load_state_dict() does not restore all of state_dict()."
        ]
    if any(key.startswith("train() metrics") for key in keys):
        return [
            "train() returned other metrics from equal states: it reads something state_dict() does not hold."
        ]
    return [
        "the step drew a different amount of random numbers from the global generators: "
        "something that decides how many (a data order, a counter) is not in state_dict()."
    ]


def _describe(value: Any) -> str | None:
    if isinstance(value, torch.optim.Optimizer):
        return f"the {type(value).__name__} optimizer"
    if isinstance(value, _SCHEDULER):
        return f"the {type(value).__name__} learning-rate scheduler"
    if isinstance(value, torch.nn.Module):
        return f"the {type(value).__name__} module"
    if isinstance(value, torch.Generator):
        return "a private torch.Generator"
    if isinstance(value, (np.random.Generator, np.random.RandomState, random.Random)):
        return f"a private {type(value).__module__}.{type(value).__name__}"
    if isinstance(value, ResumableBatches):
        return "the data order"
    return None


#: what an optimizer's per-parameter state is, by its key in torch.optim's state dicts
_OPTIMIZER_STATE = {
    "momentum_buffer": "momentum buffers",
    "exp_avg": "first moments",
    "exp_avg_sq": "second moments",
    "max_exp_avg_sq": "maximal second moments",
    "square_avg": "squared-gradient averages",
    "acc_delta": "accumulated updates",
    "sum": "accumulated squared gradients",
}


def _what_restarts(value: Any) -> str:
    if isinstance(value, torch.optim.Optimizer):
        kinds = sorted({key for state in value.state.values() for key in state if key != "step"})
        return f" (its {', '.join(_OPTIMIZER_STATE.get(k, k) for k in kinds)})" if kinds else ""
    if isinstance(value, _SCHEDULER):
        return " (its schedule)"
    return ""


def _saved_somewhere(value: Any, saved: Any) -> bool:
    """Whether `saved` holds a part shaped like `value`'s state."""
    if isinstance(value, torch.optim.Optimizer):
        return _any_mapping(saved, lambda m: {"state", "param_groups"} <= m.keys())
    if isinstance(value, _SCHEDULER):
        return _any_mapping(saved, lambda m: "last_epoch" in m)
    if isinstance(value, ResumableBatches):
        return _any_mapping(saved, lambda m: {"epoch", "position", "batch_size"} <= m.keys())
    if isinstance(value, torch.nn.Module):
        names = set(value.state_dict())
        return bool(names) and _any_mapping(saved, lambda m: names <= set(map(str, m.keys())))
    if isinstance(value, torch.Generator):
        size = value.get_state().numel()
        return any(
            isinstance(leaf, torch.Tensor) and leaf.dtype == torch.uint8 and leaf.numel() == size
            for leaf in _leaves(saved)
        )
    return False  # numpy's and python's generators: no telling shape


def _any_mapping(value: Any, test: Any) -> bool:
    if isinstance(value, Mapping):
        return test(value) or any(_any_mapping(item, test) for item in value.values())
    if isinstance(value, (list, tuple)):
        return any(_any_mapping(item, test) for item in value)
    return False


def _leaves(value: Any) -> Iterator[Any]:
    if isinstance(value, Mapping):
        for item in value.values():
            yield from _leaves(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _leaves(item)
    else:
        yield value


def out_of_memory(error: BaseException) -> bool:
    """Whether `error` says memory ran out (a second trainer may not fit beside the first)."""
    return isinstance(error, (MemoryError, torch.OutOfMemoryError)) or "out of memory" in str(error)


class ResumeChecks:
    """One worker's record of the resume checks it passed, per model identity: it checks
    until `limit` passed (a failed or inconclusive one counts nothing, so a retried stage is
    checked again)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._passed: dict[str, int] = {}

    def due(self, identity: str, limit: int) -> bool:
        """Whether the next checkpoint of `identity` on this worker is to be checked."""
        with self._lock:
            return self._passed.get(identity, 0) < limit

    def passed(self, identity: str) -> None:
        """Count a passed check of `identity`."""
        with self._lock:
            self._passed[identity] = self._passed.get(identity, 0) + 1
