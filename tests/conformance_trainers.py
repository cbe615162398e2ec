"""Trainers of the executor conformance suite (a module Dask workers import by name)."""

from __future__ import annotations

from dagtune.sim import SyntheticTrainer


class FailingTrainer(SyntheticTrainer):
    """`SyntheticTrainer` whose third step raises for a learning rate of 0.3 or more: the
    same error, at the same step, on every executor and every retry."""

    def train(self) -> dict:
        if float(self.hp["lr"]) >= 0.3 and self.step == 2:
            raise RuntimeError("this learning rate is refused at step 3")
        return super().train()
