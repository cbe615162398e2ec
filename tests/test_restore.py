"""A trial's model back after a study: `TrialResult.load_trainer` / `state_dict`, the same
from `open_results`, `dagtune export`, and checkpoints garbage collection removed rebuilt
bit for bit."""

from __future__ import annotations

import logging
import pickle

import numpy as np
import pytest
import torch
from click.testing import CliRunner

import dagtune as dt
from dagtune.algos import GridSearch
from dagtune.checkpoints import CheckpointStore
from dagtune.cli import main as cli
from dagtune.restore import import_trainer, stored_model
from dagtune.sim import SimulatedExecutor, SyntheticTrainer

CONFIGS = [
    {"lr": 0.1, "momentum": 0.5},
    {"lr": dt.MultiStep(0.1, [4], 0.5), "momentum": 0.5},
    {"lr": 0.3, "momentum": 0.5},
]
STEPS = 6


class NoisyEvaluation(SyntheticTrainer):
    """Its evaluation draws from numpy's global generator: only the RNG state saved with the
    checkpoint makes a restored trainer evaluate to the trial's metrics."""

    def evaluate(self) -> dict:
        metrics = super().evaluate()
        return {**metrics, "val_noisy": metrics["val_loss"] + float(np.random.uniform())}


class TupleArguments(SyntheticTrainer):
    """Takes a tuple, which JSON can't give back: the study can't record its arguments."""

    def __init__(self, shape: tuple = (8,), **kwargs):
        super().__init__(dim=shape[0], **kwargs)


def study_in(path: str, trainer=NoisyEvaluation, name: str = "models", kwargs=None, **options) -> dt.Study:
    store = CheckpointStore(path)
    executor = SimulatedExecutor(2, store=store)
    return dt.Study(trainer, kwargs, name=name, storage=path, executor=executor, **options)


def run(study: dt.Study, configs=CONFIGS, steps: int = STEPS):
    return study.run(GridSearch(configs, metric="val_loss", mode="min", steps=steps))


def evaluated(trainer) -> dict:
    return trainer.evaluate()


def test_the_best_trials_trainer_comes_back_at_its_last_step(tmp_path):
    with study_in(str(tmp_path)) as study:
        result = run(study)
        best = result.best
        trainer = best.load_trainer()
        assert isinstance(trainer, NoisyEvaluation) and trainer.step == STEPS
        metrics = evaluated(trainer)
        assert metrics == {k: best.metrics[k] for k in metrics}  # the random draw too: RNG restored
        checkpoint = study.store.load(study.identity, study.coordinator.trials[best.id].node, STEPS)
        assert best.state_dict() == checkpoint["trainer"] == trainer.state_dict()
        assert result.load_trainer().state_dict() == trainer.state_dict()  # default: the best
        again = pickle.loads(pickle.dumps(result))  # without its tie to the study
        assert again.best == best and again.trials.equals(result.trials)
        with pytest.raises(ValueError, match=r"unpickled.*open_results"):
            again.best.load_trainer()
        other = result.trial(0).load_trainer(rng=False)
        before = np.random.get_state()[1].copy()
        assert other.state_dict() == result.state_dict(0)
        assert (np.random.get_state()[1] == before).all()  # rng=False leaves the generators alone


def test_a_checkpoint_gc_removed_is_rebuilt_bit_for_bit_from_the_nearest_kept_one(tmp_path, caplog):
    with study_in(str(tmp_path), checkpoint_every=2) as study:
        result = run(study)
        states = {t: result.state_dict(t) for t in range(3)}
        finals = {t: result.trial(t).metrics for t in range(3)}
        node = study.coordinator.trials[1].node
        study.store.delete(study.identity, node, STEPS)  # behind the plan's back: found missing
        with caplog.at_level(logging.WARNING, logger="dagtune"):
            assert result.state_dict(1) == states[1]
        assert "training 2 steps in this process, from the checkpoint at step 4" in caplog.text
        caplog.clear()
        assert study.gc(dt.GcPolicy(keep_best=0, keep_latest=False))["kept"] == 0
        for t in range(3):
            with caplog.at_level(logging.WARNING, logger="dagtune"):
                trainer = result.trial(t).load_trainer()
            assert f"training {STEPS} steps in this process, from scratch" in caplog.text
            assert trainer.state_dict() == states[t]
            assert evaluated(trainer).items() <= finals[t].items()
            caplog.clear()


def test_gc_keeps_the_best_trials_final_checkpoints_by_default(tmp_path, caplog):
    with study_in(str(tmp_path)) as study:
        result = run(study)
        study.gc()  # GcPolicy(): each completed trial's latest checkpoint and the best trials'
        with caplog.at_level(logging.WARNING, logger="dagtune"):
            for t in range(3):
                result.trial(t).load_trainer()
        assert "rebuilding" not in caplog.text


def test_a_stopped_trial_comes_back_where_it_stopped(tmp_path):
    with study_in(str(tmp_path), name="stop") as study:
        handle = study.submit({"lr": 0.1, "momentum": 0.5}, 20)
        while handle.trial.reported < 5:
            study.coordinator.pump()
        handle.stop()
        reached = handle.trial.reported
        trial = study.trial_result(handle.id)
        assert trial.status == "stopped" and trial.steps == reached < 20
        trainer = trial.load_trainer()  # no checkpoint where it stopped: rebuilt
        assert trainer.step == reached and evaluated(trainer).items() <= trial.metrics.items()
    alone = dt.run_alone(NoisyEvaluation, {"lr": 0.1, "momentum": 0.5}, reached)
    assert trial.metrics == alone[-1]


def test_stored_results_give_each_trials_model_by_trial_id(tmp_path):
    path = str(tmp_path)
    with study_in(path) as study:
        result = run(study)
        states = {t: result.state_dict(t) for t in range(3)}
    stored = dt.open_results(path, "models")
    for t in range(3):
        trainer = stored.load_trainer(t)  # the recorded trainer, imported by name
        assert type(trainer).__qualname__ == "NoisyEvaluation" and trainer.state_dict() == states[t]
        assert evaluated(trainer).items() <= result.trial(t).metrics.items()
        assert stored.state_dict(t) == states[t]
    with pytest.raises(KeyError, match="no trial 7"):
        stored.load_trainer(7)


def test_arguments_json_cannot_hold_must_be_given_and_must_make_the_studys_model(tmp_path):
    path = str(tmp_path)
    with study_in(path, trainer=TupleArguments, name="tuple", kwargs={"shape": (6,)}) as study:
        result = study.run(GridSearch(CONFIGS[:1], metric="val_loss", mode="min", steps=2))
        study.gc(dt.GcPolicy(keep_best=0, keep_latest=False))  # a rebuild needs the trainer
    stored = dt.open_results(path, "tuple")
    with pytest.raises(ValueError, match=r"did not record its trainer arguments.*trainer_kwargs="):
        stored.load_trainer(0)
    with pytest.raises(ValueError, match=r"is model [0-9a-f]+, but the study trained model"):
        stored.load_trainer(0, trainer_kwargs={"shape": (4,)})
    with pytest.raises(ValueError, match=r"trainer=test_restore.NoisyEvaluation is not the study's trainer"):
        stored.load_trainer(0, trainer=NoisyEvaluation, trainer_kwargs={})
    trainer = stored.load_trainer(0, trainer_kwargs={"shape": (6,)})
    assert trainer.state_dict() == result.state_dict(0) and len(trainer.w) == 6


def test_a_trainer_defined_in_the_script_that_ran_the_study_must_be_given():
    with pytest.raises(ImportError, match=r"defined in the script that ran the study.*trainer="):
        import_trainer("__main__.NotHere")
    with pytest.raises(ImportError, match="not importable here"):
        import_trainer("no_such_module_anywhere.Trainer")
    assert import_trainer("dagtune.sim.SyntheticTrainer") is SyntheticTrainer


def test_dagtune_export_writes_the_best_trials_state_dict(tmp_path, caplog):
    path = str(tmp_path / "runs")
    with study_in(path) as study:
        result = run(study)
        best = result.best
        states = {t: result.state_dict(t) for t in range(3)}
    out = tmp_path / "best.pt"
    done = CliRunner().invoke(
        cli, ["export", path, "--study", "models", "--metric", "val_loss", "--mode", "min", "-o", str(out)]
    )
    assert done.exit_code == 0, done.output
    assert f"trial {best.id} of study 'models' (completed, after {STEPS} steps" in done.output
    assert torch.load(out, weights_only=True) == states[best.id]
    with study_in(path) as again:
        again.gc(dt.GcPolicy(keep_best=0, keep_latest=False))
    done = CliRunner().invoke(cli, ["export", path, "--study", "models", "--trial", "2", "-o", str(out)])
    assert done.exit_code == 0, done.output
    assert torch.load(out, weights_only=True) == states[2]  # rebuilt by training
    done = CliRunner().invoke(cli, ["export", path, "--study", "models", "--trial", "9", "-o", str(out)])
    assert done.exit_code == 2 and "Error: study 'models' has no trial 9" in done.output
    done = CliRunner().invoke(cli, ["export", path, "--study", "nope", "-o", str(out)])
    assert done.exit_code == 2 and "no study 'nope'" in done.output


@pytest.mark.slow
def test_a_real_trainers_model_comes_back_from_a_dask_study_exactly(client, tmp_path):
    from digits_trainer import HandWrittenDigitsTrainer  # examples/: dropout, SGD with momentum

    kwargs = {"hidden": 4}
    space = [
        {"lr": 0.05, "batch_size": 64},
        {"lr": dt.MultiStep(0.05, [2], 0.5), "batch_size": 64},
        {"lr": 0.05, "batch_size": dt.Steps([64, 128], [2])},
    ]
    path = str(tmp_path)
    with dt.Study(HandWrittenDigitsTrainer, kwargs, name="digits", storage=path, client=client) as study:
        result = study.run(GridSearch(space, metric="val_loss", mode="min", steps=3))
    best = result.best
    trainer = best.load_trainer()
    assert evaluated(trainer) == {k: best.metrics[k] for k in evaluated(trainer)}
    states = {t: result.state_dict(t) for t in range(3)}
    with dt.Study(HandWrittenDigitsTrainer, kwargs, name="digits", storage=path, client=client) as again:
        again.gc(dt.GcPolicy(keep_best=0, keep_latest=False))
    stored = dt.open_results(path, "digits")
    for t in range(3):
        rebuilt = stored.load_trainer(t)  # imported by name, trained here from scratch
        assert_same(rebuilt.state_dict(), states[t])
        assert evaluated(rebuilt).items() <= result.trial(t).metrics.items()


def assert_same(a, b) -> None:
    """Equal to the bit: tensors with torch.equal, everything else with ==."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for key in a:
            assert_same(a[key], b[key])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            assert_same(x, y)
    else:
        assert a == b


def test_a_fused_studys_trial_is_rebuilt_through_the_fused_code_path(tmp_path):
    from fusion_helpers import TinyMLP  # a FusibleTrainer

    space = dt.Grid({"lr": [dt.Steps([0.1, 0.05], [2]), dt.Steps([0.1, 0.02], [2])], "momentum": [0.9, 0.5]})
    path = str(tmp_path)
    executor = SimulatedExecutor(2, store=CheckpointStore(path))
    with dt.Study(TinyMLP, name="fused", storage=path, executor=executor, fuse=4) as study:
        result = study.run(GridSearch(space, metric="val_loss", mode="min", steps=4))
        states = {t: result.state_dict(t) for t in range(4)}
        study.gc(dt.GcPolicy(keep_best=0, keep_latest=False))
        for t in range(4):
            rebuilt = result.trial(t).load_trainer()  # trained again as a fused group of one
            assert_same(rebuilt.state_dict(), states[t])
            metrics = rebuilt.evaluate()  # unfused: within rounding of the fused metrics
            assert metrics == pytest.approx({k: result.trial(t).metrics[k] for k in metrics}, rel=1e-5)
    restorer, _, _ = stored_model(CheckpointStore(path), "fused", 2)
    assert restorer.fused and study._restorer.fused  # the study recorded that it trained fused
    assert_same(dt.open_results(path, "fused").state_dict(2), states[2])
