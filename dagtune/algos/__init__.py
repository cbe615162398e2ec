"""Tuning algorithms, all written against one small interface (`Algorithm`).

Every algorithm runs on the stage tree: what it asks for shares every prefix it can with
everything asked before, and early stopping, promotion and branching cost no recomputation.
"""

from dagtune.algos._base import Algorithm, Context, Decision, Extend, MissingMetricWarning, Stop, Submit
from dagtune.algos._bayes import BayesOpt
from dagtune.algos._halving import ASHA, Hyperband, SuccessiveHalving
from dagtune.algos._median import MedianStopping
from dagtune.algos._optuna import OptunaSampler
from dagtune.algos._params import Param, ParamSpace
from dagtune.algos._pbt import PBT, Exploit
from dagtune.algos._retune import Progress, Retune, summarize_progress
from dagtune.algos._search import GridSearch, RandomSearch

__all__ = [
    "ASHA",
    "PBT",
    "Algorithm",
    "BayesOpt",
    "Context",
    "Decision",
    "Exploit",
    "Extend",
    "GridSearch",
    "Hyperband",
    "MedianStopping",
    "MissingMetricWarning",
    "OptunaSampler",
    "Param",
    "ParamSpace",
    "Progress",
    "RandomSearch",
    "Retune",
    "Stop",
    "Submit",
    "SuccessiveHalving",
    "summarize_progress",
]
