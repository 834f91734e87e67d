"""The watchdog echoes each line of a trainer's log once, even when two processes write the same
attempt's log: a hot standby killed as not ready and the forked trainer that replaces it are the
same attempt and append to the same file (CI once saw the replacement's lines printed twice)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from conftest import wait_for
from procsv.watchdog.children import ECHO_READ, ChildProcess, complete_lines


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


@pytest.mark.parametrize("data, at_cap, lines, used", [
    (b"", False, [], 0),
    (b"one\ntwo\nthr", False, ["one", "two"], 8),
    (b"epoch 1\r 10%\r 50%\r100%\ndone\r\n", False, ["100%", "done"], 29),  # a bar shows its last state, once
    (b"a\n 10%\r 20%", False, ["a"], 7),  # the open bar's redrawn state is done with; " 20%" stays
    (b"crlf\r", False, [], 0),  # a CRLF's first half: its line may still come whole
    (b"x" * 8, True, ["x" * 8], 8),  # a chunk of the cap with no line end at all is a line of its own
    (b"x" * 8, False, [], 0),
    (b"xx\xc3", True, ["xx"], 2),  # a cut never splits a UTF-8 character: its lead byte waits for the rest
    (b"xx\xc3\xa9", True, ["xx\u00e9"], 4),
])
def test_complete_lines_are_what_a_terminal_shows_and_the_position_moves_past_redraws(data, at_cap, lines, used):
    assert complete_lines(data, at_cap) == (lines, used)


def test_a_progress_bar_that_redraws_for_hours_is_read_once_and_echoed_in_its_last_state(tmp_path, writer):
    """A tqdm-style bar rewrites its line with carriage returns and ends it only at its end. The
    echo once read the open line again from its start at every round (ten a second), so its cost
    grew with the bar's length; it now moves past what was redrawn, and reads at most ECHO_READ."""
    log = str(tmp_path / "trainer.1.log")
    proc = writer(log, "start\n")
    child = ChildProcess("trainer", "trainer", 1, proc, log)  # type: ignore[arg-type]
    assert child.new_log_lines() == ["start"]
    bar = "".join(f"\rstep {i:7d} [{'#' * (i * 40 // 200_000):40s}]" for i in range(200_000))  # ~11 MB
    with open(log, "a") as fh:
        fh.write(bar)
    reads = -(-len(bar) // ECHO_READ)
    for _ in range(reads):
        assert child.new_log_lines() == []
    assert os.path.getsize(log) - child.log_pos < 60  # each byte read once: only the bar's last state is left
    with open(log, "a") as fh:
        fh.write("\nafter\n")
    assert child.new_log_lines() == [f"step  199999 [{'#' * 39:40s}]", "after"]


def test_a_line_longer_than_a_read_is_echoed_in_pieces_not_read_again_and_again(tmp_path, writer):
    log = str(tmp_path / "trainer.1.log")
    with open(log, "w") as fh:
        fh.write("x" * (ECHO_READ + 10))
    proc = writer(log, "\n")
    child = ChildProcess("trainer", "trainer", 1, proc, log)  # type: ignore[arg-type]
    assert child.new_log_lines() == ["x" * ECHO_READ]
    assert child.new_log_lines() == ["x" * 10]
    assert child.new_log_lines() == []


def test_at_the_reap_the_rest_of_the_log_is_echoed_its_last_mib_if_more_is_left(tmp_path, writer):
    """A child that dies with more than a read unread (it printed fast at the end) still shows its
    last lines, where its traceback is, and a line says how much was not echoed."""
    log = str(tmp_path / "trainer.1.log")
    with open(log, "w") as fh:
        fh.write("start\n")
    proc = writer(log, "ready\n")
    child = ChildProcess("trainer", "trainer", 1, proc, log)  # type: ignore[arg-type]
    assert child.new_log_lines() == ["start", "ready"]
    echoed_to = child.log_pos
    with open(log, "a") as fh:
        fh.write("".join(f"noise line {i:08d}\n" for i in range(200_000)))  # ~4 MB
        fh.write("Traceback (most recent call last):\nValueError: boom\nno newline at the end")
    lines = child.new_log_lines(final=True)
    assert lines[0].startswith("procsv: ") and "bytes of trainer.1.log were not echoed" in lines[0]
    assert lines[-3:] == ["Traceback (most recent call last):", "ValueError: boom", "no newline at the end"]
    assert lines[1].startswith("noise line ") and len(lines[1]) == len("noise line 00000000")  # a whole line
    assert child.log_pos == os.path.getsize(log) and child.new_log_lines(final=True) == []
    skipped = int(lines[0].split()[1])
    assert skipped + sum(len(line) + 1 for line in lines[1:]) - 1 == os.path.getsize(log) - echoed_to  # all accounted
