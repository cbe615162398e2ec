"""The results writer's CPU (`time.process_time`) and store writes (keys zarr 3's local
store is asked to set): one write after k changed rows scattered over a table of 10,000 and
100,000 (median of 5 writes; the table written and its log applied first), and the first
write after resuming a 100,000-trial group (one trial added, one moved on). Runs on
whichever dagtune is imported, so an older one (its `write` takes no changed ids) is
measured side by side from a worktree of it (perf/RESULTS.md section 9e):

    PYTHONPATH=$PWD python perf/results_writes.py
"""

from __future__ import annotations

import inspect
import json
import statistics
import tempfile
import time

import zarr
import zarr.storage

import dagtune as dt
from dagtune.records import MetricsPoint, Trial
from dagtune.results import ResultsWriter

keys = []
orig = zarr.storage.LocalStore.set


async def counting(self, k, v):
    keys.append(k)
    return await orig(self, k, v)


zarr.storage.LocalStore.set = counting
BRANCH = "changed" in inspect.signature(ResultsWriter.write).parameters


def trials_of(n):
    out = {}
    for i in range(n):
        t = Trial(i, {"lr": dt.Constant(0.001 * (i + 1)), "m": dt.Constant(0.5)}, 9)
        t.curve, t.reported = [(1, {"loss": 1.0 / (i + 1)})], 1
        out[i] = t
    return out


def advance(trials, ids, step):
    for i in ids:
        t = trials[i]
        t.points.append(MetricsPoint.of(step, {"loss": 0.5 / (i + step)}))  # `curve`: a copy
        t.reported = step


def scattered(n, k):
    return [round(j * (n - 1) / (k - 1)) for j in range(k)]


def writes(n, k, reps=5):
    d = tempfile.mkdtemp()
    w = ResultsWriter(f"{d}/r.zarr", None, study="s", identity="x")
    trials = trials_of(n)
    w.write(trials)
    w.compact()
    res = {"scan": [], "changed": []}
    step = 2
    for r in range(reps):
        for mode in ("scan", "changed") if BRANCH else ("scan",):
            ids = [(i + r * 7 + (mode == "changed")) % n for i in scattered(n, k)]
            advance(trials, ids, step)
            step += 1
            keys.clear()
            t0 = time.process_time()
            if mode == "changed":
                w.write(trials, set(ids))
            else:
                w.write(trials)
            res[mode].append((time.process_time() - t0, len(keys)))
    return {
        m: {
            "cpu_ms_median": round(1000 * statistics.median(c for c, _ in v), 2),
            "store_sets_median": statistics.median(s for _, s in v),
        }
        for m, v in res.items()
        if v
    }


def resume(n):
    d = tempfile.mkdtemp()
    url = f"{d}/r.zarr"
    w = ResultsWriter(url, None, study="s", identity="x")
    trials = trials_of(n)
    w.write(trials)
    w.compact()
    advance(trials, [n // 2], 2)
    trials[n] = Trial(n, {"lr": dt.Constant(0.5), "m": dt.Constant(0.5)}, 9)
    keys.clear()
    w2 = ResultsWriter(url, None, study="s", identity="x")
    t0 = time.process_time()
    w2.write(trials)
    return {"cpu_s": round(time.process_time() - t0, 3), "store_sets": len(keys)}


def main() -> None:
    out: dict = {"told_changed_ids": BRANCH, "writes": {}}
    for n in (10_000, 100_000):
        for k in (10, 100):
            out["writes"][f"{n}x{k}"] = writes(n, k)
    out["resume_100000"] = resume(100_000)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
