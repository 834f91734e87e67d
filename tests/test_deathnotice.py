"""The death notice (procsv.common.mutex, trainer.ends.deathnotice, watchdog.deathwatch) with real processes: SIGKILL, a crash and a clean exit of the mutex holder."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from conftest import wait_for
from procsv.common.env import DEATH_MUTEX
from procsv.common.mutex import RobustMutex
from procsv.watchdog.deathwatch import DeathWatch

HOLDER = """
import os, sys, time
from procsv.common import bootstrap
from procsv.trainer.ends import deathnotice
deathnotice.hold(bootstrap.read_config().death_mutex)
print("held", flush=True)
mode = sys.argv[1]
sys.stdin.readline()  # "go": the test's watch is waiting on the mutex now
if mode == "crash":
    raise RuntimeError("boom")
if mode == "clean":
    deathnotice.release()
    sys.exit(0)
time.sleep(60)
"""


def _run(tmp_path, mode: str, kill: bool):
    path = str(tmp_path / "m")
    mutex = RobustMutex(path, create=True)
    env = dict(os.environ, **{DEATH_MUTEX: path})
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, mode], env=env, stdout=subprocess.PIPE,
                            stdin=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    events: list[bool] = []
    got = threading.Event()
    try:
        assert proc.stdout.readline().strip() == "held"
        watch = DeathWatch(mutex, on_event=lambda died, at: (events.append(died), got.set()))
        wait_for(lambda: watch.waiting, 10, what="the watch to block on the held mutex")
        if kill:
            os.kill(proc.pid, signal.SIGKILL)
        else:
            proc.stdin.write("go\n")
            proc.stdin.flush()
        assert got.wait(10), "no notice within 10 s"
        watch.cancel()
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    return events


def test_sigkill_of_the_holder_is_an_owner_died_notice(tmp_path):
    assert _run(tmp_path, "sleep", kill=True) == [True]


def test_an_uncaught_exception_in_the_holder_is_an_owner_died_notice(tmp_path):
    assert _run(tmp_path, "crash", kill=False) == [True]


def test_a_clean_release_is_not_a_death(tmp_path):
    assert _run(tmp_path, "clean", kill=False) == [False]


def test_a_watch_on_a_process_that_never_takes_the_mutex_ends_when_it_is_reaped(tmp_path):
    """The watchdog cancels the watch as it reaps the process (ChildProcess.reap): its thread ends, no notice."""
    mutex = RobustMutex(str(tmp_path / "m"), create=True)
    events: list[bool] = []
    watch = DeathWatch(mutex, on_event=lambda died, at: events.append(died))
    time.sleep(0.05)  # (polling: nobody holds it)
    assert watch.thread.is_alive()
    watch.cancel()
    watch.thread.join(5)
    assert not watch.thread.is_alive() and events == []


def test_creating_a_mutex_twice_at_one_path_is_refused(tmp_path):
    RobustMutex(str(tmp_path / "m"), create=True)
    with pytest.raises(FileExistsError):
        RobustMutex(str(tmp_path / "m"), create=True)


def test_a_watch_closed_before_its_thread_ends_deletes_the_mutex_as_the_thread_ends(tmp_path):
    """Issue 51, point 9. Before: ``close`` of a watch whose thread had not ended within its timeout
    (a loaded machine) left the mapping and the file for good: a reaped trainer's mutex outlived it."""
    path = str(tmp_path / "trainer.5.mutex")
    mutex = RobustMutex(path, create=True)
    inside, go = threading.Event(), threading.Event()

    trylock = mutex.trylock

    def held() -> int:  # the thread is held here, as one a loaded machine does not run
        inside.set()
        go.wait(30)
        return trylock()

    mutex.trylock = held  # type: ignore[method-assign]
    watch = DeathWatch(mutex, on_event=lambda died, at: None)
    assert inside.wait(10)
    assert watch.close(timeout=0.1) is False and os.path.exists(path)  # its thread still runs: kept
    go.set()
    watch.thread.join(10)
    assert not watch.thread.is_alive() and not os.path.exists(path)
