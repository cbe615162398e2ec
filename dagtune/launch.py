"""What ``dagtune run TARGET`` runs: a study setup returned by a function of the user's.

`TARGET` is ``path/to/script.py`` (its function ``study_setup``), ``path/to/script.py:func``
or ``package.module:func``. The function takes no arguments and returns a `StudySetup` (or
a dict of its fields): the trainer, the algorithm and what else the `Study` needs. The
command line adds where it runs (scheduler, storage, workers). A script is imported as a
module named after its file with its directory on ``sys.path``, so Dask workers started
from here can import its trainer too (on a remote cluster, its workers must find it).
"""

from __future__ import annotations

import difflib
import importlib
import importlib.util
import inspect
import os
import sys
import traceback
from dataclasses import dataclass, field, fields
from typing import Any

from dagtune.algos import Algorithm
from dagtune.errors import DagtuneError
from dagtune.study import Study, Surrogate
from dagtune.trainer import Trainer

__all__ = ["DEFAULT_FUNCTION", "SetupError", "StudySetup", "load_setup"]

DEFAULT_FUNCTION = "study_setup"


class SetupError(DagtuneError, ValueError):
    """The target can't give a study setup; `hint` says what to do."""

    def __init__(self, message: str, hint: str = ""):
        super().__init__(message)
        self.hint = hint


@dataclass
class StudySetup:
    """A study to run: `Study(trainer, trainer_kwargs, name, **options)` then `run(algorithm)`;
    with a `surrogate`, `SurrogateStudy(trainer, trainer_kwargs, surrogate, name, **options)`."""

    trainer: type[Trainer]
    algorithm: Algorithm
    trainer_kwargs: dict[str, Any] = field(default_factory=dict)
    name: str = "study"
    options: dict[str, Any] = field(default_factory=dict)  # seed, reuse, resources, gc, ...
    surrogate: Surrogate | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.trainer, type) or not issubclass(self.trainer, Trainer):
            raise SetupError(f"trainer must be a dagtune.Trainer subclass, got {self.trainer!r}")
        if not isinstance(self.algorithm, Algorithm):
            raise SetupError(f"algorithm must be a dagtune.algos algorithm, got {self.algorithm!r}")
        if self.surrogate is not None and not isinstance(self.surrogate, Surrogate):
            raise SetupError(f"surrogate must be a dagtune.Surrogate or None, got {self.surrogate!r}")
        _check_options(self.options)


#: options `dagtune run` takes from its command line alone, and the flag that gives each
_COMMAND_LINE = {"client": "--scheduler ADDRESS"}
#: what options the setup holds in its own fields
_FIELDS = ("trainer", "trainer_kwargs", "name")


def _check_options(options: Any) -> None:
    """Refuse options `Study` does not take, naming each and the fix (a typo gets the option it
    is closest to), before any cluster starts; ``storage`` and ``workers`` are the defaults of
    ``--storage`` and ``--workers``."""
    if not isinstance(options, dict):
        raise SetupError(
            f"options must be a dict of Study options, got {options!r}", "e.g. options={'seed': 1}"
        )
    known = set(inspect.signature(Study.__init__).parameters) - {"self", *_FIELDS}
    for key in options:
        if key in _FIELDS:
            raise SetupError(
                f"options[{key!r}] = {options[key]!r}: {key} is a field of StudySetup",
                f"give StudySetup({key}=...) instead",
            )
        if key in _COMMAND_LINE:
            raise SetupError(
                f"options[{key!r}] = {options[key]!r}: dagtune run makes the {key} itself",
                f"give {_COMMAND_LINE[key]} on the command line instead",
            )
        if key not in known:
            close = difflib.get_close_matches(str(key), sorted(known), n=1)
            raise SetupError(
                f"options[{key!r}] = {options[key]!r}: Study takes no option {key!r}"
                + (f"; did you mean {close[0]!r}?" if close else ""),
                "see help(dagtune.Study) for its options",
            )


def _split(target: str) -> tuple[str, str | None]:
    """``(module or path, function)``; a Windows drive letter is not a separator."""
    head, sep, tail = target.rpartition(":")
    if sep and tail and not (len(head) == 1 and head.isalpha()) and "/" not in tail:
        return head, tail
    return target, None


def _import_script(path: str):
    if not os.path.isfile(path):
        raise SetupError(f"no script {path!r}", "give a path to a .py file, or module:function")
    directory, name = os.path.split(os.path.abspath(path))
    module_name = os.path.splitext(name)[0]
    if directory not in sys.path:
        sys.path.insert(0, directory)
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as error:
        sys.modules.pop(module_name, None)
        raise SetupError(*_describe_failure(error, path)) from error
    return module


def _describe_failure(
    error: BaseException, path: str, doing: str = "importing the script"
) -> tuple[str, str]:
    """Where in the user's file `doing` failed, in one line."""
    if (
        isinstance(error, SyntaxError)
        and error.filename
        and os.path.abspath(error.filename) == os.path.abspath(path)
    ):
        return (
            f"{path}:{error.lineno}: SyntaxError: {error.msg}",
            "fix the script; `python -m py_compile SCRIPT` checks it",
        )
    frames = [
        f
        for f in traceback.extract_tb(error.__traceback__)
        if os.path.abspath(f.filename) == os.path.abspath(path)
    ]
    where = f"{path}:{frames[-1].lineno}" if frames else path
    return (
        f"{where}: {doing} raised {type(error).__name__}: {_one_line(error)}",
        "add --debug to see the whole traceback",
    )


def _one_line(error: BaseException) -> str:
    text = " ".join(str(error).split())
    return text if len(text) <= 300 else text[:297] + "..."


def _source(module: Any) -> str:
    return getattr(module, "__file__", None) or getattr(module, "__name__", "?")


def load_setup(target: str) -> StudySetup:
    """The `StudySetup` that `target`'s function returns (see the module docstring)."""
    location, function = _split(target)
    if location.endswith(".py") or os.sep in location:
        module = _import_script(location)
        function = function or DEFAULT_FUNCTION
    else:
        if function is None:
            raise SetupError(
                f"{target!r} is neither a .py script nor module:function",
                f"e.g. `dagtune run examples/digits.py` or `dagtune run mypackage.tuning:{DEFAULT_FUNCTION}`",
            )
        try:
            module = importlib.import_module(location)
        except ImportError as error:
            if not _missing(error, location):  # the module is there, one of its imports is not
                raise SetupError(
                    *_describe_failure(error, _imported_file(location), "importing it")
                ) from error
            raise SetupError(
                f"cannot import {location!r}: {error}", "is it installed, or on PYTHONPATH?"
            ) from None
        except Exception as error:
            raise SetupError(*_describe_failure(error, _imported_file(location), "importing it")) from error
    make = getattr(module, function, None)
    if not callable(make):
        raise SetupError(
            f"{location} has no function {function!r}",
            f"define `def {function}(): return dagtune.launch.StudySetup(trainer=..., algorithm=...)`",
        )
    try:
        made = make()
    except SetupError:
        raise
    except Exception as error:
        raise SetupError(*_describe_failure(error, _source(module), f"{function}()")) from error
    if isinstance(made, dict):
        unknown = sorted(set(made) - {f.name for f in fields(StudySetup)})
        if unknown:
            raise SetupError(
                f"{function}() returned unknown setup keys {unknown}", "see dagtune.launch.StudySetup"
            )
        try:
            made = StudySetup(**made)
        except TypeError as error:
            raise SetupError(
                f"{function}() returned an incomplete setup: {error}", "it needs trainer and algorithm"
            ) from None
    if not isinstance(made, StudySetup):
        raise SetupError(
            f"{function}() returned {type(made).__name__}, not a StudySetup",
            "return dagtune.launch.StudySetup(trainer=..., algorithm=...) or a dict of its fields",
        )
    return made


def _missing(error: ImportError, location: str) -> bool:
    """Whether `error` says `location` itself (or a package on its way) is not there."""
    name = getattr(error, "name", None)
    return name is None or location == name or location.startswith(name + ".")


def _imported_file(location: str) -> str:
    """The file of module `location` (for messages), even if importing it failed."""
    try:
        spec = importlib.util.find_spec(location)
    except Exception:
        spec = None
    return spec.origin if spec is not None and spec.origin else location
