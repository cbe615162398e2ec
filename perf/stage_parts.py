"""Where one stage of `perf/all_three.py`'s trainer spends its CPU time, at S = 8 and at full width.

In this process, one thread, the benchmark's `ScaledCNN` (muP digits CNN, base width 128):
a stage's fixed parts as a worker runs them (building the trainer, saving its state as a
checkpoint into a `CheckpointStore` on local disk and loading it back, one evaluation) and
one epoch of training, split into the data batches, forward and backward, and the optimizer
step; and one fused epoch per member (`FusedGroup`) at K members, with the trainer's exact
kernels and with grouped ones.
Each figure is the median over `REPEATS` in CPU time (`time.process_time`), so other work
on the machine slows it little; a checkpoint's fsync waits for the disk and is not CPU time.

    PYTHONPATH=$PWD python perf/stage_parts.py
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from dagtune.checkpoints import CheckpointStore  # noqa: E402
from dagtune.fusion import FusedGroup  # noqa: E402
from dagtune.runner import checkpoint_state  # noqa: E402
from dagtune.trainer import build_trainer  # noqa: E402
from perf import all_three  # noqa: E402

REPEATS = 5
BASE = 128
IDENTITY = "0123abcd"  # a checkpoint identity (hex) of this script's own store
CONFIG = {"lr": 0.125, "momentum": all_three.MOMENTUM, "batch_size": all_three.BATCH_SIZE}


def cpu(call: Callable[..., Any], *args: Any) -> tuple[float, Any]:
    """The CPU seconds of ``call(*args)`` and what it returned."""
    began = time.process_time()
    value = call(*args)
    return time.process_time() - began, value


def one_stage(scale: int, store: CheckpointStore, node: str) -> dict[str, float]:
    """CPU seconds of each part of one stage of one epoch at width ``BASE / scale``."""
    parts: dict[str, float] = {}
    parts["build"], trainer = cpu(build_trainer, all_three.ScaledCNN, {"scale": scale, "base": BASE}, 0)
    trainer.setup(dict(CONFIG))
    parts["epoch"] = cpu(trainer.train)[0]
    parts["evaluate"] = cpu(trainer.evaluate)[0]
    state = checkpoint_state(trainer.state_dict(), [])
    parts["save"] = cpu(store.save, IDENTITY, node, 1, state)[0]
    parts["load"] = cpu(lambda: trainer.load_state_dict(store.load(IDENTITY, node, 1)["trainer"]))[0]
    return {**parts, **epoch_parts(trainer)}


def epoch_parts(trainer: Any) -> dict[str, float]:
    """One more epoch of `trainer`, by hand: CPU seconds of its data batches, forward and
    backward, and optimizer steps."""

    def backward(batch: Any) -> None:
        trainer.optimizer.zero_grad()
        trainer.loss(trainer.model, batch).mean().backward()

    parts = {"data": 0.0, "forward+backward": 0.0, "optimizer": 0.0}
    order = torch.randperm(len(trainer.train_y)).numpy()
    for start in range(0, len(order), all_three.BATCH_SIZE):
        seconds, batch = cpu(trainer.batch, order[start : start + all_three.BATCH_SIZE])
        parts["data"] += seconds
        parts["forward+backward"] += cpu(backward, batch)[0]
        parts["optimizer"] += cpu(trainer.optimizer.step)[0]
    return parts


def stage_parts(scale: int, store: CheckpointStore) -> dict[str, float]:
    """Median CPU seconds of each part of a stage of one epoch over `REPEATS`."""
    runs = [one_stage(scale, store, f"{scale * REPEATS + repeat:016x}") for repeat in range(REPEATS)]
    return {name: statistics.median(run[name] for run in runs) for name in runs[0]}


class GroupedCNN(all_three.ScaledCNN):
    """The benchmark's trainer with grouped fused kernels (its layers are subclasses of
    ``Conv2d`` and ``Readout``, so vmap's grouped path, not the one without vmap)."""

    fused_kernels = "grouped"


def fused_epoch(trainer: type, scale: int, members: int) -> float:
    """Median CPU seconds of one fused epoch per member at K = `members`."""
    host = build_trainer(trainer, {"scale": scale, "base": BASE}, 0)
    group = FusedGroup.from_states(host, [host.state_dict()] * members)
    group.setup([{**CONFIG, "lr": CONFIG["lr"] * (k + 1) / members} for k in range(members)])
    return statistics.median(cpu(group.train)[0] for _ in range(REPEATS)) / members


def main() -> None:
    torch.set_num_threads(1)
    store = CheckpointStore(tempfile.mkdtemp(prefix="dagtune-stage-parts-"))
    for scale in (all_three.SCALE, 1):
        parts = stage_parts(scale, store)
        shown = ", ".join(f"{name} {1000 * seconds:.1f}" for name, seconds in parts.items())
        print(f"width {BASE // scale} (S = {scale}), ms of CPU (median of {REPEATS}): {shown}")
    for trainer in (all_three.ScaledCNN, GroupedCNN):
        epochs = {k: fused_epoch(trainer, all_three.SCALE, k) for k in (1, 6, 12)}
        shown = ", ".join(f"K = {k} {1000 * seconds:.1f}" for k, seconds in epochs.items())
        print(
            f"width {BASE // all_three.SCALE}, fused, {trainer.fused_kernels} kernels, ms of CPU per "
            f"member-epoch (median of {REPEATS}): {shown}"
        )


if __name__ == "__main__":
    main()
