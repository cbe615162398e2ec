"""The ``dagtune`` command: run a study, inspect storage, collect checkpoints, serve the page.

::

    dagtune run examples/digits.py [--scheduler ADDRESS] [--storage URL] [--workers N] [--surrogate S]
                                   [--tensorboard DIR]
                                   [--no-tls | --tls-ca-file PEM --tls-cert PEM [--tls-key PEM]]
                                   [--retry-failed] [--step-timeout SECONDS]
                                   [--wait-for-lease SECONDS] [--storage-retry SECONDS]
    dagtune status STORAGE [--study NAME]
    dagtune tree STORAGE [--study NAME]
    dagtune gc STORAGE [--keep-best N] [--budget BYTES] [--dry-run]
    dagtune export STORAGE --study NAME [--trial N] -o FILE
    dagtune dashboard STORAGE [--port PORT]

A user's mistake (a bad storage URL, an unreachable scheduler, a script that can't give a
study) is one ``Error:`` line and a ``Hint:`` line, exit code 2; ``--debug`` shows the
traceback instead.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import shlex
import signal
import sys
import threading
import warnings
from collections.abc import Callable
from typing import Any, NoReturn

import click

import dagtune as dt
from dagtune.catalog import (
    NotDagtuneStorageError,
    StorageError,
    StorageReadError,
    StudyNameError,
    check_study_name,
    collect_garbage,
    load_study,
    open_storage,
    stored_studies,
)
from dagtune.checkpoints import CheckpointStore
from dagtune.dashboard.server import serve, websocket_origins
from dagtune.errors import DagtuneError
from dagtune.frames import TrialRow, trials_table
from dagtune.gc import GcPolicy
from dagtune.progress import watch
from dagtune.records import COMPLETED, PENDING
from dagtune.study_index import StudyDetail, status_figures, study_detail, study_status, study_view, top_rows
from dagtune.study_lease import StudyInUseError, writer_status
from dagtune.summary import (
    UNKNOWN_FROM_STORAGE,
    best_of,
    divergence_line,
    error_line,
    metric_of,
    reuse_text,
    seconds_label,
)

__all__ = ["main"]


class UserError(click.ClickException, DagtuneError):
    """One line saying what is wrong and one saying what to do."""

    exit_code = 2

    def __init__(self, message: str, hint: str = ""):
        super().__init__(message)
        self.hint = hint

    def format_message(self) -> str:
        return self.message + (f"\nHint: {self.hint}" if self.hint else "")


def _debug() -> bool:
    """Whether ``dagtune --debug`` asked for tracebacks instead of one-line errors."""
    context = click.get_current_context(silent=True)
    return bool(context is not None and context.find_root().params.get("debug"))


@contextlib.contextmanager
def _mistake(kinds: type[BaseException] | tuple, message: Callable[[Any], str], hint: str):
    """Turn `kinds` raised in the block into a `UserError` (with --debug: let them through)."""
    try:
        yield
    except kinds as error:
        if _debug():
            raise
        raise UserError(message(error), hint) from None


def _user_errors(command: Callable) -> Callable:
    """Turn the known user mistakes into `UserError` (unless --debug)."""

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if _debug():
            return command(*args, **kwargs)
        try:
            return command(*args, **kwargs)
        except StudyNameError as error:
            raise UserError(f"--study {error}", "`dagtune status STORAGE` lists the studies there") from None
        except StorageReadError as error:
            raise UserError(
                str(error),
                "dagtune reads every file under STORAGE: check its permissions (this user must be able to "
                "read them; gc also deletes) and that nothing replaced a file or folder; "
                "`dagtune --debug ...` shows the traceback",
            ) from None
        except NotDagtuneStorageError as error:
            raise UserError(
                str(error), "give the directory or URL a study wrote to (its storage=..., or --storage)"
            ) from None
        except StorageError as error:
            raise UserError(
                str(error), "give a directory or fsspec URL (s3://bucket/prefix) that a study wrote to"
            ) from None

    return wrapper


def _escape(value: Any) -> str:
    """`value` as text that rich shows literally (a config value like ``[/]`` is not markup)."""
    from rich.markup import escape

    return escape(str(value))


def _console():
    """Rich output; off a terminal (pipes, CI logs) wide enough not to wrap table cells."""
    from rich.console import Console

    console = Console()
    return console if console.is_terminal else Console(width=200)


@click.group()
@click.option("--debug", is_flag=True, help="Show tracebacks instead of one-line errors.")
@click.version_option(package_name="dagtune")
def main(debug: bool) -> None:
    """dagtune: hyper-parameter studies on Dask that never train the same prefix twice."""


# --------------------------------------------------------------------------- run


def _connect(address: str, security: Any = None):
    from distributed import Client

    with _mistake(
        (OSError, TimeoutError, ValueError, TypeError),  # TypeError: a tls:// address without certificates
        lambda error: f"cannot reach the Dask scheduler at {address}: {error}",
        "start one with `dask scheduler` (and `dask worker ADDRESS`), or drop --scheduler for a local cluster; "
        "a TLS scheduler needs --tls-ca-file and --tls-cert (or Dask's distributed.comm.tls config)",
    ):
        return Client(address, timeout="5s", security=security)


def _security(
    scheduler: str | None, no_tls: bool, ca_file: str | None, cert: str | None, key: str | None
) -> Any:
    """The TLS settings ``run`` was given: certificate files (for the client of --scheduler,
    or for every process of the local cluster), ``False`` for a local cluster without TLS,
    or None (a local cluster with temporary credentials; for --scheduler, Dask's config)."""

    files = {"--tls-ca-file": ca_file, "--tls-cert": cert, "--tls-key": key}
    given = [option for option, path in files.items() if path]
    if no_tls and scheduler:
        raise UserError(
            "--no-tls is for the local cluster; a --scheduler address says whether it uses TLS (tls://...)",
            "drop --no-tls",
        )
    if no_tls and given:
        raise UserError(f"--no-tls can't be used with {given[0]}", "drop one of them")
    if not given:
        return False if no_tls else None
    if not ca_file or not cert:
        raise UserError(
            f"{given[0]} needs --tls-ca-file and --tls-cert too",
            "give the CA file and this process's certificate (and --tls-key unless the certificate holds it)",
        )
    from dagtune.security import tls_from_files  # loads the executors (the simulated one: torch)

    try:
        return tls_from_files(ca_file, cert, key)
    except ValueError as error:
        raise UserError(
            str(error), "give the PEM files the scheduler and workers were started with"
        ) from None


def _check_storage(url: str) -> None:
    """Fail early and clearly on a storage URL no filesystem can open."""

    with _mistake(
        (ValueError, ImportError, OSError),
        lambda error: f"cannot use storage {url!r}: {type(error).__name__}: {error}",
        "give a writable directory or an fsspec URL whose package is installed (s3:// needs s3fs)",
    ):
        store = CheckpointStore(url)
        store.fs.makedirs(store.root, exist_ok=True)


def _parse_resources(values: tuple[str, ...]) -> dict[str, float] | None:
    resources = {}
    for value in values:
        name, sep, amount = value.partition("=")
        try:
            resources[name] = float(amount)
        except ValueError:
            sep = ""
        if not sep or not name:
            raise UserError(f"--resources {value!r} is not NAME=AMOUNT", "e.g. --resources GPU=1")
    return resources or None


class _Terminated(KeyboardInterrupt):
    """SIGTERM, taken as Ctrl-C is: the study keeps what it trained and closes."""


def _terminate_as_interrupt(command: Callable) -> Callable:
    """While `command` runs (in the main thread), SIGTERM (a batch system ending the job,
    ``kill``) interrupts it as Ctrl-C does, instead of ending the process before the study
    writes its last records."""

    def terminated(signum: int, frame: Any) -> None:
        raise _Terminated()

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if threading.current_thread() is not threading.main_thread():
            return command(*args, **kwargs)
        previous = signal.signal(signal.SIGTERM, terminated)
        try:
            return command(*args, **kwargs)
        finally:
            signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)

    return wrapper


class _PatientClose:
    """While a study runs, the first Ctrl-C (SIGINT) or SIGTERM interrupts it as usual (the
    run withdraws its trials' work and writes what it left, then the study closes: the last
    journal lines, results, index and lease, then the loggers and the embedded cluster); a
    second one meanwhile (an impatient user, a repeated key) says so once and is otherwise
    ignored, so that none of that is cut short (a close cut short leaves the cluster to
    Dask's exit handlers, with their timeouts and tracebacks). SIGKILL still ends it at once.
    The handlers there were before are back on exit. Only in the main thread (signals
    reach no other)."""

    def __init__(self) -> None:
        self.previous: dict[int, Any] = {}
        self.told = False
        self.interrupted_after_finish = False

    def __enter__(self) -> _PatientClose:
        if threading.current_thread() is threading.main_thread():
            for number in (signal.SIGINT, signal.SIGTERM):
                self.previous[number] = signal.signal(number, self._first)
        return self

    def _first(self, signum: int, frame: Any) -> None:
        for number in self.previous:
            signal.signal(number, self._again)
        raise _Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()

    def _again(self, signum: int, frame: Any) -> None:
        if not self.told:
            self.told = True
            click.echo(
                "dagtune: closing the study (writing what it left, stopping its cluster); a few seconds, "
                "please. Further interrupts are ignored until it has closed (SIGKILL ends it at once, "
                "losing at most its last 50 ms of records)",
                err=True,
            )

    def finished(self) -> None:
        """The study's run has returned, its results complete: from now on an interrupt (of
        its close) is not one of the run. It says so once and is otherwise ignored, so that
        the close writes everything and the command still shows the result and exits as a
        finished run does."""
        for number in self.previous:
            signal.signal(number, self._after_finish)

    def _after_finish(self, signum: int, frame: Any) -> None:
        if not self.interrupted_after_finish:
            self.interrupted_after_finish = True
            click.echo(
                f"dagtune: {'SIGTERM' if signum == signal.SIGTERM else 'Ctrl-C'} after the study had finished: "
                "its results are complete; closing it (a few seconds), then its result. Further interrupts "
                "are ignored until then",
                err=True,
            )

    def __exit__(self, *exc_info: Any) -> None:
        for number, handler in self.previous.items():
            signal.signal(number, signal.SIG_DFL if handler is None else handler)


def _interrupted(shown: list, storage: str, interrupt: KeyboardInterrupt) -> NoReturn:
    """Print the one line an interrupted run ends with (what storage keeps, the command that
    resumes), then exit with 130 for Ctrl-C, 143 for SIGTERM (128 + the signal, as a shell
    reports a process the signal ended)."""
    terminated = isinstance(interrupt, _Terminated)
    trials = [trial for study in shown for trial in study.view().trials]
    command = shlex.join(["dagtune", *sys.argv[1:]])
    if trials:
        pending = sum(1 for trial in trials if trial.status == PENDING)
        again = (
            "The same command resumes each pending trial from its latest checkpoint"
            if pending
            # the run was cut after its last trial ended, before it returned: its algorithm may
            # still have asked for more
            else "The same command ends the study (training only what its algorithm still asks for) "
            "and shows its best"
        )
        kept = (
            f"{len(trials) - pending}/{len(trials)} trials finished, {pending} pending; their results and "
            f"checkpoints are kept in {storage}. {again}: {command}"
        )
    else:
        kept = f"the study had not started, nothing was trained. The same command starts it: {command}"
    click.echo(f"Interrupted ({'SIGTERM' if terminated else 'Ctrl-C'}): {kept}", err=True)
    raise SystemExit(128 + (signal.SIGTERM if terminated else signal.SIGINT))


@main.command()
@click.argument("target")
@click.option("--scheduler", metavar="ADDRESS", help="A running `dask scheduler` (default: a local cluster).")
@click.option(
    "--storage",
    help="Directory or fsspec URL (default: the setup's options['storage'], else ./dagtune-runs).",
)
@click.option(
    "--workers",
    type=click.IntRange(min=1),
    help="Workers of the local cluster (default: the setup's options['workers'], else one per core).",
)
@click.option("--name", help="Study name (default: the setup's).")
@click.option("--resources", multiple=True, metavar="NAME=AMOUNT", help="Per stage, e.g. GPU=1 (repeatable).")
@click.option("--timeout", type=float, help="Give up after this many seconds.")
@click.option(
    "--surrogate",
    type=click.IntRange(min=2),
    metavar="S",
    help="Search on the trainer at width scale S (its `scale` argument), then train the best on the "
    "full model (overrides the setup's dagtune.Surrogate scale).",
)
@click.option(
    "--no-tls",
    is_flag=True,
    help="Run the local cluster on plain TCP: any local process can then connect and run code on it.",
)
@click.option(
    "--tls-ca-file", metavar="PATH", help="CA certificate (PEM), as `dask scheduler --tls-ca-file`."
)
@click.option(
    "--tls-cert",
    metavar="PATH",
    help="This process's certificate (PEM): the client's for --scheduler, else every local process's.",
)
@click.option("--tls-key", metavar="PATH", help="Its private key (PEM), unless --tls-cert holds it.")
@click.option(
    "--tensorboard",
    metavar="DIR",
    help="Log every trial to TensorBoard in DIR (a run per trial: `tensorboard --logdir DIR`).",
)
@click.option(
    "--fuse",
    is_flag=False,
    flag_value="memory",
    metavar="[N]",
    help="Train trials of a FusibleTrainer that differ only in fusible hyper-parameters as fused "
    "tasks of up to N (no N: as many as memory allows); after TARGET.",
)
@click.option(
    "--wait-for-lease",
    type=click.FloatRange(min=0),
    metavar="SECONDS",
    help="If another process has the study open, wait this long for it to close (or for its lease "
    "to lapse, if it was killed) instead of failing at once.",
)
@click.option(
    "--storage-retry",
    type=click.FloatRange(min=0),
    metavar="SECONDS",
    help="How long to retry storage that can't be reached before the study fails (default 300).",
)
@click.option(
    "--step-timeout",
    type=click.FloatRange(min=0, min_open=True),
    metavar="SECONDS",
    help="Fail a step (train(), evaluation, checkpoint) still running after SECONDS, and restart its worker.",
)
@click.option(
    "--retry-failed",
    is_flag=True,
    help="Train the study's failed trials again, from their latest checkpoints (those that failed "
    "outside the trainer, in storage or with their workers, are retried anyway).",
)
@_user_errors
@_terminate_as_interrupt
def run(
    target: str,
    scheduler: str | None,
    storage: str | None,
    workers: int | None,
    name: str | None,
    resources: tuple[str, ...],
    timeout: float | None,
    surrogate: int | None,
    no_tls: bool,
    tls_ca_file: str | None,
    tls_cert: str | None,
    tls_key: str | None,
    tensorboard: str | None,
    fuse: str | None,
    wait_for_lease: float | None,
    storage_retry: float | None,
    step_timeout: float | None,
    retry_failed: bool,
) -> None:
    """Run the study that TARGET sets up (script.py, script.py:func or module:func).

    The local cluster speaks TLS with credentials made for this run alone; with
    --tls-ca-file/--tls-cert/--tls-key it uses those instead (other processes holding
    them can connect). A --scheduler with TLS needs the same options (or Dask's
    distributed.comm.tls config).

    With --surrogate S (or a setup whose `surrogate` is a dagtune.Surrogate) the search runs
    on the trainer scaled down by S as study NAME, and its best configuration then trains
    the full model as study NAME-target; progress shows both."""

    if scheduler and workers:
        raise UserError(
            "--workers sizes the local cluster; it can't be used with --scheduler", "drop one of them"
        )
    parsed = _parse_resources(resources)
    security = _security(scheduler, no_tls, tls_ca_file, tls_cert, tls_key)
    fused = _parse_fuse(fuse)
    from dagtune.launch import SetupError, load_setup  # loads the study, torch and the algorithms

    try:
        setup = load_setup(target)
    except SetupError as error:
        if _debug():
            raise
        raise UserError(str(error), error.hint) from None
    options = dict(setup.options)
    # the command line's --storage and --workers win over the setup's
    setup_storage, setup_workers = options.pop("storage", "./dagtune-runs"), options.pop("workers", None)
    storage = storage if storage is not None else setup_storage
    workers = workers if workers is not None else setup_workers
    if scheduler and workers:
        raise UserError(
            "the setup's options['workers'] sizes the local cluster; it can't be used with --scheduler",
            "drop one of them",
        )
    _check_storage(storage)
    client = _connect(scheduler, security) if scheduler else None
    if tensorboard:
        with _mistake(
            ImportError, str, "pip install tensorboard (or 'dagtune[tensorboard]'), or drop --tensorboard"
        ):
            options["loggers"] = [*options.get("loggers", ()), dt.loggers.TensorBoard(tensorboard)]
    if fused is not None:
        _check_fuse(fused, setup.trainer)
        options["fuse"] = fused
    if parsed:
        options["resources"] = parsed
    if wait_for_lease is not None:
        options["wait_for_lease"] = wait_for_lease
    if storage_retry is not None:
        options["storage_retry_seconds"] = storage_retry
    if retry_failed:
        options["retry_failed"] = True
    if step_timeout is not None:
        options["step_timeout"] = step_timeout
    if client is None and security is not None:
        options["security"] = security
    shown: list[dt.Study] = []  # the studies opened (both halves of a surrogate study)
    result: Any = None  # the run's result, once it returned
    try:
        with (
            _mistake(  # e.g. resources no worker offers, a name in use by another model
                ValueError, str, "see `dagtune status STORAGE` for the studies already there"
            ),
            _mistake(  # another process has the study open
                StudyInUseError,
                str,
                "stop that process, or wait for it with --wait-for-lease SECONDS (a killed one's lease "
                "lapses after its ttl; one that ran on this machine is taken over at once)",
            ),
            _mistake(  # a scheduler no worker joined
                TimeoutError,
                str,
                "start workers with `dask worker ADDRESS"
                + "".join(f" --resources {k}={v:g}" for k, v in (parsed or {}).items())
                + "`, or drop --scheduler for a local cluster",
            ),
        ):
            study = _open_study(setup, surrogate, name or setup.name, storage, client, workers, options)
        algorithm = setup.algorithm
        shown.extend([study] if isinstance(study, dt.Study) else [study.surrogate_study, study.target_study])
        expired = _mistake(
            TimeoutError,
            lambda _: (
                f"the study did not finish within --timeout {timeout:g} s ({_completed(shown[0])} trials completed)"
            ),
            f"raise --timeout (or drop it); what was trained is kept in {storage} and reused by "
            "every study of this model, and the same command continues the pending trials",
        )
        lost = _mistake(  # every worker died and none came back
            dt.study.NoWorkersError,
            str,
            "see the workers' logs for why they died; the same command continues the pending trials",
        )
        # a second Ctrl-C while the study closes must not cut its close short, nor one that
        # comes once the run has returned (`_PatientClose.finished`)
        with _PatientClose() as patient, study, contextlib.ExitStack() as watching, expired, lost:
            for each in shown:
                watching.enter_context(watch(each, algorithm.metric, algorithm.mode, show="terminal"))
            with warnings.catch_warnings():  # listed after the summary (`_print_result`), not twice
                warnings.simplefilter("ignore", dt.TrialsFailedWarning)
                warnings.simplefilter("ignore", dt.TrialsDivergedWarning)
                result = study.run(algorithm, timeout=timeout)
            patient.finished()
    except KeyboardInterrupt as interrupt:  # Ctrl-C, or SIGTERM (`_terminate_as_interrupt`)
        if result is None:
            _interrupted(shown, storage, interrupt)
        # it came between the run's return and `patient.finished()`: the close was patient
    finally:
        if client is not None:
            client.close()
    if isinstance(result, dt.SurrogateResult):
        failed = _print_result(result.surrogate)
        _print_target(result)
    else:
        failed = _print_result(result)
    if failed:
        sys.exit(1)


def _open_study(
    setup: Any, scale: int | None, name: str, storage: str, client: Any, workers: int | None, options: dict
) -> Any:
    """The setup's `Study`, or its `SurrogateStudy` when it declares a surrogate or --surrogate
    gives a scale (which replaces the setup's)."""
    surrogate = setup.surrogate
    if scale is not None:
        surrogate = (
            dt.Surrogate(scale=scale) if surrogate is None else dataclasses.replace(surrogate, scale=scale)
        )
    if surrogate is None:
        return dt.Study(
            setup.trainer,
            setup.trainer_kwargs,
            name=name,
            storage=storage,
            client=client,
            workers=workers,
            **options,
        )
    return dt.SurrogateStudy(
        setup.trainer,
        setup.trainer_kwargs,
        surrogate,
        name,
        storage=storage,
        client=client,
        workers=workers,
        **options,
    )


def _parse_fuse(value: str | None) -> bool | int | None:
    """``--fuse``'s value: None if not given, True without N (F measured from memory), else N."""
    if value is None:
        return None
    if value == "memory":
        return True
    try:
        count = int(value)
    except ValueError:
        count = 0
    if count < 1:
        raise UserError(
            f"--fuse {value!r} is not a positive count of trials",
            "e.g. --fuse 8, or --fuse alone after TARGET",
        )
    return count


def _check_fuse(fuse: bool | int, trainer: type) -> None:
    from dagtune.coordinator import check_fuse  # loads the fusion check and torch

    try:
        check_fuse(fuse, trainer)
    except ValueError as error:
        raise UserError(
            f"--fuse: {error}",
            "drop --fuse, or write the trainer as a dagtune.FusibleTrainer (docs/fusion.md)",
        ) from None


def _completed(study: Any) -> str:

    trials = study.view().trials
    return f"{sum(1 for t in trials if t.status == COMPLETED)}/{len(trials)}"


def _print_result(result: Any) -> bool:
    """The run's best trial and figures, then its failed and diverged trials; whether any
    failed."""
    from rich.table import Table

    console = _console()
    report = result.report
    best = result.best
    if best is not None:
        ended = "" if best.status == COMPLETED else f" ({best.status})"  # none completed
        # the headline on a line of its own: as the table's title it wrapped to the table's width
        console.print(
            f"best: {_escape(result.metric)} = {best.metrics[result.metric]:.4g} after {best.steps} steps{ended}"
        )
        table = Table()
        table.add_column("hyper-parameter")
        table.add_column("sequence")
        for hp, sequence in best.config.items():
            table.add_row(_escape(hp), _escape(repr(sequence)))
        console.print(table)
    console.print(
        f"{report['trials']} trials: trained {report['executed_steps']} steps for {report['trial_steps']} "
        f"trial steps (unique {report['unique_steps']}, merge rate {report['merge_rate']:.2f}, "
        f"reuse {reuse_text(report)}) in {report['makespan_seconds']:.1f} s"
    )
    failed = result.failed
    if failed:
        console.print(f"[red]{len(failed)} of {report['trials']} trials failed:[/]")
        for trial in failed[:_FAILURES_SHOWN]:
            console.print(f"  trial {trial.id}: {_escape(error_line(trial.error))}")
        if len(failed) > _FAILURES_SHOWN:
            console.print(
                f"  and {len(failed) - _FAILURES_SHOWN} more (`dagtune status STORAGE --study NAME`)"
            )
    _print_diverged(console, result.diverged, report["trials"])
    return bool(failed)


def _print_diverged(console: Any, diverged: list, trials: int) -> None:
    """The trials a NaN or infinite metric ended (a result of the search, not a failure)."""
    if not diverged:
        return
    console.print(
        f"[yellow]{len(diverged)} of {trials} trials diverged (a NaN or infinite metric ends its trial):[/]"
    )
    for trial in diverged[:_FAILURES_SHOWN]:
        console.print(f"  trial {trial.id} {_escape(divergence_line(trial.steps, trial.metrics))}")
    if len(diverged) > _FAILURES_SHOWN:
        console.print(
            f"  and {len(diverged) - _FAILURES_SHOWN} more (their status in `dagtune status STORAGE --study NAME`)"
        )


_FAILURES_SHOWN = 10  # failed (and diverged) trials listed after a run


def _print_target(result: Any) -> None:
    """The target's training with the configuration the surrogate search found."""
    metric = result.metric
    value = result.target.metrics.get(metric)
    shown = "no result" if value is None else f"{_escape(metric)} = {value:.4g}"
    report = result.target_report
    restarts = f", {result.restarts} eager restart(s)" if result.restarts else ""
    _console().print(
        f"target (S=1, transferred from S={result.scale}): {shown} after {result.target.steps} steps; "
        f"trained {report['executed_steps']} steps in {report['makespan_seconds']:.1f} s{restarts}"
    )


# --------------------------------------------------------------------------- storage views


def _names(storage: str, study: str | None) -> tuple[CheckpointStore, list[str]]:
    """The storage of `storage` and the studies to show: `study`, or every one there."""
    if study is not None:
        check_study_name(study)
    store = open_storage(storage)
    names = stored_studies(store)
    if not names:
        raise UserError(
            f"no studies in {store.url}", "run one first: `dagtune run SCRIPT --storage " + storage + "`"
        )
    return store, [study] if study else names


@main.command()
@click.argument("storage")
@click.option("--study", help="Only this study, with its best trials.")
@click.option("--metric", help="Metric to rank by (default: the first val_* metric).")
@click.option("--mode", type=click.Choice(["max", "min"]), help="Whether higher or lower is better.")
@click.option(
    "--top", default=5, show_default=True, type=click.IntRange(min=0), help="Best trials listed with --study."
)
@_user_errors
def status(storage: str, study: str | None, metric: str | None, mode: str | None, top: int) -> None:
    """Trials, best so far and reuse of the studies in STORAGE."""
    from rich.table import Table

    console = _console()
    store, names = _names(storage, study)
    plans: dict = {}
    snapshots: dict[str, dict] = {}
    detail: StudyDetail | None = None
    for name in names:
        indexed = None if metric or mode or not study else study_detail(store, name, top)
        if indexed is not None:  # the best trials and incidents from a current index
            snapshots[name], detail = indexed
        elif study or metric or mode:  # another metric, or no current index: the journals
            stored = load_study(store, name, plans)
            if study and metric:
                _check_reported(name, metric, stored.trials)
            snapshots[name] = status_figures(stored, metric, mode)
            rows = top_rows(stored.trials, snapshots[name]["metric"], snapshots[name]["mode"], top)
            detail = StudyDetail(stored.identity, rows, stored.describe.get("gpus"), stored.incidents)
        else:  # from the study's index when it is current (`dagtune.study_index`)
            snapshots[name] = study_status(store, name, plans)
    table = Table(title=f"dagtune studies in {storage}")
    for column in (
        "study",
        "trials",
        "completed",
        "pending",
        "stopped/diverged",
        "failed",
        "best",
        "trial steps",
        "unique steps",
        "merge rate",
    ):
        table.add_column(column, justify="left" if column == "study" else "right")
    links = {name: snapshot["link"] for name, snapshot in snapshots.items()}
    if any(links.values()):  # surrogate studies: which study searched and which is the target
        table.add_column("surrogate study")
    for name, snapshot in snapshots.items():
        c, best = snapshot["counters"], snapshot["best"]
        link = links[name]
        table.add_row(
            name,
            str(c["trials"]),
            str(c["completed"]),
            str(c["pending"]),
            str(c["stopped"] + c["diverged"]),
            f"[red]{c['failed']}[/]" if c["failed"] else "0",
            "—" if best is None else f"{_escape(snapshot['metric'])} {best['value']:.4g}{_running(best)}",
            str(c["trial_steps"]),
            str(c["unique_steps"]),
            "–" if c["merge_rate_ended"] is None else f"{c['merge_rate_ended']:.2f}",
            *(["" if link is None else _escape(link)] if any(links.values()) else []),
        )
    console.print(table)
    if any(c["pending"] and c["ended"] for c in (snap["counters"] for snap in snapshots.values())):
        console.print(
            "[dim]merge rate: over the trials that have ended (a pending trial counts once it ends)[/]"
        )
    for name, snapshot in snapshots.items():
        _print_failures(console, name, snapshot["failures"], storage, limit=None if study else 1)
    if study and detail is not None:
        snapshot = snapshots[study]
        report = snapshot["report"]
        console.print(
            f"reuse: {report['trial_steps']} trial steps need {report['unique_steps']} unique steps "
            f"(merge rate {report['merge_rate']:.2f}); the search plan of {detail.identity} holds "
            f"{report['plan_steps']} trained steps and {report['checkpoints']} checkpoints "
            f"({report['checkpoint_bytes'] / 1e6:.1f} MB) shared by every study of this model"
        )
        if "executed_steps" in report:
            console.print(
                f"trained: {report['executed_steps']} steps executed by this study's sessions, "
                f"{report['gpu_seconds']:.1f} {seconds_label(detail.gpus)}"
            )
        else:
            console.print(f"[dim]{_escape(UNKNOWN_FROM_STORAGE)}[/]")
        _print_top(console, detail.top, snapshot)
        _print_writer(console, store, study)
        for incident in detail.incidents:
            console.print(f"[yellow]incident:[/] {_escape(incident)}")


def _check_reported(name: str, metric: str, trials: list) -> None:
    """Refuse `metric` if trials of study `name` reported metrics, but not it (a misspelled
    --metric would show an empty table without a word; a study with no result yet is shown)."""
    reported = sorted({m for t in trials for m in (t.metrics or {})})
    if reported and metric not in reported:
        raise UserError(
            f"no trial of study {name!r} reported {metric!r} (its metrics: {', '.join(reported)})",
            "give --metric one of them",
        )


def _print_writer(console: Any, store: CheckpointStore, name: str) -> None:
    """Which process has the study open, from its writer lease (`dagtune.study_lease`)."""
    try:
        status = writer_status(store, name)
    except OSError as error:
        status = f"unknown (its lease can't be read: {type(error).__name__}: {error})"
    if status is not None:
        console.print(f"writer: {_escape(status)}")


def _running(best: dict) -> str:
    """`` (at step 18, running)`` when the best value is a pending trial's (it may still change)."""
    return f" (at step {best['steps']}, running)" if best["status"] == "pending" else ""


def _print_failures(console: Any, name: str, failed: list, storage: str, limit: int | None) -> None:
    """The failed trials of study `name` (``[trial id, error line]``, in trial order), the
    first `limit` of them."""
    if not failed:
        return
    shown = failed if limit is None else failed[:limit]
    head = f"{name}: {len(failed)} failed trial{'s' if len(failed) > 1 else ''}"
    if limit is not None and len(failed) > limit:
        head += f" (the first below; `dagtune status {storage} --study {name}` lists them)"
    console.print(f"[red]{_escape(head)}[/]")
    for trial, line in shown:
        console.print(f"  trial {trial}: {_escape(line)}")


def _print_top(console: Any, rows: list[TrialRow], snapshot: dict) -> None:
    """The table of the best trials (`rows`, best first) by the snapshot's metric."""
    from rich.table import Table

    metric = snapshot["metric"]
    # the table is in trial id order: put it back in the order of `rows`, best first
    frame = trials_table(rows).loc[[row.id for row in rows]].reset_index()
    if metric is None or metric not in frame or frame.empty:
        return
    table = Table(title=f"best {len(frame)} trials by {_escape(metric)}")
    shown = (c for hp in snapshot["hp"] for c in (hp, f"{hp}/schedule") if c in frame)
    columns = ["trial_id", "status", "steps", metric, *shown]
    for column in columns:
        table.add_column(_escape(column))
    for _, row in frame.iterrows():
        table.add_row(*(f"{row[c]:.4g}" if c == metric else _escape(row[c]) for c in columns))
    console.print(table)


@main.command()
@click.argument("storage")
@click.option("--study", help="Only this study.")
@click.option(
    "--depth",
    default=3,
    show_default=True,
    help="Levels of branches shown (0: all); deeper ones are counted.",
)
@click.option(
    "--width",
    default=8,
    show_default=True,
    help="Branches shown under each node (0: all); the rest are counted.",
)
@_user_errors
def tree(storage: str, study: str | None, depth: int, width: int) -> None:
    """The stage tree of the studies in STORAGE: shared prefixes and where trials branch.

    A large tree is folded: `--depth` levels, `--width` branches under each node (those
    with the most trials first) and the first trials ending on each node; each fold says
    how many branches and trials it holds and how to see them."""
    from rich.tree import Tree

    from dagtune.dashboard.figures import COLORS  # the dashboard loads bokeh and distributed

    for name, value in (("--depth", depth), ("--width", width)):
        if value < 0:
            raise UserError(f"{name} must be 0 (all) or more, got {value}", f"e.g. {name} 3")
    console = _console()
    folded = False
    store, names = _names(storage, study)
    plans: dict = {}
    for name in names:
        view = study_view(store, name, plans)  # from the study's index when it is current
        snapshot = view.snapshot
        t = snapshot["tree"]
        pieces: dict[str, list[int]] = {}
        for i, node in enumerate(t["node"]):
            pieces.setdefault(node, []).append(i)
        ends = view.ends
        metric = snapshot["metric"]
        root = Tree(f"[bold]{_escape(name)}[/] ({view.trials} trials, {_escape(metric)})")
        children: dict[str | None, list[str]] = {}
        for node in sorted(snapshot["parents"], key=lambda n: t["row"][pieces[n][0]]):
            children.setdefault(snapshot["parents"][node], []).append(node)
        folds = _FoldedTree(t, pieces, children, ends, COLORS, depth, width)
        folded |= folds.add(root, None, 1)
        console.print(root)
    if folded:
        console.print(
            "[dim]folded: `--depth 0 --width 0` shows the whole tree; `dagtune dashboard` draws it[/]"
        )


class _FoldedTree:
    """`dagtune tree`'s branches of one study, added to a rich Tree `depth` levels deep and
    `width` branches wide (0: all), the branches with the most trials first."""

    def __init__(
        self,
        pieces_of_tree: dict,
        pieces: dict,
        children: dict,
        ends: dict,
        colors: dict,
        depth: int,
        width: int,
    ):
        self.t, self.pieces, self.children, self.ends = pieces_of_tree, pieces, children, ends
        self.colors, self.depth, self.width = colors, depth, width

    def trials_on(self, node: str) -> int:
        return max(self.t["trials"][i] for i in self.pieces[node])

    def line(self, node: str) -> tuple[str, bool]:
        """A node's line (its pieces, label and the first trials ending on it), and whether
        trials were left out of it."""
        t, width = self.t, self.width
        runs = " ".join(
            f"[{self.colors.get(t['state'][i], 'white')}]{t['start'][i]}–{t['end'][i]}[/]×{t['trials'][i]}"
            for i in self.pieces[node]
        )
        label = _escape(t["label"][self.pieces[node][0]])
        ending = self.ends.get(node, [])
        listed = ending if not width or len(ending) <= width else ending[:width]
        more = f", … {len(ending) - len(listed)} more" if len(listed) < len(ending) else ""
        trials = f"  → {', '.join(listed)}{more}" if ending else ""
        return f"{runs}  [dim]{label}[/]{trials}", bool(more)

    def add(self, branch: Any, parent: str | None, level: int) -> bool:
        """Add `parent`'s children under `branch`; True if anything was folded."""
        below = self.children.get(parent, [])
        if self.depth and level > self.depth:
            hidden = sum(self.trials_on(n) for n in below)
            branch.add(f"[dim]… {len(below)} branches below ({hidden} trial paths): --depth {level}[/]")
            return True
        kept = set(below)
        if self.width and len(below) > self.width:
            kept = set(sorted(below, key=lambda n: -self.trials_on(n))[: self.width])
        folded = False
        for node in below:
            if node not in kept:
                continue
            text, more = self.line(node)
            folded |= more
            child = branch.add(text)
            if self.children.get(node):
                folded |= self.add(child, node, level + 1)
        if len(kept) < len(below):
            rest = [n for n in below if n not in kept]
            paths = sum(self.trials_on(n) for n in rest)
            branch.add(f"[dim]… {len(rest)} more branches ({paths} trial paths): --width {len(below)}[/]")
            folded = True
        return folded


@main.command()
@click.argument("storage")
@click.option(
    "--keep-best", default=3, show_default=True, help="Keep the latest checkpoints of this many best trials."
)
@click.option(
    "--budget", "budget_bytes", type=int, help="Evict kept checkpoints until they fit in this many bytes."
)
@click.option("--dry-run", is_flag=True, help="Say what would be deleted; delete nothing.")
@_user_errors
def gc(storage: str, keep_best: int, budget_bytes: int | None, dry_run: bool) -> None:
    """Delete the checkpoints of STORAGE that no study keeps (what pending trials resume
    from is always kept)."""
    from rich.table import Table

    store = open_storage(storage)
    summaries = collect_garbage(
        store, GcPolicy(keep_best=keep_best, budget_bytes=budget_bytes), dry_run=dry_run
    )
    table = Table(title="checkpoints" + (" (dry run: nothing deleted)" if dry_run else ""))
    for column in ("model identity", "deleted", "kept", "protected", "MB before", "MB after"):
        table.add_column(column, justify="right")
    for s in summaries:
        table.add_row(
            s["identity"],
            str(s["deleted"]),
            str(s["kept"]),
            str(s["protected"]),
            f"{s['bytes_before'] / 1e6:.1f}",
            f"{s['bytes_after'] / 1e6:.1f}",
        )
    _console().print(table)


@main.command()
@click.argument("storage")
@click.option("--study", required=True, help="The study whose trial to export.")
@click.option("--trial", "trial_id", type=click.IntRange(min=0), help="Trial id (default: the best trial).")
@click.option("--metric", help="Metric that ranks the best trial (default: the first val_* metric).")
@click.option("--mode", type=click.Choice(["max", "min"]), help="Whether higher or lower is better.")
@click.option(
    "-o", "--output", required=True, type=click.Path(dir_okay=False), help="File to write (torch.save)."
)
@_user_errors
def export(
    storage: str, study: str, trial_id: int | None, metric: str | None, mode: str | None, output: str
) -> None:
    """Write a trial's trainer state_dict() at its last step to OUTPUT with torch.save (read it
    with torch.load(OUTPUT, weights_only=True)). It comes from the trial's checkpoint; if
    garbage collection removed it, it is rebuilt by training here from the nearest one."""
    import os

    import torch

    from dagtune.restore import stored_model  # loads torch and the worker's runner

    check_study_name(study)
    store = open_storage(storage)
    stored = load_study(store, study)
    if trial_id is None:
        if metric is None:
            metric, guessed = metric_of(stored.trials)
            mode = mode or guessed
        best = best_of(stored.trials, metric, mode or "max")
        if best is None:
            raise UserError(
                f"no trial of study {study!r} reported {metric!r}", "give --trial N, or --metric NAME"
            )
        trial_id = best.id
    with _mistake(KeyError, lambda e: e.args[0], "`dagtune status STORAGE --study NAME` lists its trials"):
        restorer, path, state = stored_model(store, study, trial_id)
    with _mistake(
        (ImportError, ValueError),
        str,
        "rebuilding the state needs the trainer: export from Python with "
        "dt.open_results(STORAGE, NAME).state_dict(TRIAL, trainer=..., trainer_kwargs=...)",
    ):
        trainer_state = restorer.state(path, what=f"trial {trial_id} of study {study!r}")["trainer"]
    partial = f"{output}.partial"
    torch.save(trainer_state, partial)
    os.replace(partial, output)
    shown = (
        "" if not state.metrics or metric not in state.metrics else f", {metric} {state.metrics[metric]:.4g}"
    )
    click.echo(
        f"trial {trial_id} of study {study!r} ({state.status}, after {path.step} steps{shown}) -> {output}"
    )


@main.command()
@click.argument("storage")
@click.option("--study", "studies", multiple=True, help="Only these studies (repeatable).")
@click.option(
    "--address",
    default="127.0.0.1",
    show_default=True,
    help="Where to listen; 0.0.0.0: every interface (anyone who reaches it may read the page).",
)
@click.option("--port", default=8790, show_default=True, help="0: any free port.")
@click.option("--refresh", default=5.0, show_default=True, help="Seconds between re-reading storage.")
@click.option(
    "--allow-origin",
    "origins",
    multiple=True,
    metavar="HOST:PORT",
    help="Also accept a browser at this address (a proxy or tunnel; repeatable).",
)
@_user_errors
def dashboard(
    storage: str, studies: tuple[str, ...], address: str, port: int, refresh: float, origins: tuple[str, ...]
) -> None:
    """Serve the dagtune page for the studies in STORAGE (no study needs to run)."""
    for name in studies:
        check_study_name(name)
    for origin in origins:
        host, _, number = origin.rpartition(":")
        if not host or ":" in host or not number.isdigit():
            raise UserError(f"--allow-origin {origin!r} is not HOST:PORT", "e.g. --allow-origin myhost:8790")
    try:
        server = serve(
            storage,
            names=list(studies) or None,
            address=address,
            port=port,
            refresh=refresh,
            allow_origins=origins,
            read=lambda store, name, plans: study_view(
                store, name, plans
            ).page_snapshot(),  # its index, if current
        )
    except OSError as error:
        raise UserError(
            f"cannot listen on {address}:{port}: {error}", "choose another --port (0: any free one)"
        ) from None
    click.echo(f"dagtune dashboard: http://{address}:{server.port}/dagtune (Ctrl-C stops it)")
    if address != "127.0.0.1" or origins:
        allowed = websocket_origins(address, server.port, origins)
        click.echo(f"browsers may open it as: {', '.join(f'http://{o}/dagtune' for o in allowed)}")
    sys.stdout.flush()
    try:
        server.io_loop.start()
    except KeyboardInterrupt:
        server.stop()


if __name__ == "__main__":  # python -m dagtune.cli
    main(prog_name="dagtune")
