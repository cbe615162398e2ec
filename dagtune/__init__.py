"""dagtune: hyper-parameter optimization on Dask that trains every shared prefix once.

Trials whose hyper-parameter sequences agree on a prefix share its training through a tree
of stages and checkpoints (the Hippo design), scheduled by critical path on Dask.

The package's face is lazy (PEP 562): ``import dagtune`` loads none of its modules, and a name
of ``__all__`` loads the module that defines it on first use (``dt.Study`` loads the study,
hence torch; ``dagtune status`` reading a store never does). Any other submodule is loaded
the same way on first attribute access (``dt.config``), as the eager face that imported them all
allowed. The static imports under ``TYPE_CHECKING`` are what linters and IDEs read.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dagtune import algos, fusion, loggers, mup
    from dagtune.checkpoints import CheckpointError, CheckpointStore
    from dagtune.distributions import choice, loguniform, normal, qloguniform, quniform, randint, uniform
    from dagtune.errors import DagtuneError, DagtuneWarning
    from dagtune.fusion import SGD, Adagrad, Adam, AdamW, FusibleTrainer, FusionWarning, RMSprop
    from dagtune.gc import GcPolicy
    from dagtune.lightning import LightningTrainer
    from dagtune.mainguard import UnguardedMainError
    from dagtune.notices import (
        DefaultedHyperparameterWarning,
        NondeterministicTrainingWarning,
        ResumeCheckSkippedWarning,
        TrialsDivergedWarning,
        TrialsFailedWarning,
        UnreadHyperparameterWarning,
    )
    from dagtune.plan import merge_rate, unique_steps
    from dagtune.results import StudyResults, open_results
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
    from dagtune.storage_retry import StorageUnavailableError
    from dagtune.study import (
        Result,
        Study,
        Surrogate,
        SurrogateResult,
        SurrogateStudy,
        TrialError,
        TrialHandle,
        TrialResult,
        run_alone,
    )
    from dagtune.study_lease import StudyInUseError, StudyLeaseLostError
    from dagtune.trainer import (
        ResumableBatches,
        ResumableBatchSampler,
        Trainer,
        capture_rng,
        isolated_rng,
        restore_rng,
        seed_everything,
    )

__version__ = "0.1.0"

__all__ = [
    "SGD",
    "Adagrad",
    "Adam",
    "AdamW",
    "CheckpointError",
    "CheckpointStore",
    "Constant",
    "Cosine",
    "Cyclic",
    "DagtuneError",
    "DagtuneWarning",
    "DefaultedHyperparameterWarning",
    "Exponential",
    "FusibleTrainer",
    "FusionWarning",
    "GcPolicy",
    "Grid",
    "LightningTrainer",
    "Linear",
    "MultiStep",
    "NondeterministicTrainingWarning",
    "Piecewise",
    "RMSprop",
    "Random",
    "Result",
    "ResumableBatchSampler",
    "ResumableBatches",
    "ResumeCheckSkippedWarning",
    "Sequence",
    "Steps",
    "StorageUnavailableError",
    "Study",
    "StudyInUseError",
    "StudyLeaseLostError",
    "StudyResults",
    "Surrogate",
    "SurrogateResult",
    "SurrogateStudy",
    "Trainer",
    "TrialError",
    "TrialHandle",
    "TrialResult",
    "TrialsDivergedWarning",
    "TrialsFailedWarning",
    "UnguardedMainError",
    "UnreadHyperparameterWarning",
    "Warmup",
    "algos",
    "capture_rng",
    "choice",
    "fusion",
    "isolated_rng",
    "loggers",
    "loguniform",
    "merge_rate",
    "mup",
    "normal",
    "open_results",
    "qloguniform",
    "quniform",
    "randint",
    "restore_rng",
    "run_alone",
    "seed_everything",
    "uniform",
    "unique_steps",
]

#: Each public name -> the module that defines it (a submodule's own name -> itself).
_WHERE = {
    "algos": "dagtune.algos",
    "fusion": "dagtune.fusion",
    "loggers": "dagtune.loggers",
    "mup": "dagtune.mup",
    "CheckpointError": "dagtune.checkpoints",
    "CheckpointStore": "dagtune.checkpoints",
    "choice": "dagtune.distributions",
    "loguniform": "dagtune.distributions",
    "normal": "dagtune.distributions",
    "qloguniform": "dagtune.distributions",
    "quniform": "dagtune.distributions",
    "randint": "dagtune.distributions",
    "uniform": "dagtune.distributions",
    "DagtuneError": "dagtune.errors",
    "DagtuneWarning": "dagtune.errors",
    "SGD": "dagtune.fusion",
    "Adam": "dagtune.fusion",
    "AdamW": "dagtune.fusion",
    "Adagrad": "dagtune.fusion",
    "RMSprop": "dagtune.fusion",
    "FusibleTrainer": "dagtune.fusion",
    "FusionWarning": "dagtune.fusion",
    "GcPolicy": "dagtune.gc",
    "LightningTrainer": "dagtune.lightning",
    "UnguardedMainError": "dagtune.mainguard",
    "DefaultedHyperparameterWarning": "dagtune.notices",
    "NondeterministicTrainingWarning": "dagtune.notices",
    "ResumeCheckSkippedWarning": "dagtune.notices",
    "TrialsDivergedWarning": "dagtune.notices",
    "TrialsFailedWarning": "dagtune.notices",
    "UnreadHyperparameterWarning": "dagtune.notices",
    "merge_rate": "dagtune.plan",
    "unique_steps": "dagtune.plan",
    "StudyResults": "dagtune.results",
    "open_results": "dagtune.results",
    "Constant": "dagtune.sequences",
    "Cosine": "dagtune.sequences",
    "Cyclic": "dagtune.sequences",
    "Exponential": "dagtune.sequences",
    "Linear": "dagtune.sequences",
    "MultiStep": "dagtune.sequences",
    "Piecewise": "dagtune.sequences",
    "Sequence": "dagtune.sequences",
    "Steps": "dagtune.sequences",
    "Warmup": "dagtune.sequences",
    "Grid": "dagtune.space",
    "Random": "dagtune.space",
    "StorageUnavailableError": "dagtune.storage_retry",
    "Result": "dagtune.study",
    "Study": "dagtune.study",
    "Surrogate": "dagtune.study",
    "SurrogateResult": "dagtune.study",
    "SurrogateStudy": "dagtune.study",
    "TrialError": "dagtune.study",
    "TrialHandle": "dagtune.study",
    "TrialResult": "dagtune.study",
    "run_alone": "dagtune.study",
    "StudyInUseError": "dagtune.study_lease",
    "StudyLeaseLostError": "dagtune.study_lease",
    "ResumableBatches": "dagtune.trainer",
    "ResumableBatchSampler": "dagtune.trainer",
    "Trainer": "dagtune.trainer",
    "capture_rng": "dagtune.trainer",
    "isolated_rng": "dagtune.trainer",
    "restore_rng": "dagtune.trainer",
    "seed_everything": "dagtune.trainer",
}


def __getattr__(name: str) -> Any:
    """Load the module behind a public name (or a submodule) on first access, and keep it."""
    module = _WHERE.get(name)
    if module is None:
        if name.startswith("__") or importlib.util.find_spec(f"{__name__}.{name}") is None:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        module = f"{__name__}.{name}"
    loaded = importlib.import_module(module)
    value = loaded if module == f"{__name__}.{name}" else getattr(loaded, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
