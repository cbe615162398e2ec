"""Records: trials and their statuses, and trial records and search plan events as read back
from storage, checked field by field.

A journal line's checksum (`dagtune.plan.Journal`) catches accidents: a flipped bit, a write
cut short. It says nothing about a line with a valid checksum and values dagtune never
writes, put there by another program, by hand, or by anyone with write access to the
storage. Such a line must neither take down what reads it (a resumed study, ``dagtune
status``, ``dagtune tree``, the page served from storage) nor be guessed at. So every reader
goes through one parser per kind of line:

- `parse_trial_record` for the lines of a study's records journal (``open``, ``submit``,
  ``extend``, ``end``, ``retry``, ``work``), folded into trials by `read_study_records`, which adds
  the checks that span records (an ``end`` for a trial never submitted, an ``extend`` that
  does not extend, ...);
- `parse_plan_event` for the lines of a search plan journal (``node``, ``checkpoint``,
  ``drop_checkpoint``, ``metrics``).

Each returns the record as a checked value or raises `RecordError` naming the field and the
value; a reader skips that line and reports it as ``file:line``, as it does a bad checksum.
The writers use the same rules (`check_steps`), so nothing dagtune writes is refused when read.

What is checked, for every field a reader uses: its type (a step count is an int, not a
bool or a float), its range (steps from 1 to `MAX_STEPS`, trial ids from 0 to
`MAX_TRIAL_ID`, byte counts >= 0), its form (ids and digests are lowercase hex of their
length, statuses are the known ones, configs parse into sequences with valid names and are
finite over the trial's steps, metrics map names to numbers, finite unless the trial
diverged) and that a node's id is the hash of its content. Fields a reader does not use
(and fields a newer dagtune may add) are ignored. Tags may be any JSON value.

What is not checked: that a record is true. A well-formed line can claim metrics no
training produced or a checkpoint of any size; the checks make every line safe to read,
they do not authenticate it (checkpoints themselves are verified against their commit
marker and loaded with ``weights_only=True``).

The records layer holds plain records and nothing that drives them: the `Trial` and its
statuses (`_trial`), one step's metrics kept compact (`_point`), the checks every parser shares (`_checks`), a study's trial records
(`_trial_records`), the search plan's node ids, checkpoint info and events
(`_plan_events`), and the read model every view reads a study through (`_views`: a frozen
`StudyView` of trials, report, running spans and the critical path). It uses only the value layer (configs and sequences); every layer above
reads storage, and shares trials, through it.
"""

from dagtune.records._checks import (
    MAX_STEPS,
    MAX_TRIAL_ID,
    RecordError,
    check_steps,
    is_study_name,
    parse_config,
    parse_metrics,
    parsed_configs_shared,
)
from dagtune.records._plan_events import CheckpointInfo, PlanEvent, node_id, parse_plan_event
from dagtune.records._point import MetricsPoint
from dagtune.records._trial import (
    CAUSES,
    COMPLETED,
    DIVERGED,
    FAILED,
    OUTSIDE_THE_TRAINER,
    PENDING,
    STATUSES,
    STOPPED,
    Trial,
    TrialSnapshot,
)
from dagtune.records._trial_records import (
    Ended,
    Extended,
    FoldedTrial,
    Opened,
    Retried,
    StudyLink,
    StudyRecords,
    Submitted,
    TrialRecord,
    TrialState,
    Worked,
    parse_trial_record,
    read_study_records,
)
from dagtune.records._views import Activity, ScheduleView, Span, StudyView, TrialChanges, ViewFigures

__all__ = [
    "CAUSES",
    "COMPLETED",
    "DIVERGED",
    "FAILED",
    "MAX_STEPS",
    "MAX_TRIAL_ID",
    "OUTSIDE_THE_TRAINER",
    "PENDING",
    "STATUSES",
    "STOPPED",
    "Activity",
    "CheckpointInfo",
    "Ended",
    "Extended",
    "FoldedTrial",
    "MetricsPoint",
    "Opened",
    "PlanEvent",
    "RecordError",
    "Retried",
    "ScheduleView",
    "Span",
    "StudyLink",
    "StudyRecords",
    "StudyView",
    "Submitted",
    "Trial",
    "TrialChanges",
    "TrialRecord",
    "TrialSnapshot",
    "TrialState",
    "ViewFigures",
    "Worked",
    "check_steps",
    "is_study_name",
    "node_id",
    "parse_config",
    "parse_metrics",
    "parse_plan_event",
    "parse_trial_record",
    "parsed_configs_shared",
    "read_study_records",
]
