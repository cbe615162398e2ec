"""The search plan, its journal, and the stage tree built from it."""

from dagtune.plan._journal import Journal, PlanJournal
from dagtune.plan._plan import Node, SearchPlan, merge_rate, trial_steps, unique_steps
from dagtune.plan._tree import InFlight, Stage, StageTree, build_stage_tree

__all__ = [
    "InFlight",
    "Journal",
    "Node",
    "PlanJournal",
    "SearchPlan",
    "Stage",
    "StageTree",
    "build_stage_tree",
    "merge_rate",
    "trial_steps",
    "unique_steps",
]
