"""`TensorBoard`: one TensorBoard run per trial, its hyper-parameters and every step."""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

from dagtune.loggers._base import Logger, TrialInfo, safe_name
from dagtune.validation import check_int

__all__ = ["TensorBoard"]

_STATUS = {"completed": "STATUS_SUCCESS", "stopped": "STATUS_SUCCESS", "pending": "STATUS_RUNNING"}


def _need_tensorboard() -> None:
    try:
        import tensorboard  # noqa: F401
    except ImportError as error:
        raise ImportError(
            "dt.loggers.TensorBoard needs the tensorboard package: pip install 'dagtune[tensorboard]'"
        ) from error


class TensorBoard(Logger):
    """TensorBoard event files: one run per trial, ``{directory}/{study}/trial-{id}``
    (``tensorboard --logdir DIRECTORY`` shows every study's trials side by side).

    Each run holds the trial's hyper-parameters for TensorBoard's HPARAMS tab (a
    constant's value; a schedule's text and its first value: `dagtune.loggers.hparams_of`)
    and one scalar per metric per step, ``global_step`` the step from 0. The steps of a
    prefix several trials share were trained once, and each of those trials' runs holds
    them, so every curve starts at step 0. The trial's end is recorded as the HPARAMS
    session's status (success for completed and stopped trials, failure for failed and
    diverged ones).

    `max_open` bounds the event files kept open at once (a trial's file is closed when it
    ends and when more trials are logging; TensorBoard reads a run's files together).
    """

    def __init__(self, directory: str | os.PathLike, *, max_open: int = 64):
        _need_tensorboard()
        check_int("TensorBoard.max_open", max_open, minimum=1)
        self.directory = os.fspath(directory)
        self.max_open = max_open
        self._writers: OrderedDict[tuple[str, int], Any] = OrderedDict()

    def __repr__(self) -> str:
        return f"dt.loggers.TensorBoard({self.directory!r})"

    def run_directory(self, study: str, trial: int) -> str:
        """Where trial `trial` of `study` is logged."""
        return os.path.join(self.directory, safe_name(study), f"trial-{trial}")

    def _writer(self, study: str, trial: int) -> Any:
        from torch.utils.tensorboard import SummaryWriter

        key = (study, trial)
        writer = self._writers.get(key)
        if writer is None:
            while len(self._writers) >= self.max_open:
                self._writers.popitem(last=False)[1].close()
            writer = self._writers[key] = SummaryWriter(self.run_directory(study, trial))
        self._writers.move_to_end(key)
        return writer

    def start(self, trial: TrialInfo) -> int:
        last, has_hparams = _read_run(self.run_directory(trial.study, trial.id))
        if not has_hparams:
            hparams = {k: v for k, v in trial.hparams.items() if isinstance(v, (bool, int, float, str))}
            self._writer(trial.study, trial.id).file_writer.add_summary(_session_start(hparams))
        return last

    def log(self, study: str, trial: int, step: int, metrics: Mapping[str, float]) -> None:
        writer = self._writer(study, trial)
        for name, value in metrics.items():
            writer.add_scalar(name, value, global_step=step)

    def end(self, study: str, trial: int, status: str, metrics: Mapping[str, float]) -> None:
        writer = self._writer(study, trial)
        writer.file_writer.add_summary(_session_end(_STATUS.get(status, "STATUS_FAILURE")))
        writer.close()
        del self._writers[(study, trial)]

    def flush(self, study: str) -> None:
        for (name, _), writer in self._writers.items():
            if name == study:
                writer.flush()

    def close(self, study: str) -> None:
        for key in [k for k in self._writers if k[0] == study]:
            self._writers.pop(key).close()


def _read_run(directory: str) -> tuple[int, bool]:
    """The last step of any scalar in the run's event files (-1 if none) and whether they
    hold its hyper-parameters already (an earlier session logged them)."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
    from tensorboard.plugins.hparams import metadata

    if not os.path.isdir(directory):
        return -1, False
    last, has_hparams = -1, False
    for name in sorted(os.listdir(directory)):
        if "tfevents" not in name:
            continue
        try:
            for event in EventFileLoader(os.path.join(directory, name)).Load():
                for value in event.summary.value:
                    if value.tag == metadata.SESSION_START_INFO_TAG:
                        has_hparams = True
                    elif not value.tag.startswith("_hparams_/"):
                        last = max(last, event.step)
        except Exception:  # a file cut short by a crash: what was read counts
            continue
    return last, has_hparams


def _summary(tag: str, content: Any) -> Any:
    from tensorboard.compat.proto.summary_pb2 import Summary, SummaryMetadata
    from tensorboard.plugins.hparams import metadata
    from tensorboard.plugins.hparams.plugin_data_pb2 import HParamsPluginData

    data = HParamsPluginData(version=metadata.PLUGIN_DATA_VERSION, **content)
    plugin = SummaryMetadata.PluginData(plugin_name=metadata.PLUGIN_NAME, content=data.SerializeToString())
    return Summary(value=[Summary.Value(tag=tag, metadata=SummaryMetadata(plugin_data=plugin))])


def _session_start(hparams: Mapping[str, Any]) -> Any:
    from tensorboard.plugins.hparams import metadata
    from tensorboard.plugins.hparams.plugin_data_pb2 import SessionStartInfo

    info = SessionStartInfo()
    for name, value in hparams.items():
        if isinstance(value, bool):
            info.hparams[name].bool_value = value
        elif isinstance(value, (int, float)):
            info.hparams[name].number_value = value
        else:
            info.hparams[name].string_value = str(value)
    return _summary(metadata.SESSION_START_INFO_TAG, {"session_start_info": info})


def _session_end(status: str) -> Any:
    from tensorboard.plugins.hparams import metadata
    from tensorboard.plugins.hparams.api_pb2 import Status
    from tensorboard.plugins.hparams.plugin_data_pb2 import SessionEndInfo

    info = SessionEndInfo(status=Status.Value(status))
    return _summary(metadata.SESSION_END_INFO_TAG, {"session_end_info": info})
