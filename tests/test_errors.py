"""One exception hierarchy: every error dagtune defines is a `dagtune.DagtuneError` (beside the
standard base it always had), every warning a `dagtune.DagtuneWarning`."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest

import dagtune as dt
from dagtune.catalog import StorageError, StudyNameError
from dagtune.fusion import FusionError
from dagtune.study import NoWorkersError


def _defined_classes() -> list[type]:
    found = []
    for info in pkgutil.walk_packages(dt.__path__, "dagtune."):
        module = importlib.import_module(info.name)
        found += [
            value for _, value in inspect.getmembers(module, inspect.isclass) if value.__module__ == info.name
        ]
    return found


CLASSES = _defined_classes()


def test_the_package_defines_exceptions_in_many_modules():
    """The walk finds them: a test over nothing would pass whatever the package holds."""
    modules = {c.__module__ for c in CLASSES if issubclass(c, Exception)}
    assert len(modules) >= 8, modules


def test_every_error_is_a_dagtune_error():
    wrong = [
        f"{c.__module__}.{c.__qualname__}"
        for c in CLASSES
        if issubclass(c, Exception) and not issubclass(c, Warning) and not issubclass(c, dt.DagtuneError)
    ]
    assert not wrong, f"errors not rooted in DagtuneError: {wrong}"


def test_every_warning_is_a_dagtune_warning():
    wrong = [
        f"{c.__module__}.{c.__qualname__}"
        for c in CLASSES
        if issubclass(c, Warning) and not issubclass(c, dt.DagtuneWarning)
    ]
    assert not wrong, f"warnings not rooted in DagtuneWarning: {wrong}"


@pytest.mark.parametrize(
    ("error", "standard"),
    [
        (dt.TrialError, RuntimeError),
        (dt.UnguardedMainError, RuntimeError),
        (NoWorkersError, RuntimeError),
        (StorageError, ValueError),
        (StudyNameError, ValueError),
        (FusionError, ValueError),
        (dt.CheckpointError, Exception),
    ],
)
def test_errors_keep_their_standard_base(error, standard):
    assert issubclass(error, dt.DagtuneError) and issubclass(error, standard)


def test_an_interrupt_is_not_an_error():
    interrupts = [c for c in CLASSES if issubclass(c, BaseException) and not issubclass(c, Exception)]
    assert all(not issubclass(c, dt.DagtuneError) for c in interrupts)
