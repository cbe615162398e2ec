"""Studies: the public entry point (`Study`, `TrialHandle`, `Result`, `run_alone`).

A `Study` owns a coordinator for one model identity (trainer class, trainer arguments,
seed, version; `model_identity`) and an executor, and runs algorithms on it (a session per
`Study.run`, giving back a `Result`); `run_alone` trains one trial in-process, the
reference every study reproduces; a `SurrogateStudy` searches on a width-scaled model
(`Surrogate`) and trains the winner once on the full one.
"""

from dagtune.identity import model_identity
from dagtune.study._alone import run_alone
from dagtune.study._results import Result, TrialError, TrialResult
from dagtune.study._study import Study, TrialHandle
from dagtune.study._surrogate import NOT_TRANSFERRED, Surrogate, SurrogateResult, SurrogateStudy
from dagtune.study._workers import NoWorkersError

__all__ = [
    "NOT_TRANSFERRED",
    "NoWorkersError",
    "Result",
    "Study",
    "Surrogate",
    "SurrogateResult",
    "SurrogateStudy",
    "TrialError",
    "TrialHandle",
    "TrialResult",
    "model_identity",
    "run_alone",
]
