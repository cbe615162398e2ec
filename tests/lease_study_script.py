"""A study run as its own process by `test_study_lease.py`, to open one study from two
processes at once, kill it, pause it.

usage: python lease_study_script.py STORAGE OPTIONS_JSON SETTINGS_JSON

SETTINGS_JSON holds ``name``, ``lrs`` (one trial per learning rate), ``steps``, ``delay``
(seconds per step), ``log`` (a file that gets a line per trained step), ``opened`` (a file
written once the study is open: its writer session), ``out`` (the trials as run, JSON),
``lease_ttl`` and ``wait_for_lease``; with ``go``, it writes the file ``ready`` once its
cluster runs and opens the study when the file ``go`` exists (two processes open it at once). Exit status: 0 done, 3 refused (the study is in use; the
message is printed), 4 the lease was lost (printed), 1 anything else.
"""

from __future__ import annotations

import faulthandler
import json
import os
import signal
import sys
import time
import traceback

from distributed import Client, LocalCluster
from durable_helpers import SlowTrainer

import dagtune as dt
from dagtune.study_lease import StudyInUseError, StudyLeaseLostError


def caused_by(error: BaseException, kind: type) -> BaseException | None:
    seen = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, kind):
            return error
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return None


def run(storage: str, options: dict, settings: dict) -> None:
    with (
        LocalCluster(
            n_workers=1,
            threads_per_worker=2,
            processes=False,  # in-process workers: stopped and killed with this process
            dashboard_address="127.0.0.1:0",
        ) as cluster,
        Client(cluster) as client,
    ):
        if settings["go"]:
            with open(settings["ready"], "w"):
                pass
            while not os.path.exists(settings["go"]):
                time.sleep(0.01)
        open_and_run(client, storage, options, settings)


def open_and_run(client: Client, storage: str, options: dict, settings: dict) -> None:
    with (
        dt.Study(
            SlowTrainer,
            {"delay": settings["delay"], "log": settings["log"]},
            name=settings["name"],
            storage=storage,
            storage_options=options,
            client=client,
            checkpoint_every=2,
            lease_ttl=settings["lease_ttl"],
            wait_for_lease=settings["wait_for_lease"],
        ) as study,
    ):
        with open(settings["opened"], "w") as file:
            file.write(study._lease.session)
        handles = [study.submit({"lr": lr}, settings["steps"]) for lr in settings["lrs"]]
        trials = [
            {"id": h.id, "lr": h.trial.config["lr"](0), "metrics": h.result(timeout=300)} for h in handles
        ]
    with open(settings["out"], "w") as file:
        json.dump(trials, file)


def main() -> int:
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # a test that waits in vain asks for stacks
    storage, options, settings = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
    try:
        run(storage, options, settings)
    except BaseException as error:
        for kind, status in ((StudyInUseError, 3), (StudyLeaseLostError, 4)):
            found = caused_by(error, kind)
            if found is not None:
                print(f"{kind.__name__}: {found}", flush=True)
                return status
        traceback.print_exc()
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
