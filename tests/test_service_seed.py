"""A launch's service seeds (``services/seed.py``, ``procsv/watchdog/seeds.py``), without TensorFlow.

``procsv launch`` forks a seed per service before its watchdog starts any thread; the watchdog grows
each service's first attempt from it where the service's environment suits the seed's imports (pure:
:func:`procsv.watchdog.seeds.suits`), else discards it. Here a small program plants the seeds as a
launch does and uses them as its watchdog would: one grown with a log it cannot open (the service
runs, its output discarded, after one line on the planter's stderr, as a fresh spawn's), one whose
environment does not suit (discarded: none left), and one never used (it ends at its pipe's EOF with
0). A real launch's seeded services, their log, their ``spawned`` record, and a seeded service
SIGKILLed and replaced by a fresh one started alike: ``tests/test_zygote_seed.py`` (its warm launch, and
its fresh one's services).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from conftest import REPO, quick_guard_env
from procsv.watchdog.seeds import suits

BORN = {"PATH": "/usr/bin", "HOME": "/h", "TF_CPP_MIN_LOG_LEVEL": "3", "PROCSV_PREEMPT_SIGNAL": "15"}


def test_a_seed_suits_a_service_whose_environment_differs_only_where_no_import_reads():
    child = {**BORN, "PROCSV_ROLE": "checkpoint", "PROCSV_ATTEMPT": "1", "PYTHONUNBUFFERED": "1"}
    assert suits(BORN, "/r", False, child, "/r")  # a child's coordinates; its streams are lossyio's
    assert suits(BORN, "/r", False, {**child, "TF_CPP_MIN_LOG_LEVEL": "2"}, "/r")  # no TensorFlow imported then
    assert not suits(BORN, "/r", True, {**child, "TF_CPP_MIN_LOG_LEVEL": "2"}, "/r")  # read at its import
    assert not suits(BORN, "/r", False, {**child, "OPENBLAS_NUM_THREADS": "1"}, "/r")  # read at numpy's
    assert not suits(BORN, "/r", False, {k: v for k, v in child.items() if k != "HOME"}, "/r")
    assert not suits(BORN, "/r", False, child, "/elsewhere")  # python -m puts its directory on sys.path


_PLANT = """
import json, os, signal, sys
import psutil
from procsv.watchdog.seeds import ServiceSeeds

log, env, cwd = sys.argv[1], dict(os.environ), os.getcwd()
seeds = ServiceSeeds.plant(signal.SIGTERM)
summary, checkpoint = seeds.get("summary"), seeds.get("checkpoint")
pids = [summary.pid, checkpoint.pid]
grown = summary.start({**env, "PROCSV_ROLE": "summary"}, log, cwd)  # no PROCSV_LOGDIR: run_service says so, exits 2
said = {"grown": grown is not None and grown.pid == pids[0],
        "summary": grown.wait() if grown is not None else None}
said["unsuited"] = checkpoint.start({**env, "OPENBLAS_NUM_THREADS": "3"}, log, cwd) is None  # discarded
seeds.discard()  # (both taken: a no-op)
again = ServiceSeeds.plant(signal.SIGTERM)
unused = again.get("checkpoint")
os.close(unused.req_w)  # the watchdog gone or done with it: EOF
said["unused"] = unused.process.wait()
again.get("summary").discard()
said["children"] = [p.pid for p in psutil.Process().children()]
said["left"] = [p for p in pids if psutil.pid_exists(p)]
print(json.dumps(said))
"""


def test_seeds_grow_into_a_service_whose_log_cannot_be_opened_or_end_with_nothing_left(tmp_path):
    missing = str(tmp_path / "gone" / "summary.1.log")  # its folder does not exist
    run = subprocess.run([sys.executable, "-c", _PLANT, missing], capture_output=True, text=True, timeout=120,
                         cwd=REPO, env={**os.environ, **quick_guard_env()})
    assert run.returncode == 0, run.stderr
    said = json.loads(run.stdout.strip().splitlines()[-1])
    assert said == {"grown": True, "summary": 2, "unsuited": True, "unused": 0, "children": [],
                    "left": []}, (said, run.stderr)
    assert run.stderr.count("procsv: cannot open") == 1, run.stderr  # said on the planter's stderr, as a spawn's
    assert f"{missing} (No such file or directory); this process's output is discarded" in run.stderr
    assert "must be set" not in run.stderr  # the service's own line: discarded with its output


_IGNORING = """
import json, signal, time
from procsv.watchdog.seeds import ServiceSeeds

for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGQUIT):  # as a script's `procsv launch ... &` inherits SIGINT
    signal.signal(sig, signal.SIG_IGN)
seeds = ServiceSeeds.plant(signal.SIGUSR1)
def status(pid):
    with open(f"/proc/{pid}/status") as fh:
        return {k: int(v, 16) for k, v in (l.split(":", 1) for l in fh.read().splitlines()) if k in ("SigIgn", "SigBlk")}
said = {}
for role in ("checkpoint", "summary"):
    pid = seeds.get(role).pid
    deadline = time.monotonic() + 60
    # set up, waiting: its stop signals blocked, then its preempt signal ignored (its last step before the pipe)
    while not (status(pid)["SigBlk"] & (1 << (signal.SIGTERM - 1)) and status(pid)["SigIgn"] & (1 << (signal.SIGUSR1 - 1))):
        assert time.monotonic() < deadline, "the seed never blocked its stop signals"
        time.sleep(0.01)
    ignored = status(pid)["SigIgn"]
    said[role] = sorted(signal.Signals(s).name for s in range(1, 32) if ignored & (1 << (s - 1)))
seeds.discard()
print(json.dumps(said))
"""


def test_a_seed_takes_the_stop_signals_at_their_default_where_the_launch_ignored_them():
    """A fresh service is spawned by the watchdog, which catches SIGTERM and SIGINT, so its ``exec`` leaves
    both at their default whatever the launch inherited; a seed, forked before the watchdog took them,
    resets them likewise (ignored, they would be discarded, never read by its signalfd). What else the
    launch ignored stays ignored, as across an ``exec``; SIGHUP and the preempt signal as a spawn's."""
    run = subprocess.run([sys.executable, "-c", _IGNORING], capture_output=True, text=True, timeout=120,
                         cwd=REPO, env={**os.environ, **quick_guard_env()})
    assert run.returncode == 0, run.stderr
    said = json.loads(run.stdout.strip().splitlines()[-1])
    # SIGPIPE and SIGXFSZ: ignored by every Python interpreter's start
    fresh = ["SIGHUP", "SIGPIPE", "SIGQUIT", "SIGUSR1", "SIGXFSZ"]
    assert said == {"checkpoint": fresh, "summary": fresh}, said
