"""Execution on a real Dask LocalCluster with 2 worker processes."""

from __future__ import annotations

import time

import pytest

import dagtune as dt
from dagtune.algos import GridSearch
from dagtune.events import MetricsReported, StateLoaded, StepDone, TaskEnded, TaskStarted
from dagtune.execution._wire import unpack
from dagtune.sim import SyntheticTrainer
from dagtune.study import Study, run_alone

pytestmark = pytest.mark.slow


DIGITS_SPACE = dt.Grid(
    {
        "lr": [dt.Constant(0.05), dt.MultiStep(0.05, [3], 0.2)],
        "momentum": [0.9, dt.Steps([0.5, 0.9], [2])],
        "batch_size": [64, dt.Steps([64, 128], [4])],
        "weight_decay": [0.0],
    }
)


def test_digits_grid_is_bit_exact_with_training_alone(client, tmp_path):
    from digits import DigitsTrainer

    steps = 6
    with Study(DigitsTrainer, name="exact", storage=tmp_path, client=client, resources={"GPU": 1}) as study:
        result = study.run(GridSearch(DIGITS_SPACE, metric="val_acc", steps=steps), timeout=300)
        report = result.report
        assert report["executed_steps"] == report["unique_steps"] < report["trial_steps"]
        assert report["reuse"] == pytest.approx(report["trial_steps"] / report["unique_steps"])
        trials = list(study.coordinator.trials.values())
        assert len(trials) == 8 and all(t.status == "completed" for t in trials)
        # some children resumed from a checkpoint in storage on another worker (restored RNG,
        # data order and optimizer); the others continued within their path's task
        assert study.coordinator.loads["storage"] > 0
        for trial in trials:
            alone = run_alone(DigitsTrainer, trial.config, steps)
            assert [step for step, _ in trial.curve] == list(range(1, steps + 1))
            assert [metrics for _, metrics in trial.curve] == alone, trial.config


def test_child_on_the_same_worker_continues_in_memory_and_elsewhere_loads(client, tmp_path):
    from durable_helpers import SlowTrainer

    base = {"lr": dt.Steps([0.1, 0.05, 0.02], [5, 6]), "batch_size": 128}
    branch = {"lr": dt.Steps([0.1, 0.2], [5]), "batch_size": 128}
    # SlowTrainer: the curves of SyntheticTrainer, with steps slow enough that both children
    # of (base, 5) run at once
    # check_resume=0: the resume check trains a step past a path that ends at its checkpoint
    # and then keeps no live trainer there (tests/test_resumecheck.py)
    with Study(
        SlowTrainer,
        {"delay": 0.2},
        name="loads",
        storage=tmp_path,
        client=client,
        resources={"GPU": 1},
        check_resume=0,
    ) as study:
        events = []
        handle = study.coordinator.handle
        study.coordinator.handle = lambda event: (events.append(event), handle(event))
        study.submit(base, 5).result(timeout=60)
        assert study.coordinator.loads == {"memory": 0, "storage": 0}
        (parent,) = {e.worker for e in events if isinstance(e, TaskStarted)}
        (elsewhere,) = set(client.scheduler_info(n_workers=-1)["workers"]) - {parent}
        # the coordinator places the child that can continue the live trainer on its worker;
        # the other one it leaves to Dask, which here is told to use the other worker
        launch = study.executor.launch
        study.executor.launch = lambda task, priority=0.0, prefer=None: launch(
            task, priority, prefer or elsewhere
        )
        one = study.submit(base, 8)
        other = study.submit(branch, 8)
        assert one.result(timeout=60) == run_alone(SyntheticTrainer, base, 8)[-1]
        assert other.result(timeout=60) == run_alone(SyntheticTrainer, branch, 8)[-1]
        assert study.coordinator.loads == {"memory": 1, "storage": 1}
        assert study.report["executed_steps"] == 5 + 3 + 3
    worker_of = {e.task: e.worker for e in events if isinstance(e, TaskStarted)}
    loads = {e.origin: worker_of[e.task] for e in events if isinstance(e, StateLoaded)}
    # the child on the parent's worker continued the live trainer without reading storage;
    # the child on the other worker read the parent's checkpoint from storage
    assert loads == {"memory": parent, "storage": elsewhere}


def test_trials_submitted_one_by_one_in_a_loop_train_their_shared_prefix_once(client, tmp_path):
    """Twelve trials whose lr schedules branch at step 1, submitted in a plain loop: the burst
    is planned as one (`SUBMIT_QUIET_SECONDS`), so no stage launched for the first trial alone
    runs past step 1 before the others arrive and step 1 is trained once (it was trained
    twice, every run, when each submission launched work at once)."""
    lrs = [0.2, 0.15, 0.12, 0.1, 0.08, 0.06, 0.05, 0.04, 0.03, 0.02, 0.01, 0.005]
    configs = [{"lr": dt.Steps([0.1, lr], [1])} for lr in lrs]
    with Study(
        SyntheticTrainer, name="burst", storage=tmp_path, client=client, resources={"GPU": 1}
    ) as study:
        handles = [study.submit(config, 7) for config in configs]
        for handle, config in zip(handles, configs):
            assert handle.result(timeout=120) == run_alone(SyntheticTrainer, config, 7)[-1]
        report = study.report
    assert report["unique_steps"] == 1 + 12 * 6
    assert report["executed_steps"] == report["unique_steps"]


def test_asking_for_more_gpus_than_any_worker_has_fails_fast(client, tmp_path):
    with pytest.raises(ValueError, match=r"GPU.*no worker offers"):
        Study(SyntheticTrainer, name="greedy", storage=tmp_path, client=client, resources={"GPU": 2})


def test_metrics_stream_to_the_study_while_a_stage_runs(client, tmp_path):
    from durable_helpers import SlowTrainer

    config = {"lr": 0.1, "batch_size": 128}
    with Study(
        SlowTrainer,
        {"delay": 0.4},
        name="stream",
        storage=tmp_path,
        client=client,
        resources={"GPU": 1},
    ) as study:
        handle = study.submit(config, 10)  # one stage of 10 steps
        deadline = time.monotonic() + 60
        while len(handle.curve()) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        seen = handle.curve()
        assert handle.status == "pending" and 3 <= len(seen) < 10  # before the stage ended
        assert [step for step, _ in seen] == list(range(len(seen)))  # steps count from 0
        assert handle.result(timeout=60) == run_alone(SyntheticTrainer, config, 10)[-1]
        assert study.coordinator.dispatcher.launched == 1  # one task: the points came as events, not results
        # each message is one step's events, the step last: the step is counted together with
        # its metrics, so the report read when the trial ends has counted every step
        assert study.report["executed_steps"] == 10
        messages = [unpack(batch) for _, batch in client.get_events(study.coordinator.topic)]
        steps = [batch for batch in messages if any(isinstance(e, MetricsReported) for e in batch)]
        assert [[e.step for e in batch if isinstance(e, MetricsReported | StepDone)] for batch in steps] == [
            [n, n] for n in range(1, 11)
        ]
        # the last step's message also ends the task (`TaskEnded` after its step)
        assert all(isinstance(batch[-1], StepDone) for batch in steps[:-1])
        assert [type(e) for e in steps[-1][-2:]] == [StepDone, TaskEnded]


def test_a_one_step_stage_is_one_message_and_its_result_is_not_fetched(client, tmp_path):
    """Each independent one-step stage sends one ``log_event`` message (its step's events and
    its end; it sent two, the end apart), its events packed into one bytes, and the coordinator fetches no task's result (a
    gather through the scheduler from the worker for events the stream had carried: it
    fetched every one), so it handles each event once."""
    configs = [{"lr": lr, "batch_size": 128} for lr in (0.1, 0.05, 0.02, 0.01, 0.005, 0.002)]
    with Study(
        SyntheticTrainer, name="one-message", storage=tmp_path, client=client, resources={"GPU": 1}
    ) as study:
        for handle, config in [(study.submit(config, 1), config) for config in configs]:
            assert handle.result(timeout=60) == run_alone(SyntheticTrainer, config, 1)[-1]
        payloads = [batch for _, batch in client.get_events(study.coordinator.topic)]
        # each message is one bytes (`_wire`): Dask's walks of it (dumpable? its size?) see one
        # object, where they visited each of its events' dicts and values (about 80)
        assert all(isinstance(batch, bytes) for batch in payloads)
        messages = [unpack(batch) for batch in payloads]
        executor, dispatcher = study.executor, study.coordinator.dispatcher
        assert dispatcher.launched == len(configs)
        assert len(messages) == len(configs)
        assert all(isinstance(batch[-1], TaskEnded) for batch in messages)
        assert executor.results_fetched == 0
        assert dispatcher.events_seen == sum(len(batch) for batch in messages)  # none twice


def test_submissions_leave_the_client_at_once_and_its_batching_comes_back_at_close(client, tmp_path):
    """Dask's client holds a message for the scheduler until 10 ms have passed since its
    stream's previous write; a study submits each task as a slot frees, so it sends them at
    once (`SUBMIT_BATCH_SECONDS`), on a stream made anew by a reconnection too, and the caller's
    client batches as before once the study closes."""
    from dagtune.execution._dask_executor import SUBMIT_BATCH_SECONDS

    stream = client.scheduler_comm
    before = stream.interval
    assert before > SUBMIT_BATCH_SECONDS  # Dask's own batching (10 ms)
    with Study(
        SyntheticTrainer, name="prompt", storage=tmp_path, client=client, resources={"GPU": 1}
    ) as study:
        assert stream.interval == before  # nothing submitted yet
        study.submit({"lr": 0.1, "batch_size": 128}, 1).result(timeout=60)
        assert stream.interval == SUBMIT_BATCH_SECONDS
        stream.interval = before  # as a reconnection's new stream would batch
        study.submit({"lr": 0.05, "batch_size": 128}, 1).result(timeout=60)
        assert stream.interval == SUBMIT_BATCH_SECONDS
    assert client.scheduler_comm.interval == before


def test_a_task_whose_end_the_stream_lost_has_its_result_fetched(client, tmp_path):
    """Nothing is lost if the stream lags: with every streamed message dropped in the study's
    process, each task's events come from its result, fetched once Dask says it finished."""
    configs = [{"lr": lr, "batch_size": 128} for lr in (0.1, 0.05, 0.02)]
    with Study(
        SyntheticTrainer, name="lost-stream", storage=tmp_path, client=client, resources={"GPU": 1}
    ) as study:
        client.subscribe_topic(study.coordinator.topic, lambda event: None)  # replaces the executor's handler
        for config in configs:  # one stage after the other, 3 steps each
            assert study.submit(config, 3).result(timeout=60) == run_alone(SyntheticTrainer, config, 3)[-1]
        assert study.executor.results_fetched == study.coordinator.dispatcher.launched == len(configs)
        assert study.report["executed_steps"] == 3 * len(configs)
