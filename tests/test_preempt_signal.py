"""``--preempt-signal`` (default USR2): handled by the watchdog only, like its SIGTERM.

Slurm's warning signal (``sbatch --signal=USR2@T``, or ``scancel --signal=USR2``) may reach every
process of the step. Here a real ``kill -USR2 -<pgid>`` goes to every process group of a launch with
a hot standby: every procsv process but the watchdog has the signal ignored (read from
``/proc/<pid>/status``), the run saves its last completed step (read back with plain TensorFlow) and
stops in order with exit code 128+12, and the standby is not promoted. Before it, a SIGUSR1 to every
process (``scancel --signal=USR1``) ends nothing and promotes no standby (only the watchdog's does). Pure checks of the flag's
value and of the KillWait warning too.
"""

from __future__ import annotations

import signal
import subprocess
import sys

import psutil
import pytest

from conftest import committed_steps, finish, launch, lifecycle, raw_status, run_processes, seed_example_restores, \
    status_json, wait_for
from procsv.common.errors import UsageError
from procsv.watchdog.multihost.slurm import grace_warning, parse_kill_wait, parse_preempt_signal
from test_job_sigterm import ARGS, TARGET, _roles, _sigterm_every_group, _tree


def _ignored(pid: int) -> set[int]:
    """The signals ``pid`` ignores (``SigIgn`` of /proc/<pid>/status)."""
    with open(f"/proc/{pid}/status") as fh:
        mask = int(next(line for line in fh if line.startswith("SigIgn:")).split()[1], 16)
    return {n for n in range(1, 65) if mask >> (n - 1) & 1}


def _signal_every_group(root: int, sig: int) -> set[int]:
    import os

    import psutil

    procs = _tree(root)
    for g in {os.getpgid(p.pid) for p in procs if psutil.pid_exists(p.pid)}:
        try:
            os.killpg(g, sig)
        except ProcessLookupError:
            pass
    return {p.pid for p in procs}


@pytest.mark.slow
def test_usr2_to_every_process_saves_the_last_step_and_stops_in_order_handled_by_the_watchdog_only(logdir):
    proc = launch(logdir, *ARGS, target=TARGET, opts=("--standby", "hot"))
    signalled = False
    try:
        st = wait_for(lambda: (s := raw_status(logdir)) and s.get("step", 0) > 30 and
                      {"trainer", "checkpoint", "summary"} <= set(_roles(s)) and
                      (s.get("prewarm") or {}).get("ready") and s, 120, what="training with the zygote ready")
        standby = wait_for(lambda: [e for e in lifecycle(logdir) if e["event"] == "standby_ready"], 120,
                           what="a ready standby")[0]["pid"]
        roles = _roles(st)
        children = {**{r: p for r, p in roles.items() if r != "watchdog"}, "zygote": st["prewarm"]["pid"],
                    "standby": standby}
        ignoring = {role: signal.SIGUSR2 in _ignored(pid) for role, pid in children.items()}
        assert ignoring == {role: True for role in children}, ignoring
        assert signal.SIGUSR2 not in _ignored(proc.pid)  # the watchdog handles it
        # a SIGUSR1 to every process (scancel --signal=USR1) ends nothing and promotes no standby
        assert set(children.values()) <= _signal_every_group(proc.pid, signal.SIGUSR1)
        at = st["step"]
        wait_for(lambda: (s := raw_status(logdir)) and s.get("step", 0) > at + 20, 120,
                 what="training on after SIGUSR1 to every process")
        alive = {role: psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
                 for role, pid in {**children, "watchdog": proc.pid}.items()}
        assert alive == {role: True for role in alive}, alive
        assert _roles(raw_status(logdir))["trainer"] == roles["trainer"]
        assert set(children.values()) <= _signal_every_group(proc.pid, signal.SIGUSR2)
        signalled = True
    finally:
        if not signalled:
            for p in _tree(proc.pid):
                p.kill()
        code, out, err = finish(proc)
    assert code == 128 + signal.SIGUSR2, err
    assert "procsv: SIGUSR2 received, asking the trainer to checkpoint and stop" in out + err
    wait_for(lambda: not run_processes(logdir), 5, what="every process of the run to exit")
    st = status_json(logdir)
    assert (st["state"], st["restarts"]) == ("stopped", 0), st
    assert committed_steps(logdir)[-1] == st["step"] > 30
    seed_example_restores(logdir, st["step"])
    assert [e["signal"] for e in lifecycle(logdir) if e["event"] == "preempted"] == ["SIGUSR2"]
    # the standby was not promoted: one trainer attempt, no restart
    assert [e["attempt"] for e in lifecycle(logdir) if e["event"] == "spawned" and e["role"] == "trainer"] == [1]


@pytest.mark.parametrize("text,number", [("USR2", 12), ("SIGUSR2", 12), ("usr2", 12), ("12", 12), ("HUP", 1),
                                         ("XCPU", 24)])
def test_the_preempt_signal_is_given_by_name_or_number(text, number):
    assert parse_preempt_signal(text) == number


@pytest.mark.parametrize("text", ["USR1", "TERM", "KILL", "INT", "CHLD"])
def test_a_signal_procsv_uses_itself_cannot_be_the_preempt_signal(text):
    with pytest.raises(UsageError, match=f"--preempt-signal {text} cannot be used"):
        parse_preempt_signal(text)


@pytest.mark.slow
def test_a_preempt_signal_that_is_no_signal_is_one_usage_line(tmp_path):
    r = subprocess.run([sys.executable, "-m", "procsv", "launch", "procsv.examples.digits", "--logdir",
                        str(tmp_path / "run"), "--preempt-signal", "BOGUS"], capture_output=True, text=True, timeout=60)
    assert (r.returncode, r.stderr.strip()) == (2, "procsv: error: --preempt-signal 'BOGUS' is not a signal name "
                                                   "(e.g. USR2, HUP, XCPU)")
    r = subprocess.run([sys.executable, "-m", "procsv", "launch", "procsv.examples.digits", "--logdir",
                        str(tmp_path / "run"), "--requeue-on-preempt"], capture_output=True, text=True, timeout=60,
                       env={"PATH": "/usr/bin:/bin"})
    assert r.returncode == 2 and "--requeue-on-preempt requeues the Slurm job" in r.stderr
    assert not (tmp_path / "run").exists()


def test_kill_wait_is_read_from_scontrol_show_config_and_a_longer_grace_is_warned_of():
    config = "KeepAliveTime           = (null)\nKillOnBadExit           = 0\nKillWait                = 30 sec\n"
    assert parse_kill_wait(config) == 30
    assert parse_kill_wait("nothing here") is None
    assert grace_warning(120, 30) == (
        "procsv: warning: --stop-grace-secs 120 is longer than Slurm's KillWait (30 s): a scancel, requeue or "
        "preemption SIGKILLs every process of the job 30 s after its SIGTERM, so a checkpoint still being written "
        "then is lost; give --stop-grace-secs 30 or less (or ask for a longer KillWait)")
    assert grace_warning(30, 30) == grace_warning(120, None) == ""


@pytest.mark.slow
def test_a_preemption_whose_last_checkpoint_did_not_commit_is_still_requeued(logdir, tmp_path):
    """Issue 51, point 3 made a stop whose checkpoint of the last step did not commit exit 1, not
    128+N, and --requeue-on-preempt requeued only on 128+N: a preemption whose emergency checkpoint
    missed (a frozen checkpoint service here; a slow filesystem, a KillWait shorter than the save)
    ended the job for good, though its newest committed checkpoint is intact and a requeued job
    resumes there. An unattended run must be requeued all the same (exit code still 1: steps were
    lost). A fake ``scontrol`` on PATH records what it is asked."""
    import os

    from conftest import quiet_env

    calls = tmp_path / "scontrol.calls"
    fake = tmp_path / "bin" / "scontrol"
    fake.parent.mkdir()
    fake.write_text(f'#!/bin/sh\necho "$@" >> {calls}\n'
                    'if [ "$1" = show ]; then echo "KillWait                = 30 sec"; fi\n')
    fake.chmod(0o755)
    env = quiet_env(SLURM_JOB_ID="4242", PATH=f"{fake.parent}:{os.environ['PATH']}")
    proc = launch(logdir, "--steps", "100000", "--step-delay", "0.005", "--save-checkpoint-steps", "200",
                  target=TARGET, opts=("--standby", "fork", "--stop-grace-secs", "3", "--requeue-on-preempt"), env=env)
    stopped = None
    try:
        wait_for(lambda: proc.poll() is not None or committed_steps(logdir), 120, what="a periodic checkpoint")
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        stopped = wait_for(lambda: role_of(logdir, "checkpoint"), 10, what="the checkpoint service's pid")
        os.kill(stopped, signal.SIGSTOP)  # frozen: the emergency checkpoint cannot commit
        proc.send_signal(signal.SIGUSR2)
        code, out, err = finish(proc, 120)
    finally:
        if proc.poll() is None:
            for p in _tree(proc.pid):
                p.kill()
            finish(proc, 30)
    assert code == 1, err[-3000:]
    assert "its checkpoint of the last step did not commit" in err, err[-3000:]
    assert "requeue 4242" in (calls.read_text() if calls.exists() else ""), err[-3000:]
    assert "procsv: --requeue-on-preempt: ran `scontrol requeue 4242`" in err, err[-3000:]


def role_of(logdir: str, role: str) -> int | None:
    st = raw_status(logdir) or {}
    return next((p["pid"] for p in st.get("processes", []) if p["role"] == role), None)
