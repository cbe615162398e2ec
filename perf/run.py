"""Run every benchmark and write perf/RESULTS.md and perf/results.json.

    python -m perf            quick mode (about 10 minutes on 2 cores)
    python -m perf --full     the larger versions
    python -m perf --smoke    a minute-long check that every benchmark still runs (writes to
                              a temporary directory unless --out is given)
    python -m perf --only paper,dispatch     (updates those sections of an earlier run's report)

Timings are ratios measured side by side in one run; the machine is described at the top.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import sys
import tempfile
import time
from pathlib import Path

from perf import smoke
from perf.machine import describe

BENCHMARKS = (
    ("paper", "1. The paper's single studies, simulated at the paper's scale (40 GPUs)"),
    ("multistudy", "2. Several studies sharing one plan (simulated, 40 GPUs)"),
    ("raytune", "3. Real training against Ray Tune (2 workers of this machine)"),
    ("planner_bench", "4. Planner scale"),
    ("dispatch", "5. Dispatch overhead through Dask"),
    ("checkpoint_io", "6. Checkpoint I/O"),
    ("fusion", "7. Trial fusion"),
    ("surrogate", "8. Hyper-parameter transfer across width (muP surrogates)"),
    ("scale", "9. Coordinator at scale"),
    ("resume_check", "10. The resume check's cost"),
    ("all_three", "11. All three together: surrogate, fusion and prefix sharing against Ray Tune"),
    ("stored_reads", "12. Reading a large stored study (durable path)"),
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m perf", description=__doc__.splitlines()[0])
    modes = parser.add_mutually_exclusive_group()
    modes.add_argument("--full", action="store_true", help="run the larger versions")
    modes.add_argument("--smoke", action="store_true", help="tiny versions, to check the benchmarks run")
    parser.add_argument(
        "--only", help="comma-separated benchmark names: " + ", ".join(n for n, _ in BENCHMARKS)
    )
    parser.add_argument("--out", type=Path, help="directory for RESULTS.md and results.json (default: perf/)")
    parser.add_argument("--render", action="store_true", help="only rewrite RESULTS.md from results.json")
    args = parser.parse_args(argv)
    if args.render:
        out = args.out or Path(__file__).parent
        results = json.loads((out / "results.json").read_text())
        (out / "RESULTS.md").write_text(render(results))
        return 0
    mode = "full" if args.full else "smoke" if args.smoke else "quick"
    chosen = set(args.only.split(",")) if args.only else {name for name, _ in BENCHMARKS}
    unknown = chosen - {name for name, _ in BENCHMARKS}
    if unknown:
        parser.error(f"unknown benchmark(s) {sorted(unknown)}")
    out = args.out or (
        Path(tempfile.mkdtemp(prefix="dagtune-perf-")) if args.smoke else Path(__file__).parent
    )
    out.mkdir(parents=True, exist_ok=True)

    command = "python -m perf" + {"quick": "", "full": " --full", "smoke": " --smoke"}[mode]
    if args.only:
        command += f" --only {args.only}"
    results = {"mode": mode, "command": command, "machine": describe(), "benchmarks": {}}
    base = _earlier_run(out / "results.json", mode) if args.only else None
    if base is not None:  # --only updates its benchmarks in the report of an earlier run
        results["command"], results["seconds"], results["machine"] = (
            base["command"],
            base["seconds"],
            base["machine"],
        )
        results["benchmarks"] = {n: r for n, r in base["benchmarks"].items() if n not in chosen}
    began = time.perf_counter()
    with smoke.session() if mode == "smoke" else contextlib.nullcontext():
        for name, title in BENCHMARKS:
            if name not in chosen:
                continue
            print(f"[perf] {title} ...", flush=True)
            module = importlib.import_module(f"perf.{name}")
            started = time.perf_counter()
            result = module.benchmark(mode)
            result["seconds"] = time.perf_counter() - started
            result["command"] = command
            results["benchmarks"][name] = result
            print(f"[perf] done in {result['seconds']:.0f} s", flush=True)
    if base is None:
        results["seconds"] = time.perf_counter() - began
    (out / "RESULTS.md").write_text(render(results))
    (out / "results.json").write_text(json.dumps(results, indent=1, default=str) + "\n")
    print(f"[perf] wrote {out / 'RESULTS.md'} and {out / 'results.json'}")
    return 0


def _earlier_run(path: Path, mode: str) -> dict | None:
    """The results of an earlier run of the same mode at `path`, if there are any."""
    if not path.exists():
        return None
    earlier = json.loads(path.read_text())
    return earlier if earlier.get("mode") == mode else None


def render(results: dict) -> str:
    """RESULTS.md from the results of a run."""
    sections = []
    for name, title in BENCHMARKS:
        if name in results["benchmarks"]:
            module = importlib.import_module(f"perf.{name}")
            result = results["benchmarks"][name]
            source = result.get("command", results["command"])
            note = f"{result['seconds']:.0f} s" + (
                "" if source == results["command"] else f", from `{source}`"
            )
            sections.append(
                f"## {title}\n\n{module.__doc__.strip()}\n\n{module.markdown(result)}\n\n_({note})_"
            )
    machine = ", ".join(f"{k} {v}" for k, v in results["machine"].items())
    header = (
        f"# dagtune benchmarks\n\nProduced by `{results['command']}` in {results['seconds'] / 60:.1f} minutes on: "
        f"{machine}.\n\nEvery timing below is a ratio or a side-by-side measurement from this one run."
    )
    return header + "\n\n" + "\n\n".join(sections) + "\n"


if __name__ == "__main__":
    sys.exit(main())
