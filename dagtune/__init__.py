"""dagtune: hyper-parameter optimization on Dask that trains every shared prefix once.

Trials whose hyper-parameter sequences agree on a prefix share its training through a tree
of stages and checkpoints (the Hippo design), scheduled by critical path on Dask.
"""

from dagtune import algos, fusion, loggers, mup
from dagtune.checkpoints import CheckpointError, CheckpointStore
from dagtune.distributions import choice, loguniform, normal, qloguniform, quniform, randint, uniform
from dagtune.errors import DagtuneError, DagtuneWarning
from dagtune.fusion import SGD, AdamW, FusibleTrainer, FusionWarning
from dagtune.gc import GcPolicy
from dagtune.lightning import LightningTrainer
from dagtune.mainguard import UnguardedMainError
from dagtune.notices import (
    NondeterministicTrainingWarning,
    ResumeCheckSkippedWarning,
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
    "AdamW",
    "CheckpointError",
    "CheckpointStore",
    "Constant",
    "Cosine",
    "Cyclic",
    "DagtuneError",
    "DagtuneWarning",
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
