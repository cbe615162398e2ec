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
they ended up running, as if those had been known from the start: a promotion cannot start
before the results that decide it (all of a rung's for SHA, enough of them for ASHA), a
dependency neither bound sees, and that is what their distance to the precedence bound below
measures. Only starting likely promotions before they are decided would close it, and that
trains steps a later decision may throw away (executed > unique), which dagtune does not do.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import dagtune as dt
from dagtune.algos import ASHA, GridSearch, SuccessiveHalving
from dagtune.config import config_values, normalize_config
from dagtune.events import StepDone, TaskEvent
from dagtune.plan import SearchPlan
from dagtune.sim import SimulatedExecutor, SyntheticTrainer
from perf import schedulers, spaces

WORKERS = 40
LAUNCH_SECONDS = 5.0  # starting a task
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
    tail: int = 0  # steps the best trial trains afterwards (the paper's final training)


def _calibrated(average: float, space: Callable[[], dt.Grid], steps: int, factor: Callable[[dict], float]):
    """A per-step cost ``base * factor(values)`` whose mean over every trial step of the grid
    equals `average` (the paper's Ray Tune GPU-seconds per trial step, already a mix of cheap
    and dear steps), computed when first needed."""
    base: list[float] = []

    def seconds(values: dict) -> float:
        if not base:
            configs = list(space())
            mean = sum(factor(config_values(c, t)) for c in configs for t in range(steps)) / (
                len(configs) * steps
            )
            base.append(average / mean)
        return base[0] * factor(values)

    return seconds


def _vision_factor(values: dict) -> float:
    return 0.85 if values.get("batch_size") == 256 else 1.0


def _bert_factor(values: dict) -> float:
    """Wall seconds per GPU-second of a dagtune step (100 optimizer steps) on 4 data-parallel
    GPUs; sequence length 512 costs 45% more than 384."""
    return spaces.BERT_STEP / BERT_GPUS * (1.45 if values.get("seq_len") == 512 else 1.0)


BERT_GPUS = 4  # our assumption: the paper trains BERT data-parallel but does not say on how many GPUs
# Ray Tune's GPU-seconds per trial step in the paper's Table 5 (GPU-hours / steps its trials
# trained; the grids train every trial fully, SHA's budget is 13,440 epochs, ASHA's unknown)
RESNET56_EPOCH = 402.66 * 3600 / 13_440
MOBILENETV2_EPOCH = 917.11 * 3600 / (240 * 120)
BERT_OPTIMIZER_STEP = 835.03 * 3600 / (40 * 27_000)
_resnet56 = _calibrated(RESNET56_EPOCH, spaces.resnet56_paper, 120, _vision_factor)
_mobilenetv2 = _calibrated(MOBILENETV2_EPOCH, spaces.mobilenetv2_paper, 120, _vision_factor)
_bert = _calibrated(
    BERT_OPTIMIZER_STEP * spaces.BERT_STEP / BERT_GPUS, spaces.bert_paper, spaces.BERT_STEPS, _bert_factor
)
TAIL = 100  # the paper trains the best ResNet56 / MobileNetV2 trial 100 more epochs (not BERT)

STUDIES = (
    PaperStudy("ResNet56 SHA", spaces.resnet56_paper, 120, "sha", _resnet56, 1.0, tail=TAIL),
    PaperStudy("ResNet56 ASHA", spaces.resnet56_paper, 120, "asha", _resnet56, 1.0, tail=TAIL),
    PaperStudy("MobileNetV2 grid", spaces.mobilenetv2_paper, 120, "grid", _mobilenetv2, 2.0, tail=TAIL),
    PaperStudy(
        "BERT-Base grid", spaces.bert_paper, spaces.BERT_STEPS, "grid", _bert, 20.0, gpus_per_trial=BERT_GPUS
    ),
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
    study: PaperStudy, configs: list[dict], reuse: bool, scheduler: Any, gpus: int
) -> dict[str, Any]:
    workers = gpus // study.gpus_per_trial  # one worker slot per data-parallel group
    executor = SimulatedExecutor(
        workers,
        study.step_seconds,
        save_seconds=study.checkpoint_seconds,
        load_seconds=study.checkpoint_seconds,
        launch_seconds=LAUNCH_SECONDS,
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
    coordinator = simulation.coordinator
    trained_points: list[tuple[str, int]] = []  # every step executed: (node, step)
    training = [0.0]  # virtual seconds of the executed steps themselves (no overhead)
    seen: set[tuple] = set()
    handle = coordinator.handle

    def recording(event: TaskEvent) -> None:
        key = (event.task, event.attempt, event.step)
        if isinstance(event, StepDone) and key not in seen:
            seen.add(key)
            trained_points.append((event.node, event.step))
            training[0] += event.seconds
        handle(event)

    coordinator.handle = recording
    result = simulation.run(_algorithm(study, configs))
    report = result.report
    training_seconds = training[0]
    trained = [
        (t.config, t.steps if t.status == "completed" else t.reported) for t in coordinator.trials.values()
    ]
    bound = lower_bound([(c, s) for c, s in trained if s > 0], study.step_seconds, workers)
    tail_seconds = 0.0
    if study.tail and result.best is not None:  # the best trial trains `tail` more steps, alone
        best = result.best.config
        tail_seconds = (
            LAUNCH_SECONDS
            + study.checkpoint_seconds
            + sum(
                study.step_seconds(config_values(best, t))
                for t in range(study.max_steps, study.max_steps + study.tail)
            )
        )
    tail_gpu = tail_seconds * study.gpus_per_trial
    return {
        "gpu_hours": report["gpu_seconds"] / 3600,
        "makespan_hours": report["makespan_seconds"] / 3600,
        "gpu_hours_with_tail": (report["gpu_seconds"] + tail_gpu) / 3600,
        "makespan_hours_with_tail": (report["makespan_seconds"] + tail_seconds) / 3600,
        "trial_steps": report["trial_steps"],
        "unique_steps": report["unique_steps"],
        "executed_steps": report["executed_steps"],
        "redundant_steps": report["executed_steps"] - report["unique_steps"],
        "training_gpu_hours": training_seconds * study.gpus_per_trial / 3600,
        "explored_merge_rate": report["trial_steps"] / report["unique_steps"],
        "reuse": report["trial_steps"] / report["executed_steps"],
        "redundancy": redundancy(coordinator, trained_points),
        "makespan_over_bound": report["makespan_seconds"] / bound["simple"],
        "makespan_over_precedence_bound": report["makespan_seconds"] / bound["precedence"],
        "simulated_in_seconds": time.perf_counter() - began,
    }


def redundancy(coordinator, trained_points: list[tuple[str, int]]) -> dict[str, Any]:
    """Why executed steps differ from unique steps, from the run itself.

    `needed` are the points (node, step) on the trials' paths up to the steps they reached
    (unique steps count exactly these). Every executed step is one point; a point executed
    twice is a *retrained* step (a prefix recomputed because no checkpoint was there), a
    point no trial reached is *beyond* the trials (a stage that kept training after the
    trials it served were stopped, until its stop directive took effect; the run returns only
    after such stages have ended, so they are all counted).
    """
    plan = coordinator.plan
    needed: set[tuple[str, int]] = set()
    stopped_paths: set[tuple[str, int]] = set()
    for trial in coordinator.trials.values():
        reached = trial.steps if trial.status == "completed" else trial.reported
        points = {
            (node, k)
            for node, start, end in plan.segments(trial.node, reached)
            for k in range(start + 1, end + 1)
        }
        needed |= points
        if trial.status != "completed":  # where a stopped trial would have gone
            stopped_paths |= {
                (node, k)
                for node, start, end in plan.segments(trial.node, trial.steps)
                for k in range(start + 1, end + 1)
            }
    counts: dict[tuple[str, int], int] = {}
    for point in trained_points:
        counts[point] = counts.get(point, 0) + 1
    beyond = [p for p in counts if p not in needed]
    return {
        "retrained": sum(c - 1 for c in counts.values()),
        "beyond_trials": len(beyond),
        "beyond_on_stopped_trials": sum(1 for p in beyond if p in stopped_paths),
        "not_trained": len(needed - set(counts)),
    }


def explain(redundancy: dict[str, Any]) -> str:
    """One sentence on a run's executed - unique, from `redundancy`."""
    parts = []
    if redundancy["retrained"]:
        parts.append(
            f"{redundancy['retrained']} step(s) retrained (a prefix recomputed without a checkpoint)"
        )
    if redundancy["beyond_trials"]:
        parts.append(
            f"{redundancy['beyond_trials']} step(s) trained beyond what any trial reached "
            f"({redundancy['beyond_on_stopped_trials']} on the path of a stopped trial): a stage keeps "
            "training until the stop directive reaches it at a step boundary"
        )
    if redundancy["not_trained"]:
        parts.append(f"{redundancy['not_trained']} needed step(s) never executed (served by known results)")
    return "; ".join(parts) if parts else "none"


def benchmark(mode: str = "quick", variants: bool | None = None) -> dict[str, Any]:
    """In smoke mode every study shrinks to its first few configs and 8 workers. `variants`
    (default: in full runs only; they double the run time) also runs the prototype scheduling
    policies of perf/schedulers.py on every study."""
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
                "gpu_hours_ratio_with_tail": base["gpu_hours_with_tail"] / ours["gpu_hours_with_tail"],
                "paper_gpu_hours_ratio": PAPER[study.name]["gpu_hours"],
                "end_to_end_ratio": base["makespan_hours"] / ours["makespan_hours"],
                "end_to_end_ratio_with_tail": base["makespan_hours_with_tail"]
                / ours["makespan_hours_with_tail"],
                "paper_end_to_end_ratio": PAPER[study.name]["end_to_end"],
                "tail_steps": study.tail,
                # GPU-hour ratio = explored ratio x dagtune's reuse x cost per executed step ratio
                "explored_ratio": base["trial_steps"] / ours["trial_steps"],
                "dagtune_reuse": ours["reuse"],
                "step_cost_ratio": (base["gpu_hours"] / base["executed_steps"])
                / (ours["gpu_hours"] / ours["executed_steps"]),
                # (c) = (c1) training seconds per executed step ratio x (c2) overhead ratio
                "step_mix_ratio": (base["training_gpu_hours"] / base["executed_steps"])
                / (ours["training_gpu_hours"] / ours["executed_steps"]),
                "overhead_ratio": (base["gpu_hours"] / base["training_gpu_hours"])
                / (ours["gpu_hours"] / ours["training_gpu_hours"]),
            }
        )
    result: dict[str, Any] = {"workers": WORKERS if mode != "smoke" else 8, "studies": rows}
    if variants if variants is not None else mode == "full":
        result["schedulers"] = compare_schedulers(mode)
    return result


def compare_schedulers(mode: str = "quick") -> dict[str, Any]:
    """Every scheduling policy of perf/schedulers.py on every study (smoke: 12 configs, 8 workers)."""
    rows = []
    for study in STUDIES:
        configs = list(study.space())
        gpus = WORKERS
        if mode == "smoke":
            configs, gpus = configs[:12], 8
        workers = gpus // study.gpus_per_trial
        row: dict[str, Any] = {"study": study.name}
        for name, policy in schedulers.variants(workers).items():
            run = run_study(study, configs, True, policy, gpus)
            row[name] = run["makespan_hours"]
            row[name + " / precedence bound"] = run["makespan_over_precedence_bound"]
        row["breadth first"] = run_study(study, configs, True, "breadth_first", gpus)["makespan_hours"]
        rows.append(row)
    return {"rows": rows, "variants": list(schedulers.variants(1)), "tolerance": schedulers.TOLERANCE}


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
            ("gpu_hours_ratio_with_tail", "with the best trial's 100 more epochs"),
            ("paper_gpu_hours_ratio", "paper's (with them)"),
            ("end_to_end_ratio", "end-to-end trial-based / dagtune"),
            ("end_to_end_ratio_with_tail", "with the 100 more epochs"),
            ("paper_end_to_end_ratio", "paper's (with them)"),
        ],
    )
    tail = (
        "The paper's GPU-hours and end-to-end times include training the best ResNet56 and "
        "MobileNetV2 trial 100 more epochs afterwards (alone, on one GPU; not for BERT). The "
        "*with* columns add that tail, simulated with the same cost profile, to both sides; "
        "they are the ones to compare with the paper's ratios. The tail is the same work for "
        "both systems, so it pulls every ratio towards 1."
    )
    decomposition = table(
        [
            {
                "study": row["study"],
                "tb_trial": row["runs"]["trial-based FIFO"]["trial_steps"],
                "tb_merge": row["runs"]["trial-based FIFO"]["explored_merge_rate"],
                "dt_trial": row["runs"]["dagtune critical path"]["trial_steps"],
                "dt_merge": row["runs"]["dagtune critical path"]["explored_merge_rate"],
                "explored": row["explored_ratio"],
                "reuse": row["dagtune_reuse"],
                "mix": row["step_mix_ratio"],
                "overhead": row["overhead_ratio"],
                "ratio": row["gpu_hours_ratio"],
            }
            for row in result["studies"]
        ],
        [
            ("study", "study"),
            ("tb_trial", "trial-based: trial steps explored"),
            ("tb_merge", "their merge rate"),
            ("dt_trial", "dagtune: trial steps explored"),
            ("dt_merge", "their merge rate"),
            ("explored", "(a) explored ratio"),
            ("reuse", "(b) dagtune reuse"),
            ("mix", "(c) training s per executed step, trial-based / dagtune"),
            ("overhead", "(d) GPU-hours / training hours, trial-based / dagtune"),
            ("ratio", "GPU-hours ratio = a x b x c x d"),
        ],
    )
    decomposition_text = (
        "The GPU-hour ratio decomposes exactly into (a) how many trial steps each run explored "
        "(SHA and ASHA decide from results, so the two runs need not explore the same trials: "
        "asynchronous promotions differ with the order results arrive), (b) dagtune's reuse, "
        "trial steps / executed steps, which is the merge rate of what it explored when executed = "
        "unique, (c) the training cost of an executed step (the mix of cheap and dear steps: shared "
        "prefixes are trained once, so dagtune's executed steps are weighted towards the branches, "
        "e.g. BERT's 512-token tails and the 256-sample batches after a ramp), and (d) the overhead "
        "on top of training (task start-up, checkpoint saves and loads, idle GPUs held by a task). "
        "A GPU-hour ratio above the space's merge rate comes from (a), and from exploring a subset "
        "whose merge rate is higher than the whole space's."
    )
    details = []
    for study in result["studies"]:
        rows = [{"system": name, **run} for name, run in study["runs"].items()]
        notes = [
            f"{name}: executed - unique = {run['redundant_steps']}: {explain(run['redundancy'])}."
            for name, run in study["runs"].items()
            if run["redundant_steps"] and name != "trial-based FIFO"
        ]
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
                    ("redundant_steps", "executed - unique"),
                    ("makespan_over_bound", "makespan / simple bound"),
                    ("makespan_over_precedence_bound", "makespan / precedence bound"),
                ],
            )
            + ("\n\n" + " ".join(notes) if notes else "")
        )
    parts = [summary, tail, decomposition_text, decomposition, *details]
    if "schedulers" in result:
        parts.append(_schedulers_markdown(result["schedulers"]))
    return "\n\n".join(parts)


def _schedulers_markdown(found: dict[str, Any]) -> str:
    from perf.table import table

    columns = [("study", "study"), ("breadth first", "breadth first (h)")]
    for name in found["variants"]:
        columns.append((name, f"{name} (h)"))
    columns += [(name + " / precedence bound", f"{name} / bound") for name in found["variants"]]
    return (
        "**Scheduling policies (prototypes, perf/schedulers.py).** Makespan of dagtune with each "
        "policy, and over the precedence bound. "
        + " ".join(schedulers.__doc__.split("\n\n")[1].split())
        + "\n\n"
        + table(found["rows"], columns)
    )


if __name__ == "__main__":
    import json
    import sys

    mode = "smoke" if "--smoke" in sys.argv else "quick"
    found = compare_schedulers(mode) if "--schedulers" in sys.argv else benchmark(mode)
    print(json.dumps(found, indent=2))
