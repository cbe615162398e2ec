"""A description of the machine a benchmark ran on (for RESULTS.md)."""

from __future__ import annotations

import os
import platform
from importlib import metadata


def describe() -> dict[str, str]:
    model = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            model = next(line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name"))
    except (OSError, StopIteration):
        model = platform.processor() or model
    memory = "unknown"
    try:
        with open("/proc/meminfo") as meminfo:
            kilobytes = int(next(line.split()[1] for line in meminfo if line.startswith("MemTotal")))
        memory = f"{kilobytes / 2**20:.0f} GiB"
    except (OSError, StopIteration):
        pass
    versions = {}
    for package in ("dagtune", "torch", "distributed", "ray", "numpy"):
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = "not installed"
    return {
        "cpu": model,
        "cores": str(os.cpu_count()),
        "memory": memory,
        "python": platform.python_version(),
        "os": f"{platform.system()} {platform.release()}",
        **versions,
    }
