"""The coordinator: one loop from trials to stages to events and back.

Data flows one way. Trials become requests in the search plan; the stage tree follows the
plan (kept up to date by `dagtune.planner.IncrementalPlanner` as requests, checkpoints,
metrics and task progress arrive, or rebuilt from the plan at each scheduling round with
``planner="rebuild"``, the reference); the scheduling policy picks paths of ready stages
for the free slots and the executor runs them; the events they report (`dagtune.events`:
metrics, checkpoints, progress, ends, errors) update the plan, which resolves requests and
reports results to the trials' listeners. Running tasks are never re-issued: the tree asks
them (`InFlight`) for the points they will still pass, which also tells each task which
extra checkpoints it should save on its way and where it may stop.

Two parts, joined by values (docs/architecture.md draws them): the trial ledger
(`_ledger`: trials, requests, delivery, records; it knows no executor) and the dispatcher
(`_dispatcher`: rounds, pauses, redirects, task building, launch, retirement, retries,
protected points; it knows no algorithm and no `Trial`). The dispatcher returns what an
event means for trials (`_outcomes`: metrics became known, a point failed for good) and the
ledger applies it; what a listener decides is queued and delivered after it is applied
(`Coordinator.settle`), so nothing re-enters.

Durability hooks: every trial change (submit, extend, end) is handed to `recorders` as a
plain record, which is how a study journals its trials, and `restore` rebuilds trials from
those records, checked and folded by `dagtune.records`, when a study resumes. A checkpoint
that fails verification when a task loads it (`CheckpointCorrupt`) is dropped from the plan
and deleted, and the work it held is planned again from an earlier point; it is not a
trainer failure. `absorb` takes plan events written by other coordinators (studies of the
same model running at the same time).

Change hooks: the id of every trial whose fields change (submitted, restored, extended,
placed, a result, an end, a restored trial adopted) is added to each set in the ledger's
`changes`, whether or not the study has storage: a study's view keeps each trial's snapshot
and copies again only those (`dagtune.study`), and reports them from figures kept as they
change (`KeptFigures`).

The coordinator is not thread-safe by itself; `dagtune.study.Study` serializes access.

Its other parts: the running tasks and what they will deliver (`_running`), the trainers
workers keep live (`_memory`), the points where later trials would branch off a path
(`_branches`), which launches share a fused task (`_fusion`, `Study(fuse=...)`), and the
figures of its report, each defined once, and kept as the trials change (`_report`).

The face is lazy (PEP 562), like the package's: a name loads its part on first use, so a
reader of storage that asks `trial_figures` loads the report's figures, not the fusion check
and torch behind `Coordinator` and `check_fuse`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dagtune.coordinator._coordinator import Coordinator
    from dagtune.coordinator._fusion import check_fuse
    from dagtune.coordinator._ledger import TrialListener
    from dagtune.coordinator._report import KeptFigures, reached_along_paths, report_figures, trial_figures

__all__ = [
    "Coordinator",
    "KeptFigures",
    "TrialListener",
    "check_fuse",
    "reached_along_paths",
    "report_figures",
    "trial_figures",
]

#: Each public name -> the part that defines it.
_WHERE = {
    "Coordinator": "._coordinator",
    "check_fuse": "._fusion",
    "TrialListener": "._ledger",
    "KeptFigures": "._report",
    "reached_along_paths": "._report",
    "report_figures": "._report",
    "trial_figures": "._report",
}


def __getattr__(name: str) -> Any:
    """Load the part behind a public name on first access, and keep the name."""
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_WHERE[name], __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
