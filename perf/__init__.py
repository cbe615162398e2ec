"""dagtune's benchmarks: ``python -m perf`` (see perf/run.py)."""
