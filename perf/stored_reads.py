"""Reading a large stored study (the durable path: what a 10,000- and a 100,000-trial study leave in storage).

The stores are written by `perf.stored_study` through dagtune's own writers (search plan
journal, trial records, ``results.zarr``): a two-stage learning-rate search, 100 shared
warm-up prefixes times N/100 branches, 97% completed, 1% each stopped, failed and pending.
Each command runs in a fresh subprocess (in smoke mode the first only) that imports what it
needs first; **seconds** are the wall and CPU time of the command alone (imports excluded), **peak MB** the process's
peak resident set over the whole run (imports included; **imports MB** is the peak after
the imports alone). ``status`` and ``tree`` are `dagtune status STORAGE` and `dagtune tree
STORAGE` (output to /dev/null), ``status --study`` adds the study's top trials and
incidents, ``open_results`` is ``dt.open_results(STORAGE, NAME).trials`` and ``page
snapshot`` is what `dagtune dashboard` serves for the study (its JSON size in MB).
``status``, ``tree`` and the page read the study's index (`dagtune.study_index`: what the views
show, written by the study's writer when it closes, with the journal sizes it covers) when it is
current, else every journal line; so does ``status --study`` (the best trials and the incidents)
when the index holds them (its ``detail``), else it reads the journals. ``index (writer)`` is what writing that index costs (`rebuild_index`: the journals read
and digested; a closing writer reads back only its own session's lines, so this bounds its cost).
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

COMMANDS = ("status", "status --study", "tree", "open_results", "page snapshot", "index (writer)")


def _peak_mb() -> float:
    """The process's peak resident set (``VmHWM``: of this program's memory, where
    ``ru_maxrss`` would count the parent's it was forked from)."""
    with open("/proc/self/status") as status:
        line = next(line for line in status if line.startswith("VmHWM:"))
    return int(line.split()[1]) / 1024


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def child(command: str, storage: str) -> dict[str, Any]:
    """Run `command` on `storage` here (imports first, then measured)."""
    import pandas  # noqa: F401 - imported by the views that need it
    import rich.console  # noqa: F401

    import dagtune as dt
    from dagtune.catalog import open_storage
    from dagtune.cli import main
    from dagtune.study_index import rebuild_index, study_view

    imports = _peak_mb()
    extra: dict[str, Any] = {}
    wall, cpu = time.perf_counter(), _cpu()
    if command in ("status", "status --study", "tree"):
        words = command.split()
        argv = [words[0], storage, *(["--study", "big"] if "--study" in words else [])]
        with open(os.devnull, "w") as null, contextlib.redirect_stdout(null):
            main(argv, standalone_mode=False)
    elif command == "open_results":
        extra["rows"] = len(dt.open_results(storage, "big").trials)
    elif command == "page snapshot":
        snapshot = study_view(open_storage(storage), "big").page_snapshot()  # what `dagtune dashboard` serves
        extra["json_mb"] = len(json.dumps(snapshot)) / 1e6
    elif command == "index (writer)":
        rebuild_index(open_storage(storage), "big")  # the same bytes again: readers see no change
    else:
        raise ValueError(f"unknown command {command!r}")
    return {
        "seconds": time.perf_counter() - wall,
        "cpu_seconds": _cpu() - cpu,
        "peak_mb": _peak_mb(),
        "imports_mb": imports,
        "beyond_mb": _peak_mb() - imports,
        **extra,
    }


def measure(command: str, storage: str) -> dict[str, Any]:
    completed = subprocess.run(
        [sys.executable, __file__, "--child", command, storage],
        capture_output=True,
        text=True,
        timeout=3600,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)},
    )
    if completed.returncode != 0:
        raise RuntimeError(f"{command} failed: {completed.stderr[-2000:]}")
    return json.loads(completed.stdout.splitlines()[-1])


def benchmark(mode: str = "quick") -> dict[str, Any]:
    from perf.stored_study import storage

    sizes = {"smoke": (1_000,), "quick": (10_000, 100_000), "full": (10_000, 100_000)}[mode]
    rows: list[dict[str, Any]] = []
    for n in sizes:
        url = storage(n)
        for command in COMMANDS:
            # smoke mode only checks that each command runs: the first in a fresh subprocess,
            # the others here (a fresh process each would cost a Python start and the imports)
            fresh = mode != "smoke" or not rows
            rows.append({"trials": n, "command": command, **(measure if fresh else child)(command, url)})
            print(f"[perf]   {n} trials, {command}: {rows[-1]}", flush=True)
    return {"rows": rows, "commit": _commit()}


def _commit() -> str:
    completed = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=Path(__file__).parent
    )
    return completed.stdout.strip()


def markdown(result: dict[str, Any]) -> str:
    from perf.table import table

    return (
        table(
            result["rows"],
            [
                ("trials", "trials"),
                ("command", "command"),
                ("seconds", "seconds"),
                ("cpu_seconds", "CPU seconds"),
                ("peak_mb", "peak MB"),
                ("imports_mb", "imports MB"),
                ("beyond_mb", "peak beyond imports MB"),
                ("json_mb", "JSON MB"),
            ],
        )
        + f"\n\nMeasured at commit {result['commit']} on the durable path (storage on local disk)."
        + (f" {result['note']}" if result.get("note") else "")
    )


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        print(json.dumps(child(sys.argv[2], sys.argv[3])))
    else:
        print(markdown(benchmark(sys.argv[1] if len(sys.argv) > 1 else "quick")))
