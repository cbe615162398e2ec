"""One writer per study (`dagtune.study_lease`), on local disk and on the loopback S3 endpoint:
real processes opening one study at once, a holder killed with SIGKILL, a holder paused
(SIGSTOP, as a sleeping laptop) whose lease lapses and is taken over, and contenders racing
for a lapsed lease. Whatever happens, every trial read back has the metrics of its config.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import dagtune as dt
from dagtune.catalog import load_study
from dagtune.checkpoints import CheckpointStore
from dagtune.config import config_dumps, config_from_json, normalize_config
from dagtune.results import open_results
from dagtune.sim import SimulatedExecutor, SyntheticTrainer
from dagtune.study_lease import StudyInUseError, StudyLease, StudyLeaseLostError

pytestmark = pytest.mark.slow

HERE = os.path.dirname(os.path.abspath(__file__))
STEPS = 8


def wait_for(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"gave up waiting for {what}")
        time.sleep(0.05)


def start(storage, tmp_path, tag: str, lrs: list[float], **settings) -> tuple[subprocess.Popen, dict]:
    """`lease_study_script.py` as a process of its own (see there for the settings)."""
    settings = {
        "name": "shared",
        "lrs": lrs,
        "steps": STEPS,
        "delay": 0.2,
        "log": str(tmp_path / "steps.log"),  # one for all: trainer arguments are part of the model
        "opened": str(tmp_path / f"{tag}.opened"),
        "out": str(tmp_path / f"{tag}.json"),
        "ready": str(tmp_path / f"{tag}.ready"),
        "go": None,
        "lease_ttl": 45.0,
        "wait_for_lease": 0.0,
        **settings,
    }
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([HERE, os.environ.get("PYTHONPATH", "")])}
    args = [storage.url, json.dumps(storage.options), json.dumps(settings)]
    process = subprocess.Popen(
        [sys.executable, os.path.join(HERE, "lease_study_script.py"), *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    return process, settings


def finish(process: subprocess.Popen, timeout: float = 300) -> str:
    try:
        output, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        output, _ = process.communicate()
        raise AssertionError(f"the study process did not end:\n{output[-3000:]}") from None
    return output


def alone(lr: float) -> dict:
    return dt.run_alone(SyntheticTrainer, {"lr": lr}, STEPS)[-1]


def assert_every_trial_has_its_configs_metrics(storage, lrs: set[float]) -> None:
    """Read back through the trial records (as `dagtune status`) and the results group: one
    trial per learning rate, ids 0..n-1, each completed with the metrics of training it alone."""
    store = CheckpointStore(storage.url, storage.options)
    stored = load_study(store, "shared")
    assert not [i for i in stored.incidents if "trial record" in i], stored.incidents
    assert sorted(t.id for t in stored.trials) == list(range(len(lrs)))
    assert sorted(t.config["lr"](0) for t in stored.trials) == sorted(lrs)
    for trial in stored.trials:
        assert trial.status == "completed"
        assert trial.metrics == alone(trial.config["lr"](0))
    results = open_results(storage.url, "shared", storage.options).trials
    assert sorted(results.index) == list(range(len(lrs)))
    for _, row in results.iterrows():
        expected = alone(config_from_json(json.loads(row["config"]))["lr"](0))
        assert row["status"] == "completed"
        assert {m: row[m] for m in expected} == expected


# On local disk only (the two-process tests cost ~30 s each): on S3, the race of two processes
# creating the lease is the exclusive creation `test_contenders_for_a_lapsed_lease_never_both_win`
# races there, the refusal and its message do not depend on the storage, and a new process
# taking the study over and a released study opened again are `test_a_paused_holder...` and
# `test_a_released_study...` on S3.
LOCAL_ONLY = pytest.mark.parametrize("storage", ["local"], indirect=True)


@LOCAL_ONLY
def test_a_second_process_opening_the_study_is_refused_naming_the_holder(storage, tmp_path):
    go = tmp_path / "go"
    first, first_settings = start(storage, tmp_path, "a", [0.1, 0.05], go=str(go))
    second, second_settings = start(storage, tmp_path, "b", [0.01, 0.02], go=str(go))
    try:
        wait_for(
            lambda: (tmp_path / "a.ready").exists() and (tmp_path / "b.ready").exists(), 120, "both ready"
        )
        go.write_text("")  # both open the study now
        outputs = {p: finish(p) for p in (first, second)}
    finally:
        for process in (first, second):
            if process.poll() is None:
                process.kill()
    codes = sorted((first.returncode, second.returncode))
    assert codes == [0, 3], outputs
    winner, loser = (first, second) if first.returncode == 0 else (second, first)
    winner_settings, loser_settings = (
        (first_settings, second_settings) if winner is first else (second_settings, first_settings)
    )
    session = Path(winner_settings["opened"]).read_text()
    message = outputs[loser]
    assert "StudyInUseError: study 'shared'" in message
    for part in (f"pid {winner.pid}", f"session {session[:12]}", f"host {os.uname().nodename}"):
        assert part in message, message
    assert "wait_for_lease" in message and "--wait-for-lease" in message
    assert "lapses" in message
    assert not os.path.exists(loser_settings["opened"])  # it never opened the study

    # the refused process, run again once the first has finished, adds its trials
    again, _ = start(storage, tmp_path, "c", loser_settings["lrs"])
    output = finish(again)
    assert again.returncode == 0, output[-3000:]
    assert_every_trial_has_its_configs_metrics(storage, {0.1, 0.05, 0.01, 0.02})


@LOCAL_ONLY  # whether the holder's process is gone is asked of this machine, not of storage
def test_a_study_whose_holder_was_killed_is_taken_over_at_once_on_its_machine(storage, tmp_path):
    first, settings = start(storage, tmp_path, "a", [0.1, 0.05])
    try:
        wait_for(lambda: os.path.exists(settings["log"]), 120, "the first process to train a step")
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait(30)
    began = time.monotonic()
    second, _ = start(storage, tmp_path, "b", [0.1, 0.05], wait_for_lease=0.0)
    output = finish(second)
    assert second.returncode == 0, output[-3000:]  # not refused: the holder's process is gone
    print(f"took over a killed holder's study ({storage.kind}) in {time.monotonic() - began:.1f} s")
    assert_every_trial_has_its_configs_metrics(storage, {0.1, 0.05})


def journal_files(storage) -> dict[str, int]:
    store = CheckpointStore(storage.url, storage.options)
    directory = f"{store.root}/studies/shared/journal"
    store.fs.invalidate_cache(directory)
    return {info["name"]: info["size"] for info in store.fs.ls(directory, detail=True)}


def test_a_paused_holder_loses_its_lease_to_a_waiting_process_and_stops_writing(storage, tmp_path):
    first, first_settings = start(storage, tmp_path, "a", [0.1, 0.05], lease_ttl=4.0, delay=0.3)
    second = None
    try:
        wait_for(lambda: os.path.exists(first_settings["log"]), 120, "the first process to train a step")
        first.send_signal(signal.SIGSTOP)  # a laptop closed mid-study
        paused = time.monotonic()
        second, second_settings = start(
            storage, tmp_path, "b", [0.1, 0.05, 0.01], lease_ttl=4.0, delay=0.3, wait_for_lease=120.0
        )
        wait_for(lambda: os.path.exists(second_settings["opened"]), 180, "the second process to take over")
        waited = time.monotonic() - paused
        assert waited >= 4.0  # the paused holder's lease had to lapse first
        before = journal_files(storage)
        first.send_signal(signal.SIGCONT)  # the laptop wakes up
        output = finish(first)
        assert first.returncode == 4, output[-3000:]
        taker = Path(second_settings["opened"]).read_text()
        assert f"was taken over by session {taker[:12]}" in output
        output = finish(second)
        assert second.returncode == 0, output[-3000:]
    finally:
        for process in (first, second):
            if process is not None and process.poll() is None:
                process.send_signal(signal.SIGCONT)
                process.kill()
    after = journal_files(storage)
    first_session = Path(first_settings["opened"]).read_text()
    written_late = [path for path, size in after.items() if before.get(path) != size]
    assert written_late and all(first_session not in path for path in written_late), written_late
    assert_every_trial_has_its_configs_metrics(storage, {0.1, 0.05, 0.01})


def race(
    store: CheckpointStore, name: str, contenders: int
) -> tuple[list[StudyLease], list[StudyInUseError]]:
    """`contenders` threads, released at once, each trying to take study `name`'s lease
    (waiting up to 10 s); returns the winners and the refusals."""
    winners: list[StudyLease] = []
    refused: list[StudyInUseError] = []
    barrier = threading.Barrier(contenders)

    def contend() -> None:
        lease = StudyLease(store, name, ttl=30.0)
        barrier.wait()
        try:
            winners.append(lease.acquire(wait=10.0))
        except StudyInUseError as error:
            refused.append(error)

    threads = [threading.Thread(target=contend) for _ in range(contenders)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    return winners, refused


def test_contenders_for_a_lapsed_lease_never_both_win(storage):
    store = CheckpointStore(storage.url, storage.options)
    holders = {}
    for round_ in range(2):
        name = f"race-{round_}"
        holder = StudyLease(store, name, ttl=3.0).acquire()
        holder._stop.set()  # its heartbeat stops, as if its machine slept
        holder._heartbeat.join()
        holders[name] = holder
    with ThreadPoolExecutor(len(holders)) as pool:  # both races at once: their waits overlap
        raced = dict(zip(holders, pool.map(lambda name: race(store, name, 4), holders)))
    for name, holder in holders.items():
        winners, refused = raced[name]
        assert len(winners) == 1 and len(refused) == 3, (winners, refused)
        (winner,) = winners
        assert all(error.holder.session == winner.session for error in refused)
        holder.valid_until = -1.0  # its validity ran out while it slept
        with pytest.raises(StudyLeaseLostError, match=f"taken over by session {winner.session[:12]}"):
            holder.ensure()
        winner.ensure()  # the winner holds it
        winner.release()


def test_a_stale_listing_cached_by_another_thread_never_hides_the_lease_files(storage, monkeypatch):
    """The filesystem object, and so its listings cache, is shared by the process: a listing
    another contender took before this one wrote its files can be cached after this one
    invalidated it. Reading the lease must not trust that listing (s3fs would answer
    FileNotFoundError for files that exist, as a CI run once did)."""
    store = CheckpointStore(storage.url, storage.options)
    lease = StudyLease(store, "stale", ttl=30.0)
    fs = getattr(store.fs, "fs", store.fs)  # the fsspec filesystem under any retrying wrapper
    directory = fs._strip_protocol(lease.directory)

    def after_a_stale_listing(method):
        def called(path, *args, **kwargs):
            fs.dircache[directory] = []  # another thread's listing, from before the writes
            return method(path, *args, **kwargs)

        return called

    monkeypatch.setattr(fs, "info", after_a_stale_listing(fs.info))
    monkeypatch.setattr(fs, "ls", after_a_stale_listing(fs.ls))
    acquired: list[StudyLease] = []
    taking = threading.Thread(target=lambda: acquired.append(lease.acquire()), daemon=True)
    taking.start()
    taking.join(60)  # a lease trusting the stale listing never sees its own generation: it loops
    assert acquired, "the lease was not taken within 60 s"
    (held,) = acquired
    try:
        stamp = lease._storage_now()
        assert stamp is None or stamp > 0
        top = lease._top()
        assert top is not None and top.holder.session == held.session
    finally:
        held.release()


def test_a_released_study_is_opened_at_once_and_a_held_one_is_refused_in_process(storage):
    store = CheckpointStore(storage.url, storage.options)
    executor = SimulatedExecutor(2, store=store)
    config = normalize_config({"lr": 0.1})
    with dt.Study(SyntheticTrainer, name="shared", executor=executor) as study:
        study.submit(config, STEPS).result()
        with pytest.raises(
            StudyInUseError, match=r"is already open in this process .* close that Study first"
        ):
            dt.Study(SyntheticTrainer, name="shared", executor=SimulatedExecutor(2, store=store))
    began = time.monotonic()
    with dt.Study(SyntheticTrainer, name="shared", executor=SimulatedExecutor(2, store=store)) as again:
        assert [config_dumps(t.config) for t in again.coordinator.trials.values()] == [config_dumps(config)]
    assert time.monotonic() - began < 30  # released: no lease to wait out


def test_lease_settings_are_checked_first(tmp_path):
    for field, value in (("lease_ttl", 0), ("lease_ttl", float("nan")), ("wait_for_lease", -1)):
        with pytest.raises(ValueError, match=f"{field} must be"):
            dt.Study(SyntheticTrainer, name="x", storage=str(tmp_path), **{field: value})
    with pytest.raises(ValueError, match="storage_retry_seconds must be a finite number of seconds >= 0"):
        dt.Study(SyntheticTrainer, name="x", storage=str(tmp_path), storage_retry_seconds=float("inf"))
