"""A plain Python script that runs a study shows a progress line on a terminal, and nothing
when its output goes to a file or a pipe."""

from __future__ import annotations

import os
import pty
import select
import subprocess
import sys
import textwrap
import time

SCRIPT = textwrap.dedent(
    """
    import dagtune as dt
    from dagtune.algos import GridSearch
    from dagtune.checkpoints import CheckpointStore
    from dagtune.sim import SimulatedExecutor, SyntheticTrainer

    if __name__ == "__main__":
        store = CheckpointStore("{storage}")
        with dt.Study(SyntheticTrainer, name="bar", storage="{storage}",
                      executor=SimulatedExecutor(2, store=store)) as study:
            space = dt.Grid({{"lr": [0.1, 0.05, 0.02, 0.01]}})
            result = study.run(GridSearch(space, metric="val_loss", mode="min", steps=5){progress})
        print("done", len(result.trials))
    """
)


def script(tmp_path, progress: str = "") -> str:
    path = tmp_path / "plain.py"
    path.write_text(SCRIPT.format(storage=tmp_path / "runs", progress=progress))
    return str(path)


def environment() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [os.getcwd(), env.get("PYTHONPATH")]))
    env.update(TERM="xterm", COLUMNS="120")
    return env


def run_in_terminal(path: str, timeout: float = 120) -> str:
    """Run `path` with a pseudo-terminal as its stdout and stderr; everything it wrote."""
    leader, follower = pty.openpty()
    process = subprocess.Popen(
        [sys.executable, path], stdin=follower, stdout=follower, stderr=follower, env=environment()
    )
    os.close(follower)
    chunks, deadline = [], time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([leader], [], [], 0.5)
            if ready:
                try:
                    chunk = os.read(leader, 65536)
                except OSError:  # the terminal closed: the script ended
                    break
                if not chunk:
                    break
                chunks.append(chunk)
            elif process.poll() is not None:
                break
    finally:
        os.close(leader)
        if process.poll() is None:
            process.kill()
        process.wait(timeout=30)
    return b"".join(chunks).decode(errors="replace")


def test_a_plain_script_shows_a_progress_line_on_a_terminal(tmp_path):
    output = run_in_terminal(script(tmp_path))
    assert "done 4" in output
    assert "4/4" in output and "trials" in output and "saved by reuse" in output and "best val_loss" in output


def test_nothing_is_shown_off_a_terminal_or_when_asked_not_to(tmp_path):
    done = subprocess.run(
        [sys.executable, script(tmp_path)], capture_output=True, text=True, env=environment(), timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "done 4" and "trials" not in done.stderr
    quiet = run_in_terminal(script(tmp_path, progress=", progress=False"))
    assert "done 4" in quiet and "saved by reuse" not in quiet


def test_a_resumed_study_counts_no_earlier_session_as_saved_by_reuse(tmp_path):
    """A trial cut at step 15 (its checkpoint at 12) resumes: the run trains 18 steps (12 to
    30) for the 15 steps its trial reaches in it, which reuse saved none of (the earlier
    session's 15 steps are not this run's: counted, they read as 12 saved)."""
    import io

    import dagtune as dt
    from dagtune.algos import GridSearch
    from dagtune.checkpoints import CheckpointStore
    from dagtune.progress import read_state, watch, work
    from dagtune.sim import SimulatedExecutor, SyntheticTrainer

    def study() -> dt.Study:
        executor = SimulatedExecutor(1, store=CheckpointStore(str(tmp_path)))
        return dt.Study(SyntheticTrainer, name="cut", executor=executor, checkpoint_every=12)

    with study() as first:
        first.submit({"lr": 0.05}, 30)
        while first.coordinator.executed_steps < 15:
            first.coordinator.pump()
    with study() as again:
        start = read_state(again, "val_loss", "min", time.monotonic(), work(again))
        assert (start.trained, start.trial_steps, start.saved) == (0, 0, 0)
        stream = io.StringIO()
        with watch(again, "val_loss", "min", show="terminal", stream=stream, interval=60):
            again.run(GridSearch([{"lr": 0.05}], metric="val_loss", mode="min", steps=30))
        assert "1/1 trials finished, 18 steps trained, 0 saved by reuse" in stream.getvalue()
