"""Tuning algorithms, all written against one small interface (`Algorithm`)."""

from dagtune.algos._base import Algorithm, Context, Decision, Extend, Stop, Submit
from dagtune.algos._search import GridSearch, RandomSearch

__all__ = [
    "Algorithm",
    "Context",
    "Decision",
    "Extend",
    "GridSearch",
    "RandomSearch",
    "Stop",
    "Submit",
]
