"""The search plan, its journal, and the stage tree built from it (rebuilt, or kept live)."""

from dagtune.plan._chains import LiveStage
from dagtune.plan._journal import (
    COMMIT_SECONDS,
    GroupCommit,
    Journal,
    PlanJournal,
    commit_seconds,
    plan_header,
    records_header,
)
from dagtune.plan._live import InFlightPoints, LiveStageTree, TreeObserver
from dagtune.plan._plan import NO_ENTRIES, Node, SearchPlan, merge_rate, trial_steps, unique_steps
from dagtune.plan._tree import InFlight, Stage, StageTree, build_stage_tree

__all__ = [
    "COMMIT_SECONDS",
    "NO_ENTRIES",
    "GroupCommit",
    "InFlight",
    "InFlightPoints",
    "Journal",
    "LiveStage",
    "LiveStageTree",
    "Node",
    "PlanJournal",
    "SearchPlan",
    "Stage",
    "StageTree",
    "TreeObserver",
    "build_stage_tree",
    "commit_seconds",
    "merge_rate",
    "plan_header",
    "records_header",
    "trial_steps",
    "unique_steps",
]
