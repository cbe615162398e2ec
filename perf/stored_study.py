"""A realistic stored study of N trials, written through dagtune's own writers (issue 24).

Running a 100,000-trial durable study takes hours, so this writes what one leaves behind,
with the writers a study uses and in the order it uses them: the search plan's journal
(`PlanJournal`: node, metrics and checkpoint events), the study's trial records
(``open``, then ``submit`` and ``end`` per trial, ``work``) and ``results.zarr``
(`ResultsWriter`). The study is a two-stage learning-rate search: 100 warm-up rates (steps
0-2, each a shared prefix) times N/100 rates after step 2 (steps 2-4), momentum 0.9; so
the stage tree has 100 shared roots with N/100 branches each. 97% of the trials completed,
1% stopped at step 2 (early stopping), 1% failed with a traceback, 1% are pending (the run
was interrupted: no ``end`` record, the plan has their first stage). Checkpoint events
name files that are not written (nothing here loads them; `dagtune gc` would drop them).

Last, the study's read index is written (`dagtune.study_index.rebuild_index`: what a study's
writer does when it closes), so readers find what a closed study leaves.

Stores are cached under ``/tmp/dagtune-perf-stores/{n}-dagtune-results3`` (the results
format this dagtune writes: a store an older writer left is not read as this one's; a
``READY`` file marks a whole one; one made before read indexes gets its index on first use).

    python perf/stored_study.py 100000    # prints the storage directory
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import dagtune as dt
from dagtune.checkpoints import CheckpointStore
from dagtune.config import config_to_json
from dagtune.durable import index_path
from dagtune.plan import GroupCommit, Journal, PlanJournal, SearchPlan, plan_header, records_header
from dagtune.records import CheckpointInfo, Trial
from dagtune.results import FORMAT as RESULTS_FORMAT
from dagtune.results import ResultsWriter, results_url
from dagtune.study_index import rebuild_index

CACHE = Path("/tmp/dagtune-perf-stores")
IDENTITY = "5eed5eed5eed5eed"
NAME = "big"
ROOTS = 100
STEPS, BRANCH_AT = 4, 2
TRACEBACK = (
    "Traceback (most recent call last):\n"
    '  File "train.py", line 42, in train\n'
    "    loss = model(batch)\n"
    "RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB"
)


def _loss(warm: float, lr: float, step: int) -> float:
    return round(2.0 / step + 10 * (warm - 0.05) ** 2 + 5 * (lr - 0.01) ** 2 + 0.001 * math.sin(lr * 1e4), 6)


def generate(n: int, cache: Path = CACHE, identity: str = IDENTITY) -> str:
    """The storage directory of a stored study of `n` trials (a multiple of 100), made once;
    its model `identity` (another than the default: a store a study of that model resumes,
    `perf/resume.py`)."""
    directory = cache / f"{n}-{RESULTS_FORMAT.replace('/', '')}"  # a store of each results format
    if identity != IDENTITY:
        directory = directory.with_name(f"{directory.name}-{identity}")
    if (directory / "READY").exists():
        if not Path(index_path(f"{directory}/runs", NAME)).exists():
            rebuild_index(CheckpointStore(str(directory / "runs")), NAME)
        return str(directory)
    if n % ROOTS:
        raise ValueError(f"n must be a multiple of {ROOTS}, got {n}")
    store = CheckpointStore(str(directory / "runs"))
    commit = GroupCommit(3600.0)  # committed at the end, as a long run's groups would be
    plan = SearchPlan()
    plan_journal = PlanJournal(
        plan, Journal(store.fs, f"{store.root}/{identity}/plan", header=plan_header(identity), commit=commit)
    )
    records = Journal(
        store.fs, f"{store.root}/studies/{NAME}/journal", header=records_header(NAME), commit=commit
    )
    records.append(
        {
            "r": "open",
            "identity": identity,
            "trainer": "dagtune.sim.SyntheticTrainer",
            "seed": 0,
            "version": "",
            "trainer_kwargs": {},
        }
    )
    per_root = n // ROOTS
    trials: dict[int, Trial] = {}
    for i in range(n):
        warm = 0.01 + 0.001 * (i // per_root)
        lr = 0.001 + 0.0001 * (i % per_root)
        config = {"lr": dt.Steps([warm, lr], [BRANCH_AT]), "momentum": dt.Constant(0.9)}
        records.append(
            {"r": "submit", "trial": i, "config": config_to_json(config), "steps": STEPS, "tag": None}
        )
        node = plan.locate(config, STEPS, create=True)
        path = plan.segments(node, STEPS)
        fate = i % 100
        reached = STEPS if fate < 98 else BRANCH_AT if fate == 98 else 1
        for owner, start, end in path:
            for step in range(start + 1, min(end, reached) + 1):
                if plan.metrics_at(owner, step) is None:
                    plan.record_metrics(
                        owner, step, {"val_loss": _loss(warm, lr, step), "train_loss": 1.0 / step}
                    )
            if end <= reached and plan.checkpoint_at(owner, end) is None:
                plan.record_checkpoint(owner, end, CheckpointInfo(4_000_000, f"{i:064x}"))
        trial = Trial(i, config, STEPS, node=node, segments=path)
        trial.curve = [
            (s, plan.metrics_at(o, s)) for o, a, b in path for s in range(a + 1, min(b, reached) + 1)
        ]
        trial.reported = reached
        if fate == 97:  # pending: interrupted, no end record
            trials[i] = trial
            continue
        status = {98: "stopped", 99: "failed"}.get(fate, "completed")
        trial.status, trial.metrics = status, (trial.curve[-1][1] if status != "failed" else None)
        trial.error = TRACEBACK if status == "failed" else None
        end = {
            "r": "end",
            "trial": i,
            "status": status,
            "steps": reached,
            "metrics": trial.metrics,
            "error": trial.error,
        }
        if status == "failed":
            end["cause"] = "trainer"
        records.append(end)
        trials[i] = trial
    records.append(
        {"r": "work", "session": records.writer, "executed_steps": 2 * n + 2 * ROOTS, "gpu_seconds": 0.1 * n}
    )
    plan_journal.journal.flush()
    results = ResultsWriter(results_url(store.url, NAME), None, study=NAME, identity=identity)
    results.write(trials)
    results.compact()  # as the study's close leaves it
    rebuild_index(store, NAME)
    (directory / "READY").write_text(f"{n} trials\n")
    return str(directory)


def storage(n: int) -> str:
    """The storage URL of the cached store of `n` trials."""
    return f"{generate(n)}/runs"


if __name__ == "__main__":
    print(storage(int(sys.argv[1]) if len(sys.argv) > 1 else 100_000))
