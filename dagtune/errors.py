"""The roots of dagtune's exceptions and warnings: every error dagtune raises is a
`DagtuneError`, every warning it gives a `DagtuneWarning`.

``except dt.DagtuneError`` catches whatever dagtune itself refuses or reports, and nothing
else (a trainer's own exception reaches the caller as a `dagtune.TrialError`, which is one).
Each error keeps the standard base it always had beside this one (`ValueError` for bad
input, `RuntimeError` for a failed run, ...), so code that catches those goes on working.
An interrupt (`KeyboardInterrupt` and what dagtune derives from it) is not an error and is
not one of these.
"""

from __future__ import annotations

__all__ = ["DagtuneError", "DagtuneWarning", "TrainerCheckError"]


class DagtuneError(Exception):
    """The base of every exception dagtune raises."""


class TrainerCheckError(DagtuneError):
    """A check of the trainer's code failed (its evaluate changed the training state, or a
    trainer resumed from a checkpoint trains differently): training the stage again would
    fail the same way, so the stage is not retried and the trials fail with this error."""


class DagtuneWarning(UserWarning):
    """The base of every warning dagtune gives (a `UserWarning`, shown once by default)."""
