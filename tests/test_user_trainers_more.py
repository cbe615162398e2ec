"""Trainers written the way users write them (`user_trainers`), beyond the MNIST-style ones of
`test_resumecheck` and `test_failures`: what dagtune says when one does what it can't take."""

from __future__ import annotations

import multiprocessing
import random
import textwrap
import warnings

import numpy as np
import pytest
from user_trainers import (
    EvaluatesEveryOther,
    ForgetsTheOptimizer,
    GetsWithDefault,
    GetsWithTheValueInUse,
    KeepsNumpyHistory,
    MnistStyle,
    OneCycleOverEpochs,
    SeedsInSetup,
    SetsLrUnderAScheduler,
)

import dagtune as dt
from dagtune.algos import GridSearch, MissingMetricWarning
from dagtune.checkpoints import serialize_state
from dagtune.runner import failure_fields
from dagtune.sim import SimulatedExecutor
from dagtune.study import Study, TrialError, run_alone


def test_a_setup_that_reseeds_is_named_as_the_cause():
    with pytest.raises(TrialError) as failure:
        run_alone(SeedsInSetup, {"lr": 0.05, "seed": 1}, 3)
    message = " ".join(str(failure.value).split())
    causes = message[message.index("Likely cause:") : message.index("After step")]
    assert causes.startswith(
        "Likely cause: setup() changes the global random generators (it reseeds them, e.g. "
        "torch.manual_seed(hp['seed'])"
    )
    assert "does load_state_dict() load it?" not in causes  # the model and optimizer are loaded


def test_a_setup_that_sets_again_what_a_scheduler_moved_is_named_as_the_cause():
    with pytest.raises(TrialError) as failure:
        run_alone(SetsLrUnderAScheduler, {"lr": 0.05}, 3)
    message = " ".join(str(failure.value).split())
    causes = message[message.index("Likely cause:") : message.index("After step")]
    assert causes.startswith(
        "Likely cause: setup() changes what load_state_dict() restored "
        "(self.optimizer.state_dict()['param_groups'][0]['lr']) when a resumed trainer calls it with every value"
    )
    assert "does load_state_dict() load it?" not in causes  # the scheduler is loaded


def test_a_setup_that_sets_the_lr_of_an_optimizer_left_out_of_the_state_is_not_blamed():
    with pytest.raises(TrialError) as failure:  # setup() moves the lr from __init__'s 0.05: not the cause
        run_alone(ForgetsTheOptimizer, {"lr": 0.1}, 3)
    message = " ".join(str(failure.value).split())
    causes = message[message.index("Likely cause:") : message.index("After step")]
    assert causes.startswith("Likely cause: self.optimizer (the SGD optimizer) is not in state_dict()")
    assert "setup() changes what load_state_dict() restored" not in causes


def test_a_scheduler_built_in_setup_is_compared_by_what_the_trainer_holds():
    with pytest.raises(TrialError) as failure:  # its state_dict() needs the scheduler setup() builds
        run_alone(OneCycleOverEpochs, {"epochs": 4}, 3)
    message = " ".join(str(failure.value).split())
    assert message.index("Likely cause: setup() changes what load_state_dict() restored") < message.index(
        "self.optimizer.state_dict()['param_groups'][0]['momentum']"
    )


def test_a_setup_that_keeps_the_generators_is_not_blamed():
    run_alone(MnistStyle, {"lr": 0.05}, 3)  # passes the check: nothing to name


def _run_alone_daemonic(queue) -> None:
    """`run_alone` of `LoaderWorkers` in a daemonic process (as a Dask worker's is): what failed."""
    from user_trainers import LoaderWorkers

    try:
        run_alone(LoaderWorkers, {"lr": 0.05}, 1, check_resume=0)
        queue.put("")
    except TrialError as error:
        queue.put(str(error))


def test_a_dataloader_with_workers_in_a_daemonic_worker_names_the_fix():
    context = multiprocessing.get_context("spawn")  # a Dask worker process, as the embedded cluster starts it
    queue = context.Queue()
    process = context.Process(target=_run_alone_daemonic, args=(queue,), daemon=True)
    process.start()
    message = queue.get(timeout=120)
    process.join(60)
    last = message.strip().splitlines()[-1]
    assert last.startswith("dagtune.trainer.DaemonicWorkerError: the trainer starts processes (a DataLoader")
    assert "DataLoader(..., num_workers=0)" in last
    assert "dask.config.set({'distributed.worker.daemon': False})" in last
    assert "AssertionError: daemonic processes are not allowed to have children" in message  # its cause


def test_an_error_dagtune_knows_no_fix_for_is_reported_as_it_is():
    error = AssertionError("some other assertion")
    fields = failure_fields(error)
    assert fields["error"] == "AssertionError: some other assertion"
    assert fields["retry"]


def test_the_daemonic_error_is_not_retried():
    fields = failure_fields(AssertionError("daemonic processes are not allowed to have children"))
    assert fields["error"].startswith("DaemonicWorkerError: the trainer starts processes")
    assert not fields["retry"]  # it would fail the same way


# --------------------------------------------------------------------------- dagtune run's setup

SETUP_SCRIPT = textwrap.dedent(
    """
    import dagtune as dt
    from dagtune.algos import GridSearch
    from dagtune.launch import StudySetup
    from dagtune.sim import SyntheticTrainer

    def setup(**options):
        algorithm = GridSearch(dt.Grid({"lr": [0.1, 0.2]}), metric="val_loss", mode="min", steps=2)
        return StudySetup(trainer=SyntheticTrainer, algorithm=algorithm, name="opts", options=options)

    def typo():
        return setup(checkpoint_intervall=60)

    def named():
        return setup(name="other")

    def client():
        return setup(client="tcp://127.0.0.1:8786")

    def storage():
        return setup(storage="nosuchproto://from-the-setup")

    def workers_and_scheduler():
        return setup(workers=2)
    """
)


def run_command(*args: str):
    from click.testing import CliRunner

    from dagtune.cli import main

    out = CliRunner().invoke(main, ["run", *args])
    lines = out.output.strip().splitlines()
    assert out.exit_code == 2 and "Traceback" not in out.output, out.output
    return lines[-2], lines[-1]  # the Error line, the Hint line


@pytest.mark.parametrize(
    ("function", "error", "hint"),
    [
        (
            "typo",
            "Error: options['checkpoint_intervall'] = 60: Study takes no option 'checkpoint_intervall'; "
            "did you mean 'checkpoint_interval'?",
            "Hint: see help(dagtune.Study)",
        ),
        (
            "named",
            "Error: options['name'] = 'other': name is a field of StudySetup",
            "Hint: give StudySetup(name=...)",
        ),
        (
            "client",
            "Error: options['client'] = 'tcp://127.0.0.1:8786': dagtune run makes the client itself",
            "Hint: give --scheduler ADDRESS",
        ),
    ],
)
def test_a_setup_option_study_does_not_take_is_one_line_naming_it(tmp_path, function, error, hint):
    (tmp_path / "tuning.py").write_text(SETUP_SCRIPT)
    shown, hinted = run_command(f"{tmp_path / 'tuning.py'}:{function}", "--storage", str(tmp_path))
    assert shown == error and hinted.startswith(hint)


def test_the_setups_storage_and_workers_are_the_command_lines_defaults(tmp_path):
    (tmp_path / "tuning.py").write_text(SETUP_SCRIPT)
    script = str(tmp_path / "tuning.py")
    error, _ = run_command(f"{script}:storage")  # was: Study() got multiple values for 'storage'
    assert "cannot use storage 'nosuchproto://from-the-setup'" in error
    error, _ = run_command(f"{script}:storage", "--storage", "nosuchproto://from-the-command-line")
    assert "cannot use storage 'nosuchproto://from-the-command-line'" in error  # the command line wins
    error, _ = run_command(f"{script}:workers_and_scheduler", "--scheduler", "tcp://127.0.0.1:1")
    assert error.startswith("Error: the setup's options['workers'] sizes the local cluster")


# --------------------------------------------------------------------------- metrics not at every step


def test_a_metric_missing_from_the_first_result_says_it_may_be_returned_only_at_some_steps():
    study = Study(EvaluatesEveryOther, {"first": False}, executor=SimulatedExecutor(1))
    with pytest.raises(ValueError) as failure:
        study.run(GridSearch([{"lr": 0.05}], metric="val_loss", mode="min", steps=4), progress=False)
    assert str(failure.value) == (
        "GridSearch: metric 'val_loss' is not among the reported metrics ['loss'] of the first result: "
        "is it misspelled, or does the trainer return it only at some steps? evaluate() (or train()) "
        "must return it at every step"
    )


def test_a_metric_missing_from_a_later_result_is_warned_about_once():
    study = Study(EvaluatesEveryOther, {"first": True}, executor=SimulatedExecutor(1))
    space = [{"lr": 0.05}, {"lr": 0.02}]
    with pytest.warns(MissingMetricWarning) as caught:
        result = study.run(GridSearch(space, metric="val_loss", mode="min", steps=4), progress=False)
    missing = [w for w in caught if issubclass(w.category, MissingMetricWarning)]
    assert len(missing) == 1  # once per algorithm, though both trials lack it at steps 2 and 4
    assert str(missing[0].message) == (
        "GridSearch: a result lacks metric 'val_loss' (it has ['loss']); the algorithm counts it as the "
        "worst value of 'val_loss': evaluate() (or train()) must return it at every step"
    )
    assert len(result.trials) == 2


# --------------------------------------------------------------------------- hyper-parameter values


def test_a_tuple_value_is_refused_naming_it_and_the_fix():
    with pytest.raises(ValueError) as refusal:
        dt.Grid({"lr": [0.1], "betas": [(0.9, 0.999), (0.9, 0.98)]})  # AdamW's betas, as users write them
    assert str(refusal.value) == (
        "Grid['betas'] must be a sequence or a JSON scalar, got (0.9, 0.999): a value is a number, string, "
        "bool or None, or a dagtune sequence of them (dt.Steps, dt.Cosine, ...); give each part of a tuple "
        "its own hyper-parameter (betas_0, betas_1, ...) or a string that setup() parses"
    )


# --------------------------------------------------------------------------- what state_dict() may hold


@pytest.mark.parametrize(
    ("extra", "fix"),
    [
        (np.zeros(3), "save torch.from_numpy(array) or array.tolist() instead"),
        (np.float64(0.5), "save value.item() (a python number) instead"),
        (np.random.default_rng(0), "save generator.bit_generator.state (a dict)"),
    ],
)
def test_numpy_in_the_state_is_refused_at_save_naming_the_key_and_the_conversion(extra, fix):
    with pytest.raises(TypeError) as refusal:
        serialize_state({"trainer": {"history": extra}})  # a state_dict() as users write it
    message = str(refusal.value)
    assert message.startswith(
        f"state['trainer']['history'] is of type {type(extra).__qualname__}, which torch"
    )
    assert f"and dicts of those: {fix}" in message


def test_what_numpy_users_keep_instead_saves():
    rng = np.random.default_rng(0)
    serialize_state({"a": [0.5], "b": 0.5, "rng": rng.bit_generator.state, "py": random.Random(0).getstate()})


def test_numpy_in_the_state_fails_the_trial_as_the_trainers_fault(client, tmp_path):
    study = Study(KeepsNumpyHistory, client=client, storage=str(tmp_path))  # saved as on any worker
    space = [{"lr": 0.05}, {"lr": dt.Steps([0.05, 0.02], [1])}]  # a checkpoint at step 1, to branch
    with pytest.warns(dt.TrialsFailedWarning), study:
        study.run(GridSearch(space, metric="val_loss", mode="min", steps=3), progress=False)
        trials = [handle.trial for handle in study.trials]
    for trial in trials:  # was cause "storage", which opening the study again retries, every time
        assert (trial.status, trial.cause) == ("failed", "trainer")
        assert "UnsavableStateError: state['trainer']['history'] is of type ndarray" in trial.error


def test_a_get_whose_default_hides_the_configs_value_is_warned_about():
    config = {"lr": 0.01, "batch_size": dt.Steps([32, 64], [2])}  # only batch_size changes at step 2
    with pytest.warns(dt.DefaultedHyperparameterWarning) as caught:
        run_alone(GetsWithDefault, config, 3, check_resume=0)
    (warning,) = [w for w in caught if issubclass(w.category, dt.DefaultedHyperparameterWarning)]
    assert str(warning.message) == (
        "GetsWithDefault.setup() read hyper-parameter 'lr' with hp.get('lr', 0.05) before step 2, where "
        "'lr' did not change, so it got the default 0.05, not the config's 0.01: setup() is handed only "
        "the values that changed; test 'lr' in hp first (a default that is the value in use, "
        "hp.get(name, self.lr), is fine)"
    )


def test_a_get_whose_default_is_the_value_in_use_is_not_warned_about():
    config = {"lr": 0.01, "batch_size": dt.Steps([32, 64], [2])}
    with warnings.catch_warnings():
        warnings.simplefilter("error", dt.DefaultedHyperparameterWarning)
        run_alone(GetsWithTheValueInUse, config, 3, check_resume=0)
