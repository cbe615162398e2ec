"""dagtune: hyper-parameter optimization on Dask that trains every shared prefix once.

Trials whose hyper-parameter sequences agree on a prefix share its training through a tree
of stages and checkpoints (the Hippo design), scheduled by critical path on Dask.
"""

from dagtune.distributions import choice, loguniform, randint, uniform
from dagtune.plan import merge_rate, unique_steps
from dagtune.sequences import (
    Constant,
    Cosine,
    Cyclic,
    Exponential,
    Linear,
    MultiStep,
    Piecewise,
    Sequence,
    Steps,
    Warmup,
)
from dagtune.space import Grid, Random

__version__ = "0.1.0"

__all__ = [
    "Constant",
    "Cosine",
    "Cyclic",
    "Exponential",
    "Grid",
    "Linear",
    "MultiStep",
    "Piecewise",
    "Random",
    "Sequence",
    "Steps",
    "Warmup",
    "choice",
    "loguniform",
    "merge_rate",
    "randint",
    "uniform",
    "unique_steps",
]
