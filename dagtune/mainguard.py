"""A study started by a script's top-level code, without ``if __name__ == "__main__":``.

The embedded cluster starts its Dask workers with multiprocessing's ``spawn`` (Dask's
default, ``distributed.worker.multiprocessing-method``; ``forkserver`` does the same): each
worker is a fresh interpreter that imports the main script again, as ``__mp_main__``, before
it can run a task. A script that opens its study at the top level, unguarded, opens it again
in every worker, which tries to start a cluster of its own while it is still starting up:
multiprocessing refuses ("the current process has finished its bootstrapping phase"), the
workers die, and the study fails after pages of tracebacks, or waits for workers forever.

`check_main_guard` stops that before anything starts, with one error that says what to write:

- in the script's own process: the study is being opened by the top-level code of the main
  script (its ``<module>`` frame is on the call stack) at a line outside an
  ``if __name__ == "__main__":`` block, read from the script's source;
- in a worker importing the main script (a ``<module>`` frame whose ``__name__`` is
  ``__mp_main__`` is on the stack): whatever the source says, the study is being opened
  again where it never should be.

Notebooks, ``python -c``, ``python -m package`` and ``dagtune run`` are never refused:
multiprocessing imports no main module again for them, or the one it imports is guarded.
"""

from __future__ import annotations

import ast
import inspect
import os
import sys
import types
from collections.abc import Iterator

from dagtune.errors import DagtuneError

__all__ = ["UnguardedMainError", "check_main_guard"]

_RESTARTING = ("spawn", "forkserver")  # start methods whose processes import the main script


class UnguardedMainError(DagtuneError, RuntimeError):
    """A study was opened by a script's top-level code outside ``if __name__ == "__main__":``."""


def check_main_guard(start_method: str = "spawn") -> None:
    """Raise `UnguardedMainError` if the embedded cluster, whose worker processes start with
    `start_method`, is being started by the main script's unguarded top-level code, or while a
    worker process imports the main script."""
    if start_method not in _RESTARTING:
        return
    for frame in _frames():
        if frame.f_code.co_name != "<module>":
            continue
        name = frame.f_globals.get("__name__")
        if name == "__mp_main__":
            raise UnguardedMainError(_in_a_worker(frame.f_code.co_filename))
        if name == "__main__" and not _guarded(frame.f_code.co_filename, frame.f_lineno):
            raise UnguardedMainError(_in_the_script(frame.f_code.co_filename, frame.f_lineno))


def _frames() -> Iterator[types.FrameType]:
    frame = inspect.currentframe()
    while frame is not None:
        yield frame
        frame = frame.f_back


def _imported_again() -> str | None:
    """The file of the main module that a spawned process imports again, as multiprocessing
    decides it (`multiprocessing.spawn.get_preparation_data`): a module run with ``-m``,
    unless it is a package's ``__main__``; else a script file, unless it is IPython's; None
    where nothing is imported again (a notebook, ``python -c``, ``python -m package``)."""
    main = sys.modules.get("__main__")
    name = getattr(getattr(main, "__spec__", None), "name", None)
    path = getattr(main, "__file__", None)
    if name is not None:
        return None if name == "__main__" or name.endswith(".__main__") else path
    if path is None or os.path.splitext(os.path.basename(path))[0] == "ipython":
        return None
    return path


def _guarded(filename: str, line: int) -> bool:
    """Whether `line` of the main script `filename` runs only in the script's own process:
    inside an ``if __name__ == "__main__":`` block; also when `filename` is not a main
    module spawned processes import again (`_imported_again`) or can't be read."""
    main = _imported_again()
    try:
        if main is None or not os.path.samefile(main, filename):
            return True
        with open(filename, encoding="utf-8") as source:
            tree = ast.parse(source.read(), filename)
    except (OSError, SyntaxError, ValueError):
        return True
    return any(
        block.body[0].lineno <= line <= (block.body[-1].end_lineno or block.body[-1].lineno)
        for block in ast.walk(tree)
        if isinstance(block, ast.If) and _is_main_test(block.test)
    )


def _is_main_test(test: ast.expr) -> bool:
    """``__name__ == "__main__"``, either way round."""
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq)):
        return False
    sides = [test.left, test.comparators[0]]
    names = [s.id for s in sides if isinstance(s, ast.Name)]
    values = [s.value for s in sides if isinstance(s, ast.Constant)]
    return names == ["__name__"] and values == ["__main__"]


_FIX = (
    'Put the code that runs the study under `if __name__ == "__main__":` (as the README\'s '
    "snippets do), or start it from a function that `dagtune run` calls."
)


def _in_the_script(filename: str, line: int) -> str:
    script = os.path.basename(filename)
    return (
        f"this study is started by the top-level code of {script} (line {line}), outside "
        '`if __name__ == "__main__":`. Its Dask workers start as new Python processes that '
        f"import {script} again, and would each start the study again while starting up. {_FIX}"
    )


def _in_a_worker(filename: str) -> str:
    script = os.path.basename(filename)
    return (
        f"a study was started while a Dask worker process imported the main script {script}: "
        'the script starts its study outside `if __name__ == "__main__":`, so every worker '
        f"would start it again. {_FIX}"
    )
