"""A tuning algorithm of your own in a few lines: successive doubling on a simulated cluster.

An algorithm is a policy written against `dagtune.algos.Algorithm`; the study calls it back and
applies the decisions it returns (it never trains or waits itself):

- callbacks: ``start(ctx)`` (``ctx.slots``, ``ctx.seed``), ``on_result(trial, step, metrics)``,
  ``on_complete(trial)``, ``on_end(trial)`` (stopped, failed or diverged), ``is_finished()``;
- decisions: ``Submit(config, steps, tag)``, ``Extend(trial_id, steps)`` (from its checkpoint), ``Stop(id)``;
- helpers: ``self.trials``, ``self.completed``, ``self.top(trials, k)``, ``self.check_metric``.

Run ``python examples/custom_algorithm.py``: 16 configs on 4 simulated workers, in virtual time.
"""

import dagtune as dt
from dagtune.algos import Algorithm, Extend, Submit
from dagtune.sim import SimulatedExecutor, SyntheticTrainer


class SuccessiveDoubling(Algorithm):
    """Train every config `steps` steps, then the better half twice as long, until one is left."""

    def __init__(self, space, metric, mode="max", steps=2):
        super().__init__(metric, mode)
        self.configs, self.steps = list(space), steps

    def start(self, ctx):
        return [Submit(config, self.steps) for config in self.configs]

    def on_result(self, trial, step, metrics):  # a clear error if `metric` is not reported
        self.check_metric(metrics)

    def on_complete(self, trial):
        waiting = len(self.trials) < len(self.configs) or any(t.status == "pending" for t in self.trials)
        rung = [t for t in self.completed if t.steps == self.steps]
        if waiting or len(rung) <= 1:
            return []  # the rung is not done yet, or one config is left (and the run ends)
        self.steps *= 2
        return [Extend(t.id, self.steps) for t in self.top(rung, len(rung) // 2)]

    on_end = on_complete


if __name__ == "__main__":
    lr = [0.01, 0.03, 0.1, dt.MultiStep(0.1, [8], 0.3)]
    space = dt.Grid({"lr": lr, "momentum": [0.0, 0.5], "batch_size": [128, dt.Steps([128, 256], [4])]})
    study = dt.Study(SyntheticTrainer, executor=SimulatedExecutor(4))
    res = study.run(SuccessiveDoubling(space, "val_loss", "min"))
    print(f"best val_loss {res.best.metrics['val_loss']:.4f} at {res.best.steps} steps: {res.best.config}")
    print(res.report)  # trial steps vs unique and executed steps: each shared prefix trained once
