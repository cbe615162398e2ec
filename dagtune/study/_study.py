"""A `Study` of one model (and `TrialHandle`, the handle on one of its trials).

A `Study` owns a coordinator for one model identity (trainer class, trainer arguments,
seed, version) and an executor: the embedded local Dask cluster by default, an existing
Dask `Client`, or a `SimulatedExecutor`. On Dask a driver thread pumps the coordinator so
trials progress while you do something else; in simulation the waiting caller pumps
virtual time, which keeps runs deterministic.

A study whose checkpoints are durable (a `CheckpointStore`: the default, or an executor
given one) keeps its search plan, trial records and results under the storage URL
(`dagtune.durable`): every study of the same model identity reuses what the others trained,
and a study opened again with the same name and storage resumes. A simulated executor with
its in-memory store keeps nothing.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from dagtune.algos import Algorithm, Context
from dagtune.checkpoints import CheckpointStore, process_token
from dagtune.config import Config, config_dumps, normalize_config
from dagtune.coordinator import Coordinator, check_fuse
from dagtune.durable import Persistence
from dagtune.executor import Executor
from dagtune.gc import GcPolicy, collect
from dagtune.plan import SearchPlan
from dagtune.progress import watch
from dagtune.records import FAILED, StudyLink, Trial, check_steps, is_study_name
from dagtune.scheduling import policy_named
from dagtune.storage_retry import DEFAULT_RETRY_SECONDS, check_retry_seconds
from dagtune.study._alone import check_evaluate_count
from dagtune.study._identity import model_identity
from dagtune.study._results import Result, TrialError
from dagtune.study._session import Session
from dagtune.study_lease import DEFAULT_LEASE_TTL, StudyLease, check_lease_ttl
from dagtune.tasks import TrainerSpec
from dagtune.trainer import Trainer

if TYPE_CHECKING:
    from distributed.security import Security

log = logging.getLogger("dagtune")

__all__ = ["Study", "TrialHandle"]

#: a burst of `Study.submit` calls (a plain loop) is planned as one: the driver launches work
#: for submitted trials once this long passed without a submission. A stage launched for
#: the first trial alone would run past the point where the next ones branch off, and that
#: prefix would be trained again.
SUBMIT_QUIET_SECONDS = 0.05


class Study:
    """A hyper-parameter study of one trainer (see DESIGN.md for the whole API).

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

    `link` records that the study is half of a surrogate study (`SurrogateStudy` sets it;
    ``dagtune status`` and the page show it).

    `check_evaluate`: each worker compares the training state (every ``state_dict()`` leaf
    and module's training mode) before and after its first `check_evaluate` evaluations of
    the model, and fails the trial with ``evaluate() changed the training state: <keys>``
    if they differ (results would depend on where dagtune evaluates); 0 turns it off.

    `fuse` (a `dagtune.FusibleTrainer` only; docs/fusion.md): True or an int trains the
    ready stages that may share a model (same start, differing only in fusible
    hyper-parameters) as fused tasks of up to F trials each, one worker slot per task; F is
    the int, or with True measured from memory (`dagtune.fusion.fusion_count`). Every stage
    then trains through the fused code path, so each trial's metrics are exactly
    ``run_alone(..., fused=True)``'s.
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
        checkpoint_every: int | None = None,
        max_retries: int = 1,
        workers: int | None = None,
        executor: Executor | None = None,
        gc: GcPolicy | None = None,
        refresh_seconds: float = 2.0,
        security: bool | Security | None = None,
        fuse: bool | int = False,
        link: StudyLink | None = None,
        lease_ttl: float = DEFAULT_LEASE_TTL,
        wait_for_lease: float = 0.0,
        storage_retry_seconds: float = DEFAULT_RETRY_SECONDS,
    ):
        if not isinstance(trainer, type) or not issubclass(trainer, Trainer):
            raise TypeError(f"trainer must be a dagtune.Trainer subclass, got {trainer!r}")
        if not is_study_name(name):
            raise ValueError(f"name must be 1-128 letters, digits, '.', '_' or '-', got {name!r}")
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ValueError(f"seed must be an int, got {seed!r}")
        for field_name, value in (("eval_every", eval_every), ("checkpoint_every", checkpoint_every)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value <= 0):
                raise ValueError(f"{field_name} must be a positive int, got {value!r}")
        check_evaluate_count(check_evaluate)
        check_fuse(fuse, trainer)
        lease_ttl = check_lease_ttl(lease_ttl)
        wait_for_lease = check_retry_seconds(wait_for_lease, "wait_for_lease")
        storage_retry_seconds = check_retry_seconds(storage_retry_seconds)
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
        self.identity = model_identity(trainer, self.trainer_kwargs, seed, version)
        self.storage = os.fspath(storage)
        self.gc_policy = gc
        self._token = uuid.uuid4().hex[:8]
        self._owned_cluster = None
        self._names: tuple[str, ...] | None = None
        self._lock = threading.RLock()
        self._changed = threading.Condition(self._lock)
        self._failure: BaseException | None = None
        self._closed = False
        self._gc_at = time.monotonic()
        self._submitted_at = -SUBMIT_QUIET_SECONDS  # monotonic time of the latest submit
        self._lease: StudyLease | None = None
        self._persistence: Persistence | None = None
        if executor is None:
            self.store = self._open_storage(storage_options, storage_retry_seconds)
            if client is None:  # the embedded cluster's workers are processes of their own
                self._check_shared_storage(None)
            # the lease first: a study another process has open is refused before a cluster starts
            self._lease = StudyLease(self.store, name, ttl=lease_ttl).acquire(wait_for_lease)
            try:
                executor = self._dask_executor(client, workers, security)
            except BaseException:
                self._lease.release()
                raise
        else:
            self.store = getattr(executor, "store", None)
            if isinstance(self.store, CheckpointStore):
                self._lease = StudyLease(self.store, name, ttl=lease_ttl).acquire(wait_for_lease)
        self.executor = executor
        spec = TrainerSpec(trainer, self.trainer_kwargs, seed, self.identity)
        gpus = float((self.resources or {}).get("GPU", 1.0))
        if self._lease is not None:
            self.storage = self.store.url
            describe = {
                "trainer": f"{trainer.__module__}.{trainer.__qualname__}",
                "seed": seed,
                "version": version,
                **(link.fields() if link is not None else {}),
            }
            try:
                self._persistence = Persistence(
                    self.store,
                    name,
                    self.identity,
                    describe,
                    lease=self._lease,
                    refresh_seconds=refresh_seconds,
                )
            except BaseException:
                self.close()
                raise
            self.plan = self._persistence.plan
        else:
            self.plan = SearchPlan()
        self.coordinator = Coordinator(
            self.plan,
            executor,
            spec,
            policy_named(scheduler),
            share=reuse,
            eval_every=eval_every,
            check_evaluate=check_evaluate,
            checkpoint_every=checkpoint_every,
            max_retries=max_retries,
            gpus_per_task=gpus,
            topic=f"dagtune-{name}-{self._token}",
            name=f"{name}-{self._token}",
            fuse=fuse,
        )
        self._restored: list[Trial] = []
        if self._persistence is not None:
            self._restored = self._persistence.attach(self.coordinator)
            if self._restored:
                self._names = tuple(self._restored[0].config)
        self._metric: tuple[str | None, str] = (None, "max")
        self._virtual = getattr(executor, "virtual", False)
        if not self._virtual:
            self._driver = threading.Thread(target=self._drive, name=f"dagtune-{name}", daemon=True)
            self._driver.start()
        self._dashboard = None
        if getattr(self, "client", None) is not None:
            from dagtune.dashboard import attach  # loads distributed and bokeh: on Dask only

            self._dashboard = attach(self)
        self._demand = self._publish_demand()

    def _publish_demand(self) -> Any:
        """On Dask, keep the study's demand (stages ready without a worker) published for an
        adaptive cluster (`dagtune.cluster.DemandAdaptive`); None otherwise."""
        if getattr(self, "client", None) is None:
            return None
        from dagtune.cluster import DemandPublisher  # loads distributed: on Dask only

        return DemandPublisher(self).start()

    def _open_storage(
        self, storage_options: Mapping[str, Any] | None, retry_seconds: float
    ) -> CheckpointStore:
        """The checkpoint store, its filesystem opened and its root made: a storage URL that
        can't be used fails here, naming it, before any cluster starts (storage that can't be
        reached is waited for up to 30 s: more often a wrong endpoint than an outage)."""
        try:
            store = CheckpointStore(self.storage, storage_options, retry_seconds=retry_seconds)
            store.make_root(wait=30.0)
        except (ValueError, ImportError, OSError) as error:
            raise ValueError(
                f"storage={self.storage!r} cannot be used: {type(error).__name__}: {error}"
            ) from None
        return store

    def _check_shared_storage(self, client: Any) -> None:
        """Refuse storage only this process sees (``memory://``) when Dask workers run in
        other processes (the embedded cluster's always do, with `client` None): each would
        keep its checkpoints to itself and the others would find them missing."""
        if not self.store.process_local:
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
            f"storage={self.storage!r} is the memory of this process, but {elsewhere}: checkpoints "
            "could not be shared between them. Give a directory or an object store URL (s3://...), "
            "or run the workers in this process (LocalCluster(processes=False))."
        )

    def _dask_executor(self, client: Any, workers: int | None, security: bool | Security | None) -> Executor:
        # Dask is loaded only by a study that runs on it
        from distributed import Client

        from dagtune.cluster import embedded_cluster, slow_allocator_workers  # both load distributed
        from dagtune.graph import DaskExecutor, check_resources

        if client is None:
            cluster = embedded_cluster(workers, self.resources, security)
            client = Client(cluster)  # with the cluster's security
            self._owned_cluster = (client, cluster)
        self.client = client
        check_resources(client, self.resources)
        self._check_shared_storage(client)
        slow = slow_allocator_workers(client)
        if slow:
            log.warning(
                "dagtune: %d worker(s) run with MALLOC_TRIM_THRESHOLD_=%s (Dask's nanny default), which "
                "slows training on CPU by up to 1.6x; start them with --preload-nanny dagtune.cluster, "
                "or set distributed.nanny.pre-spawn-environ.MALLOC_TRIM_THRESHOLD_ to null in their Dask config",
                len(slow),
                ", ".join(sorted({str(v) for v in slow.values()})),
            )
        return DaskExecutor(client, self.store, f"dagtune-{self.name}-{self._token}", self.resources)

    # ------------------------------------------------------------------ driving

    def _drive(self) -> None:
        while not self._closed:
            burst = self._in_burst()
            events = self.executor.poll(timeout=SUBMIT_QUIET_SECONDS if burst else 0.2)
            with self._lock:
                try:
                    for event in events:
                        self.coordinator.handle(event)
                    self._tick()
                    if not self._in_burst():  # else the next round plans the whole burst
                        self.coordinator.schedule()
                except BaseException as error:  # a bug or a storage failure: wake every waiter
                    self._failure = error
                self._changed.notify_all()

    def _in_burst(self) -> bool:
        """Trials were submitted less than `SUBMIT_QUIET_SECONDS` ago (more may follow)."""
        return time.monotonic() - self._submitted_at < SUBMIT_QUIET_SECONDS

    def _tick(self, force: bool = False) -> None:
        """Periodic durable work (journals, results) and automatic checkpoint collection."""
        if self._persistence is not None:
            self._persistence.tick(self.coordinator, force=force)
        self._collect_when_due()

    def _collect_when_due(self) -> None:
        """Collect checkpoints if the study's policy collects every so often and it is time."""
        policy = self.gc_policy
        interval = None if policy is None else policy.interval_seconds
        if interval is not None and time.monotonic() - self._gc_at >= interval:
            self._collect(policy)

    def _call(self, function, *args: Any) -> Any:
        with self._lock:
            result = function(*args)
            self.coordinator.schedule()
            self._changed.notify_all()
            return result

    def _wait(self, done, timeout: float | None = None) -> None:
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            while not done():
                if self._failure is not None:
                    raise RuntimeError("the dagtune coordinator failed") from self._failure
                if self._virtual:
                    self._tick()
                    if self.coordinator.pump() == 0 and not self.coordinator.running:
                        if done():
                            return
                        raise RuntimeError("nothing is running and nothing will: the wait can never end")
                    continue
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise TimeoutError(f"still waiting after {timeout} s")
                self._changed.wait(0.5 if remaining is None else min(remaining, 0.5))

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
        """A trial restored from an earlier session with this config and steps, not handed
        to an algorithm yet (it is removed from the restored ones)."""
        text = config_dumps(config)
        for i, trial in enumerate(self._restored):
            if trial.steps == steps and config_dumps(trial.config) == text:
                return self._restored.pop(i)
        return None

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
        if trial is None:
            with self._lock:  # planned with the rest of a burst (`SUBMIT_QUIET_SECONDS`)
                trial = self.coordinator.submit(config, steps)
                self._submitted_at = time.monotonic()
                self._changed.notify_all()
        return TrialHandle(self, trial)

    def evaluate(
        self, config: Mapping[str, Any], step: int, timeout: float | None = None
    ) -> dict[str, float]:
        """The metrics of `config` after `step` steps, trained only if not known yet."""
        return self.submit(config, step).result(timeout)

    def run(self, algorithm: Algorithm, timeout: float | None = None) -> Result:
        """Run a tuning algorithm to its end and return its `Result`.

        If the algorithm raises, or `timeout` seconds pass, the run's pending trials are
        stopped (what they trained stays in the plan) and the error is raised."""
        if not isinstance(algorithm, Algorithm):
            raise TypeError(f"run needs a dagtune.algos.Algorithm, got {algorithm!r}")
        session = Session(self.coordinator, algorithm, self._check_config, self._take_restored)
        with watch(self, algorithm.metric, algorithm.mode, show="notebook"), self._lock:
            self._metric = (algorithm.metric, algorithm.mode)
            since = self.coordinator.report([])
            self.coordinator.listeners.append(session)
            try:
                session.apply(algorithm.start(Context(slots=self.executor.slots(), seed=self.seed)))
                self.coordinator.expect(normalize_config(c, owner="prospect") for c in algorithm.prospects())
                session.started = True  # known results arriving during start must not end the run
                session.check_end()
                self.coordinator.schedule()
                # the run ends when its trials have ended and so has every stage no trial needs
                # any more: the report then counts every step trained for the run (see
                # `dagtune.coordinator.report_figures`), those a stop reached late included
                self._wait(
                    lambda: (
                        session.error is not None or (session.finished and not self.coordinator.unneeded())
                    ),
                    timeout,
                )
            finally:
                self.coordinator.listeners.remove(session)
                self.coordinator.expect(())
                if not session.finished:  # an error, a timeout or an interrupt: nobody waits for them
                    for trial in session.trials.values():
                        self.coordinator.stop(trial.id)
                    self.coordinator.schedule()
            if self.gc_policy is not None:
                self._collect(self.gc_policy)
            self._tick(force=True)
            trials = list(session.trials.values())
            report = self.coordinator.report(trials, since)
        if session.error is not None:
            raise session.error
        return Result(trials, report, algorithm.metric, algorithm.mode, algorithm.best_trial())

    @property
    def report(self) -> dict:
        """Trial/unique/executed steps, merge rate, reuse, GPU-seconds and makespan so far:
        every trial of the study (restored ones too) and the work of this session, with the
        figures defined in `dagtune.coordinator.report_figures`."""
        with self._lock:
            return self.coordinator.report()

    # ------------------------------------------------------------------ lifetime

    def close(self) -> None:
        """Stop the driver and the embedded cluster (an external client is left open)."""
        if self._closed:
            return
        self._closed = True
        if getattr(self, "_driver", None) is not None:
            self._driver.join(timeout=5)
        try:
            if getattr(self, "coordinator", None) is not None:
                with self._lock:
                    try:
                        self._collect_when_due()
                    finally:  # the last work, journal lines and results; the leases go
                        if self._persistence is not None:
                            self._persistence.close(self.coordinator)
        finally:
            try:
                self._stop_execution()
            finally:
                if self._persistence is None and self._lease is not None:
                    self._lease.release()  # opening failed before its records were read

    def _stop_execution(self) -> None:
        if getattr(self, "_dashboard", None) is not None:
            self._dashboard.close()  # sends the final snapshot
        if getattr(self, "_demand", None) is not None:
            self._demand.close()  # withdraws the demand
        if getattr(self, "executor", None) is not None:
            self.executor.close()
        if self._owned_cluster is not None:
            client, cluster = self._owned_cluster
            client.close()
            cluster.close()
            self._owned_cluster = None

    def __enter__(self) -> Study:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def _repr_html_(self) -> str:
        from dagtune.notebook import study_html  # the views load bokeh and distributed

        return study_html(self)

    def __repr__(self) -> str:
        return f"<Study {self.name!r} trainer={self.trainer.__name__} trials={len(self.coordinator.trials)}>"


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
        metrics; a failed one raises `TrialError`."""
        self._study._wait(lambda: self.trial.done, timeout)
        if self.trial.status == FAILED:
            raise TrialError(f"trial {self.trial.id} failed:\n{self.trial.error}")
        return dict(self.trial.metrics or {})

    def curve(self) -> list[tuple[int, dict[str, float]]]:
        return list(self.trial.curve)

    def stop(self) -> None:
        self._study._call(self._study.coordinator.stop, self.trial.id)

    def __repr__(self) -> str:
        return f"<TrialHandle {self.trial.id} {self.trial.status} steps={self.trial.steps}>"
