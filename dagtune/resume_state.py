"""What a study's journals fold into, kept so that resuming it reads only what was appended
since: the resume state (issue 24).

Opening a stored study (same name and storage: `dagtune.durable.Persistence`) folds every
line of its trial records and of its model's search plan journal: 10 to 20 us a line and
several lines a trial, half a minute of CPU for a 100,000-trial study, before any new work
starts. So the session that opened it keeps what that fold gave, right after it: the
folded trial records (`dagtune.records.StudyRecords`), the search plan with the events
still waiting for their node, and each journal's reading position (`Journal.read_state`:
every file read, to which byte and line, what was reported, the latest time stamp). The
next session puts them back and reads only the bytes appended since (the tail), as a
session that had stayed open would read them.

That gives exactly the fold of all the lines when (checked, else the journals are read
whole, as before):

- the state is this study's and model's (format, name, identity, the storage root: the
  trials' and incidents' places name the journal files);
- every file it covers is still there, at least as long, and the bytes it covers have the
  checksum they had (CRC-32): journals only grow, so those are the bytes the state was
  folded from; a file cut short, changed, replaced or gone makes it stale;
- every record of the tail is later than every record the state read: readers merge the
  writers' records by time stamp, so the tail then follows all of them, as in a fold of
  everything. (A writer whose clock is behind, or another study of the model writing the
  shared plan while this one was opened, can break that; the journals are then read.)

A stale, partial, corrupt or foreign state file is logged (a warning) and ignored; a missing
one is the usual first resume. The state is written (whole: `dagtune.durable.put_whole`) by
the holder of the study's writer lease only, after a full read or when the tail has grown
past `REWRITE_SHARE` of what the state covers, so resuming costs what was appended since,
plus reading the state. It is read with an unpickler that builds only the classes a state
holds (`ALLOWED`), never runs other code, and only if the CRC-32 of its parts is the one
written with them.

Beside the fold, the state keeps what the session that wrote it derived from the fold while
restoring the trials (`Restored`), which a 100,000-trial study otherwise spends most of its
opening on: where each trial sits in the search plan (`SearchPlan.locate` walks the plan
comparing the trial's config with each node's) and each trial's config as canonical text
(`dagtune.config.config_dumps`, which the study's index of restored trials is keyed by). A
trial's config never changes, so its text stays true. Where it sits stays true while the
plan only gains nodes where no walk went, or where one created the node it found (restoring
creates a trial's node if its plan lacks it): checked as every node it names still being in
the plan and the plan having as many equal-valued siblings (`SearchPlan.siblings`, which
only concurrent writers' journals bring) as when it was derived; else every trial is
located again.
"""

from __future__ import annotations

import io
import logging
import pickle
import zlib
from dataclasses import dataclass, field
from typing import Any

from dagtune.checkpoints import CheckpointStore
from dagtune.plan import NO_ENTRIES, Journal, PlanJournal, SearchPlan
from dagtune.records import StudyRecords

__all__ = [
    "ALLOWED",
    "FORMAT",
    "REWRITE_SHARE",
    "Restored",
    "Resumed",
    "due",
    "fold_bytes",
    "read_state",
    "state_bytes",
    "state_path",
]

log = logging.getLogger("dagtune")

#: 3: the search plan keeps each point's metrics as a `dagtune.records.MetricsPoint`, not a dict
#: (a state of format 2 is foreign: the journals are read)
FORMAT = "dagtune-resume/3"
#: bytes appended since the state, as a share of the bytes it covers, past which it is written again
REWRITE_SHARE = 0.125
#: the builtins a state may hold beside plain values; with the classes of `_MODULES`, all
#: that reading one builds (data classes, made without running their constructors)
ALLOWED = frozenset({("builtins", "set"), ("builtins", "frozenset"), ("builtins", "complex")})
_MODULES = ("dagtune.records.", "dagtune.sequences.", "dagtune.distributions", "dagtune.plan._plan")
_ENTRY = ("dagtune.plan._journal", "Entry")  # held-back plan events


def state_path(root: str, name: str) -> str:
    """Where study `name`'s resume state lives under storage root `root`."""
    return f"{root}/studies/{name}/resume.pickle"


class _Unpickler(pickle.Unpickler):
    """Builds only the classes a resume state holds (`ALLOWED`, dagtune's records, sequences,
    distributions, the plan's nodes, its shared empty table and journal entries): nothing in
    it can run other code."""

    def find_class(self, module: str, name: str) -> Any:
        allowed = (module, name) in ALLOWED or (module, name) == _ENTRY or module.startswith(_MODULES)
        found = super().find_class(module, name) if allowed else None
        if not (isinstance(found, type) or found is NO_ENTRIES):  # the plan's one empty table
            raise pickle.UnpicklingError(f"a resume state does not hold {module}.{name}")
        return found


@dataclass
class Restored:
    """What a session derived from the fold while restoring its trials (see the module
    docstring): `placed`, trial id -> (its steps, its salt, the node `SearchPlan.locate`
    gave for them); `siblings`, the plan's `SearchPlan.siblings` then; `texts`, trial id ->
    its config's `config_dumps`."""

    placed: dict[int, tuple[int, str, str]] = field(default_factory=dict)
    siblings: int = 0
    texts: dict[int, str] = field(default_factory=dict)


@dataclass
class Resumed:
    """The fold a state and its tail give: the study's records and its search plan's
    journal (the plan in it), with each journal reading from where they stopped; `tail`
    is the bytes read beyond the state; `restored`, what the state's writer derived from
    the fold, its `placed` emptied if the plan changed where trials sit since."""

    earlier: StudyRecords
    plan_journal: PlanJournal
    tail: int
    restored: Restored


def _checks(journal: Journal, seen: dict[str, int]) -> dict[str, int] | None:
    """The checksum of each file's covered bytes, or None if one is shorter or gone (reading
    and summing them costs a few percent of parsing them)."""
    sums = {}
    for path, size in seen.items():
        try:
            data = journal.fs.cat_file(path, start=0, end=size) if size else b""
        except FileNotFoundError:
            return None
        if len(data) != size:
            return None
        sums[path] = zlib.crc32(data)
    return sums


def fold_bytes(
    store: CheckpointStore,
    name: str,
    identity: str,
    records: Journal,
    earlier: StudyRecords,
    plan: PlanJournal,
) -> bytes:
    """The fold of a study whose journals were just folded into `earlier` (from `records`)
    and `plan` (before anything else changed them), pickled: the first part of its resume
    state (`state_bytes` adds what restoring the trials derives from it)."""
    states = {"records": records.read_state(), "plan": plan.journal.read_state()}
    journals = {"records": records, "plan": plan.journal}
    checks = {key: _checks(journal, states[key]["seen"]) for key, journal in journals.items()}
    payload = {
        "study": name,
        "identity": identity,
        "root": store.root,
        "directories": {key: journal.directory for key, journal in journals.items()},
        "states": states,
        "checks": checks,
        "earlier": earlier,
        "plan": plan.plan,  # pickled without the live study's listeners and observers
        "waiting": plan.waiting,
    }
    return pickle.dumps(payload, protocol=5)


def state_bytes(fold: bytes, restored: Restored) -> bytes:
    """The resume state: a study's `fold_bytes` and what restoring its trials derived from
    that fold, with the CRC-32 of both."""
    derived = pickle.dumps(
        {"placed": restored.placed, "siblings": restored.siblings, "texts": restored.texts}, protocol=5
    )
    crc = zlib.crc32(derived, zlib.crc32(fold))
    return pickle.dumps({"format": FORMAT, "crc": crc, "fold": fold, "restored": derived}, protocol=5)


def _load(data: bytes) -> Any:
    return _Unpickler(io.BytesIO(data)).load()


def _parts(data: bytes) -> tuple[dict, Restored]:
    """The fold and the `Restored` of a state file's bytes; ValueError (or any unpickling
    error) if they are not a whole state of this format."""
    outer = _load(data)
    if not isinstance(outer, dict) or outer.get("format") != FORMAT:
        raise ValueError(f"not a {FORMAT} state")
    fold, derived = outer["fold"], outer["restored"]
    if zlib.crc32(derived, zlib.crc32(fold)) != outer["crc"]:
        raise ValueError("its checksum does not match")
    payload, found = _load(fold), _load(derived)
    if not isinstance(payload, dict) or not (
        isinstance(payload.get("earlier"), StudyRecords) and isinstance(payload.get("plan"), SearchPlan)
    ):
        raise ValueError("it holds no records or no plan")
    restored = Restored(dict(found["placed"]), int(found["siblings"]), dict(found["texts"]))
    return payload, restored


def _still_placed(restored: Restored, plan: SearchPlan) -> Restored:
    """`restored`, its `placed` emptied unless the plan still places those trials there."""
    nodes = plan.nodes
    if plan.siblings == restored.siblings and all(node in nodes for _, _, node in restored.placed.values()):
        return restored
    log.info("dagtune: the search plan changed where restored trials sit; they are located again")
    return Restored({}, plan.siblings, restored.texts)


def _covered(state: dict) -> int:
    return sum(state["seen"].values())


def read_state(
    store: CheckpointStore, name: str, identity: str, records: Journal, plan: Journal
) -> Resumed | None:
    """Study `name`'s journals folded from its resume state and their tail (see the module
    docstring), or None (nothing changed in `records` and `plan`): read them whole."""
    path = state_path(store.root, name)
    try:
        data = store.fs.cat_file(path)
    except FileNotFoundError:
        return None
    except OSError as error:
        log.warning("dagtune: the resume state %s can't be read (%s); the journals are read", path, error)
        return None
    try:
        payload, restored = _parts(data)
        earlier, found_plan, states = payload["earlier"], payload["plan"], payload["states"]
    except Exception as error:  # any damage at all: the journals are the truth
        log.warning("dagtune: the resume state %s is unreadable (%r); the journals are read", path, error)
        return None
    expected = {"study": name, "identity": identity, "root": store.root}
    directories = {"records": records.directory, "plan": plan.directory}
    if any(payload.get(k) != v for k, v in expected.items()) or payload.get("directories") != directories:
        log.info("dagtune: the resume state %s is another study's or place's; the journals are read", path)
        return None
    journals = {"records": records, "plan": plan}
    for key, journal in journals.items():
        if (
            payload["checks"].get(key) is None
            or _checks(journal, states[key]["seen"]) != payload["checks"][key]
        ):
            log.warning(
                "dagtune: the resume state %s does not match the %s journal (a file shorter, changed or "
                "gone); the journals are read",
                path,
                key,
            )
            return None
    blank = {key: journal.read_state() for key, journal in journals.items()}
    for key, journal in journals.items():
        journal.set_read_state(states[key])
    new_records, new_plan = records.read_new(), plan.read_new(others_only=True)
    if any(e.record.get("t", 0.0) <= states["records"]["latest"] for e in new_records) or any(
        e.record.get("t", 0.0) <= states["plan"]["latest"] for e in new_plan
    ):
        log.info("dagtune: records appended before the resume state's latest one; the journals are read")
        for key, journal in journals.items():
            journal.set_read_state(blank[key])
        return None
    for journal in journals.values():
        for incident in journal.incidents:  # as reading them whole would say them
            log.warning("dagtune journal: %s", incident)
    for entry in new_records:
        earlier.read(entry.record, entry.where)
    for where, reason in earlier.skipped:
        records.report(where, reason)
    plan_journal = PlanJournal(found_plan, plan)
    plan_journal.waiting.update(payload["waiting"])
    plan_journal.apply_entries(new_plan)
    tail = sum(_covered(j.read_state()) for j in journals.values()) - sum(
        _covered(s) for s in states.values()
    )
    return Resumed(earlier, plan_journal, tail, _still_placed(restored, found_plan))


def due(resumed: Resumed | None, records: Journal, plan: Journal) -> bool:
    """Whether opening should write the state again: after reading the journals whole, or
    when the tail has grown past `REWRITE_SHARE` of what the state covered; never for
    journals with nothing in them (a new study)."""
    covered = _covered(records.read_state()) + _covered(plan.read_state())
    if resumed is None:
        return covered > 0
    return resumed.tail > REWRITE_SHARE * max(1, covered - resumed.tail)
