"""The watchdog's loop never waits on the logdir's filesystem (issue 39, point 2).

A write of ``status.json`` on a stalled network filesystem blocks for as long as the stall lasts.
The fault point ``watchdog:status_stall`` (:meth:`procsv.watchdog.publish.statusfile.StatusWriter.write`) blocks
every write of a record past step 0 for 5 s, in whichever thread writes it; a SIGKILLed trainer must
still be restarted at once. Also the pure parts: a look at the logdir that does not return counts
as failing, and the writer thread keeps lifecycle records in order with the time they happened.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time

import pytest

from conftest import (committed_steps, finish, launch, lifecycle, quick_guard_env, quiet_env, raw_status, wait_for,
                      wait_role_pid)

from procsv.common.layout import Layout
from procsv.watchdog.logdirwatch import Look, LogdirHealth
from procsv.watchdog.publish.diskio import DiskIO
from procsv.watchdog.publish.events import Event, EventLog

ARGS = ("--steps", "1000000", "--save-model-secs", "1", "--step-delay", "0.004", "--print-every-steps", "100000")


@pytest.mark.slow
def test_a_trainer_killed_while_status_writes_stall_is_restarted_at_once_and_one_whose_end_cannot_be_read_resumes(
        logdir, tmp_path):
    """Two kills of the trainer in one launch, each while a write or a read of the logdir stalls.

    First (``watchdog:status_stall``): before, the write ran in the loop, which noticed the death and
    spawned the next trainer only after the write in progress (5 s after the kill). The first three
    writes past step 0 stall: the first one's record names the trainer, and it is killed while the
    second one stalls.

    Then (``watchdog:error_read_stall``, its third and fourth hits: the reads of the second trainer's
    error file at its death notice and at its exit; the first kill's two reads come before) the reads
    block until the test creates the gate file, as reads of a stalled network filesystem block until the
    stall ends. Before: the loop did those reads itself and stopped in the first one: no status record,
    no decision, no restart until the stall ended. Now the reader thread stalls; the loop decides without
    the reads once their bound has passed (the failure record says so), restarts the trainer, which
    resumes from its checkpoint, and goes on writing status.json; when the stall ends, the late reads
    change nothing."""
    gate = str(tmp_path / "gate")
    stopped = False
    proc = launch(logdir, *ARGS, env=quiet_env(PROCSV_FAULT="watchdog:status_stall:1-3,watchdog:error_read_stall:3-4",
                                               PROCSV_FAULT_GATE=gate))
    try:
        st = wait_for(lambda: (s := raw_status(logdir)) and s.get("step", 0) > 0 and s, 180,
                      what="a status record past step 0")
        pid = next(p["pid"] for p in st["processes"] if p["role"] == "trainer")
        killed = time.time()
        os.kill(pid, signal.SIGKILL)
        spawned = wait_for(lambda: [e for e in lifecycle(logdir) if e["event"] == "spawned"
                                    and e["role"] == "trainer" and e["attempt"] == 2], 60,
                           what="the second trainer's spawn in lifecycle.jsonl")[0]
        # the second trainer (its pid from its spawn: status.json, its writes stalled, may still name the first)
        second = spawned["pid"]
        wait_for(lambda: committed_steps(logdir), 180, what="a committed checkpoint")
        restored_before = len([e for e in lifecycle(logdir) if e["event"] == "restored"])
        os.kill(second, signal.SIGKILL)
        # while the reads stall (the gate is closed): the death is decided and the trainer restarted ...
        restored = wait_for(lambda: [e for e in lifecycle(logdir) if e["event"] == "restored"][restored_before:], 90,
                            what="the next attempt's restore while the reads of the logdir stall")[0]
        # ... and the loop goes on: it builds status records that show the new attempt training
        wait_for(lambda: (raw_status(logdir) or {}).get("step", 0) > restored["step"] + 50, 60,
                 what="status.json to show the new attempt training while the reads stall")
        assert not os.path.exists(gate)
        opened = time.time()
        with open(gate, "w"):
            pass  # the stall ends: the late reads return
        wait_for(lambda: (raw_status(logdir) or {}).get("updated_at", 0) > opened + 1, 30,
                 what="status.json written after the stall ended")
        os.killpg(proc.pid, signal.SIGTERM)
        stopped = True
    finally:
        with open(gate, "a"):
            pass
        if not stopped:
            os.killpg(proc.pid, signal.SIGTERM)
        code, out, err = finish(proc)
    records = lifecycle(logdir)
    noticed = [e for e in records if e["event"] == "death_noticed" and e["attempt"] == 1 and e["role"] == "trainer"]
    assert noticed and noticed[0]["noticed"] - killed < 1.5, noticed
    assert spawned["time"] - killed < 4.0, (spawned, killed)  # the hot standby, promoted at once (before: 5 s)
    assert code == 143, err
    finished = [e for e in records if e["event"] == "finished"]  # the last records were written
    assert [(e["state"], e["exit_code"]) for e in finished] == [("stopped", 143)]
    assert (raw_status(logdir) or {}).get("exit_code") == 143
    ends = [e for e in records if e["event"] == "exited" and e["role"] == "trainer" and e["attempt"] == 2]
    assert [(e["pid"], e.get("signal")) for e in ends] == [(second, "SIGKILL")]  # decided once
    assert [e["attempt"] for e in records if e["event"] == "spawned" and e["role"] == "trainer"] == [1, 2, 3]
    assert [e["attempt"] for e in records if e["event"] == "restarted"] == [2, 3]
    assert restored["step"] > 0 and restored["step"] in committed_steps(logdir)
    import tensorflow as tf

    assert tf.train.load_checkpoint(restored["path"]).get_variable_to_shape_map()  # a real checkpoint, read back
    assert (f"trainer attempt 2 (pid {second}) was killed by SIGKILL (its error file and exit report could not be "
            "read within 3 s: the logdir's filesystem stalls; decided without them)") in err, err


@pytest.mark.slow
def test_a_restart_whose_log_rotation_stalls_does_not_stop_the_loop(logdir, tmp_path):
    """Fresh trainers (``--no-prewarm``): the rotation of the restarted trainer's logs (the fourth
    rotation: the two services, attempt 1, attempt 2) stalls on the fault point
    ``watchdog:rotate_stall`` until the test creates the gate file. Before: the loop rotated after
    the spawn and stopped there: the metrics endpoint kept the dead attempt's snapshot. Now the
    writer thread stalls (status.json with it) and the loop goes on: the metrics it publishes show
    attempt 2 training; once the stall ends the records are written, in order."""
    from test_metrics import free_port, try_scrape, value

    gate, port = str(tmp_path / "gate"), free_port()
    stopped = False
    proc = launch(logdir, *ARGS, opts=("--no-prewarm", "--metrics-port", str(port)),
                  env=quiet_env(PROCSV_FAULT="watchdog:rotate_stall:4", PROCSV_FAULT_GATE=gate))
    try:
        wait_for(lambda: committed_steps(logdir), 180, what="a committed checkpoint")
        pid = wait_role_pid(logdir, "trainer")
        os.kill(pid, signal.SIGKILL)

        def training(attempt: int, above: float) -> bool:
            got = try_scrape(port)
            return got is not None and value(got, "procsv_trainer_attempt") == attempt \
                and (value(got, "procsv_step") or 0) > above

        wait_for(lambda: training(2, 0), 120, what="the metrics to show attempt 2 while the rotation stalls")
        step = value(try_scrape(port) or {}, "procsv_step") or 0
        wait_for(lambda: training(2, step + 50), 60, what="attempt 2 to train on while the rotation stalls")
        assert not os.path.exists(gate)
        with open(gate, "w"):
            pass
        os.killpg(proc.pid, signal.SIGTERM)
        stopped = True
    finally:
        with open(gate, "a"):
            pass
        if not stopped:
            os.killpg(proc.pid, signal.SIGTERM)
        code, out, err = finish(proc)
    assert code == 143, err
    records = lifecycle(logdir)
    assert [e["attempt"] for e in records if e["event"] == "spawned" and e["role"] == "trainer"] == [1, 2]
    assert [(e["attempt"], e.get("signal")) for e in records if e["event"] == "exited" and e["role"] == "trainer"] \
        == [(1, "SIGKILL"), (2, None)]
    restored = [e for e in records if e["event"] == "restored"]
    assert len(restored) == 1 and restored[0]["step"] in committed_steps(logdir)


def test_starting_a_child_never_waits_for_its_log_to_open(tmp_path):
    """The log is a FIFO without a reader: an open of it blocks, as an open on a stalled network
    filesystem does. Before: the starter opened the log and blocked with it. Now the child opens
    its own log (procsv.common.spawn.logged_argv) and the start returns; the child's output is in
    the log once it can be opened."""
    from procsv.common import spawn

    log = str(tmp_path / "trainer.1.log")
    os.mkfifo(log)
    started: list[object] = []
    code = "import sys; print('CHILD-OUT', flush=True); sys.stderr.write('CHILD-ERR\\n')"
    starter = threading.Thread(target=lambda: started.append(spawn.spawn([sys.executable, "-c", code], quick_guard_env(), log)),
                               daemon=True)
    starter.start()
    try:
        wait_for(lambda: started, 30, what="spawn() to return while the log cannot be opened")
    finally:
        fd = os.open(log, os.O_RDONLY)  # the stall ends (it also frees a starter blocked in the open)
    with os.fdopen(fd, "rb") as fh:
        text = fh.read().decode()
    proc = started[0]
    assert proc.wait(30) == 0  # type: ignore[attr-defined]
    assert text == "CHILD-OUT\nCHILD-ERR\n"


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_look_that_has_not_returned_for_the_timeout_loses_the_logdir():
    health = LogdirHealth((1, 2), timeout=60.0)
    assert health.judge_pending(since=100.0, now=159.0) is None
    assert health.judge_pending(since=100.0, now=160.0) == \
        "a look at it has not returned for 60 s (--logdir-timeout 60: its filesystem hangs)"
    assert health.judge(Look((1, 2)), 161.0) is None  # a look that returned clears it


class Out:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def write(self, text: str) -> None:
        self.lines.append(text)

    def flush(self) -> None:
        pass


def echo_of(text: str) -> object:
    """A child's handle whose log gained one line."""
    return type("Handle", (), {"role": "trainer", "attempt": 1, "new_log_lines": lambda self, final: [text]})()


def test_the_writer_thread_keeps_records_in_order_with_their_own_time_and_lines_behind_an_echo(tmp_path):
    from procsv.watchdog.publish.output import Terminal

    layout = Layout(str(tmp_path / "run"))
    layout.create()
    out = Out()
    term = Terminal(out=out, err=out)  # type: ignore[arg-type]
    clock = Clock()
    io = DiskIO(layout, term, clock)
    io.events = EventLog(layout.lifecycle)
    gate = threading.Event()
    io.call(gate.wait)  # the disk stalls: nothing queued after this is done until it is set
    for i in range(50):
        io.event(Event.RESTARTED, {"attempt": i}, wall=1000.0 + i)
    io.echo(echo_of("from the child"), final=True)  # type: ignore[arg-type]
    io.line("procsv: after the child")
    assert out.lines == []  # the loop did not wait
    gate.set()
    assert io.close() is True
    term.close()
    assert "".join(out.lines) == "[trainer.1] from the child\nprocsv: after the child\n"
    with open(layout.lifecycle) as fh:
        records = [json.loads(line) for line in fh]
    assert [(r["attempt"], r["time"]) for r in records] == [(i, 1000.0 + i) for i in range(50)]


def test_a_writer_stuck_at_the_end_is_left_and_the_lines_behind_it_are_written_directly(tmp_path):
    from procsv.watchdog.publish.output import Terminal

    layout = Layout(str(tmp_path / "run"))
    layout.create()
    out = Out()
    term = Terminal(out=out, err=out)  # type: ignore[arg-type]
    io = DiskIO(layout, term)
    gate = threading.Event()
    try:
        io.echo(echo_of("from the child"), final=True)  # type: ignore[arg-type]
        io.call(gate.wait)  # a hard-mounted server that died
        io.line("procsv: the run failed")
        assert io.close(wait=0.2) is False
        term.close()
        text = "".join(out.lines)
        assert text.startswith("[trainer.1] from the child\nprocsv: the run failed\n"), text
        assert "did not finish in 0.2 s (its filesystem hangs?)" in text
    finally:
        gate.set()


@pytest.mark.slow
def test_the_metrics_snapshot_never_waits_for_the_newest_checkpoint_on_disk(tmp_path):
    """With --metrics-port, until the launch commits, the snapshot shows the newest checkpoint on
    disk. Its manifest here is a FIFO without a writer: a read of it blocks, as a read on a stalled
    network filesystem does. Before: the loop read it in ``Reporter.publish`` and blocked. Now the
    logdir writer thread reads it (a status write, as the loop hands one over every round before it
    publishes); ``publish`` returns, and a snapshot after the stall ends shows it."""
    from procsv.common.manifests import Manifest
    from procsv.watchdog.config import LaunchConfig
    from procsv.watchdog.publish.reporting import Reporter
    from procsv.watchdog.rules.state import RunView

    layout = Layout(str(tmp_path / "run"))
    layout.create()
    os.makedirs(layout.manifests, exist_ok=True)
    stalled = os.path.join(layout.manifests, "model.ckpt-100.json")
    os.mkfifo(stalled)
    clock = Clock()
    out = Reporter(LaunchConfig("t", [], layout.logdir, quiet=True, metrics_port=1), layout, clock, lambda: 5000.0)
    view = RunView(launch_start=clock())
    published: list[object] = []

    def round_() -> None:  # the loop's round: status.json handed to the writer, then the snapshot
        out.write_status(view, None, force=True)
        out.publish(view, force=True)

    publisher = threading.Thread(target=lambda: published.append(round_()), daemon=True)
    publisher.start()
    try:
        wait_for(lambda: published, 30, what="publish() to return while the manifest cannot be read")
        assert out.snapshot is not None and out.snapshot.last_checkpoint_step is None  # not known yet
    finally:
        m = Manifest(100, "model.ckpt-100", {"model.ckpt-100.index": {"size": 1, "crc32c": 0}}, 4000.0, "steps")
        with open(stalled, "w") as fh:  # the stall ends (it also frees a reader blocked in the open)
            json.dump(m.to_json(), fh)

    def shown() -> object:
        round_()
        return out.snapshot is not None and out.snapshot.last_checkpoint_step == 100

    wait_for(shown, 30, what="a snapshot showing the checkpoint read after the stall")
    wait_for(lambda: _release(stalled), 30, what="the next read of the FIFO, to end it")
    out.close_io()
    out.term.close()


def _release(fifo: str) -> bool:
    """End a read blocked in the open of ``fifo`` (it reads nothing); False while no reader waits."""
    try:
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    except OSError:
        return False
    return True
