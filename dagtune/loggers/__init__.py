"""Loggers: a study's trials in TensorBoard, CSV files or MLflow, as they train.

``dt.Study(..., loggers=[dt.loggers.TensorBoard("tb"), dt.loggers.CSV("csv"),
dt.loggers.MLflow()])`` (or ``dagtune run --tensorboard DIR``). Loggers run in the study's
own process, fed from the results its trials receive (`Logging`, a listener of the
study's coordinator), never on a worker. Each trial is one run with its hyper-parameters
and every step's metrics, steps counted from 0; the steps of a prefix several trials share
were trained once but appear in each of their runs, so every curve is whole. A resumed study
sends each logger only the steps it lacks. Write your own by subclassing `Logger`.
"""

from dagtune.loggers._base import Logger, TrialInfo, hparams_of
from dagtune.loggers._csv import CSV
from dagtune.loggers._dispatch import Logging, check_loggers
from dagtune.loggers._mlflow import MLflow
from dagtune.loggers._tensorboard import TensorBoard

__all__ = ["CSV", "Logger", "Logging", "MLflow", "TensorBoard", "TrialInfo", "check_loggers", "hparams_of"]
