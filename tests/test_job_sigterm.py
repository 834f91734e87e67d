"""A SIGTERM to every process of the job at once ends the run exactly like one to the watchdog alone.

Slurm's ``scancel``, ``scontrol requeue`` and preemption signal every process of the job, and so do
systemd's default ``KillMode=control-group`` and ``kill -TERM -<pgid>`` of each group. Here that is
a real ``kill -TERM -<pgid>`` to every process group of the launch's process tree, in one pass
(each child leads its own group, so the watchdog's group alone would reach only the watchdog): the
services, the zygote and a hot standby must leave the stop to the watchdog, the emergency checkpoint
of the last completed step must commit (read back and restored with plain TensorFlow), nothing may
be left running, and the next launch resumes at that step.
"""

from __future__ import annotations

import os
import signal
import subprocess
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psutil
import pytest

from conftest import (committed_steps, finish, launch, lifecycle, raw_status, run_processes, seed_example_restores,
                      status_json, wait_for)

pytestmark = pytest.mark.slow  # starts TensorFlow processes: not in the quick tier

TARGET = "procsv.examples.seeds.basic"
# steps of 20 ms (5 before): each run here waits seconds for processes to be up (the zygote, a hot standby preparing
# at idle priority) or for a signal's effect, and trains all the while: a quarter of the steps in those seconds,
# each CPU of the trainer and both services
ARGS = ("--steps", "100000", "--step-delay", "0.02", "--save-checkpoint-steps", "1000000")


def _sighup_at_its_default() -> None:
    """In the child before its exec: SIGHUP's default action (a terminal's shell gives it that)."""
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


def _sighup_ignored() -> None:
    """In the child before its exec: SIGHUP ignored, as ``nohup`` starts a command."""
    signal.signal(signal.SIGHUP, signal.SIG_IGN)


def _tree(root: int) -> list[psutil.Process]:
    top = psutil.Process(root)
    return [top, *top.children(recursive=True)]


def _sigterm_every_group(root: int) -> set[int]:
    """``kill -TERM -<pgid>`` for every process group of ``root``'s tree, one right after the other;
    returns the pids that were sent it (every process of the tree)."""
    return _signal_every_group(root, signal.SIGTERM)


def _signal_every_group(root: int, sig: int) -> set[int]:
    """``kill -<sig> -<pgid>`` for every process group of ``root``'s tree (see :func:`_sigterm_every_group`)."""
    procs = _tree(root)
    groups = set()
    for p in procs:
        try:
            groups.add(os.getpgid(p.pid))
        except ProcessLookupError:
            pass
    for g in groups:
        try:
            os.killpg(g, sig)
        except ProcessLookupError:
            pass
    return {p.pid for p in procs}


def _roles(st: dict[str, Any]) -> dict[str, int]:
    return {p["role"]: p["pid"] for p in st["processes"]}


def _outcome(logdir: str) -> list[tuple[Any, ...]]:
    """What the lifecycle log says from the stop on, without pids, steps and times: each event, for an
    exit the role and how it ended (a killed or failed service, a restart, a standby counted as
    failed would all show here). In order up to the run's ``finished``; the exits of what the
    shutdown then stops at once (services, standby) in any order."""
    events = lifecycle(logdir)
    first = next(i for i, e in enumerate(events) if e["event"] == "preempted")
    seen = [("exited", e["role"], e.get("code"), e.get("signal")) if e["event"] == "exited" else (e["event"],)
            for e in events[first:]]
    end = seen.index(("finished",)) + 1
    return seen[:end] + sorted(seen[end:], key=repr)


def _run_and_stop(logdir: str, group: bool, standby: bool) -> tuple[int, str, str]:
    """Launch, wait until it trains (with the zygote ready, and a ready standby if asked), stop it with
    a SIGTERM to every process group (``group``) or to the watchdog alone; finish's result."""
    opts = ("--standby", "hot" if standby else "fork")  # fork: the zygote, no standby
    proc = launch(logdir, *ARGS, target=TARGET, opts=opts)
    signalled = False
    try:
        want = {"watchdog", "trainer", "checkpoint", "summary"}
        st = wait_for(lambda: (s := raw_status(logdir)) and s.get("step", 0) > 30 and want <= set(_roles(s)) and
                      (s.get("prewarm") or {}).get("ready") and s, 120,
                      what="training with every process up and the zygote ready")
        pids = set(_roles(st).values()) | {st["prewarm"]["pid"]}
        if standby:
            ready = wait_for(lambda: [e for e in lifecycle(logdir) if e["event"] == "standby_ready"], 120,
                             what="a ready standby")
            pids.add(ready[0]["pid"])
        if group:
            assert pids <= _sigterm_every_group(proc.pid)  # every process of the run got it
        else:
            proc.send_signal(signal.SIGTERM)
        signalled = True
    finally:
        if not signalled:  # the wait failed: take the run down now, not after finish's timeout
            for p in _tree(proc.pid):
                p.kill()
        code, out, err = finish(proc)
    return code, out, err


@pytest.mark.slow
@pytest.mark.parametrize("standby", [False, True], ids=["plain", "standby_hot"])
def test_sigterm_to_every_process_of_the_job_saves_the_last_step_like_one_to_the_watchdog(logdir, tmp_path,
                                                                                             standby):
    alone = str(tmp_path / "alone")
    # the reference, the same run stopped by a SIGTERM to the watchdog alone, runs beside the job's:
    # each has its own logdir, and each is stopped once it trains
    with ThreadPoolExecutor(1) as pool:
        reference = pool.submit(_run_and_stop, alone, group=False, standby=standby)
        try:
            code, out, err = _run_and_stop(logdir, group=True, standby=standby)
        finally:
            try:
                code_alone, _, err_alone = reference.result()
            finally:
                for p in run_processes(alone):
                    p.kill()
    assert code_alone == 128 + signal.SIGTERM, err_alone
    assert code == 128 + signal.SIGTERM, err
    gone = wait_for(lambda: not run_processes(logdir), 5, what="every process of the run to exit")
    assert gone
    st = status_json(logdir)
    assert st["state"] == "stopped", st
    assert st["restarts"] == 0
    step = st["step"]
    assert committed_steps(logdir)[-1] == step > 30, (committed_steps(logdir), step, err)
    seed_example_restores(logdir, step)  # plain TF: latest_checkpoint is that step, restores every value
    assert _outcome(logdir) == _outcome(alone), err
    # the services, the zygote and the standby said they left the stop to the watchdog
    for role in ("checkpoint.1", "summary.1", "zygote.1") + (("trainer.2",) if standby else ()):
        with open(os.path.join(logdir, "logs", f"{role}.log")) as fh:
            assert "SIGTERM from pid" in (text := fh.read()) and "left to the watchdog" in text, (role, text)

    again = launch(logdir, "--steps", str(step + 20), target=TARGET, opts=("--standby", "fork"))  # restarts nothing
    code, out, err = finish(again)
    assert code == 0, err
    assert f"restored step {step} " in out, out
    assert status_json(logdir)["step"] == step + 20
    seed_example_restores(logdir, step + 20)


@pytest.mark.slow
def test_sigterm_to_every_process_of_a_group_is_left_to_the_watchdog_by_the_worker_and_the_chief_commits(logdir):
    """A group (--nproc 2, MultiWorkerMirroredStrategy): a worker that stopped on the job-wide SIGTERM
    at its own step boundary, one step apart from the chief, failed the chief's next collective before
    its emergency checkpoint (seen under Slurm's scontrol requeue). The worker leaves it to the
    watchdog, which stops it after the chief committed its last step."""
    from test_group import restores_with_plain_tf

    proc = launch(logdir, "--strategy", "multiworker", "--save-model-secs", "1000", "--step-delay", "0.004",
                  "--print-every-steps", "100000", "--steps", "100000", opts=("--nproc", "2"))
    signalled = False
    try:
        st = wait_for(lambda: (s := raw_status(logdir)) and s.get("step", 0) > 100 and
                      {"trainer", "worker1"} <= set(_roles(s)) and s, 180, what="the group at step 100")
        assert set(_roles(st).values()) <= _sigterm_every_group(proc.pid)
        signalled = True
    finally:
        if not signalled:
            for p in _tree(proc.pid):
                p.kill()
        code, out, err = finish(proc)
    assert code == 128 + signal.SIGTERM, err
    with open(os.path.join(logdir, "logs", "worker1.1.log")) as fh:
        assert "procsv worker1: SIGTERM from pid" in fh.read()  # left to the watchdog
    committed = [e for e in lifecycle(logdir) if e["event"] == "checkpoint_committed"]
    assert [e["reason"] for e in committed] == ["preempted"], committed
    assert committed[-1]["step"] >= status_json(logdir)["step"] > 100
    assert restores_with_plain_tf(logdir) == committed[-1]["step"]
    assert [e["code"] for e in lifecycle(logdir) if e["event"] == "exited" and e["role"] == "trainer"] == [42]


@pytest.mark.slow
def test_sighup_to_every_process_of_the_run_is_an_orderly_stop_with_exit_129(logdir):
    """Issue 51, point 4: a closed ssh session or a killed tmux pane (without nohup) sends SIGHUP. By
    its default action it ended every process at once: no checkpoint, the in-memory snapshot lost
    with the checkpoint service, ``status.json`` left at ``running``. The watchdog now stops the run
    in order on it (exit 128+1), and every child has it ignored from its start: the trainer commits
    its last step, and the services, the zygote and a hot standby live until the watchdog stops them."""
    proc = launch(logdir, *ARGS, target=TARGET, opts=("--standby", "hot"), preexec_fn=_sighup_at_its_default)
    signalled = False
    try:
        st = wait_for(lambda: (s := raw_status(logdir)) and s.get("step", 0) > 30 and
                      {"watchdog", "trainer", "checkpoint", "summary"} <= set(_roles(s)) and
                      (s.get("prewarm") or {}).get("ready") and s, 120, what="training with the zygote ready")
        ready = wait_for(lambda: [e for e in lifecycle(logdir) if e["event"] == "standby_ready"], 120,
                         what="a ready standby")
        pids = set(_roles(st).values()) | {st["prewarm"]["pid"], ready[0]["pid"]}
        assert pids <= _signal_every_group(proc.pid, signal.SIGHUP)  # every process of the run got it
        signalled = True
    finally:
        if not signalled:
            for p in _tree(proc.pid):
                p.kill()
        code, out, err = finish(proc)
    assert code == 128 + signal.SIGHUP, err
    assert "procsv: SIGHUP received, asking the trainer to checkpoint and stop" in err + out, err
    gone = wait_for(lambda: not run_processes(logdir), 5, what="every process of the run to exit")
    assert gone
    st = status_json(logdir)
    assert st["state"] == "stopped", st
    assert st["restarts"] == 0
    step = st["step"]
    committed = [e for e in lifecycle(logdir) if e["event"] == "checkpoint_committed"]
    assert committed[-1]["reason"] == "preempted" and committed_steps(logdir)[-1] == step > 30, (committed, err)
    seed_example_restores(logdir, step)
    ended = {e["role"]: (e.get("code"), e.get("signal")) for e in lifecycle(logdir) if e["event"] == "exited"}
    assert ended["trainer"] == (42, None), ended  # stopped by the watchdog's SIGTERM, saved
    assert all(sig != "SIGHUP" for _, sig in ended.values()), ended  # none died of the SIGHUP itself


@pytest.mark.slow
def test_a_closed_terminal_is_an_orderly_stop_with_exit_129_though_the_terminal_is_gone(logdir):
    """Issue 51, point 4, as a closed ssh session or a killed tmux pane really does it: the launch
    runs on a terminal (its controlling tty, its stdout and stderr), and the terminal goes away (the
    master side closed: the kernel hangs the tty up and sends SIGHUP). Every later write of the
    watchdog to its stdout or stderr then fails (EIO): the stop must still be orderly (exit 129, the
    last step committed, status.json stopped), not end in an error of the watchdog's own lines."""
    import fcntl
    import pty
    import sys
    import termios

    from conftest import REPO, quiet_env

    master, slave = pty.openpty()

    def _take_terminal() -> None:  # in the child, after setsid: the pty becomes its controlling terminal
        _sighup_at_its_default()  # as a terminal's shell starts it, whatever this test process inherited
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    cmd = [sys.executable, "-m", "procsv", "launch", TARGET, "--logdir", logdir, "--standby", "off", "--", *ARGS]
    proc = subprocess.Popen(cmd, stdin=slave, stdout=slave, stderr=slave, env=quiet_env(), cwd=REPO,
                            start_new_session=True, preexec_fn=_take_terminal)
    os.close(slave)
    closed = False
    try:
        reader = ThreadPoolExecutor(1)  # drain the terminal (as a terminal would) until it is closed
        said: list[bytes] = []

        def _drain() -> None:
            while True:
                try:
                    chunk = os.read(master, 65536)
                except OSError:
                    return
                if not chunk:
                    return
                said.append(chunk)

        reader.submit(_drain)
        wait_for(lambda: proc.poll() is not None or ((s := raw_status(logdir)) and s.get("step", 0) > 30), 120,
                 what="training on a terminal")
        assert proc.poll() is None, b"".join(said)[-3000:]
        os.close(master)  # the terminal goes away: the kernel hangs it up (SIGHUP to the launch)
        closed = True
        code = proc.wait(120)
        reader.shutdown(wait=False)
    finally:
        if not closed:
            os.close(master)
        if proc.poll() is None:
            for p in _tree(proc.pid):
                p.kill()
            proc.wait(30)
    events = lifecycle(logdir)
    assert code == 128 + signal.SIGHUP, (code, events[-5:])
    assert wait_for(lambda: not run_processes(logdir), 10, what="every process of the run to exit")
    st = status_json(logdir)
    assert st["state"] == "stopped", st
    committed = [e for e in events if e["event"] == "checkpoint_committed"]
    assert committed and committed[-1]["reason"] == "preempted" and committed_steps(logdir)[-1] == st["step"], events[-8:]


@pytest.mark.slow
def test_sighup_to_a_plain_python_run_in_a_terminal_is_an_orderly_stop(tmp_path):
    """Issue 51, point 4 covered ``procsv launch`` only: a plain ``python train.py`` (the Supervisor
    starts its own services) in a terminal whose ssh session closes got SIGHUP's default action:
    killed, no checkpoint, where a SIGTERM commits the last step. A SIGHUP to its process group (as
    the terminal's hang-up sends it) now stops it in order, exactly as a SIGTERM does."""
    import glob
    import sys

    from conftest import PROGRAMS, quiet_env

    logdir = str(tmp_path / "run")
    # started as a terminal's shell starts it: SIGHUP at its default action, whatever this test process
    # inherited (a suite run under nohup has it ignored, and a run that ignores it keeps it so: that one
    # trains on through the hang-up, as a nohup'ed run must)
    proc = subprocess.Popen([sys.executable, os.path.join(PROGRAMS, "tiny_train.py"), "--logdir", logdir,
                             "--steps", "100000", "--step-delay", "0.01", "--chatty", "1"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=quiet_env(),
                            start_new_session=True, preexec_fn=_sighup_at_its_default)
    try:
        assert proc.stdout is not None
        for line in proc.stdout:  # (the trainer's own lines: bounded by the communicate below)
            if line.startswith("tiny: step 50 "):
                os.killpg(proc.pid, signal.SIGHUP)
                break
        out = proc.communicate(timeout=120)[0]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
    assert proc.returncode == 0, out[-3000:]  # as after a SIGTERM in this mode, not -SIGHUP
    assert "procsv: preempted checkpoint committed at step" in out, out[-3000:]
    step = int(out.split("procsv: preempted checkpoint committed at step ")[1].split()[0])
    assert step >= 50 and glob.glob(os.path.join(logdir, f"model.ckpt-{step}.index")), out[-3000:]


def test_a_launch_under_nohup_trains_on_through_a_sighup_and_stops_in_order_on_a_sigterm(logdir):
    """``nohup procsv launch ...`` asks for hang-ups to be ignored: the launch inherits SIGHUP ignored,
    and a SIGHUP (the ssh session closed) must not stop it. Before, the watchdog put its own handler
    over the inherited SIG_IGN and stopped the run with exit 129. A SIGTERM still stops it in order."""
    proc = launch(logdir, *ARGS, target=TARGET, opts=("--standby", "off"), preexec_fn=_sighup_ignored)
    stopping = False
    try:
        wait_for(lambda: (s := raw_status(logdir)) and s.get("step", 0) > 30, 120, what="training")
        os.kill(proc.pid, signal.SIGHUP)
        at = (raw_status(logdir) or {}).get("step", 0)
        # trains on: 200 more steps after the hang-up (the run stays up), not a stop
        wait_for(lambda: proc.poll() is not None or (raw_status(logdir) or {}).get("step", 0) > at + 200, 120,
                 what="training on after the SIGHUP")
        assert proc.poll() is None
        os.kill(proc.pid, signal.SIGTERM)
        stopping = True
    finally:
        if not stopping and proc.poll() is None:
            for p in _tree(proc.pid):
                p.kill()
        code, out, err = finish(proc)
    assert code == 128 + signal.SIGTERM, err
    assert "SIGHUP received" not in err + out, err
    st = status_json(logdir)
    assert st["state"] == "stopped" and st["restarts"] == 0, st
    committed = [e for e in lifecycle(logdir) if e["event"] == "checkpoint_committed"]
    assert committed[-1]["reason"] == "preempted" and committed_steps(logdir)[-1] == st["step"] > at + 200, committed
