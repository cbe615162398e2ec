"""Surrogate studies (`dt.SurrogateStudy`): the search runs on the scaled trainer, the target
trains the transferred best once, eager transfer restarts the target when the best changes,
and a search varying what does not transfer is warned about."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
from scaled_digits import ScaledDigitsTrainer

import dagtune as dt
from dagtune.algos import ASHA, PBT, GridSearch, Hyperband, MedianStopping
from dagtune.config import config_dumps
from dagtune.launch import load_setup
from dagtune.records import COMPLETED, STOPPED
from dagtune.sim import SimulatedExecutor, SyntheticTrainer

LRS = [0.002, 0.005, 0.01, 0.02]  # better and better over 6 steps, none diverging


class ScaledSynthetic(SyntheticTrainer):
    """The synthetic trainer with a width `scale`: a narrower model is a noisier one."""

    def __init__(self, scale: int = 1, seed: int = 0):
        super().__init__(noise=0.05 * scale, seed=seed)
        self.scale = scale


def _surrogate_study(surrogate: dt.Surrogate, workers: int = 1, **kwargs) -> dt.SurrogateStudy:
    return dt.SurrogateStudy(
        ScaledSynthetic,
        surrogate=surrogate,
        executor=SimulatedExecutor(workers),
        target_executor=SimulatedExecutor(1),
        **kwargs,
    )


def test_the_search_runs_on_the_scaled_trainer_and_the_target_trains_its_best_once():
    study = _surrogate_study(dt.Surrogate(scale=8))
    result = study.run(GridSearch(dt.Grid({"lr": LRS}), "val_loss", "min", steps=6))
    assert study.surrogate_study.trainer_kwargs == {"scale": 8}
    assert study.target_study.trainer_kwargs == {}
    assert study.target_study.name == "study-target"
    assert len(result.surrogate._trials) == len(LRS)
    best = result.surrogate.best
    assert config_dumps(result.config) == config_dumps(best.config)
    assert len(study.target_study.trials) == 1 and result.restarts == 0
    alone = dt.run_alone(ScaledSynthetic, {"lr": best.config["lr"]}, 6)
    assert result.target.metrics == alone[-1] and result.target.steps == 6
    surrogate_alone = dt.run_alone(ScaledSynthetic, {"lr": best.config["lr"]}, 6, {"scale": 8})
    assert best.metrics == surrogate_alone[-1] != alone[-1]
    assert result.target_report["trial_steps"] == 6


def test_steps_gives_the_target_its_own_budget():
    study = _surrogate_study(dt.Surrogate(scale=4, steps=9))
    result = study.run(GridSearch(dt.Grid({"lr": LRS}), "val_loss", "min", steps=3))
    assert result.target.steps == 9 and result.surrogate.best.steps == 3


def test_eager_transfer_starts_the_target_early_and_restarts_it_when_the_best_changes():
    """3 search slots, 4 trials: the first three end together, the last one then leaves two
    slots idle, where the target starts with the best of three; the last one is better."""
    study = _surrogate_study(dt.Surrogate(scale=2, eager=0.25), workers=3)
    result = study.run(GridSearch(dt.Grid({"lr": LRS}), "val_loss", "min", steps=6))
    targets = [t.trial for t in study.target_study.trials]
    assert targets[0].config["lr"](0) == LRS[2]  # the best of the first three
    assert result.restarts == len(targets) - 1 >= 1  # the best changed after the first trial ended
    assert all(t.status in (STOPPED, COMPLETED) for t in targets[:-1])
    assert targets[-1].status == COMPLETED and targets[-1].id == result.target.id
    assert config_dumps(targets[-1].config) == config_dumps(result.surrogate.best.config)
    assert len({config_dumps(t.config) for t in targets}) == len(targets)  # each a new best


def test_eager_transfer_of_the_final_best_trains_the_target_once():
    study = _surrogate_study(dt.Surrogate(scale=2, eager=1.0))
    result = study.run(GridSearch(dt.Grid({"lr": LRS}), "val_loss", "min", steps=6))
    assert result.restarts == 0 and len(study.target_study.trials) == 1


def test_eager_transfer_waits_for_a_slot_the_search_leaves_idle():
    """One search slot, always busy until the search ends: the target never takes it early
    (it would compete with the search), so it trains the final best once."""
    study = _surrogate_study(dt.Surrogate(scale=2, eager=0.25))
    result = study.run(GridSearch(dt.Grid({"lr": LRS}), "val_loss", "min", steps=6))
    assert result.restarts == 0 and len(study.target_study.trials) == 1
    assert result.config["lr"](0) == LRS[-1]


def test_asha_on_the_surrogate_transfers_a_config_trained_to_max_steps():
    study = _surrogate_study(dt.Surrogate(scale=4, eager=0.5))
    space = dt.Grid({"lr": LRS, "momentum": [0.0, 0.5]})
    result = study.run(ASHA(space, "val_loss", "min", max_steps=9, min_steps=1, eta=3))
    assert result.surrogate.best.steps == 9 and result.target.steps == 9
    assert config_dumps(result.config) == config_dumps(result.surrogate.best.config)
    alone = dt.run_alone(ScaledSynthetic, result.config, 9)
    assert result.target.metrics == alone[-1]


@pytest.mark.parametrize(
    "make",
    [
        lambda space: Hyperband(space, "val_loss", "min", max_steps=9, eta=3),
        lambda space: MedianStopping(space, "val_loss", "min", max_steps=6, grace=2, min_samples=2),
        lambda space: PBT(space, "val_loss", "min", max_steps=8, interval=2, population=4, seed=0),
    ],
    ids=["Hyperband", "MedianStopping", "PBT"],
)
def test_other_algorithms_transfer_what_they_answer(make):
    study = _surrogate_study(dt.Surrogate(scale=4, eager=0.5))
    result = study.run(make(dt.Grid({"lr": LRS, "momentum": [0.0, 0.5]})))
    best = result.surrogate.best
    assert config_dumps(result.config) == config_dumps(best.config) and result.target.steps == best.steps
    assert result.target.metrics == dt.run_alone(ScaledSynthetic, result.config, best.steps)[-1]


def test_a_search_varying_what_does_not_transfer_is_warned_about():
    study = _surrogate_study(dt.Surrogate(scale=2))
    space = dt.Grid({"lr": LRS[:2], "weight_decay": [0.0, 1e-3]})
    with pytest.warns(UserWarning, match=r"varies weight_decay, which .*not transfer"):
        study.run(GridSearch(space, "val_loss", "min", steps=2))
    study = _surrogate_study(dt.Surrogate(scale=2, not_transferred=("momentum",)))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # weight_decay is not in this study's list; fixed momentum is fine
        study.run(
            GridSearch(
                dt.Grid({"lr": LRS[:2], "weight_decay": [0.0, 1e-3], "momentum": [0.5]}),
                "val_loss",
                "min",
                steps=2,
            )
        )


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"scale": 1}, r"Surrogate.scale must be an int >= 2 .*got 1"),
        ({"scale": True}, r"Surrogate.scale .*got True"),
        ({"scale": 2.0}, r"Surrogate.scale .*got 2.0"),
        ({"argument": "the width"}, r"Surrogate.argument .*got 'the width'"),
        ({"eager": 0}, r"Surrogate.eager must be None or a share in \(0, 1\], got 0"),
        ({"eager": 1.5}, r"Surrogate.eager .*got 1.5"),
        ({"steps": 0}, r"Surrogate.steps must be a positive int or None, got 0"),
        ({"not_transferred": "dropout"}, r"Surrogate.not_transferred must be a tuple .*got 'dropout'"),
        ({"not_transferred": ("dropout", 3)}, r"Surrogate.not_transferred holds 3"),
    ],
)
def test_bad_surrogates_are_refused_naming_the_field(kwargs, message):
    with pytest.raises(ValueError, match=message):
        dt.Surrogate(**kwargs)


def test_bad_surrogate_studies_are_refused_naming_the_field():
    with pytest.raises(ValueError, match=r"Surrogate.argument='width' is not an argument of ScaledSynthetic"):
        _surrogate_study(dt.Surrogate(argument="width"))
    with pytest.raises(
        ValueError, match=r"trainer_kwargs\['scale'\] = 2: the trainer arguments are the target's"
    ):
        _surrogate_study(dt.Surrogate(), trainer_kwargs={"scale": 2})
    with pytest.raises(ValueError, match=r"executor is given but target_executor is None"):
        dt.SurrogateStudy(ScaledSynthetic, executor=SimulatedExecutor(1))
    with pytest.raises(ValueError, match=r"name must be 1-121 .*got 'x{122}'"):
        _surrogate_study(dt.Surrogate(), name="x" * 122)
    with pytest.raises(TypeError, match=r"surrogate must be a dagtune.Surrogate, got 8"):
        dt.SurrogateStudy(ScaledSynthetic, surrogate=8)


def test_on_dask_the_surrogate_and_the_eager_target_share_the_cluster_and_resume(client, tmp_path):
    """A digits CNN of 16 channels, searched at 4 (S=4) on the test cluster; run again, both
    studies resume and train nothing."""
    kwargs = {"base": 16, "split_seed": 0}
    space = dt.Grid({"lr": [0.05, 0.2], "momentum": [0.9]})

    def run():
        with dt.SurrogateStudy(
            ScaledDigitsTrainer,
            kwargs,
            dt.Surrogate(scale=4, eager=0.5),
            name="digits",
            storage=tmp_path,
            client=client,
            resources={"GPU": 1},
        ) as study:
            return study.run(GridSearch(space, "val_loss", "min", steps=2), timeout=120)

    first = run()
    best = first.surrogate.best
    alone = dt.run_alone(ScaledDigitsTrainer, best.config, 2, kwargs)
    assert first.target.metrics == alone[-1]
    assert (
        first.surrogate.best.metrics
        == dt.run_alone(ScaledDigitsTrainer, best.config, 2, {**kwargs, "scale": 4})[-1]
    )
    again = run()
    assert again.surrogate.report["executed_steps"] == 0 and again.target_report["executed_steps"] == 0
    assert again.target.metrics == first.target.metrics


def test_the_example_searches_the_surrogate_and_trains_the_target(client, tmp_path):
    """examples/surrogate.py, small: a 2x1 grid of 2 epochs on a 16-channel CNN at scale 4."""
    from surrogate import search_space, study_setup, tune

    setup = load_setup(str(Path(__file__).resolve().parents[1] / "examples" / "surrogate.py"))
    assert setup.surrogate == dt.Surrogate(scale=8, eager=0.5) and setup.name == study_setup().name
    space = search_space(range(-3, -1), (0.9,))
    result = tune(4, 2, str(tmp_path), space=space, base=16, client=client, resources={"GPU": 1})
    assert len(result.surrogate.trials) == 2 and result.target.steps == 2
    assert config_dumps(result.config) == config_dumps(result.surrogate.best.config)
    assert result.target.metrics == dt.run_alone(ScaledDigitsTrainer, result.config, 2, {"base": 16})[-1]


def test_a_scale_that_does_not_divide_the_width_is_refused_when_the_study_is_built():
    """Surrogate(scale=3) of a base width of 512: the cause, at once, not in failed trials."""
    with pytest.raises(ValueError, match=r"scale=3.*512 / scale 3 = 170\.667 is not a whole width"):
        dt.SurrogateStudy(
            ScaledDigitsTrainer,
            {"base": 512},
            dt.Surrogate(scale=3),
            executor=SimulatedExecutor(1),
            target_executor=SimulatedExecutor(1),
        )
