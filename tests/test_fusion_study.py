"""Fused studies (`Study(..., fuse=...)`): the coordinator groups the paths of a round into
fused tasks, each trial's metrics are exactly ``run_alone(..., fused=True)``'s.

In simulation (real training, virtual time) and on a real 2-worker Dask LocalCluster."""

from __future__ import annotations

import warnings

import pytest
import torch
from fusion_helpers import Kinds, Square, TinyCNN, TinyMLP, task
from torch import nn
from torch.nn import functional as F  # noqa: N812

import dagtune as dt
from dagtune.algos import GridSearch
from dagtune.coordinator._fusion import Fusion
from dagtune.fusion import can_fuse
from dagtune.sim import SimulatedExecutor, SyntheticTrainer
from dagtune.study import Study, run_alone

STEPS = 5
# two lr schedules branch off one prefix at step 2, two momenta, and a batch-size branch at 3
# (not fusible): 8 trials on one stage tree
SPACE = dt.Grid(
    {
        "lr": [dt.Steps([0.1, 0.05], [2]), dt.Steps([0.1, 0.02], [2])],
        "momentum": [0.9, 0.5],
        "batch_size": [32, dt.Steps([32, 64], [3])],
    }
)


class Recording(SimulatedExecutor):
    """Keeps the tasks of every launch: singles and fused groups."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.launches: list[list] = []

    def launch(self, task, priority=0.0, prefer=None):
        self.launches.append([task])
        super().launch(task, priority, prefer)

    def launch_group(self, tasks, priority=0.0, prefer=None):
        self.launches.append(list(tasks))
        super().launch_group(tasks, priority, prefer)


def fused_study(fuse, workers=2, trainer=TinyMLP, **kwargs) -> Study:
    return Study(trainer, executor=Recording(workers), fuse=fuse, **kwargs)


def curves(study: Study) -> dict[str, list[dict]]:
    return {repr(t.config): [m for _, m in t.curve] for t in study.coordinator.trials.values()}


def test_a_fused_grid_trains_each_trial_as_run_alone_fused_and_each_prefix_once():
    study = fused_study(4)
    report = study.run(GridSearch(SPACE, metric="val_acc", steps=STEPS)).report
    assert report["executed_steps"] == report["unique_steps"] == dt.unique_steps((c, STEPS) for c in SPACE)
    launches = study.executor.launches
    assert all(len(group) <= 4 for group in launches) and max(map(len, launches)) > 1
    for group in launches:
        assert all(can_fuse(a, b) for a in group for b in group if a is not b)
    for trial in study.coordinator.trials.values():
        assert trial.status == "completed"
        assert [m for _, m in trial.curve] == run_alone(TinyMLP, trial.config, STEPS, fused=True), (
            trial.config
        )


def test_fused_results_do_not_depend_on_the_fusion_count_or_the_workers():
    space = dt.Grid(
        {"lr": [0.1, 0.05, dt.Steps([0.1, 0.02], [2])], "momentum": [0.9, 0.0], "batch_size": [32]}
    )
    seen = []
    for fuse, workers in ((1, 1), (2, 2), (True, 1)):
        study = fused_study(fuse, workers)
        study.run(GridSearch(space, metric="val_acc", steps=3))
        widest = max(map(len, study.executor.launches))
        assert widest == fuse if fuse is not True else widest > 2  # True: F from memory, all 6 fit
        seen.append(curves(study))
    assert seen[0] == seen[1] == seen[2]


def test_a_non_fusible_difference_is_never_fused():
    study = fused_study(8)
    study.run(GridSearch(dt.Grid({"lr": [0.1], "batch_size": [16, 32, 64]}), metric="val_acc", steps=2))
    assert [len(group) for group in study.executor.launches] == [1, 1, 1]


def test_fused_rounds_are_charged_by_the_simple_model():
    """A round of K members costs the costliest step times 1 + 0.1 (K - 1); each member's
    step carries its share, so the cost model learns a member's share."""
    study = fused_study(4, workers=1)
    study.run(
        GridSearch(dt.Grid({"lr": [0.1, 0.2, 0.3, 0.4], "batch_size": [32]}), metric="val_acc", steps=2)
    )
    assert study.executor.now() == pytest.approx(2 * 1.3)
    assert study.report["gpu_seconds"] == pytest.approx(2 * 1.3)


def test_the_simulated_group_takes_directives_per_member():
    """Trials submitted while a fused group runs make the coordinator ask its members for
    extra checkpoints (per member key); the results are still exact."""
    study = fused_study(2, workers=1)
    base = {"lr": 0.1, "momentum": 0.9, "batch_size": 32}
    first = [study.submit(base, 4), study.submit({**base, "lr": 0.05}, 4)]
    study.coordinator.pump()
    later = study.submit({**base, "lr": dt.Steps([0.1, 0.3], [2])}, 4)
    for handle in [*first, later]:
        handle.result()
    assert study.report["executed_steps"] == study.report["unique_steps"] == 4 + 4 + 2
    for handle in [*first, later]:
        trial = handle.trial
        assert [m for _, m in trial.curve] == run_alone(TinyMLP, trial.config, 4, fused=True)


def test_a_cnn_study_fuses_exactly_as_run_alone_fused():
    space = dt.Grid({"lr": [0.1, dt.Steps([0.1, 0.02], [1])], "momentum": [0.9], "batch_size": [32]})
    study = fused_study(True, trainer=TinyCNN)
    study.run(GridSearch(space, metric="val_acc", steps=2))
    for trial in study.coordinator.trials.values():
        assert [m for _, m in trial.curve] == run_alone(TinyCNN, trial.config, 2, fused=True)


@pytest.mark.parametrize("fuse", [0, -1, 2.0, "2", None])
def test_fuse_must_be_a_bool_or_a_positive_int(fuse):
    with pytest.raises(ValueError, match=f"fuse must be False, True .* got {fuse!r}"):
        Study(TinyMLP, executor=SimulatedExecutor(1), fuse=fuse)


def test_fuse_needs_a_fusible_trainer():
    with pytest.raises(
        ValueError, match=r"fuse=True needs a dagtune\.FusibleTrainer; SyntheticTrainer is not one"
    ):
        Study(SyntheticTrainer, executor=SimulatedExecutor(1), fuse=True)


# --------------------------------------------------------------------------- on Dask


def recording_groups(study: Study) -> list[int]:
    """The sizes of the fused tasks `study`'s Dask executor launches from now on."""
    sizes: list[int] = []
    launch_group = study.executor.launch_group

    def record(tasks, priority=0.0, prefer=None):
        sizes.append(len(tasks))
        launch_group(tasks, priority, prefer)

    study.executor.launch_group = record
    return sizes


def dask_study(client, tmp_path, name: str, fuse) -> Study:
    return Study(TinyMLP, name=name, storage=tmp_path, client=client, resources={"GPU": 1}, fuse=fuse)


@pytest.mark.slow
def test_a_fused_grid_on_dask_is_run_alone_fused_and_trains_each_prefix_once(client, tmp_path):
    with dask_study(client, tmp_path, "fused", 4) as study:
        sizes = recording_groups(study)
        report = study.run(GridSearch(SPACE, metric="val_acc", steps=STEPS), timeout=120).report
        assert (
            report["executed_steps"] == report["unique_steps"] == dt.unique_steps((c, STEPS) for c in SPACE)
        )
        assert max(sizes) > 1 and all(size <= 4 for size in sizes)
        trials = list(study.coordinator.trials.values())
        assert len(trials) == 8 and all(t.status == "completed" for t in trials)
        for trial in trials:
            assert [step for step, _ in trial.curve] == list(range(1, STEPS + 1))
            assert [m for _, m in trial.curve] == run_alone(TinyMLP, trial.config, STEPS, fused=True)


@pytest.mark.slow
@pytest.mark.parametrize(
    "first, then", [(4, False), (False, 4)], ids=["fused-then-unfused", "unfused-then-fused"]
)
def test_a_study_resumes_the_checkpoints_of_the_other_kind(client, tmp_path, first, then):
    """Studies of one model share their plan: the second trains on from the first's step-3
    checkpoints (fused ones unfused, or the reverse). The 30-64-2 MLP trains fused bit for bit
    as unfused, so every curve is run_alone's."""
    space = dt.Grid({"lr": [0.1, 0.05], "momentum": [0.9, 0.5], "batch_size": [32]})
    with dask_study(client, tmp_path, "first", first) as study:
        study.run(GridSearch(space, metric="val_acc", steps=3), timeout=120)
    with dask_study(client, tmp_path, "then", then) as study:
        sizes = recording_groups(study)
        report = study.run(GridSearch(space, metric="val_acc", steps=STEPS), timeout=120).report
        assert report["executed_steps"] == 4 * (STEPS - 3)  # only the steps after the checkpoints
        loads = study.coordinator.loads  # a worker may still hold a trainer the first left live
        assert loads["storage"] + loads["memory"] == 4 and loads["storage"] > 0
        assert (max(sizes, default=0) > 1) == bool(then)  # unfused: no fused task at all
        for trial in study.coordinator.trials.values():
            alone = run_alone(TinyMLP, trial.config, STEPS)
            assert alone == run_alone(TinyMLP, trial.config, STEPS, fused=True)
            assert [m for _, m in trial.curve] == alone


def test_a_failing_member_fails_alone_on_its_retry():
    """A trainer's error in a fused task ends every member (whose it was is unknown); the
    retries run alone, so only the trial at fault fails."""
    study = fused_study(4, workers=1, max_retries=1)
    space = [{"lr": lr, "momentum": 0.9, "batch_size": 32} for lr in (0.1, "fast", 0.2)]  # "fast": no number
    study.run(GridSearch(space, metric="val_acc", steps=2))
    statuses = {t.config["lr"](0): t.status for t in study.coordinator.trials.values()}
    assert statuses == {0.1: "completed", "fast": "failed", 0.2: "completed"}
    assert [len(group) for group in study.executor.launches] == [3, 1, 1, 1]
    (failed,) = [t for t in study.coordinator.trials.values() if t.status == "failed"]
    assert (
        "hyper-parameter 'lr' sets an optimizer field and needs a finite number, got 'fast'" in failed.error
    )
    for trial in study.coordinator.trials.values():
        if trial.status == "completed":
            assert [m for _, m in trial.curve] == run_alone(TinyMLP, trial.config, 2, fused=True)


# --------------------------------------------------------------------------- the grouping


class ScriptedMemory:
    """A memory probe with scripted peaks (it still runs what it measures)."""

    def __init__(self, peaks: list[int], available: int):
        self.peaks, self.free = list(peaks), available

    def peak(self, run) -> int:
        run()
        return self.peaks.pop(0)

    def available(self) -> int:
        return self.free


def test_fuse_true_measures_f_once_per_non_fusible_start_values():
    probe = ScriptedMemory([1000, 1500, 1500, 2500], available=3000)  # F = 5, then F = 2
    fusion = Fusion(True, task("t", {"lr": 0.1}, 2).trainer, slots=lambda: 1, probe=probe)
    tasks = [task(f"t{i}", {"lr": 0.1 * (i + 1), "batch_size": 32}, 2, node=i) for i in range(7)]
    assert fusion.groups(tasks, free=1) == [[0, 1, 2, 3, 4]]  # base 500 + 500 per member fits 5
    assert fusion.groups(tasks, free=4) == [[0, 1], [2, 3], [4, 5], [6]]  # spread over the slots
    wide = [task(f"w{i}", {"lr": 0.1 * (i + 1), "batch_size": 64}, 2, node=10 + i) for i in range(3)]
    assert fusion.groups(wide, free=1) == [[0, 1]]  # batch 64: measured again, 500 + 1000 each
    assert fusion.paths_wanted(2) == 2 * 5 and not probe.peaks  # measured twice, not more


def test_fusion_off_or_capped_measures_nothing():
    tasks = [task(f"t{i}", {"lr": 0.1 * (i + 1), "batch_size": 32}, 2, node=i) for i in range(5)]
    spec = tasks[0].trainer
    off = Fusion(False, spec, slots=lambda: 2)
    assert not off.on and off.paths_wanted(3) == 3 and off.groups(tasks, free=3) == [[0], [1], [2]]
    capped = Fusion(2, spec, slots=lambda: 2, probe=None)
    assert capped.paths_wanted(3) == 6 and capped.groups(tasks, free=3) == [[0, 1], [2, 3], [4]]


def test_asha_and_pbt_fused_give_each_trial_run_alone_fused():
    """Rungs (trials completing, then extended from their checkpoints) and exploits
    (branches from another trial's checkpoint) on fused tasks."""
    space = dt.Random(
        {"lr": dt.loguniform(0.01, 0.3), "momentum": dt.uniform(0.1, 0.9), "batch_size": 32}, n=8
    )
    for algorithm in (
        dt.algos.ASHA(space, "val_loss", "min", max_steps=6, min_steps=2, eta=2),
        dt.algos.PBT(space, "val_loss", "min", max_steps=6, interval=2, population=4, seed=3),
    ):
        study = fused_study(4)
        study.run(algorithm)
        assert max(map(len, study.executor.launches)) > 1
        for trial in study.coordinator.trials.values():
            steps = [step for step, _ in trial.curve]
            assert steps == list(range(1, trial.reached + 1))
            alone = run_alone(TinyMLP, trial.config, trial.reached, fused=True)
            assert [m for _, m in trial.curve] == alone, type(algorithm).__name__


@pytest.mark.parametrize("share", [-0.1, 1.5])
def test_the_simulated_fused_cost_is_a_share_of_a_step(share):
    with pytest.raises(ValueError, match=f"fused_member_seconds must be in \\[0, 1\\], got {share}"):
        SimulatedExecutor(1, fused_member_seconds=share)


# --------------------------------------------------------------------------- real models, the check


class LateSquare(Kinds):
    """A custom op vmap cannot batch, used only from step 2 on (hyper-parameter `square`):
    the check at the start passes, the fused step fails later."""

    def __init__(self, seed: int = 0, **optimizer):
        super().__init__("custom-op", seed, **optimizer)
        self.square = False

    def make_model(self, features, hidden):
        self.head = nn.Linear(32, 16)
        self.out = nn.Linear(16, 2)
        return nn.Sequential(self.head, self.out)

    def apply(self, name, value):
        if name == "square":
            self.square = bool(value)
        else:
            super().apply(name, value)

    def loss(self, model, batch):
        x, y = batch
        if not self.square:
            return F.cross_entropy(model(x), y, reduction="none")
        return F.cross_entropy(model(Square.apply(x)), y, reduction="none")


# 6 trials, 4 root stages (two share lr 0.05 until a branch at step 1): on 2 slots the roots
# fuse 2 and 2 whatever the timing
KIND_SPACE = dt.Grid(
    {"lr": [dt.Steps([0.05, 0.02], [1]), 0.05, 0.1], "momentum": [0.9, 0.5], "batch_size": [32]}
)


def trials_of(study: Study) -> list:
    return list(study.coordinator.trials.values())


def test_a_trainer_that_cannot_fuse_trains_unfused_with_a_warning_naming_the_op():
    study = fused_study(4, trainer=Kinds, trainer_kwargs={"kind": "custom-op"})
    with pytest.warns(dt.FusionWarning, match=r"in module '1' \(Squared\).*autograd\.Function Square"):
        report = study.run(GridSearch(KIND_SPACE, metric="val_acc", steps=3)).report
    assert "Squared" in study.coordinator.fusion.refused
    assert report["executed_steps"] == report["unique_steps"]  # the check trained nothing
    for trial in trials_of(study):
        assert trial.status == "completed"
        alone = run_alone(Kinds, trial.config, 3, {"kind": "custom-op"})
        assert [m for _, m in trial.curve] == alone
    assert report["fused_tasks"] == sum(report["group_sizes"].values()) >= 1  # the checking launches


def test_an_op_that_fails_fused_later_turns_fusion_off_and_the_trials_finish_unfused():
    space = [{"lr": lr, "square": dt.Steps([0, 1], [2]), "batch_size": 32} for lr in (0.05, 0.02)]
    study = fused_study(4, trainer=LateSquare)
    with pytest.warns(dt.FusionWarning, match="a fused step failed: RuntimeError"):
        study.run(GridSearch(space, metric="val_acc", steps=4))
    assert all(trial.status == "completed" for trial in trials_of(study))


class Switch(nn.Module):
    """Squares its input with a custom op vmap cannot batch once switched on."""

    def __init__(self):
        super().__init__()
        self.on = False

    def forward(self, x):
        return Square.apply(x) if self.on else x


class LateSwitch(Kinds):
    """`Switch` inside the model, switched on from step 2 (hyper-parameter `square`)."""

    def make_model(self, features, hidden):
        self.switch = Switch()
        return nn.Sequential(nn.Linear(32, 16), self.switch, nn.Linear(16, 2))

    def apply(self, name, value):
        if name == "square":
            self.switch.on = bool(value)
        else:
            super().apply(name, value)


def test_a_fused_step_failing_later_in_a_module_names_it_in_the_warning():
    space = [{"lr": lr, "square": dt.Steps([0, 1], [2]), "batch_size": 32} for lr in (0.05, 0.02)]
    study = fused_study(4, trainer=LateSwitch)
    with pytest.warns(
        dt.FusionWarning,
        match=r"a fused step failed: in module '1' \(Switch\): RuntimeError.*autograd\.Function Square",
    ):
        study.run(GridSearch(space, metric="val_acc", steps=4))
    assert all(trial.status == "completed" for trial in trials_of(study))


class HandDropoutTrainer(Kinds):
    """Dropout written by hand on a transposed view: its fused noise lands elsewhere."""

    def make_model(self, features, hidden):
        return nn.Sequential(nn.Linear(32, 16), HandDropout(), nn.ReLU(), nn.Linear(16, 2))


class HandDropout(nn.Module):
    def forward(self, x):
        if not self.training:
            return x
        view = x.view(x.shape[0], 4, 4).transpose(0, 1)
        return (view * torch.empty_like(view).bernoulli_(0.5) * 2).transpose(0, 1).reshape(x.shape[0], 16)


def test_a_first_batch_that_disagrees_with_unfused_training_turns_fusion_off_unless_unchecked():
    space = dt.Grid({"lr": [0.05, 0.02], "batch_size": [32]})
    # one worker: the simulator interleaves its workers' steps in this process, and unfused
    # tasks drawing random numbers (this dropout) would draw from each other's generator state
    checked = fused_study(4, workers=1, trainer=HandDropoutTrainer)
    with pytest.warns(dt.FusionWarning, match=r"does not agree with unfused training.*'1' \(HandDropout\)"):
        checked.run(GridSearch(space, metric="val_acc", steps=2))
    for trial in trials_of(checked):
        assert [m for _, m in trial.curve] == run_alone(HandDropoutTrainer, trial.config, 2)
    unchecked = fused_study(4, workers=1, trainer=HandDropoutTrainer, fusion_check=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error", dt.FusionWarning)  # the probe alone passes it
        report = unchecked.run(GridSearch(space, metric="val_acc", steps=2)).report
    assert report["group_sizes"] == {2: 1} and unchecked.coordinator.fusion.refused is None


def test_the_report_counts_the_fused_tasks_by_size():
    study = fused_study(4)
    report = study.run(GridSearch(SPACE, metric="val_acc", steps=STEPS)).report
    sizes = [len(group) for group in study.executor.launches]
    assert report["group_sizes"] == {k: sizes.count(k) for k in sorted(set(sizes))}
    assert report["fused_tasks"] == len(sizes)
    assert report["mean_group_size"] == pytest.approx(sum(sizes) / len(sizes))
    unfused = Study(TinyMLP, executor=SimulatedExecutor(2)).run(GridSearch(SPACE, "val_acc", steps=2)).report
    assert "fused_tasks" not in unfused  # a study without fusion reports what it always did


def test_a_group_with_room_waits_a_step_for_members_about_to_be_ready():
    """Two roots on 3 slots, one slower (momentum 0.5: 1.3 s a step): at 2.0 s the faster one's
    second branch is ready, the slower one's at 2.6 s; the first waits for it and both branches
    train as one group of 2 (not 1 and 1)."""
    cost = lambda values: 1.0 if values["momentum"] == 0.9 else 1.3  # noqa: E731
    study = Study(TinyMLP, executor=Recording(3, cost), fuse=4, fusion_check=False)
    configs = [
        {"momentum": momentum, "lr": dt.Steps([0.1, lr], [2]), "batch_size": 32}
        for momentum in (0.9, 0.5)
        for lr in (0.05, 0.02)
    ]
    handles = [study.submit(config, 4) for config in configs]
    for handle in handles:
        handle.result()
    starts = [(group[0].start, len(group)) for group in study.executor.launches]
    assert starts == [(0, 1), (0, 1), (2, 2)]
    assert study.report["executed_steps"] == study.report["unique_steps"]
    for handle in handles:
        assert [m for _, m in handle.trial.curve] == run_alone(TinyMLP, handle.trial.config, 4, fused=True)


# --------------------------------------------------------------------------- real models on Dask


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["batchnorm2d", "transformer", "gru", "running-mean"])
def test_fused_studies_of_real_models_on_dask_are_run_alone_fused(client, tmp_path, kind):
    """A BatchNorm CNN, a Transformer layer with dropout 0.1, a GRU and a buffer re-assigned
    in forward, each a fused grid on the real cluster: every trial bit for bit
    run_alone(fused=True), each unique step trained once, fusion never refused."""
    with Study(
        Kinds, {"kind": kind}, name=kind, storage=tmp_path, client=client, resources={"GPU": 1}, fuse=4
    ) as study:
        report = study.run(GridSearch(KIND_SPACE, metric="val_acc", steps=3), timeout=180).report
        assert study.coordinator.fusion.refused is None
        assert (
            report["executed_steps"] == report["unique_steps"] == dt.unique_steps((c, 3) for c in KIND_SPACE)
        )
        assert max(report["group_sizes"]) > 1
        for trial in trials_of(study):
            assert trial.status == "completed"
            assert [m for _, m in trial.curve] == run_alone(
                Kinds, trial.config, 3, {"kind": kind}, fused=True
            )


@pytest.mark.slow
def test_a_custom_op_on_dask_trains_unfused_with_the_warning_in_this_process(client, tmp_path):
    with Study(
        Kinds, {"kind": "custom-op"}, name="op", storage=tmp_path, client=client, resources={"GPU": 1}, fuse=4
    ) as study:
        with pytest.warns(dt.FusionWarning, match=r"'1' \(Squared\)"):
            report = study.run(GridSearch(KIND_SPACE, metric="val_acc", steps=3), timeout=180).report
        assert report["executed_steps"] == report["unique_steps"]
        for trial in trials_of(study):
            assert trial.status == "completed"
            assert [m for _, m in trial.curve] == run_alone(Kinds, trial.config, 3, {"kind": "custom-op"})
