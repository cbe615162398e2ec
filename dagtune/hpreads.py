"""Which hyper-parameters a trainer reads: a config key nobody reads changes nothing.

A search space that varies a hyper-parameter the trainer never reads (``batch_size`` where
``setup()`` only applies ``lr``; a typo, ``learning_rate`` for ``lr``) trains identical
trials under different names and reports them as different results, silently. The runner
therefore hands the first ``setup()`` call of each task a `RecordingValues`, a ``dict`` that
notes the keys read from it (``hp["lr"]``, ``hp.get``, ``pop``, iterating it, ``dict(hp)``,
``**hp``, ``update`` from it), until the first ``train()`` returned (so a trainer that keeps
``hp`` and reads it while training counts as reading it). Testing ``"lr" in hp`` is not
reading. The keys never read, with the absent keys the trainer asked for, become a warning
(`dagtune.notices`).

Every ``setup()`` is handed a `SetupValues` (the first one of a task a `RecordingValues`): a
``dict`` whose missing key raises `MissingHyperparameterError` saying why it is missing.
``setup()`` gets only the values that changed before the step it prepares, so a trainer that
reads ``hp["lr"]`` every time fails where only the batch size changes; a bare
``KeyError: 'lr'`` about a config that has ``lr`` would send its author looking elsewhere.
A task that starts before a step where some values change hands its first ``setup()`` every
value, but ``hp[...]`` of an unchanged one, not tested first (``"lr" in hp``) nor iterated,
raises as it does in `run_alone` (one task, handed only the changed values), so such a
trainer fails the same way in a study and alone. (``hp.get`` returns the value: a trainer
loaded from a checkpoint needs it.)
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from dagtune.errors import DagtuneError

__all__ = [
    "MissingHyperparameterError",
    "RecordingValues",
    "SetupValues",
    "defaulted_message",
    "unread_message",
]

_MISSING = object()


class MissingHyperparameterError(DagtuneError, KeyError):
    """``setup()`` read a hyper-parameter the values it was handed do not hold: one that did
    not change before this step, or one the config does not have. A `KeyError`, as before."""

    def __str__(self) -> str:  # the message, not KeyError's repr of it
        return str(self.args[0])


class SetupValues(dict):
    """The values one ``setup()`` call is handed, among the config's `names`, before step
    `step` (counted from 0; None: not known): a dict whose missing key raises
    `MissingHyperparameterError` saying why. It pickles (and so is saved in a checkpoint,
    and copied) as an ``OrderedDict``."""

    def __init__(
        self,
        values: dict[str, Any],
        names: Iterable[str] | None = None,
        step: int | None = None,
        unchanged: Iterable[str] = (),
    ):
        super().__init__(values)
        self.names = sorted(values if names is None else names)
        self.step = step
        # every value now, where `names` gives them (the runner's): what hp.get's default hides
        self.current = dict(names) if isinstance(names, Mapping) else {}
        self.defaulted: list[tuple[str, Any, Any]] = []  # (name, default given, config's value)
        # values handed only because the task starts here (a stage's start, from a checkpoint
        # or a live trainer) before a step where others change: training the trial alone
        # (`run_alone`, one task) hands only those others, so each reads as absent there
        # until tested (``"lr" in hp``)
        self.unchanged = frozenset(unchanged)
        self.tested: set[Any] = set()

    def __missing__(self, key: Any) -> Any:
        raise MissingHyperparameterError(missing_message(key, self.names, self.step))

    def _alone_lacks(self, key: Any) -> bool:
        """Whether `key` is held here but `run_alone` would not hand it (see `unchanged`)."""
        return key in self.unchanged and key not in self.tested

    def __contains__(self, key: object) -> bool:
        self.tested.add(key)
        return dict.__contains__(self, key)

    def __getitem__(self, key: Any) -> Any:
        if self._alone_lacks(key):
            raise MissingHyperparameterError(
                f"{missing_message(key, self.names, self.step)}. (Here a stage starts at this step, so "
                f"setup() was handed every value, but training the trial alone (run_alone) hands only "
                "those that changed and fails here: a study fails it the same way)"
            )
        return dict.__getitem__(self, key)

    def get(self, key: Any, default: Any = None) -> Any:
        """``dict.get``; a default other than the config's value now, for a value that did
        not change, is noted in `defaulted` (``hp.get("lr", 0.1)``: setup() would apply
        0.1 where the config says otherwise; ``hp.get("lr", self.lr)`` is fine). A value held
        only because a stage starts here (`unchanged`) is returned: a trainer loaded from a
        checkpoint needs it where ``self.lr`` is only ``__init__``'s (``hp.get("lr",
        self.lr)``), and one kept in memory gets what it holds already."""
        absent = not dict.__contains__(self, key)
        if default is not None and key in self.current and absent and not _equal(default, self.current[key]):
            self.defaulted.append((key, default, self.current[key]))
        return dict.get(self, key, default)

    def __reduce_ex__(self, protocol: Any) -> tuple:
        # as an OrderedDict: what ``torch.load(weights_only=True)`` reads back, should a
        # trainer keep ``hp`` and put it in its state
        return OrderedDict, (), None, None, iter(dict.items(self))


def missing_message(key: Any, names: list[str], step: int | None) -> str:
    """Why ``hp[key]`` is missing from the values handed to ``setup()`` before `step`."""
    if key in names:
        before = "this step" if step is None else f"step {step}"
        return (
            f"setup() read hyper-parameter {key!r}, which did not change before {before}: setup() is "
            "handed only the values that changed before the step it prepares (every value at a start "
            f"or a resume), so test {key!r} in hp (or use hp.get) first"
        )
    return (
        f"setup() read hyper-parameter {key!r}, which the config does not have (it has "
        f"{', '.join(map(repr, names)) or 'none'}): a misspelled name? Use hp.get({key!r}, default) "
        "for one the config may leave out"
    )


class RecordingValues(SetupValues):
    """The values of a task's first ``setup()`` (a `SetupValues`), recording which keys are
    read while `recording`, and the keys asked for that it does not hold."""

    def __init__(
        self,
        values: dict[str, Any],
        names: Iterable[str] | None = None,
        step: int | None = None,
        unchanged: Iterable[str] = (),
    ):
        super().__init__(values, names, step, unchanged)
        self.read: set[str] = set()
        self.asked: list[str] = []  # absent keys asked for, in order
        self.recording = True

    def _note(self, key: Any) -> None:
        if not self.recording:
            return
        if dict.__contains__(self, key):
            self.read.add(key)
        elif isinstance(key, str) and key not in self.asked:
            self.asked.append(key)

    def _note_all(self) -> None:
        self.tested.update(dict.keys(self))  # iterating finds each key, as testing it does
        if self.recording:
            self.read.update(dict.keys(self))

    def __getitem__(self, key: Any) -> Any:
        self._note(key)
        return super().__getitem__(key)

    def get(self, key: Any, default: Any = None) -> Any:
        self._note(key)
        return super().get(key, default)

    def pop(self, key: Any, default: Any = _MISSING) -> Any:
        self._note(key)
        return dict.pop(self, key) if default is _MISSING else dict.pop(self, key, default)

    def setdefault(self, key: Any, default: Any = None) -> Any:
        self._note(key)
        return dict.setdefault(self, key, default)

    def __contains__(self, key: object) -> bool:
        if (
            self.recording
            and not dict.__contains__(self, key)
            and isinstance(key, str)
            and key not in self.asked
        ):
            self.asked.append(key)
        return super().__contains__(key)

    def __iter__(self) -> Iterator[Any]:
        self._note_all()
        return dict.__iter__(self)

    def keys(self):  # type: ignore[override]
        self._note_all()
        return dict.keys(self)

    def values(self):  # type: ignore[override]
        self._note_all()
        return dict.values(self)

    def items(self):  # type: ignore[override]
        self._note_all()
        return dict.items(self)

    def copy(self) -> dict[str, Any]:
        self._note_all()
        return dict.copy(self)

    def popitem(self) -> tuple[Any, Any]:
        item = dict.popitem(self)
        if self.recording:
            self.read.add(item[0])
        return item

    def unread(self) -> list[str]:
        """The keys held and never read while recording, in order."""
        return [key for key in dict.keys(self) if key not in self.read]


def unread_message(trainer: str, name: str, asked: list[str]) -> str:
    """The warning for hyper-parameter `name` that `trainer`'s setup() never read."""
    hint = f" (it asked for {', '.join(map(repr, asked))}, which the config does not have)" if asked else ""
    return (
        f"{trainer}.setup() never read hyper-parameter {name!r}{hint}: every value of {name!r} "
        "trains the same, so trials that differ only in it are identical. Read it in setup(), "
        "fix its name, or leave it out of the search space."
    )


def _equal(default: Any, value: Any) -> bool:
    """Whether a ``hp.get`` default is the config's value (by ``==``: 32 and 32.0, a numpy
    float and the same python one, are the value in use)."""
    try:
        return bool(default == value)
    except Exception:  # an array's ==, an object's that raises: not the value
        return False


def defaulted_message(trainer: str, name: str, default: Any, value: Any, step: int | None) -> str:
    """What a ``hp.get(name, default)`` that hid the config's `value` does."""
    before = "a step" if step is None else f"step {step}"
    return (
        f"{trainer}.setup() read hyper-parameter {name!r} with hp.get({name!r}, {default!r}) before "
        f"{before}, where {name!r} did not change, so it got the default {default!r}, not the "
        f"config's {value!r}: setup() is handed only the values that changed; test {name!r} in hp "
        "first (a default that is the value in use, hp.get(name, self.lr), is fine)"
    )
