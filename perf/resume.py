"""Resuming a large stored study, and closing it (issue 24): the durable path's costs that
grow with the whole study rather than with what a session does.

The store is `perf.stored_study`'s study of N trials (its cache, made once), written for the
simulator's trainer (`dagtune.sim.SyntheticTrainer`'s model identity), so a `dagtune.Study`
of that trainer resumes it. Each measurement copies the cached store to a temporary
directory (a resumed study writes to it) and, in a fresh process (as a user resumes a study:
no other session's objects in its heap), opens the study on the simulator
(`SimulatedExecutor`, 100 virtual workers, storage on local disk) and runs a grid of one new
trial (its own warm-up rate: a new root of the stage tree) to its end, then does that again
(``--sessions``: sessions in a row on the same copy, each its own process; a second session
finds what the first left, such as its resume state, `dagtune.resume_state`). Per session:

- ``open_s``: CPU seconds of opening the study (`Study(...)`: the journals read, the trials
  restored);
- ``first_work_s``: wall seconds from opening to the first stage launched
  (``first_work_cpu_s``: its CPU seconds, the issue's "resuming starts new work within
  seconds");
- ``run_s``: CPU seconds of `Study.run` (its first results write included);
- ``close_s``: CPU seconds of `Study.close` (the last results write and the read index);
- ``gc_first_work_s``, ``gc_s``: of the CPU seconds from opening to the first stage and of
  the whole session, those of Python's cyclic garbage collector;
- ``imports_s``: CPU seconds of the process before the study (imports), not in the above;
- ``peak_mb``: the process's peak resident set.

    python perf/resume.py 100000 [--sessions 2] [--repeat 3] [--profile FILE]

``--profile FILE`` writes a cProfile of the last session (the whole session: open, run,
close); cProfile slows Python code unevenly, so its times are shares, not the figures.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import dagtune as dt
from dagtune.algos import GridSearch
from dagtune.checkpoints import CheckpointStore
from dagtune.identity import model_identity
from dagtune.sim import SimulatedExecutor, SyntheticTrainer
from perf.collector import Collections
from perf.stored_study import NAME, generate

WORKERS = 100
STACK = False  # print where the first stage is launched from


def resume(n: int, sessions: int, profile: str | None = None) -> Iterator[dict[str, Any]]:
    """Open the cached store of `n` trials (one copy) `sessions` times in a row, each in a
    fresh process running one new trial and closing; each session's figures as it ends
    (`profile`: a cProfile of the last one written there)."""
    source = generate(n, identity=model_identity(SyntheticTrainer, {}, 0, "", torch_threads=1))
    directory = tempfile.mkdtemp(prefix="dagtune-resume-")
    try:
        shutil.copytree(f"{source}/runs", f"{directory}/runs")
        for session in range(sessions):
            command = [sys.executable, __file__, str(n), "--child", directory, "--session", str(session)]
            if profile and session == sessions - 1:
                command += ["--profile", profile]
            done = subprocess.run(command, check=True, capture_output=True, text=True)
            yield json.loads(done.stdout.strip().splitlines()[-1])
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def _session(directory: str, n: int, session: int, profile: cProfile.Profile | None) -> dict[str, Any]:
    imports = time.process_time()  # the interpreter and the imports at the top, in this process
    collections = Collections()
    executor = SimulatedExecutor(WORKERS, store=CheckpointStore(f"{directory}/runs"))
    launched: list[float] = []
    for method in ("launch", "launch_group"):
        original = getattr(executor, method)

        def first(*args: Any, _original: Any = original, **kwargs: Any) -> Any:
            if not launched:
                launched.extend((time.perf_counter(), time.process_time(), collections.seconds))
                if STACK:
                    traceback.print_stack()
            return _original(*args, **kwargs)

        setattr(executor, method, first)
    if profile is not None:
        profile.enable()
    began, cpu, collected = time.perf_counter(), time.process_time(), collections.seconds
    study = dt.Study(SyntheticTrainer, name=NAME, executor=executor)
    opened = time.process_time()
    config = {"lr": dt.Steps([0.5 + 0.01 * session, 0.05], [2]), "momentum": dt.Constant(0.9)}
    result = study.run(GridSearch([config], metric="val_loss", mode="min", steps=4), progress=False)
    ran = time.process_time()
    study.close()
    closed = time.process_time()
    if profile is not None:
        profile.disable()
    assert list(result.trials["status"]) == ["completed"], result.trials
    return {
        "trials": n,
        "session": session,
        "open_s": round(opened - cpu, 2),
        "first_work_s": round(launched[0] - began, 2),
        "first_work_cpu_s": round(launched[1] - cpu, 2),
        "run_s": round(ran - opened, 2),
        "close_s": round(closed - ran, 2),
        "gc_first_work_s": round(launched[2] - collected, 2),
        "gc_s": round(collections.seconds - collected, 2),
        "imports_s": round(imports, 2),
        "peak_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trials", type=int, nargs="?", default=100_000)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--sessions", type=int, default=2, help="sessions in a row on one copy")
    parser.add_argument("--profile", help="write a cProfile of the (last) session here")
    parser.add_argument("--child", help=argparse.SUPPRESS)  # a session's process: the copy's directory
    parser.add_argument("--session", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        profile = cProfile.Profile() if args.profile else None
        figures = _session(args.child, args.trials, args.session, profile)
        if profile is not None:
            profile.dump_stats(args.profile)
        print(json.dumps(figures), flush=True)
        return
    runs: list[list[dict[str, Any]]] = []
    for _ in range(args.repeat):
        runs.append([])
        for figures in resume(args.trials, args.sessions, args.profile):
            runs[-1].append(figures)
            print(json.dumps(figures), flush=True)
    if args.repeat > 1:
        keys = ("open_s", "first_work_s", "first_work_cpu_s", "run_s", "close_s")
        medians = [{k: statistics.median(r[s][k] for r in runs) for k in keys} for s in range(args.sessions)]
        print(json.dumps({"median_per_session": medians}))


if __name__ == "__main__":
    main()
