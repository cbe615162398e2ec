"""A whole study's coordinator, simulated, from 1,000 to 100,000 trials (issues 15 and 24): a
grid of distinct 2-step trials (constant learning rate x momentum) and an ASHA random search
(rungs 1, 3, 9 with eta 3 over log-uniform lr x uniform momentum) on 1,000 virtual workers,
each size on both paths side by side: ``durable`` (the default path: storage on local disk,
a `CheckpointStore` in a fresh temporary directory, with the study's journals, lease and
results) and ``memory`` (no storage: the simulator's in-memory checkpoint store).

The coordinator's CPU time is the process's CPU time during `Study.run` minus the time spent
inside the simulated executor (`poll`, `launch`, `direct`: the workers' side, which really
runs each step of the synthetic trainer and saves its checkpoints): what remains is the
coordinator, the study, the algorithm and the planner. Per event divides it by the events
the coordinator handled; a pump is one event batch and its scheduling round (the
coordinator's CPU time in it: p99 and the slowest). The slowest pumps are those a full
garbage collection lands in: it walks every object of the process, so its pause grows with
the trials (the longest is given). Peak memory is the growth of the process's peak
resident set over the study; it includes the simulator's in-memory checkpoint store (one
checkpoint per trial end, kept pickled, the random generators' states in it kept once per
distinct content: `PickledStore`), whose size is given, with the checkpoints it saved and
loaded back (``checkpoint_saves``, ``checkpoint_loads``, memory path only). Each run is a fresh
subprocess (in smoke mode the first only). On the durable path the simulated workers' side
includes writing each checkpoint to disk; the coordinator's side includes its journals
(their fsyncs), lease and results.
Closing the study (`Study.close` after `Study.run` returned) is not in the coordinator's
figures; its CPU time is given apart (``close_s``): on the durable path it commits the
journals and results a last time and writes the study's read index (which keeps what the
page's importance is scored from, not the scores, since commit 283aa94).
``planner="rebuild"`` (the stage tree and its priorities rebuilt at every
scheduling round, what the coordinator did before the incremental planner) runs at the
smallest size as the reference.

    python perf/scale.py --algorithm grid --trials 10000 --workers 1000 [--durable] [--planner rebuild] [--json]

Memory per trial: with ``--heap`` the run is traced (`tracemalloc`, which slows it several
times: its CPU figures are not comparable) and the Python heap the study still holds after
it ran (after a full collection) is divided by the trials, by the file that allocated it:
``heap_per_trial_b`` is all of it, ``coordinator_heap_per_trial_b`` leaves out what the
simulated workers keep (their live trainers: `sim.py`, `trainer.py`, `runner.py`, `random`,
numpy, torch), and the largest lines are listed (``--heap-lines``). The simulator's
checkpoint store (this file) is never counted.

    python perf/scale.py --algorithm grid --trials 10000 --workers 1000 --heap [--heap-lines 30]

Where the coordinator's time goes: with ``--profile PATH`` the run is profiled (`cProfile`,
paused inside the simulated executor's methods, so the profile is the coordinator's side
only; its CPU figures are not comparable) and the statistics are written to PATH
(``python -m pstats PATH``).

    python perf/scale.py --algorithm asha --trials 10000 --workers 1000 --profile asha10k.prof
"""

from __future__ import annotations

import argparse
import cProfile
import functools
import gc
import hashlib
import io
import json
import pickle
import resource
import shutil
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import dagtune as dt
import dagtune.study._study as study_module
from dagtune.algos import ASHA, GridSearch
from dagtune.checkpoints import CheckpointStore
from dagtune.coordinator import Coordinator
from dagtune.records import CheckpointInfo
from dagtune.sim import SimulatedExecutor, SyntheticTrainer
from perf.collector import Collections

ALGORITHMS = ("grid", "asha")


def grid(n: int) -> list[dict]:
    side = round(n**0.5)
    configs = [
        {"lr": 1e-4 * (i + 1), "momentum": j / side} for i in range(side) for j in range(-(-n // side))
    ]
    return configs[:n]


def algorithm(name: str, n: int):
    if name == "grid":
        return GridSearch(grid(n), metric="val_loss", mode="min", steps=2)
    space = dt.Random({"lr": dt.loguniform(0.01, 0.3), "momentum": dt.uniform(0.0, 0.6)}, n=n, seed=1)
    return ASHA(space, "val_loss", "min", max_steps=9, eta=3)


class PickledStore:
    """The simulator's in-memory checkpoint store, keeping each state pickled with its bulky
    parts interned by content: every plain CPU tensor and every long list of ints (a
    checkpoint holds the random generators' states: torch's and numpy's as tensors, python's
    as a list of 625 ints, 14.6 KB of its 15 KB pickled) is kept once per distinct content
    (`_Interning`), so a checkpoint whose generators are where another's were costs only its
    own part (about 0.5 KB for `SyntheticTrainer`'s, against 15 KB each before, 1.4 GiB at
    100,000 trials). A load unpickles a fresh copy (tensors cloned, lists copied), as from
    storage. `held_bytes` says how much it holds; `saves` and `loads` count the checkpoints
    written and read back."""

    def __init__(self, nbytes: int = 1_000_000):
        self.nbytes = nbytes
        self.states: dict[tuple[str, str, int], bytes] = {}
        self.interned: list[torch.Tensor | tuple[int, ...]] = []  # each distinct content once
        self.index: dict[tuple, int] = {}  # a content's key -> its place in `interned`
        self.interned_bytes = 0
        self.saves = 0
        self.loads = 0

    def save(self, identity: str, node: str, step: int, state: dict) -> CheckpointInfo:
        key = (identity, node, step)
        if key not in self.states:  # write-once: a second writer yields to the first
            buffer = io.BytesIO()
            _Interning(buffer, self).dump(state)
            self.states[key] = buffer.getvalue()
            self.saves += 1
        return CheckpointInfo(self.nbytes, "")

    def load(self, identity: str, node: str, step: int) -> dict:
        self.loads += 1
        return _Uninterning(io.BytesIO(self.states[(identity, node, step)]), self.interned).load()

    def info(self, identity: str, node: str, step: int) -> CheckpointInfo | None:
        return CheckpointInfo(self.nbytes, "") if (identity, node, step) in self.states else None

    def delete(self, identity: str, node: str, step: int) -> None:
        self.states.pop((identity, node, step), None)

    def points(self, identity: str) -> Iterator[tuple[str, int, CheckpointInfo]]:
        for ident, node, step in sorted(self.states):
            if ident == identity:
                yield node, step, CheckpointInfo(self.nbytes, "")

    def intern(self, content: tuple, value: Callable[[], torch.Tensor | tuple[int, ...]], size: int) -> int:
        """The place of `content` in `interned`, ``value()`` (`size` bytes) kept there if new."""
        place = self.index.get(content)
        if place is None:
            place = self.index[content] = len(self.interned)
            self.interned.append(value())
            self.interned_bytes += size
        return place

    @property
    def held_bytes(self) -> int:
        """The pickled states and the interned contents (the bytes of their data)."""
        return sum(len(state) for state in self.states.values()) + self.interned_bytes


#: the shortest list of ints `_Interning` keeps apart (python's generator state has 625)
LONG_LIST = 64


class _Interning(pickle.Pickler):
    """Pickles a state into a `PickledStore`, each plain CPU tensor and each list of at least
    `LONG_LIST` ints replaced by its place among the store's interned contents, keyed by
    what it holds (a tensor's dtype, shape and a BLAKE2b digest of its bytes, its lazy
    conjugate or negative bits resolved; a list's ints themselves): anything else (a tensor needing grad, a sparse, quantized
    or GPU one, a subclass such as a parameter) is pickled as it is."""

    def __init__(self, file: io.BytesIO, store: PickledStore):
        super().__init__(file, protocol=5)
        self.store = store

    def persistent_id(self, obj: Any) -> int | None:
        if (
            type(obj) is torch.Tensor
            and obj.device.type == "cpu"
            and obj.layout == torch.strided
            and not (obj.requires_grad or obj.is_quantized)
        ):
            tensor = obj.resolve_conj().resolve_neg().contiguous()
            data = tensor.reshape(-1).view(torch.uint8).numpy()
            content = ("tensor", str(tensor.dtype), tuple(tensor.shape), hashlib.blake2b(data).digest())
            return self.store.intern(content, tensor.clone, data.nbytes)
        if type(obj) is list and len(obj) >= LONG_LIST and all(type(x) is int for x in obj):
            ints = tuple(obj)  # the key and the kept value: held once
            return self.store.intern(ints, lambda: ints, 8 * len(ints))
        return None


class _Uninterning(pickle.Unpickler):
    """Unpickles a `PickledStore` state, each interned content a fresh copy."""

    def __init__(self, file: io.BytesIO, interned: list[torch.Tensor | tuple[int, ...]]):
        super().__init__(file)
        self.interned = interned

    def persistent_load(self, pid: Any) -> torch.Tensor | list[int]:
        value = self.interned[pid]
        return value.clone() if isinstance(value, torch.Tensor) else list(value)


#: the profiler of a ``--profile`` run, paused inside the simulated executor (`ExecutorClock`)
PROFILER: cProfile.Profile | None = None


class ExecutorClock:
    """CPU seconds spent inside an executor's methods (the simulated workers' side)."""

    def __init__(self, executor: SimulatedExecutor):
        self.seconds = 0.0
        for name in ("poll", "launch", "direct"):
            setattr(executor, name, self._timed(getattr(executor, name)))

    def _timed(self, method):
        def timed(*args, **kwargs):
            if PROFILER is not None:
                PROFILER.disable()
            began = time.process_time()
            try:
                return method(*args, **kwargs)
            finally:
                self.seconds += time.process_time() - began
                if PROFILER is not None:
                    PROFILER.enable()

        return timed


#: where the simulated workers' own state is allocated (their live trainers), left out of the
#: coordinator's heap
WORKERS_SIDE = ("dagtune/sim.py", "dagtune/trainer.py", "dagtune/runner.py", "/random.py", "numpy/", "torch/")


class Heap:
    """The Python heap a study holds after it ran, by allocating line (`tracemalloc`)."""

    def __init__(self, lines: int) -> None:
        self.lines = lines
        gc.collect()
        tracemalloc.start()
        self._before = tracemalloc.take_snapshot()

    def held(self, n: int) -> dict[str, Any]:
        """What the study holds now, per trial of `n`."""
        gc.collect()
        after = tracemalloc.take_snapshot()
        tracemalloc.stop()
        ignored = [tracemalloc.Filter(False, __file__), tracemalloc.Filter(False, tracemalloc.__file__)]
        stats = after.filter_traces(ignored).compare_to(self._before.filter_traces(ignored), "lineno")
        total = sum(s.size_diff for s in stats)
        workers = sum(s.size_diff for s in stats if any(w in s.traceback[0].filename for w in WORKERS_SIDE))
        root = str(Path(__file__).resolve().parent.parent) + "/"
        return {
            "heap_per_trial_b": round(total / n),
            "coordinator_heap_per_trial_b": round((total - workers) / n),
            "heap_lines": [
                f"{s.size_diff / n:.0f} B/trial {s.traceback[0].filename.replace(root, '')}:{s.traceback[0].lineno}"
                for s in stats[: self.lines]
            ],
        }


def run(
    name: str, n: int, workers: int, planner: str, durable: bool = False, heap_lines: int | None = None
) -> dict[str, Any]:
    """One study in this process (see the module docstring); `heap_lines` (not None): trace
    its heap and list that many of its largest lines."""
    directory = tempfile.mkdtemp(prefix="dagtune-scale-") if durable else None
    try:
        return _run(name, n, workers, planner, directory, heap_lines)
    finally:
        if directory is not None:
            shutil.rmtree(directory, ignore_errors=True)


def _run(
    name: str, n: int, workers: int, planner: str, directory: str | None, heap_lines: int | None = None
) -> dict[str, Any]:
    store: PickledStore | CheckpointStore = (
        PickledStore() if directory is None else CheckpointStore(directory)
    )
    executor = SimulatedExecutor(workers, store=store)
    clock = ExecutorClock(executor)
    original = study_module.Coordinator
    study_module.Coordinator = functools.partial(Coordinator, planner=planner)
    try:
        study = dt.Study(SyntheticTrainer, name="scale", executor=executor)
    finally:
        study_module.Coordinator = original
    coordinator = study.coordinator
    pump, pumps = coordinator.pump, []

    def timed_pump(*args, **kwargs):
        """The pump, keeping its coordinator part (the pump less the executor's CPU in it)."""
        executor_before, began = clock.seconds, time.process_time()
        handled = pump(*args, **kwargs)
        pumps.append(time.process_time() - began - (clock.seconds - executor_before))
        return handled

    coordinator.pump = timed_pump
    collections = Collections()
    search = algorithm(name, n)
    heap = Heap(heap_lines) if heap_lines is not None else None
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    began, cpu = time.perf_counter(), time.process_time()
    result = study.run(search)
    total_cpu = time.process_time() - cpu
    wall = time.perf_counter() - began
    rss_after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    held = heap.held(n) if heap is not None else {}
    collections.close()
    pumps.sort()
    report = result.report
    coordinator_cpu = total_cpu - clock.seconds
    events = coordinator.events_seen
    closing = time.process_time()
    study.close()  # on the durable path: the journals' last commit, results and the read index
    close_cpu = time.process_time() - closing
    checkpoints = store.held_bytes if isinstance(store, PickledStore) else 0
    return {
        "algorithm": name,
        "trials": len(search.trials),
        "workers": workers,
        "planner": planner,
        "path": "memory" if directory is None else "durable",
        "coordinator_s": round(coordinator_cpu, 2),
        "per_trial_ms": round(coordinator_cpu / n * 1e3, 3),
        "events": events,
        "per_event_us": round(coordinator_cpu / events * 1e6, 1),
        "pump_p99_ms": round(pumps[int(0.99 * (len(pumps) - 1))] * 1e3, 2),
        "slowest_pump_ms": round(pumps[-1] * 1e3, 1),
        "full_gc_max_ms": round(collections.longest * 1e3, 1),
        # the collector's CPU during the run, wherever its runs landed (the coordinator's
        # part or the simulated workers'): what grows with the heap (section 9r)
        "collector_s": round(collections.seconds, 2),
        "executor_s": round(clock.seconds, 2),
        "wall_s": round(wall, 1),
        "close_s": round(close_cpu, 2),
        "peak_rss_mib": round(max(0, rss_after - rss_before) / 1024, 1),
        "checkpoints_mib": round(checkpoints / 2**20, 1) if isinstance(store, PickledStore) else None,
        "checkpoint_saves": store.saves if isinstance(store, PickledStore) else None,
        "checkpoint_loads": store.loads if isinstance(store, PickledStore) else None,
        # the measure of the coordinator's state: peak resident growth less the
        # simulated checkpoints, per trial
        "rss_per_trial_kib": round((max(0, rss_after - rss_before) - checkpoints / 1024) / n, 2),
        "executed": report["executed_steps"],
        "unique": report["unique_steps"],
        "makespan_s": round(report["makespan_seconds"], 1),
        **held,
    }


def measure(
    name: str, n: int, workers: int, planner: str = "incremental", durable: bool = False
) -> dict[str, Any]:
    """`run` in a fresh subprocess."""
    command = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--algorithm",
        name,
        "--trials",
        str(n),
        "--workers",
        str(workers),
        "--planner",
        planner,
        "--json",
        *(["--durable"] if durable else []),
    ]
    completed = subprocess.run(command, capture_output=True, text=True, check=True, timeout=3600)
    return json.loads(completed.stdout.strip().splitlines()[-1])


#: (trials, workers) per mode, each on both paths; the rebuild runs at the first size only
SIZES = {
    "smoke": ((100, 40),),
    "quick": ((1_000, 1_000), (10_000, 1_000), (100_000, 1_000)),
    "full": ((1_000, 100), (1_000, 1_000), (10_000, 100), (10_000, 1_000), (100_000, 1_000)),
}


def benchmark(mode: str = "quick") -> dict[str, Any]:
    """Every row in a fresh subprocess, but in smoke mode, which only checks that the
    benchmark runs: there the first row does, the others run in this process (each fresh
    process would cost a Python start and dagtune's imports for a second's study)."""
    sizes = SIZES[mode]
    rows: list[dict[str, Any]] = []

    def row(name: str, n: int, workers: int, planner: str = "incremental", durable: bool = False) -> None:
        fresh = mode != "smoke" or not rows
        rows.append((measure if fresh else run)(name, n, workers, planner=planner, durable=durable))

    for name in ALGORITHMS:
        row(name, *sizes[0], planner="rebuild")
        for n, workers in sizes:
            for durable in (False, True):
                row(name, n, workers, durable=durable)
                print(rows[-1], flush=True)
    return {"rows": rows}


def markdown(result: dict[str, Any]) -> str:
    from perf.table import table

    rows = result["rows"]
    columns = [
        ("algorithm", "study"),
        ("trials", "trials"),
        ("workers", "workers"),
        ("planner", "planner"),
        ("path", "path"),
        ("coordinator_s", "coordinator CPU (s)"),
        ("per_trial_ms", "per trial (ms)"),
        ("events", "events"),
        ("per_event_us", "per event (µs)"),
        ("pump_p99_ms", "pump p99 (ms)"),
        ("slowest_pump_ms", "slowest pump (ms)"),
        ("full_gc_max_ms", "longest full GC (ms)"),
        ("collector_s", "collector CPU (s)"),
        ("executor_s", "simulated workers CPU (s)"),
        ("close_s", "close CPU (s)"),
        ("peak_rss_mib", "peak RSS growth (MiB)"),
        ("checkpoints_mib", "of which simulated checkpoints (MiB)"),
        ("executed", "executed steps"),
        ("unique", "unique steps"),
        ("makespan_s", "makespan (virtual s)"),
    ]
    lines = [table(rows, columns)]
    flat = []
    for name in ALGORITHMS:
        mine = [r for r in rows if r["algorithm"] == name and r["planner"] == "incremental"]
        for path in ("memory", "durable"):
            for workers in sorted({r["workers"] for r in mine}):
                sizes = sorted(
                    (r for r in mine if r["workers"] == workers and r.get("path", "memory") == path),
                    key=lambda r: r["trials"],
                )
                if len(sizes) > 1:
                    flat.append(
                        f"{name} ({path}) on {workers:,} workers, per-trial cost at {sizes[-1]['trials']:,} "
                        f"trials / at {sizes[0]['trials']:,}: "
                        f"{sizes[-1]['per_trial_ms'] / sizes[0]['per_trial_ms']:.2f}"
                    )
        for row in mine:
            if row.get("path") == "durable":
                memory = next(
                    (
                        r
                        for r in mine
                        if r.get("path", "memory") == "memory"
                        and (r["trials"], r["workers"]) == (row["trials"], row["workers"])
                    ),
                    None,
                )
                if memory is not None:
                    flat.append(
                        f"{name}, durable / memory at {row['trials']:,} trials on {row['workers']:,} workers: "
                        f"{row['per_trial_ms'] / memory['per_trial_ms']:.2f}"
                    )
        rebuilt = next((r for r in rows if r["algorithm"] == name and r["planner"] == "rebuild"), None)
        if rebuilt is not None:
            same = next(
                r
                for r in mine
                if (r["trials"], r["workers"]) == (rebuilt["trials"], rebuilt["workers"])
                and r.get("path", "memory") == "memory"
            )
            flat.append(
                f"{name}, coordinator time rebuilding / incremental at {same['trials']:,} trials on "
                f"{same['workers']:,} workers: {rebuilt['coordinator_s'] / same['coordinator_s']:.1f}"
            )
    lines.append("Ratios: " + "; ".join(flat) + ".")
    lines.append(
        "Goals (issue 15): per-trial cost flat within 2x from 1k to 100k trials, a 100,000-trial "
        "grid under 60 s of coordinator time, an event under 1 ms at 100,000 trials. Goals (issue "
        "24): per-trial cost flat within 1.5x from 1k to 100k on both paths, durable at most 2x "
        "memory, memory about 0.4 ms per trial, a 100,000-trial durable grid and ASHA complete."
    )
    return "\n\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--algorithm", choices=ALGORITHMS, default="grid")
    parser.add_argument("--trials", type=int, default=1_000)
    parser.add_argument("--workers", type=int, default=1000)
    parser.add_argument("--planner", choices=("incremental", "rebuild"), default="incremental")
    parser.add_argument("--durable", action="store_true", help="storage on local disk (the default path)")
    parser.add_argument("--json", action="store_true", help="print one JSON line")
    parser.add_argument("--heap", action="store_true", help="trace the heap the study holds (slow)")
    parser.add_argument("--heap-lines", type=int, default=20, help="with --heap: the largest lines listed")
    parser.add_argument("--profile", metavar="PATH", help="profile the coordinator's side, stats to PATH")
    args = parser.parse_args()
    lines = args.heap_lines if args.heap else None
    global PROFILER
    PROFILER = cProfile.Profile() if args.profile else None
    if PROFILER is not None:
        PROFILER.enable()
    row = run(args.algorithm, args.trials, args.workers, args.planner, args.durable, lines)
    if PROFILER is not None:
        PROFILER.disable()
        PROFILER.dump_stats(args.profile)
    print(json.dumps(row) if args.json else row, flush=True)


if __name__ == "__main__":
    main()
