"""The watchdog is every forked trainer's parent (issue 51, point 1): the zygote double-forks.

The trainer (or standby) a pre-warmed trainer (zygote) forks is re-parented to the process that
asked for it (a child subreaper), which reaps it itself: a slow, stopped or killed zygote costs the
next fork only, never a live trainer, and no exit status waits on the zygote. Real launches of a
tiny TensorFlow program with a zygote stopped by SIGSTOP, and a real zygote asked for a fork that
dies at once.
"""

from __future__ import annotations

import os
import signal

import pytest

from conftest import (PROGRAMS, finish, launch, lifecycle, quiet_env, raw_status, ready_zygote, run_python, runtime_dir,
                      wait_for, wait_role_pid)

pytestmark = pytest.mark.slow  # starts TensorFlow processes: not in the quick tier

TINY = os.path.join(PROGRAMS, "tiny_train.py")


def _events(logdir: str, name: str) -> list[dict]:
    return [e for e in lifecycle(logdir) if e["event"] == name]


def _zygote_pid(logdir: str) -> int:
    return int(next(e["pid"] for e in _events(logdir, "spawned") if e["role"] == "zygote"))


@pytest.mark.slow
def test_a_fork_reply_later_than_the_limit_costs_no_live_trainer(logdir):
    """Before: the promoted standby (forked by the zygote) armed its parent-death signal on the
    zygote; the next standby's fork, asked of the stopped zygote, got no reply in 10 s, the zygote
    was killed and the healthy trainer with it (a second, unasked restart)."""
    # (steps of 30 ms, not 10: the test waits tens of seconds for the standby and the zygote's loss; its 200 steps
    # after the loss are kept)
    proc = launch(logdir, "--steps", "100000", "--step-delay", "0.03", target=TINY, opts=("--standby", "hot"))
    zygote = 0
    try:
        ready = wait_for(lambda: _events(logdir, "standby_ready"), 120, what="a ready standby")[0]
        zygote = _zygote_pid(logdir)
        first = wait_role_pid(logdir, "trainer")
        # the standby (forked by the zygote, at SCHED_IDLE) is a process group of its own (killpg) in the zygote's
        # session, not a session of its own: with autogroups every session is a scheduling group of equal weight
        assert os.getpgid(ready["pid"]) == ready["pid"] and os.getsid(ready["pid"]) == os.getsid(zygote)
        os.kill(zygote, signal.SIGSTOP)  # alive, but it answers no fork now
        os.kill(first, signal.SIGKILL)  # the standby is promoted; the next standby is asked of the zygote
        wait_for(lambda: [e for e in _events(logdir, "spawned") if e.get("via") == "standby"], 60, what="the promotion")
        wait_for(lambda: _events(logdir, "zygote_gone"), 90, what="the zygote given up (no fork reply in 10 s)")
        step = (raw_status(logdir) or {}).get("step", 0)
        wait_for(lambda: (raw_status(logdir) or {}).get("step", 0) > step + 200, 120, what="200 more steps")
        assert wait_role_pid(logdir, "trainer") == ready["pid"]
        assert raw_status(logdir)["restarts"] == 1  # the one asked for: the kill of the first trainer
        os.kill(ready["pid"], 0)  # the promoted standby lives
    finally:
        if zygote:
            try:
                os.kill(zygote, signal.SIGCONT)
            except ProcessLookupError:
                pass
        proc.send_signal(signal.SIGTERM)
        code, out, err = finish(proc)
    assert code == 128 + signal.SIGTERM, err
    assert "did not answer the fork request" in err, err
    trainers = [(e["pid"], e.get("signal")) for e in _events(logdir, "exited") if e["role"] == "trainer"]
    assert trainers[0] == (first, "SIGKILL") and trainers[1][0] == ready["pid"] and trainers[1][1] is None, trainers


@pytest.mark.slow
def test_a_launch_whose_zygote_is_frozen_still_exits_when_asked_to_stop(logdir):
    """Before: the standby's exit status could come only from the zygote, which was stopped: the
    launch waited for it forever after a SIGTERM."""
    proc = launch(logdir, "--steps", "100000", "--step-delay", "0.01", target=TINY, opts=("--standby", "hot"))
    zygote = 0
    try:
        ready = wait_for(lambda: _events(logdir, "standby_ready"), 120, what="a ready standby")[0]
        zygote = _zygote_pid(logdir)
        os.kill(zygote, signal.SIGSTOP)
        proc.send_signal(signal.SIGTERM)
        code, out, err = finish(proc, 60)
        zygote = 0
    finally:
        if zygote:
            os.kill(zygote, signal.SIGCONT)
        if proc.poll() is None:
            proc.kill()
    assert code == 128 + signal.SIGTERM, err
    assert ready["pid"] in [e["pid"] for e in _events(logdir, "exited")]  # the standby's end was its own




def _fork(z, lay, runtime: str, tmp_path, target: str, log_path: str, attempt: int = 1):  # type: ignore[no-untyped-def]
    """Ask ``z`` for a fork running ``target`` (as trainer ``attempt``); its answer (an Adopted process)."""
    from procsv.common import spawn

    env = spawn.child_env(role="trainer", attempt=attempt, logdir=lay.logdir, runtime_dir=runtime, supervised=False)
    z.request_fork(attempt, target, [], env, log_path, str(tmp_path))

    def answered():  # type: ignore[no-untyped-def]
        z.reader.wait(0.2)
        z.pump()
        return z.answer(attempt)

    return wait_for(answered, 60, what="the fork's reply")


@pytest.fixture(scope="module")
def shared_zygote(tmp_path_factory):  # type: ignore[no-untyped-def]
    """One real zygote (``ready_zygote``: one TensorFlow import) for the two tests below that each ask it
    for a fork of their own (attempts 1 and 2) and read nothing of its stderr; the test of a fork's
    stderr line makes its own, in the test (it copies capfd's stderr)."""
    with ready_zygote(tmp_path_factory.mktemp("zygote")) as made:
        yield made


def test_a_forks_reply_is_on_the_pipe_before_the_fork_runs(tmp_path, shared_zygote):
    """A forked trainer runs only once the zygote has written the ForkReply naming it (it waits for
    the request pipe's EOF; the zygote closes that pipe after its reply), so anything it sends comes
    after its reply: a watchdog (or node agent) that reads a message from a pid it does not know while
    a fork is pending reads the zygote's pipe (never waiting) and finds the reply there. Before, the
    fork ran at its intermediate's exit, before the zygote's reply: at load a TrainerReady could be
    read first (then held by the watchdog's EarlyReady, which this ordering removed)."""
    from procsv.common import spawn

    ran = tmp_path / "ran"
    target = tmp_path / "runs.py"
    target.write_text(f"open({str(ran)!r}, 'w').close()\nimport time\ntime.sleep(60)\n")
    z, lay, runtime = shared_zygote
    env = spawn.child_env(role="trainer", attempt=1, logdir=lay.logdir, runtime_dir=runtime, supervised=False)
    z.request_fork(1, str(target), [], env, str(tmp_path / "trainer.1.log"), str(tmp_path))
    wait_for(ran.exists, 60, what="the fork to run")
    z.pump()  # (never waits) what the pipe holds once the fork has run
    proc = z.answer(1)
    assert proc is not None  # its reply was there already
    os.kill(proc.pid, signal.SIGKILL)
    wait_for(lambda: proc.poll() is not None, 60, what="the fork's end")


def test_a_fork_that_dies_at_once_is_reaped_by_the_zygotes_parent(tmp_path, shared_zygote):
    """Before: the zygote reaped a fork that died before the watchdog opened its pidfd, and
    ``pidfd_open`` raised ProcessLookupError in the watchdog (an internal error: exit 70). Now the
    fork is the asking process's own child, a zombie until it reaps it: its pidfd opens and its
    exit code is read."""
    from procsv.watchdog.children import ChildProcess, process_state

    target = tmp_path / "ends.py"
    target.write_text("import os\nos._exit(3)\n")
    z, lay, runtime = shared_zygote
    proc = _fork(z, lay, runtime, tmp_path, str(target), str(tmp_path / "trainer.log"), attempt=2)
    # it ends before its handle is made (as a fork that dies at once, under load, does)
    wait_for(lambda: process_state(proc.pid) in ("Z", "?"), 60, what="the fork to end")
    try:  # and whoever is its parent had 2 s to reap it (the zygote did, before)
        wait_for(lambda: process_state(proc.pid) == "?", 2.0)
    except AssertionError:
        pass
    handle = ChildProcess("trainer", "trainer", 1, proc, str(tmp_path / "trainer.log"))
    assert handle.reap(timeout=10) == 3


def test_a_fork_whose_log_cannot_be_opened_still_starts(capfd, tmp_path):
    """Issue 51, point 2. Before: the fork exited 1 at the open of its log (its folder gone, EIO,
    a quota), before the program ran, with the cause only in the zygote's log. Now it runs with its
    output discarded, after one line on the stderr of the process that asked for it, as a fresh
    spawn does (``spawn.spawn``)."""
    ran = tmp_path / "ran"
    target = tmp_path / "runs.py"
    target.write_text(f"print('CHILD-OUT')\nopen({str(ran)!r}, 'w').close()\nraise SystemExit(7)\n")
    missing = str(tmp_path / "gone" / "trainer.1.log")  # its folder does not exist
    with ready_zygote(tmp_path) as (z, lay, runtime):  # made in the test: it copies capfd's stderr
        proc = _fork(z, lay, runtime, tmp_path, str(target), missing)
        wait_for(lambda: proc.poll() is not None, 60, what="the fork's exit")
        assert proc.poll() == 7  # the program ran to its own exit
    assert ran.exists()
    err = capfd.readouterr().err
    assert err.count("procsv: cannot open") == 1, err
    assert f"{missing} (No such file or directory); this process's output is discarded" in err, err
    assert "CHILD-OUT" not in err and "CHILD-OUT" not in (tmp_path / "zygote.log").read_text()


@pytest.mark.slow
def test_status_after_the_run_names_no_pre_warmed_trainer(logdir):
    """Issue 51, point 8. Before: ``procsv status`` of a run that had ended still listed
    "pre-warmed trainer pid N (ready)" (the last status.json kept the zygote the end had killed)."""
    code, out, err = finish(launch(logdir, "--steps", "30", "--step-delay", "0.01", target=TINY,
                                   opts=("--standby", "fork")), 300)  # no restart: no standby
    assert code == 0, err
    assert any(e["role"] == "zygote" for e in _events(logdir, "spawned"))  # there was one during the run
    assert raw_status(logdir)["prewarm"] is None
    shown = run_python(["-m", "procsv", "status", logdir], env=quiet_env(), timeout=60)
    assert shown.returncode == 0 and "succeeded" in shown.stdout, shown.stdout + shown.stderr
    assert "pre-warmed" not in shown.stdout, shown.stdout


@pytest.mark.slow
def test_a_standby_fork_that_is_never_answered_leaves_no_mutex(logdir):
    """Issue 51, point 9 (found on the way). Before: the death-notice mutex made for a standby whose
    fork was never answered (the zygote given up) stayed in the runtime directory and mapped in the
    watchdog for the rest of the run."""
    # (steps of 50 ms, not 10: the test waits for the zygote given up, over 10 s; its 20 steps after it are kept)
    proc = launch(logdir, "--steps", "100000", "--step-delay", "0.05", target=TINY, opts=("--standby", "hot"))
    zygote = 0
    try:
        wait_for(lambda: [e for e in _events(logdir, "spawned") if e["role"] == "trainer"], 120, what="the trainer")
        zygote = _zygote_pid(logdir)
        os.kill(zygote, signal.SIGSTOP)  # before the trainer's first step: the standby's fork is never answered
        assert not _events(logdir, "first_step"), "the trainer stepped before the zygote was stopped"
        wait_for(lambda: _events(logdir, "zygote_gone"), 90, what="the zygote given up")
        zygote = 0
        runtime = runtime_dir(wait_role_pid(logdir, "checkpoint"))
        step = (raw_status(logdir) or {}).get("step", 0)
        wait_for(lambda: (raw_status(logdir) or {}).get("step", 0) > step + 20, 60, what="20 more steps")
        assert sorted(n for n in os.listdir(runtime) if n.endswith(".mutex")) == ["trainer.1.mutex"]
        with open(f"/proc/{proc.pid}/maps") as fh:
            assert [line.split()[-1] for line in fh if line.rstrip().endswith(".mutex")] \
                == [os.path.join(runtime, "trainer.1.mutex")]
    finally:
        if zygote:
            os.kill(zygote, signal.SIGCONT)
        proc.send_signal(signal.SIGTERM)
        code, out, err = finish(proc)
    assert code == 128 + signal.SIGTERM, err
