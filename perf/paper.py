"""The paper's single studies (Hippo Table 1), simulated at the paper's scale.

Four studies (`perf/spaces.py`): ResNet56 with SHA and with ASHA (448 trials, reduction 4,
min 15, max 120 epochs), MobileNetV2 grid (240 trials, 120 epochs), BERT-Base grid (40
trials, 27,000 steps). Each runs on the simulated executor with 40 virtual GPUs three ways:
trial-based FIFO (every trial trained on its own, in submission order: what Ray Tune does),
dagtune with breadth-first stage scheduling, and dagtune with critical-path scheduling. The
training steps really run (on `SyntheticTrainer`, whose curves drive SHA/ASHA's decisions);
their durations come from the cost profile below.

Cost profile (per step on one K80, derived from the paper's Table 5: Ray Tune's GPU-hours
divided by the steps its trials trained): ResNet56 107 s/epoch and MobileNetV2 115 s/epoch
at batch size 128, 15% less per epoch at 256; BERT-Base 2.78 s per optimizer step at
sequence length 384, 45% more at 512; BERT trials train data-parallel on 4 GPUs (the paper
does so for models that do not fit one K80), so the 40 GPUs form 10 worker slots. Saving or loading a checkpoint costs 1 s (ResNet56),
2 s (MobileNetV2), 20 s (BERT), and starting a task 5 s. The paper trains the best trial 100
more epochs afterwards; that common tail is left out here.

Two lower bounds on the makespan are reported. The simple one, max(longest root-to-leaf path,
unique work / GPUs), assumes every step could start at once; it cannot be reached when a study
starts from a few root stages (the first decays and ramps branch late, so for the first hours
only a handful of stages exist for 40 GPUs). The precedence bound also respects that a step
cannot start before the steps before it on its path: max over t of (t + work that cannot start
before t / GPUs). For the grid studies dagtune's critical-path schedule comes within 5% of the
precedence bound; what remains is checkpoint and start-up overhead and list scheduling's
imperfection. SHA and ASHA decide as results arrive, so their bounds are computed for the trials
they ended up running and are looser still.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import dagtune as dt
from dagtune.algos import ASHA, GridSearch, SuccessiveHalving
from dagtune.config import config_values, normalize_config
from dagtune.plan import SearchPlan
from dagtune.sim import SimulatedExecutor, SyntheticTrainer
from perf import spaces

WORKERS = 40
PAPER = {  # Table 1 merge rates; Table 5 Ray Tune / Hippo-stage ratios
    "ResNet56 SHA": {"merge_rate": 2.447, "gpu_hours": 402.66 / 83.7, "end_to_end": 13.92 / 5.76},
    "ResNet56 ASHA": {"merge_rate": 2.447, "gpu_hours": 544.36 / 139.03, "end_to_end": 17.6 / 7.4},
    "MobileNetV2 grid": {"merge_rate": 3.144, "gpu_hours": 917.11 / 291.48, "end_to_end": 28.815 / 10.43},
    "BERT-Base grid": {"merge_rate": 2.045, "gpu_hours": 835.03 / 404.21, "end_to_end": 25.18 / 11.93},
}
SYSTEMS = (
    ("trial-based FIFO", False, "fifo"),
    ("dagtune BFS", True, "breadth_first"),
    ("dagtune critical path", True, "critical_path"),
)


@dataclass(frozen=True)
class PaperStudy:
    name: str
    space: Callable[[], dt.Grid]
    max_steps: int
    algorithm: str  # "grid", "sha" or "asha"
    step_seconds: Callable[[dict], float]
    checkpoint_seconds: float
    gpus_per_trial: int = 1


def _vision(per_epoch: float) -> Callable[[dict], float]:
    return lambda values: per_epoch * (0.85 if values.get("batch_size") == 256 else 1.0)


def _bert(values: dict) -> float:
    """Wall seconds of 100 optimizer steps on 4 data-parallel K80s (2.78 GPU-seconds a step)."""
    return spaces.BERT_STEP * 2.78 / 4 * (1.45 if values.get("seq_len") == 512 else 1.0)


STUDIES = (
    PaperStudy("ResNet56 SHA", spaces.resnet56_paper, 120, "sha", _vision(107.0), 1.0),
    PaperStudy("ResNet56 ASHA", spaces.resnet56_paper, 120, "asha", _vision(107.0), 1.0),
    PaperStudy("MobileNetV2 grid", spaces.mobilenetv2_paper, 120, "grid", _vision(115.0), 2.0),
    PaperStudy("BERT-Base grid", spaces.bert_paper, spaces.BERT_STEPS, "grid", _bert, 20.0, gpus_per_trial=4),
)


def _algorithm(study: PaperStudy, configs: list[dict]):
    if study.algorithm == "sha":
        return SuccessiveHalving(configs, "val_acc", "max", max_steps=study.max_steps, min_steps=15, eta=4)
    if study.algorithm == "asha":
        return ASHA(configs, "val_acc", "max", max_steps=study.max_steps, min_steps=15, eta=4)
    return GridSearch(configs, "val_acc", "max", steps=study.max_steps)


def lower_bound(
    trials: list[tuple[dict, int]], step_seconds: Callable[[dict], float], workers: int
) -> dict[str, float]:
    """Lower bounds on the makespan of training the unique steps of `trials`, in seconds.

    ``simple`` is the issue's max(longest root-to-leaf path, unique work / workers).
    ``precedence`` also respects that a step cannot start before every step before it on its
    path is trained: its earliest start is the time of that prefix, so for any time t the
    work that cannot start before t still needs (that work) / workers after t:
    max over t of (t + work(earliest start >= t) / workers). It is never below ``simple``.
    """
    plan = SearchPlan()
    reach: dict[str, int] = {}
    for config, steps in trials:
        node = plan.locate(normalize_config(config), steps, create=True)
        reach[node] = max(reach.get(node, 0), steps)
    earliest: dict[str, float] = {}  # node -> earliest start of its first step
    work: list[tuple[float, float]] = []  # (earliest start, seconds) of every unique step
    for node_id in plan.order:
        node = plan.nodes[node_id]
        start = 0.0
        if node.parent is not None:
            parent = plan.nodes[node.parent]
            start = earliest[parent.id] + sum(
                step_seconds(config_values(parent.config, t)) for t in range(parent.start, node.start)
            )
        earliest[node_id] = start
        end = max(reach.get(node_id, node.start), max(node.children, default=node.start))
        for t in range(node.start, end):
            seconds = step_seconds(config_values(node.config, t))
            work.append((start, seconds))
            start += seconds
    total = sum(seconds for _, seconds in work)
    longest = max(start + seconds for start, seconds in work)
    precedence, after = 0.0, total
    for start, seconds in sorted(work):
        precedence = max(precedence, start + after / workers)
        after -= seconds
    return {"simple": max(longest, total / workers), "precedence": max(precedence, longest)}


def run_study(
    study: PaperStudy, configs: list[dict], reuse: bool, scheduler: str, gpus: int
) -> dict[str, Any]:
    workers = gpus // study.gpus_per_trial  # one worker slot per data-parallel group
    executor = SimulatedExecutor(
        workers,
        study.step_seconds,
        save_seconds=study.checkpoint_seconds,
        load_seconds=study.checkpoint_seconds,
        launch_seconds=5.0,
    )
    began = time.perf_counter()
    simulation = dt.Study(
        SyntheticTrainer,
        name="paper",
        executor=executor,
        reuse=reuse,
        scheduler=scheduler,
        resources={"GPU": study.gpus_per_trial},
    )
    result = simulation.run(_algorithm(study, configs))
    report = result.report
    trained = [
        (t.config, t.steps if t.status == "completed" else t.reported)
        for t in simulation.coordinator.trials.values()
    ]
    bound = lower_bound([(c, s) for c, s in trained if s > 0], study.step_seconds, workers)
    return {
        "gpu_hours": report["gpu_seconds"] / 3600,
        "makespan_hours": report["makespan_seconds"] / 3600,
        "trial_steps": report["trial_steps"],
        "unique_steps": report["unique_steps"],
        "executed_steps": report["executed_steps"],
        "makespan_over_bound": report["makespan_seconds"] / bound["simple"],
        "makespan_over_precedence_bound": report["makespan_seconds"] / bound["precedence"],
        "simulated_in_seconds": time.perf_counter() - began,
    }


def benchmark(mode: str = "quick") -> dict[str, Any]:
    """In smoke mode every study shrinks to its first few configs and 8 workers."""
    rows = []
    for study in STUDIES:
        configs = list(study.space())
        merge = dt.merge_rate((c, study.max_steps) for c in configs)
        workers = WORKERS
        if mode == "smoke":
            configs, workers = configs[:12], 8
        runs = {
            name: run_study(study, configs, reuse, scheduler, workers) for name, reuse, scheduler in SYSTEMS
        }
        base, ours = runs["trial-based FIFO"], runs["dagtune critical path"]
        rows.append(
            {
                "study": study.name,
                "trials": len(configs),
                "merge_rate": merge,
                "paper_merge_rate": PAPER[study.name]["merge_rate"],
                "runs": runs,
                "gpu_hours_ratio": base["gpu_hours"] / ours["gpu_hours"],
                "paper_gpu_hours_ratio": PAPER[study.name]["gpu_hours"],
                "end_to_end_ratio": base["makespan_hours"] / ours["makespan_hours"],
                "paper_end_to_end_ratio": PAPER[study.name]["end_to_end"],
            }
        )
    return {"workers": WORKERS if mode != "smoke" else 8, "studies": rows}


def markdown(result: dict[str, Any]) -> str:
    from perf.table import table

    summary = table(
        result["studies"],
        [
            ("study", "study"),
            ("trials", "trials"),
            ("merge_rate", "merge rate"),
            ("paper_merge_rate", "paper's"),
            ("gpu_hours_ratio", "GPU-hours trial-based / dagtune"),
            ("paper_gpu_hours_ratio", "paper's"),
            ("end_to_end_ratio", "end-to-end trial-based / dagtune"),
            ("paper_end_to_end_ratio", "paper's"),
        ],
    )
    details = []
    for study in result["studies"]:
        rows = [{"system": name, **run} for name, run in study["runs"].items()]
        details.append(
            f"**{study['study']}**\n\n"
            + table(
                rows,
                [
                    ("system", "system"),
                    ("gpu_hours", "GPU-hours"),
                    ("makespan_hours", "makespan (h)"),
                    ("trial_steps", "trial steps"),
                    ("unique_steps", "unique steps"),
                    ("executed_steps", "executed steps"),
                    ("makespan_over_bound", "makespan / simple bound"),
                    ("makespan_over_precedence_bound", "makespan / precedence bound"),
                ],
            )
        )
    return "\n\n".join([summary, *details])


if __name__ == "__main__":
    import json
    import sys

    print(json.dumps(benchmark("smoke" if "--smoke" in sys.argv else "quick"), indent=2))
