"""Issue 51, point 3: a SIGTERM to every process of a ``--ps`` job, and a stop that saved nothing.

Slurm's ``scancel`` and requeue, systemd's ``KillMode=control-group``: a real ``kill -TERM -<pgid>``
to every process group of the launch, in one pass. The parameter servers and (with
``--coordinator``) the worker servers used to stop on it at once, so the chief's emergency
checkpoint blocked in gRPC until the grace ran out, nothing committed, and the launch still exited
143. Each server task now leaves the stop to the watchdog (its log says so), which stops it once the
chief committed its last step. And a stop whose final checkpoint did not commit (here: the
checkpoint service frozen, SIGSTOP) exits 1, not the 143 a Kubernetes podFailurePolicy ignores.
"""

from __future__ import annotations

import os
import signal

import psutil
import pytest

from conftest import PROGRAMS, committed_steps, finish, launch, lifecycle, raw_status, run_processes, wait_for
from ps_helpers import entry, log_of
from test_job_sigterm import _sigterm_every_group, _tree

pytestmark = pytest.mark.slow

CASES = {
    "coordinator": ("procsv.examples.ps_strategy", ("--ps", "1", "--workers", "2", "--coordinator"),
                    ("worker0", "worker1", "ps0")),
    "tf1_replicas": ("procsv.examples.seeds_tf1.replicas", ("--ps", "1", "--workers", "2"), ("ps0",)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_sigterm_to_every_process_of_a_ps_job_is_left_to_the_watchdog_and_the_chief_commits(short_tmp: str,
                                                                                            case: str) -> None:
    target, opts, servers = CASES[case]
    logdir = os.path.join(short_tmp, "run")
    proc = launch(logdir, "--steps", "100000", "--save-model-secs", "1000", "--step-delay", "0.05", target=target,
                  opts=opts + ("--stop-grace-secs", "40"))
    signalled = False
    try:
        wait_for(lambda: proc.poll() is not None or (entry(logdir, "trainer").get("step", 0) > 10 and
                                                      all(entry(logdir, s).get("state") == "running"
                                                          for s in servers)), 240,
                 what="the chief stepping with every server task running")
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        pids = {entry(logdir, s)["pid"] for s in servers + ("trainer",)}
        assert pids <= _sigterm_every_group(proc.pid)  # every task got it
        signalled = True
    finally:
        if not signalled:
            for p in _tree(proc.pid):
                try:
                    p.kill()
                except psutil.Error:
                    pass
        code, out, err = finish(proc, 240)
    assert code == 128 + signal.SIGTERM, err[-3000:]
    committed = [e for e in lifecycle(logdir) if e["event"] == "checkpoint_committed" and e["reason"] == "preempted"]
    assert committed, (committed_steps(logdir), err[-3000:])
    assert committed[-1]["step"] == committed_steps(logdir)[-1] > 10
    for s in servers:  # each server left the job-wide SIGTERM to the watchdog, and stopped on the watchdog's
        text = log_of(logdir, f"{s}.1.log")
        assert "SIGTERM from pid" in text and "left to the watchdog" in text, (s, text[-2000:])
        assert f"procsv ps: task {s} stopping (SIGTERM)" in text, (s, text[-2000:])
    assert wait_for(lambda: not run_processes(logdir), 5, what="every process of the run to exit")


def test_a_workers_sigterm_swallowed_by_a_pending_job_wide_one_is_sent_again(short_tmp: str) -> None:
    """The watchdog's SIGTERM to a worker that a job-wide SIGTERM reached first, not yet read: a standard
    signal is not queued twice, so the worker read only the job's (left to the watchdog) and trained on
    until the SIGKILL at half the stop grace (seen in CI: the watchdog's stop of the workers goes out in
    the same millisecond as ``kill -TERM -<pgid>``). Made certain here by SIGSTOPping the worker across
    both signals; the watchdog sends its SIGTERM again, and the worker stops at its step boundary."""
    logdir = os.path.join(short_tmp, "run")
    proc = launch(logdir, "--steps", "100000", "--save-model-secs", "1000", "--step-delay", "0.05",
                  target="procsv.examples.seeds_tf1.replicas", opts=("--ps", "1", "--workers", "2",
                                                                      "--stop-grace-secs", "60"))
    worker = 0
    try:
        wait_for(lambda: proc.poll() is not None or (entry(logdir, "trainer").get("step", 0) > 10 and
                                                      entry(logdir, "worker1").get("state") == "running"), 240,
                 what="the chief stepping with worker1 running")
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        worker = entry(logdir, "worker1")["pid"]
        os.kill(worker, signal.SIGSTOP)
        os.kill(worker, signal.SIGTERM)  # the job's, pending
        proc.send_signal(signal.SIGTERM)  # the watchdog stops the workers first: its SIGTERM merges
        wait_for(lambda: entry(logdir, "worker1").get("state") == "stopping", 30, what="worker1 stopping")
    finally:
        if worker:
            os.kill(worker, signal.SIGCONT)
        code, out, err = finish(proc, 240)
    assert code == 128 + signal.SIGTERM, err[-3000:]
    ended = [e for e in lifecycle(logdir) if e["event"] == "exited" and e["role"] == "worker1"]
    assert ended and "signal" not in ended[-1], ended  # it stopped itself, not by the SIGKILL at half the grace
    text = log_of(logdir, "worker1.1.log")
    assert text.count("left to the watchdog") == 1, text[-2000:]
    committed = [e for e in lifecycle(logdir) if e["event"] == "checkpoint_committed" and e["reason"] == "preempted"]
    assert committed and committed[-1]["step"] == committed_steps(logdir)[-1], err[-3000:]


def test_a_stop_whose_checkpoint_did_not_commit_does_not_exit_143(short_tmp: str) -> None:
    logdir = os.path.join(short_tmp, "run")
    proc = launch(logdir, "--steps", "100000", "--step-delay", "0.005", "--save-checkpoint-steps", "1000000",
                  target="procsv.examples.seeds.basic", opts=("--stop-grace-secs", "3"))
    stopped = None
    try:
        st = wait_for(lambda: proc.poll() is not None or ((s := raw_status(logdir)) and s.get("step", 0) > 30 and s),
                      120, what="training")
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        stopped = next(p["pid"] for p in st["processes"] if p["role"] == "checkpoint")
        os.kill(stopped, signal.SIGSTOP)  # frozen: no snapshot it is sent commits
        proc.send_signal(signal.SIGTERM)
        code, out, err = finish(proc, 120)
    finally:
        if proc.poll() is None:
            for p in _tree(proc.pid):
                p.kill()
            finish(proc, 30)
    assert code == 1, err[-3000:]
    assert "its checkpoint of the last step did not commit" in err and "exit code 1, not 128+signal" in err, err[-3000:]
    assert not [e for e in lifecycle(logdir) if e["event"] == "checkpoint_committed" and e["reason"] == "preempted"]
    assert (raw_status(logdir) or {}).get("state") == "stopped"
    assert wait_for(lambda: not run_processes(logdir), 10, what="every process of the run to exit")


def test_a_stop_whose_last_step_committed_exits_128_plus_n_though_the_program_outlives_the_grace(short_tmp: str) -> None:
    """The other side of the exit code: a stop whose preempted checkpoint of the last step committed
    lost nothing, even when the program then takes longer than --stop-grace-secs to exit (a slow
    teardown after the Supervisor's block: joining loader threads, an upload) and is SIGKILLed at
    the grace. judge.stop_saved counted every SIGKILL at the grace as unsaved: exit 1 and a line
    saying the checkpoint of the last step did not commit, naming that very step as the newest."""
    logdir = os.path.join(short_tmp, "run")
    proc = launch(logdir, "--steps", "100000", "--step-delay", "0.01", "--linger", "120",
                  target=os.path.join(PROGRAMS, "tiny_train.py"), opts=("--standby", "fork", "--stop-grace-secs", "3"))
    try:
        wait_for(lambda: proc.poll() is not None or (raw_status(logdir) or {}).get("step", 0) > 30, 120,
                 what="training")
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        proc.send_signal(signal.SIGTERM)
        code, out, err = finish(proc, 120)
    finally:
        if proc.poll() is None:
            for p in _tree(proc.pid):
                p.kill()
            finish(proc, 30)
    committed = [e for e in lifecycle(logdir) if e["event"] == "checkpoint_committed"]
    assert committed and committed[-1]["reason"] == "preempted", err[-3000:]
    with open(os.path.join(logdir, "logs", "trainer.1.log")) as fh:
        assert "tiny: lingering" in fh.read()  # it was still running at the grace
    ended = [e for e in lifecycle(logdir) if e["event"] == "exited" and e["role"] == "trainer"]
    assert ended and ended[-1].get("signal") == "SIGKILL", ended
    assert code == 128 + signal.SIGTERM, err[-3000:]
    assert "did not commit" not in err, err[-3000:]
