"""The watchdog echoes each line of a trainer's log once, even when two processes write the same
attempt's log: a hot standby killed as not ready and the forked trainer that replaces it are the
same attempt and append to the same file (CI once saw the replacement's lines printed twice)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from conftest import wait_for
from procsv.watchdog.children import ChildProcess


@pytest.fixture
def writer(tmp_path):
    """writer(log_path, text): a real process that appends ``text`` to ``log_path``, as a trainer
    writes its log, and lives on (returned once the text is in the file); killed at teardown."""
    procs: list[subprocess.Popen[bytes]] = []

    def start(log_path: str, text: str) -> subprocess.Popen[bytes]:
        code = f"import time; f = open({log_path!r}, 'a'); f.write({text!r}); f.flush(); time.sleep(120)"
        procs.append(subprocess.Popen([sys.executable, "-c", code]))
        wait_for(lambda: os.path.exists(log_path) and text in open(log_path).read(), 30, what="the line")
        return procs[-1]

    yield start
    for p in procs:
        p.kill()
        p.wait()


def test_a_process_that_takes_over_a_shared_log_echoes_each_line_once(tmp_path, writer):
    log = str(tmp_path / "trainer.4.log")
    standby_proc = writer(log, "procsv: standby ready after 0.59 s; waiting to be promoted\n")
    standby = ChildProcess("standby", "trainer", 4, standby_proc, log)  # type: ignore[arg-type]
    assert standby.new_log_lines() == ["procsv: standby ready after 0.59 s; waiting to be promoted"]
    with open(log, "a") as fh:
        fh.write("a line the standby wrote before it was killed\n")
    fork_proc = writer(log, "procsv: restored step 18 from model.ckpt-18\n")
    fork = ChildProcess("trainer", "trainer", 4, fork_proc, log)  # type: ignore[arg-type]
    fork.take_over_log([standby, fork])
    echoed = standby.new_log_lines() + fork.new_log_lines()
    assert echoed == ["a line the standby wrote before it was killed", "procsv: restored step 18 from model.ckpt-18"]
    with open(log, "a") as fh:
        fh.write("procsv: final checkpoint committed at step 180\n")
    assert standby.new_log_lines() + fork.new_log_lines() == ["procsv: final checkpoint committed at step 180"]


def test_processes_with_their_own_logs_are_not_silenced(tmp_path, writer):
    a_proc = writer(str(tmp_path / "trainer.3.log"), "three\n")
    b_proc = writer(str(tmp_path / "trainer.4.log"), "four\n")
    a = ChildProcess("trainer", "trainer", 3, a_proc, str(tmp_path / "trainer.3.log"))  # type: ignore[arg-type]
    b = ChildProcess("trainer", "trainer", 4, b_proc, str(tmp_path / "trainer.4.log"))  # type: ignore[arg-type]
    b.take_over_log([a, b])
    assert a.new_log_lines() == ["three"] and b.new_log_lines() == ["four"]
