"""`dt.LightningTrainer`: an existing LightningModule tuned as it is, bit for bit `run_alone`."""

from __future__ import annotations

import pytest
import torch

import dagtune as dt
from dagtune.algos import GridSearch
from dagtune.checkpoints import CheckpointStore
from dagtune.sim import SimulatedExecutor

pl = pytest.importorskip("pytorch_lightning")

from lightning_digits import DigitsClassifier, DigitsTuning, search_space  # noqa: E402 - examples/

KWARGS = {"module_kwargs": {"hidden": 16}}


class Smoothed(DigitsClassifier):
    """Reads a hyper-parameter from ``self.hparams`` in every training step."""

    def __init__(self, label_smoothing: float = 0.0, **kwargs):
        super().__init__(**kwargs)
        self.save_hyperparameters()

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.cross_entropy(self(x), y, label_smoothing=self.hparams.label_smoothing)
        self.log("train_loss", loss)
        return loss


class SmoothedTuning(DigitsTuning):
    module_class = Smoothed
    module_hparams = ("label_smoothing",)


class Scheduled(DigitsClassifier):
    """Its optimizer comes with a per-batch LR schedule, in Lightning's dict form."""

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=7, gamma=0.7)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


class ScheduledTuning(DigitsTuning):
    module_class = Scheduled


class Manual(DigitsClassifier):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.automatic_optimization = False


class ManualTuning(DigitsTuning):
    module_class = Manual


def sim_study(path, trainer, kwargs, **options) -> dt.Study:
    """A simulated study with one slot: the simulator steps its tasks in turn in this process
    without swapping the global RNGs between them, which dropout draws from."""
    store = CheckpointStore(str(path))
    executor = SimulatedExecutor(1, store=store)
    return dt.Study(trainer, kwargs, name="lit", storage=str(path), executor=executor, **options)


def test_k_batches_per_step_resume_in_the_middle_of_an_epoch_exactly(tmp_path):
    kwargs = {**KWARGS, "batches_per_step": 7}  # 1438 samples / 64: an epoch is 23 batches
    configs = [
        {"lr": 0.05, "momentum": 0.9, "batch_size": 64},
        {"lr": dt.MultiStep(0.05, [3], 0.2), "momentum": 0.9, "batch_size": 64},
        {"lr": 0.05, "momentum": 0.9, "batch_size": dt.Steps([64, 32], [2])},
    ]
    with sim_study(tmp_path, DigitsTuning, kwargs) as study:
        result = study.run(GridSearch(configs, metric="val_acc", mode="max", steps=6))
        assert study.coordinator.loads["storage"] > 0  # branches resumed from checkpoints
    for trial, config in enumerate(configs):
        alone = dt.run_alone(DigitsTuning, config, 6, trainer_kwargs=kwargs)
        assert [m for _, m in result.curves[trial]] == alone


def test_hyper_parameters_go_to_param_groups_the_data_order_and_listed_hparams(tmp_path):
    config = {"lr": 0.02, "momentum": 0.5, "batch_size": 32, "label_smoothing": dt.Steps([0.0, 0.2], [1])}
    trainer = SmoothedTuning(**KWARGS)
    trainer.setup(dt.config.config_values(dt.config.normalize_config(config), 1))
    assert (
        trainer.optimizer.param_groups[0]["lr"] == 0.02
        and trainer.optimizer.param_groups[0]["momentum"] == 0.5
    )
    assert trainer.batches.batch_size == 32 and trainer.module.hparams.label_smoothing == 0.2
    alone = dt.run_alone(SmoothedTuning, config, 3, trainer_kwargs=KWARGS)
    with sim_study(tmp_path, SmoothedTuning, KWARGS) as study:
        assert study.submit(config, 3).result() == alone[-1]


def test_a_hyper_parameter_no_rule_knows_is_an_error_naming_it():
    with pytest.raises(dt.TrialError, match=r"hyper-parameter 'lrr' is not an optimizer setting"):
        dt.run_alone(DigitsTuning, {"lrr": 0.1}, 1, trainer_kwargs=KWARGS)
    # read only in __init__: setting it afterwards would change nothing, so it is refused
    with pytest.raises(dt.TrialError, match=r"'dropout'.*module_hparams \[\]"):
        dt.run_alone(DigitsTuning, {"dropout": 0.3}, 1, trainer_kwargs=KWARGS)


def test_the_modules_own_schedulers_step_and_resume_with_it(tmp_path):
    configs = [{"momentum": 0.9}, {"momentum": dt.Steps([0.9, 0.5], [2])}]
    with sim_study(tmp_path, ScheduledTuning, KWARGS) as study:
        result = study.run(GridSearch(configs, metric="val_acc", mode="max", steps=4))
    for trial, config in enumerate(configs):
        assert [m for _, m in result.curves[trial]] == dt.run_alone(
            ScheduledTuning, config, 4, trainer_kwargs=KWARGS
        )
    trainer = ScheduledTuning(**KWARGS)
    trainer.train()
    assert trainer.global_step == 23 and trainer.schedulers[0]["scheduler"].last_epoch == 23
    with pytest.raises(dt.TrialError, match=r"lr is tuned by dagtune.*also scheduled"):
        dt.run_alone(ScheduledTuning, {"lr": 0.1}, 1, trainer_kwargs=KWARGS)


def test_what_dagtune_cannot_drive_is_refused_when_the_trainer_is_built():
    with pytest.raises(ValueError, match="manual optimization"):
        ManualTuning(**KWARGS)
    with pytest.raises(ValueError, match="batches_per_step must be a positive int"):
        DigitsTuning(batches_per_step=0, **KWARGS)


@pytest.mark.slow
def test_the_lightning_example_is_exactly_run_alone_on_a_dask_cluster_with_storage(client, tmp_path):
    configs = list(search_space())
    steps = 5
    with dt.Study(DigitsTuning, KWARGS, name="lightning", storage=str(tmp_path), client=client) as study:
        result = study.run(GridSearch(configs, metric="val_acc", mode="max", steps=steps))
        report = result.report
    assert report["executed_steps"] == report["unique_steps"] == dt.unique_steps((c, steps) for c in configs)
    assert report["unique_steps"] < report["trial_steps"]  # prefixes were shared
    for trial, config in enumerate(configs):
        assert [m for _, m in result.curves[trial]] == dt.run_alone(
            DigitsTuning, config, steps, trainer_kwargs=KWARGS
        )
    best = result.best
    metrics = best.load_trainer().evaluate()
    assert metrics == {k: best.metrics[k] for k in metrics}
