"""A `Study` of one model (and `TrialHandle`, the handle on one of its trials).

A `Study` owns a coordinator for one model identity (trainer class, trainer arguments,
seed, version) and an executor: the embedded local Dask cluster by default, an existing
Dask `Client`, or a `SimulatedExecutor`. Its one event loop (`dagtune.study._loop`) turns
the coordinator: on Dask a driver thread, so trials progress while you do something else;
in simulation the waiting caller, which keeps runs deterministic.

A study whose checkpoints are durable (a `CheckpointStore`: the default, or an executor
given one) keeps its search plan, trial records and results under the storage URL
(`dagtune.durable`): every study of the same model identity reuses what the others trained,
and a study opened again with the same name and storage resumes. A simulated executor with
its in-memory store keeps nothing.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
import time
import uuid
import warnings
from collections.abc import Iterable, Mapping, Sequence
from contextlib import nullcontext
from typing import TYPE_CHECKING, Any

from dagtune.algos import Algorithm, Context
from dagtune.checkpoints import CheckpointStore, process_token
from dagtune.collector_pause import survivors_frozen
from dagtune.config import Config, normalize_config
from dagtune.coordinator import Coordinator, check_fuse
from dagtune.durable import Persistence
from dagtune.execution import Executor
from dagtune.gc import GcPolicy, collect
from dagtune.identity import model_names, stored_kwargs
from dagtune.loggers import Logger, Logging, check_loggers
from dagtune.mainguard import check_main_guard
from dagtune.notices import TrialsDivergedWarning, TrialsFailedWarning
from dagtune.plan import SearchPlan
from dagtune.planner import live_schedule_view
from dagtune.progress import watch
from dagtune.records import FAILED, PENDING, Activity, StudyLink, StudyView, Trial, check_steps, is_study_name
from dagtune.restore import Restorer, TrialPath, trial_path
from dagtune.scheduling import policy_named
from dagtune.storage_retry import DEFAULT_RETRY_SECONDS, check_retry_seconds
from dagtune.study._alone import check_evaluate_count
from dagtune.study._kept_view import KeptView
from dagtune.study._loop import StudyLoop
from dagtune.study._restored import RestoredTrials
from dagtune.study._results import Result, TrialError, TrialResult
from dagtune.study._session import Session
from dagtune.study._workers import WorkerWatch
from dagtune.study_index import write_study_index
from dagtune.study_lease import DEFAULT_LEASE_TTL, StudyLease, check_lease_ttl
from dagtune.summary import divergence_line, error_line
from dagtune.tasks import TrainerSpec
from dagtune.trainer import Trainer, check_torch_threads
from dagtune.validation import check_int, check_number

if TYPE_CHECKING:
    from distributed.security import Security

log = logging.getLogger("dagtune")

__all__ = ["DEFAULT_CHECKPOINT_INTERVAL", "Study", "TrialHandle"]

#: seconds of a task's training after which it saves a checkpoint of its own accord (`Study`)
DEFAULT_CHECKPOINT_INTERVAL = 600.0


class Study:
    """A hyper-parameter study of one trainer (see docs/DESIGN.md for the whole API).

    `client=None` starts an embedded local Dask cluster (one single-threaded worker process
    per core, or `workers`) and stops it on `close`; an existing `distributed.Client` is used
    as it is. The embedded cluster admits only the study's own client: `security=None`
    (or True) gives it TLS credentials made for it alone, a `distributed.security.Security`
    gives it yours (so that other processes holding them can connect), and `security=False`
    runs it on plain TCP, where any process of this machine can connect to it and run code
    on its workers (use it only where that is fine, e.g. to attach Dask tools that can't
    hold the credentials, or without the `cryptography` package); see `dagtune.security`.
    `security` is for the embedded cluster only: a given client brings its own.
    `resources` (e.g. ``{"GPU": 1}``) is asked of the Dask worker by every stage.
    `reuse=False` trains every trial on its own (the trial-based baseline). `executor`
    replaces Dask altogether (e.g. `dagtune.sim.SimulatedExecutor`; its store decides
    where things are kept).

    Durability (see the module docstring): opening a study whose name already exists in
    `storage` resumes it: its finished trials come back (`trials`), its pending ones train
    on from their latest committed checkpoint, and `run` hands an algorithm that submits a
    config and steps a restored trial has that trial (results known at once, pending ones
    continue) instead of a new one. The same name with another model identity is refused.
    `gc` (a `GcPolicy`) collects checkpoints automatically; `Study.gc` does it on demand.
    `refresh_seconds` is how often a running study picks up what concurrent studies of the
    same model wrote to the shared search plan.

    One process at a time writes a study (`dagtune.study_lease`): opening a study that another
    live process holds raises `StudyInUseError` naming it (host, pid, session) and when its
    lease lapses, or with `wait_for_lease` waits up to that many seconds for it. A holder
    renews its lease every `lease_ttl` / 3 seconds; a killed one's lease lapses `lease_ttl`
    seconds after its last renewal (at once for a process of this machine that is gone).

    `storage_retry_seconds`: storage that can't be reached (connection refused or reset,
    timeouts, throttling, server errors) is retried with backoff for up to this long, by the
    study and its workers, before the study fails (`dagtune.storage_retry`); other storage
    errors fail at once.

    A trial of an earlier session that failed outside its trainer (reading or writing a
    checkpoint, its workers dying: `dagtune.records.OUTSIDE_THE_TRAINER`) is pending again
    when the study is opened again, and trains on from its latest checkpoint;
    `retry_failed=True` does that for every failed trial (a trainer fixed since).

    `step_timeout` (seconds; None: no limit) bounds each step on Dask: a step (``train()``
    and the evaluation and checkpoint after it; a task's first step also builds or loads the
    trainer) still running that long after it began fails with ``StepTimeoutError: step N
    did not finish within step_timeout=S s``, its worker is restarted (a running task can't
    be cancelled otherwise), and the failure counts as the trainer's: retried `max_retries`
    times, then the trials that need that step fail.

    `link` records that the study is half of a surrogate study (`SurrogateStudy` sets it;
    ``dagtune status`` and the page show it).

    `check_evaluate`: each worker compares every ``state_dict()`` leaf before and after its
    first `check_evaluate` evaluations of the model, and fails the trial with ``evaluate()
    changed the training state: <keys>`` if they differ (results would depend on where
    dagtune evaluates); 0 turns it off. The global random generators and every module's
    training mode need no check: dagtune puts them back after every evaluation. A failed
    check (this one or `check_resume`'s) is not retried: training again fails it again.

    `checkpoint_every` (steps; None: no more than that) makes every stage also save a
    checkpoint every that many steps, besides where it ends and where trials branch: what an
    interrupt, a lost worker or a killed coordinator trains again is then at most that many
    steps per stage (without it, a whole stage without branches).

    `checkpoint_interval` (seconds, default 600; None or 0 turns it off) bounds the same
    loss in time, by default: a task also saves a checkpoint at the end of the first step
    that ends at least that long after its last save (or after it began training), so an
    interrupt, a lost worker or a killed coordinator trains again at most that long per
    stage, plus one step. Which steps get such a checkpoint depends on the clock; nothing
    else does: they add no evaluation and training never reads them, so every trial's
    metrics and curve are bit for bit `run_alone`'s with or without them. Once saved, each
    is an ordinary checkpoint of the search plan (resumed from, kept or collected like a
    `checkpoint_every` one).

    `check_resume`: at each worker's first `check_resume` checkpoints of the model, a fresh
    trainer loaded from the checkpoint trains the next step beside the trainer that saved
    it, and a difference fails the trial with ``resuming from a checkpoint changes
    training: <entries>``, naming the likely cause (`dagtune.resumecheck`); 0 turns it off.

    `torch_threads`: every worker builds and trains the trainer with torch's thread count
    set to this (default 1: CPU kernels round differently with other counts, so results are
    bit for bit `run_alone`'s only with one count everywhere); None leaves each worker's.
    A count other than 1 is part of the model identity.

    `loggers` (`dt.loggers.TensorBoard`, `CSV`, `MLflow`, or your own `dt.loggers.Logger`)
    get every trial's hyper-parameters and every step's metrics as they are delivered to it,
    in this process (`dagtune.loggers`); a run returns once they have its results, and a
    resumed study sends them only the steps they lack.

    `fuse` (a `dagtune.FusibleTrainer` only; docs/fusion.md): True or an int trains the
    ready stages that may share a model (same start, differing only in fusible
    hyper-parameters) as fused tasks of up to F trials each, one worker slot per task; F is
    the int, or with True measured from memory (`dagtune.fusion.fusion_count`). Every stage
    then trains through the fused code path, so each trial's metrics are exactly
    ``run_alone(..., fused=True)``'s. The first fused tasks check the trainer on their
    worker before training (`dagtune.fusion.check_fusion`): an operation fusion cannot
    batch, or with `fusion_check` (on by default) a first batch whose fused result depends on
    the group or disagrees with unfused training, turns fusion off for the study with a
    `dagtune.FusionWarning` naming the layer, and its trials train unfused.
    """

    def __init__(
        self,
        trainer: type[Trainer],
        trainer_kwargs: Mapping[str, Any] | None = None,
        name: str = "study",
        storage: str | os.PathLike = "./dagtune-runs",
        client: Any = None,
        resources: Mapping[str, float] | None = None,
        seed: int = 0,
        reuse: bool = True,
        *,
        version: str = "",
        storage_options: Mapping[str, Any] | None = None,
        scheduler: str = "critical_path",
        eval_every: int = 1,
        check_evaluate: int = 3,
        check_resume: int = 1,
        torch_threads: int | None = 1,
        checkpoint_every: int | None = None,
        checkpoint_interval: float | None = DEFAULT_CHECKPOINT_INTERVAL,
        max_retries: int = 1,
        step_timeout: float | None = None,
        workers: int | None = None,
        executor: Executor | None = None,
        gc: GcPolicy | None = None,
        refresh_seconds: float = 2.0,
        security: bool | Security | None = None,
        fuse: bool | int = False,
        fusion_check: bool = True,
        link: StudyLink | None = None,
        lease_ttl: float = DEFAULT_LEASE_TTL,
        wait_for_lease: float = 0.0,
        storage_retry_seconds: float = DEFAULT_RETRY_SECONDS,
        loggers: Sequence[Logger] | None = None,
        retry_failed: bool = False,
    ):
        if not isinstance(trainer, type) or not issubclass(trainer, Trainer):
            raise TypeError(f"trainer must be a dagtune.Trainer subclass, got {trainer!r}")
        if not is_study_name(name):
            raise ValueError(f"name must be 1-128 letters, digits, '.', '_' or '-', got {name!r}")
        check_int("seed", seed)
        check_int("eval_every", eval_every, minimum=1, optional=True)
        check_int("checkpoint_every", checkpoint_every, minimum=1, optional=True)
        check_number(
            "checkpoint_interval",
            checkpoint_interval,
            minimum=0,
            optional=True,
            expected="a number of seconds >= 0 (0 turns it off)",
        )
        check_evaluate_count(check_evaluate)
        check_evaluate_count(check_resume, "check_resume")
        check_torch_threads(torch_threads)
        check_fuse(fuse, trainer)
        lease_ttl = check_lease_ttl(lease_ttl)
        wait_for_lease = check_retry_seconds(wait_for_lease, "wait_for_lease")
        storage_retry_seconds = check_retry_seconds(storage_retry_seconds)
        loggers = check_loggers(loggers)
        check_number(
            "step_timeout", step_timeout, above=0, optional=True, expected="a positive number of seconds"
        )
        if not isinstance(retry_failed, bool):
            raise ValueError(f"retry_failed must be True or False, got {retry_failed!r}")
        if security is not None and (client is not None or executor is not None):
            why = (
                "a given client brings its own (Client(address, security=...))"
                if client is not None
                else "a given executor starts no cluster"
            )
            raise ValueError(f"security={security!r} secures the embedded cluster; {why}")
        if link is not None and not isinstance(link, StudyLink):
            raise TypeError(f"link must be a dagtune.records.StudyLink or None, got {link!r}")
        if resources is not None:
            for key, amount in dict(resources).items():
                if not isinstance(amount, (int, float)) or amount <= 0:
                    raise ValueError(f"resources[{key!r}] must be a positive number, got {amount!r}")
        self.name = name
        self.trainer = trainer
        self.trainer_kwargs = dict(trainer_kwargs or {})
        self.seed = seed
        self.reuse = reuse
        self.resources = dict(resources) if resources else None
        self.link = link
        self.torch_threads = torch_threads
        names = model_names(trainer, self.trainer_kwargs, seed, version, torch_threads=torch_threads)
        self.identity = names.identity  # or its legacy name's, where storage recorded that (below)
        self.storage = os.fspath(storage)
        self.gc_policy = gc
        self._token = uuid.uuid4().hex[:8]
        self._owned_cluster = None
        self._names: tuple[str, ...] | None = None
        self._lock = threading.RLock()
        self._kept_view: KeptView | None = None  # what `view` keeps between views
        self._workers: WorkerWatch | None = None
        self._closed = False
        self._gc_at = time.monotonic()
        self._lease: StudyLease | None = None
        self._persistence: Persistence | None = None
        if executor is None:
            if client is None:  # refused before anything is written (the lease) or started
                import dask  # heavy optional library: loaded where a cluster is started

                check_main_guard(dask.config.get("distributed.worker.multiprocessing-method", "spawn"))
            self.store = _open_storage(self.storage, storage_options, storage_retry_seconds)
            if client is None:  # the embedded cluster's workers are processes of their own
                _check_shared_storage(self.storage, self.store, None)
            # the lease first: a study another process has open is refused before a cluster starts
            self._lease = StudyLease(self.store, name, ttl=lease_ttl).acquire(wait_for_lease)
            try:
                executor = self._dask_executor(client, workers, security)
            except BaseException:
                self._lease.release()
                raise
        else:
            self.store = executor.store
            if isinstance(self.store, CheckpointStore):
                self._lease = StudyLease(self.store, name, ttl=lease_ttl).acquire(wait_for_lease)
        self.executor = executor
        gpus = float((self.resources or {}).get("GPU", 1.0))
        if self._lease is not None:
            self.storage = self.store.url
            describe = {  # what rebuilding a trial's model needs (`dagtune.restore`); no credential
                "trainer": names.name,
                "seed": seed,
                "version": version,
                "trainer_kwargs": stored_kwargs(self.trainer_kwargs),
                "fused": bool(fuse),
                "gpus": float((self.resources or {}).get("GPU", 0)),
                "torch_threads": torch_threads,
                **(link.fields() if link is not None else {}),
            }
            try:
                self._persistence = Persistence(
                    self.store,
                    name,
                    self.identity,
                    describe,
                    lease=self._lease,
                    names=names,
                    refresh_seconds=refresh_seconds,
                )
            except BaseException:
                self.close()
                raise
            self.identity = self._persistence.identity
            self.plan = self._persistence.plan
        else:
            self.plan = SearchPlan()
        spec = TrainerSpec(trainer, self.trainer_kwargs, seed, self.identity)
        self.coordinator = Coordinator(
            self.plan,
            executor,
            spec,
            policy_named(scheduler),
            share=reuse,
            eval_every=eval_every,
            check_evaluate=check_evaluate,
            check_resume=check_resume,
            torch_threads=torch_threads,
            checkpoint_every=checkpoint_every,
            checkpoint_interval=float(checkpoint_interval) if checkpoint_interval else None,
            max_retries=max_retries,
            step_timeout=None if step_timeout is None else float(step_timeout),
            gpus_per_task=gpus,
            topic=f"dagtune-{name}-{self._token}",
            name=f"{name}-{self._token}",
            fuse=fuse,
            fusion_check=fusion_check,
        )
        self._loop = StudyLoop(executor, self.coordinator, self._lock, self._tick, self._workers)
        # trial models after a run (`TrialResult.load_trainer`): from the study's checkpoints
        self._restorer = Restorer(
            self.store, self.identity, lambda: spec, fused=bool(fuse), torch_threads=torch_threads
        )
        self._restored = RestoredTrials()
        if self._persistence is not None:
            restored = self._persistence.attach(self.coordinator, retry_failed=retry_failed)
            self._restored = RestoredTrials(restored, self._persistence.restored.texts)
            if restored:
                self._names = tuple(restored[0].config)
        self._logging: Logging | None = None
        if loggers:  # fed from here on; the restored trials' known results first
            self._logging = Logging(loggers, name, self.identity)
            self.coordinator.listeners.append(self._logging)
            self._logging.replay(self.coordinator.trials.values())
        self._metric: tuple[str | None, str] = (None, "max")
        self._loop.start(name)
        self._dashboard: Any = None  # the dagtune page's feed, where the scheduler serves the page
        self._demand: Any = None  # the feed of the demand an adaptive cluster reads
        self._publisher = self._publish() if getattr(self, "client", None) is not None else None

    def _publish(self) -> Any:
        """On Dask, keep what the study shows on its scheduler up to date from one thread:
        its demand (stages ready without a worker, for an adaptive cluster's
        `DemandAdaptive`) and, where the dagtune page is served, its dashboard snapshot."""
        from dagtune.dashboard.plugin import attach  # loads distributed and bokeh: on Dask only
        from dagtune.execution.dask import DemandFeed, Publisher  # loads distributed: on Dask only

        self._dashboard = attach(self)
        self._demand = DemandFeed(self)
        return Publisher(self, [feed for feed in (self._dashboard, self._demand) if feed is not None]).start()

    def _dask_executor(self, client: Any, workers: int | None, security: bool | Security | None) -> Executor:
        # Dask is loaded only by a study that runs on it
        from distributed import Client

        from dagtune.execution.dask import (  # loads distributed
            DaskExecutor,
            adapts,
            check_resources,
            embedded_cluster,
            slow_allocator_workers,
        )

        if client is None:
            cluster = embedded_cluster(workers, self.resources, security)
            client = Client(cluster)  # with the cluster's security
            self._owned_cluster = (client, cluster)
        self.client = client
        self._workers = WorkerWatch(self.name, functools.partial(adapts, client))
        check_resources(client, self.resources)
        _check_shared_storage(self.storage, self.store, client)
        slow = slow_allocator_workers(client)
        if slow:
            log.warning(
                "dagtune: %d worker(s) run with MALLOC_TRIM_THRESHOLD_=%s (Dask's nanny default), which "
                "slows training on CPU by up to 1.6x; start them with --preload-nanny dagtune.cluster, "
                "or set distributed.nanny.pre-spawn-environ.MALLOC_TRIM_THRESHOLD_ to null in their Dask config",
                len(slow),
                ", ".join(sorted({str(v) for v in slow.values()})),
            )
        topic = f"dagtune-{self.name}-{self._token}"
        return DaskExecutor(client, self.store, topic, self.resources, withdraw=self._owned_cluster is None)

    # ------------------------------------------------------------------ driving

    def _tick(self, force: bool = False) -> None:
        """The periodic work of the study's loop: durable work (journals, results; `force`:
        whatever is due) and automatic checkpoint collection when the study's policy
        collects every so often and it is time."""
        if self._persistence is not None:
            self._persistence.tick(self.coordinator, force=force)
        policy = self.gc_policy
        interval = None if policy is None else policy.interval_seconds
        if interval is not None and time.monotonic() - self._gc_at >= interval:
            self._collect(policy)

    # ------------------------------------------------------------------ trials

    def _check_config(self, config: Mapping[str, Any]) -> Config:
        config = normalize_config(config, owner="config")
        names = tuple(config)
        if self._names is None:
            self._names = names
        elif names != self._names:
            raise ValueError(
                f"configs of study {self.name!r} must name the same hyper-parameters: "
                f"expected {list(self._names)}, got {list(names)}"
            )
        return config

    def _take_restored(self, config: Config, steps: int) -> Trial | None:
        """A trial restored from an earlier session, or left pending by an interrupted run,
        with this config and steps, not handed to an algorithm since (it is removed from the
        restored ones); an interrupted one is requested again."""
        with self._lock:
            trial = self._restored.take(config, steps)
            if trial is not None:
                self.coordinator.resume(trial.id)
        return trial

    @property
    def trials(self) -> list[TrialHandle]:
        """Every trial of the study, those restored from earlier sessions included."""
        with self._lock:
            return [TrialHandle(self, t) for t in self.coordinator.trials.values()]

    @property
    def incidents(self) -> list[str]:
        """Problems found and worked around: corrupt checkpoints (dropped and recomputed),
        corrupt or foreign journal lines and lines whose values dagtune never writes
        (skipped; `dagtune.records`), each with where it was (``file:line`` for a line)."""
        with self._lock:
            found = list(self._persistence.incidents) if self._persistence else []
            return found + list(self.coordinator.incidents)

    def gc(self, policy: GcPolicy | None = None) -> dict:
        """Delete the checkpoints `policy` (default: the study's, else `GcPolicy()`) does not
        keep; never one a running or queued stage needs. Returns counts and bytes."""
        with self._lock:
            return self._collect(policy or self.gc_policy or GcPolicy())

    def _collect(self, policy: GcPolicy) -> dict:
        self._gc_at = time.monotonic()
        protected = self.coordinator.protected_points()
        if self._persistence is not None:
            self.coordinator.absorb(self._persistence.plan_journal.refresh())
            protected |= self._persistence.needed_elsewhere()
        metric, mode = self._metric
        decision = collect(
            self.plan,
            self.coordinator.trials.values(),
            protected,
            policy,
            self.coordinator.cost,
            metric=metric,
            mode=mode,
        )
        for node, step in sorted(decision.delete):
            self.plan.drop_checkpoint(node, step)
            if self.store is not None:
                self.store.delete(self.identity, node, step)
        if decision.delete:
            self.coordinator.replan()
        swept: list[tuple[str, int]] = []
        if isinstance(self.store, CheckpointStore) and policy.orphan_seconds is not None:
            known = {(n.id, s) for n in self.plan.nodes.values() for s in n.checkpoints}
            swept = self.store.sweep(self.identity, known | protected, policy.orphan_seconds)
        return {
            "deleted": len(decision.delete),
            "swept": len(swept),
            "kept": len(decision.keep),
            "bytes_before": decision.bytes_before,
            "bytes_after": decision.bytes_after,
        }

    def submit(self, config: Mapping[str, Any], steps: int) -> TrialHandle:
        """Train `config` for `steps` steps (what is already known is not trained again).

        In a resumed study, the first submission of a restored trial's config and steps is
        that trial (finished: its results at once; pending: it trains on), so running the
        same script again continues it instead of adding trials."""
        check_steps(steps)
        config = self._check_config(config)
        trial = self._take_restored(config, steps)
        with self._lock:  # planned with the rest of a burst (`SUBMIT_QUIET_SECONDS`)
            restored = trial is not None
            if not restored:
                trial = self.coordinator.submit(config, steps)
            self.coordinator.settle()  # its known results, at once
            if not restored:
                self._loop.submitted()
        return TrialHandle(self, trial)

    def evaluate(
        self, config: Mapping[str, Any], step: int, timeout: float | None = None
    ) -> dict[str, float]:
        """The metrics of `config` after `step` steps, trained only if not known yet."""
        return self.submit(config, step).result(timeout)

    def run(self, algorithm: Algorithm, timeout: float | None = None, *, progress: bool = True) -> Result:
        """Run a tuning algorithm to its end and return its `Result`.

        If the algorithm raises, `timeout` seconds pass or the run is interrupted (Ctrl-C),
        the error is raised and the run's pending trials stop training but stay pending, in
        storage too: they are not the algorithm's `Stop`. Running the same algorithm again,
        in this process or after opening the study again, continues each from its latest
        committed checkpoint.

        With `progress`, the run shows itself while it waits: a live view in Jupyter, a
        progress line on stderr when it is a terminal (trials finished, steps trained and
        saved by reuse, best metric), nothing when stderr goes to a file or a pipe."""
        if not isinstance(algorithm, Algorithm):
            raise TypeError(f"run needs a dagtune.algos.Algorithm, got {algorithm!r}")
        session = Session(self.coordinator, algorithm, self._check_config, self._take_restored)
        shown = (
            watch(self, algorithm.metric, algorithm.mode, show="interactive") if progress else nullcontext()
        )
        with shown, self._lock, survivors_frozen():
            self._metric = (algorithm.metric, algorithm.mode)
            since = self.coordinator.report([])
            self.coordinator.listeners.append(session)
            try:
                session.apply(algorithm.start(Context(slots=self.executor.slots(), seed=self.seed)))
                self.coordinator.expect(normalize_config(c, owner="prospect") for c in algorithm.prospects())
                self.coordinator.settle()  # the known results of its first trials
                session.check_end()
                self.coordinator.schedule()
                # the run ends when its trials have ended and so has every stage no trial needs
                # any more: the report then counts every step trained for the run (see
                # `dagtune.coordinator.report_figures`), those a stop reached late included
                self._loop.wait(
                    lambda: (
                        session.error is not None or (session.finished and not self.coordinator.unneeded())
                    ),
                    timeout,
                )
            finally:
                self.coordinator.listeners.remove(session)
                self.coordinator.expect(())
                if not session.finished:  # an error, a timeout or an interrupt: not a stop
                    self._interrupt(session.trials.values())
            if self.gc_policy is not None:
                self._collect(self.gc_policy)
            self._tick(force=True)
            trials = list(session.trials.values())
            report = self.coordinator.report(trials, since)
        if self._logging is not None:
            self._logging.flush()  # the run's results are in the loggers' output when it returns
        if session.error is not None:
            raise session.error
        result = Result(
            trials,
            report,
            algorithm.metric,
            algorithm.mode,
            algorithm.best_trial(),
            models=self._model_of,
            gpus=float((self.resources or {}).get("GPU", 0)),
        )
        _warn_failures(result, len(trials))
        _warn_divergence(result, len(trials))
        return result

    def _model_of(self, trial_id: int) -> tuple[Restorer, TrialPath]:
        """Where trial `trial_id`'s model comes from: the study's checkpoints along its path
        to its last step (`TrialResult.load_trainer`; works after `close` too)."""
        with self._lock:
            trial = self.coordinator.trials.get(trial_id)
            if trial is None:
                raise KeyError(f"study {self.name!r} has no trial {trial_id!r}")
            path = trial_path(self.plan, trial.node, trial.reached) if trial.node else TrialPath(0, (), ())
        return self._restorer, path

    def trial_result(self, trial_id: int) -> TrialResult:
        """Trial `trial_id` as a `TrialResult` (its config, steps reached, latest metrics and
        its model: `TrialResult.load_trainer`)."""
        with self._lock:
            trial = self.coordinator.trials.get(trial_id)
            if trial is None:
                raise KeyError(f"study {self.name!r} has no trial {trial_id!r}")
            return TrialResult(
                trial.config,
                trial.reached,
                dict(trial.metrics or {}),
                trial.id,
                trial.status,
                trial.error,
                self._model_of,
            )

    def _interrupt(self, trials: Iterable[Trial]) -> None:
        """A run ended before its algorithm did: its pending trials stop training but stay
        pending (in storage too, written at once), so the same run again continues each from
        its latest checkpoint, in this process or the next one (`_take_restored`)."""
        for trial in trials:
            if trial.status == PENDING:
                self.coordinator.interrupt(trial.id)
                self._restored.add(trial)
        self.coordinator.schedule()
        try:  # storage says now what the run left (the error on its way is the one to raise)
            self._tick(force=True)
        except Exception as error:
            log.warning("dagtune: writing study %r after its run ended early failed: %r", self.name, error)

    @property
    def report(self) -> dict:
        """Trial/unique/executed steps, merge rate, reuse, GPU-seconds and makespan so far:
        every trial of the study (restored ones too) and the work of this session, with the
        figures defined in `dagtune.coordinator.report_figures`."""
        with self._lock:
            return self.coordinator.report()

    # ------------------------------------------------------------------ the read model

    def view(self, *, schedule: bool = False) -> StudyView:
        """The study as it is now, frozen (`dagtune.records.StudyView`): its trials, report,
        the metric and mode of the algorithm it runs, whether it is closed; with `schedule`,
        also what runs and waits and the critical path (`dagtune.records.ScheduleView`,
        from the scheduler), the configs and steps trained of the nodes its trials pass and the
        page's figures of its trials (`dagtune.records.ViewFigures`: the best, the live merge
        rate).
        Taken under the study's lock; every view reads a study through it. What it copies is
        kept until it changes (`KeptView`): a view taken again snapshots only the trials that
        changed since the previous one, and reports them from figures kept as they change."""
        with self._lock:
            coordinator = self.coordinator
            kept = self._kept_view
            if kept is None or kept.coordinator is not coordinator or kept.plan is not coordinator.plan:
                if kept is not None:
                    kept.close()
                kept = self._kept_view = KeptView(coordinator)
            trials = kept.trials()
            configs, trained = kept.nodes() if schedule else (None, None)
            metric, mode = self._metric
            return StudyView(
                name=self.name,
                identity=self.identity,
                token=self._token,
                trials=trials,
                report=kept.report(),
                metric=metric,
                mode=mode,
                closed=self._closed,
                link=self.link,
                gpus=(self.resources or {}).get("GPU"),
                demand=coordinator.demand,
                schedule=live_schedule_view(
                    coordinator.planner, coordinator.plan, coordinator.running, coordinator.cost
                )
                if schedule
                else None,
                configs=configs,
                trained=trained,
                figures=kept.figures(metric, mode) if schedule else None,
                changes=kept.changes(),
            )

    def activity(self) -> Activity:
        """What a thread feeding a view asks every second (`dagtune.records.Activity`): a
        value that changes with the study, its demand for workers, its token, whether it
        is closed; no trial is copied."""
        with self._lock:
            coordinator = self.coordinator
            return Activity(
                changes=(
                    coordinator.events_seen,
                    len(coordinator.trials),
                    len(coordinator.running),
                    self._metric,
                ),
                demand=coordinator.demand,
                token=self._token,
                closed=self._closed,
            )

    # ------------------------------------------------------------------ lifetime

    def close(self) -> None:
        """Stop the driver and the embedded cluster (an external client is left open)."""
        if self._closed:
            return
        self._closed = True
        try:
            if getattr(self, "_loop", None) is not None:
                try:
                    self._loop.stop()  # the driver's last turn, and the events that came after it
                    with self._lock:
                        self._tick()
                finally:  # the last work, journal lines and results; the lease goes
                    if self._persistence is not None:
                        with self._lock:
                            self._persistence.close(self.coordinator, write_study_index)
        finally:
            try:
                self._stop_execution()
            finally:
                if self._lease is not None and (self._persistence is None or not hasattr(self, "_loop")):
                    self._lease.release()  # opening failed before the study could run

    def _stop_execution(self) -> None:
        """Stop the loggers (writing what is left), the publisher (the dashboard feed, the
        demand), the executor and the embedded cluster. The study's work is saved by now, so
        nothing here raises: each part that fails is logged, and the cluster is killed if it
        does not close in time (`close_embedded`)."""
        parts = [
            ("the loggers", getattr(self, "_logging", None)),  # writes what is left
            # sends the final snapshot, withdraws the demand
            ("the publisher", getattr(self, "_publisher", None)),
            ("the executor", getattr(self, "executor", None)),
        ]
        for what, part in parts:
            if part is None:
                continue
            try:
                part.close()
            except Exception as error:
                log.warning(
                    "dagtune: closing %s of study %r failed: %s: %s",
                    what,
                    self.name,
                    type(error).__name__,
                    error,
                )
        if self._owned_cluster is not None:
            from dagtune.execution.dask import close_embedded  # loads distributed: a study on Dask only

            client, cluster = self._owned_cluster
            self._owned_cluster = None
            close_embedded(client, cluster)

    def __enter__(self) -> Study:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def _repr_html_(self) -> str:
        from dagtune.notebook import study_html  # the views load bokeh and distributed

        return study_html(self)

    def __repr__(self) -> str:
        return f"<Study {self.name!r} trainer={self.trainer.__name__} trials={len(self.coordinator.trials)}>"


def _warn_failures(result: Result, trials: int) -> None:
    """End a run whose trials failed with a warning saying how many and the first error
    (`Result.failed` has them all, with their tracebacks)."""
    failed = result.failed
    if failed:
        first = failed[0]
        warnings.warn(
            f"{len(failed)} of {trials} trials failed; the first, trial {first.id}: "
            f"{error_line(first.error)} (Result.failed has them, with their tracebacks)",
            TrialsFailedWarning,
            stacklevel=3,
        )


def _warn_divergence(result: Result, trials: int) -> None:
    """End a run whose trials diverged with a warning saying how many and where the first
    did: a NaN or infinite metric ends a trial early, whichever metric it is, so a trial cut
    short by a metric nobody looks at is not passed over in silence."""
    diverged = result.diverged
    if diverged:
        first = diverged[0]
        warnings.warn(
            f"{len(diverged)} of {trials} trials diverged (a NaN or infinite metric ends its trial): the "
            f"first, trial {first.id}, {divergence_line(first.steps, first.metrics)} (Result.diverged has them)",
            TrialsDivergedWarning,
            stacklevel=3,
        )


def _open_storage(
    storage: str, storage_options: Mapping[str, Any] | None, retry_seconds: float
) -> CheckpointStore:
    """The checkpoint store, its filesystem opened and its root made: a storage URL that
    can't be used fails here, naming it, before any cluster starts (storage that can't be
    reached is waited for up to 30 s: more often a wrong endpoint than an outage)."""
    try:
        store = CheckpointStore(storage, storage_options, retry_seconds=retry_seconds)
        store.make_root(wait=30.0)
    except (ValueError, ImportError, OSError) as error:
        raise ValueError(f"storage={storage!r} cannot be used: {type(error).__name__}: {error}") from None
    return store


def _check_shared_storage(storage: str, store: CheckpointStore, client: Any) -> None:
    """Refuse storage only this process sees (``memory://``) when Dask workers run in
    other processes (the embedded cluster's always do, with `client` None): each would
    keep its checkpoints to itself and the others would find them missing."""
    if not store.process_local:
        return
    if client is None:
        elsewhere = "the embedded cluster's workers are processes of their own"
    else:
        here = process_token()
        others = sorted(a for a, token in client.run(process_token).items() if token != here)
        if not others:
            return
        elsewhere = f"{len(others)} Dask worker(s) run in other processes ({', '.join(others[:3])})"
    raise ValueError(
        f"storage={storage!r} is the memory of this process, but {elsewhere}: checkpoints "
        "could not be shared between them. Give a directory or an object store URL (s3://...), "
        "or run the workers in this process (LocalCluster(processes=False))."
    )


class TrialHandle:
    """A submitted trial: wait for it with `result`, or `stop` it."""

    def __init__(self, study: Study, trial: Trial):
        self._study = study
        self.trial = trial

    @property
    def id(self) -> int:
        return self.trial.id

    @property
    def status(self) -> str:
        return self.trial.status

    def done(self) -> bool:
        return self.trial.done

    def result(self, timeout: float | None = None) -> dict[str, float]:
        """The final metrics (waits for them). A stopped or diverged trial returns its last
        metrics; a failed one raises `TrialError`, one whose run was interrupted (pending, no
        longer training) a RuntimeError."""
        interrupted = self._study.coordinator.interrupted
        self._study._loop.wait(lambda: self.trial.done or self.trial.id in interrupted, timeout)
        if self.trial.id in interrupted:
            raise RuntimeError(
                f"trial {self.trial.id} is pending but its run was interrupted: run the algorithm again, "
                "or submit its config and steps, to continue it"
            )
        if self.trial.status == FAILED:
            raise TrialError(f"trial {self.trial.id} failed:\n{self.trial.error}")
        return dict(self.trial.metrics or {})

    def curve(self) -> list[tuple[int, dict[str, float]]]:
        """The ``(step, metrics)`` pairs reported so far, ``step`` counting from 0: the
        metrics evaluated right after that step (the last pair of a trial of ``n`` steps
        has step ``n - 1``)."""
        return [(k - 1, dict(m)) for k, m in self.trial.curve]

    def stop(self) -> None:
        self._study._loop.call(self._study.coordinator.stop, self.trial.id)

    def __repr__(self) -> str:
        return f"<TrialHandle {self.trial.id} {self.trial.status} steps={self.trial.steps}>"
