"""``procsv launch --metrics-port``: a real run scraped over HTTP, the port checks, and the pure parts
(the snapshot, restart causes, steps/s, the metric families)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from typing import Any, Optional

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from conftest import PROGRAMS, committed_steps, finish, launch, quiet_env, run_processes, wait_for, wait_role_pid
from procsv.cli import main
from procsv.watchdog.rules.failures import ExitReport, Failure
from procsv.watchdog.rules.lifecycle import RunState
from procsv.watchdog.publish.metrics import RunCollector, families
from procsv.watchdog.publish.runmetrics import RunSnapshot, StepRate, restart_cause, restart_counts, take_snapshot
from procsv.watchdog.rules.state import ChildView, RunView

TINY = os.path.join(PROGRAMS, "tiny_train.py")

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


@pytest.fixture(autouse=True)
def preempt_signal_taken_back(monkeypatch):  # type: ignore[no-untyped-def]
    """The launch's configuration, built in this process by some tests here, sets PROCSV_PREEMPT_SIGNAL
    for the children it would start: taken away after each test (conftest.procsv_environment_unchanged)."""
    monkeypatch.setenv("PROCSV_PREEMPT_SIGNAL", "")
    monkeypatch.delenv("PROCSV_PREEMPT_SIGNAL")



def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def parse(text: str) -> Samples:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def scrape(port: int) -> Samples:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        assert resp.status == 200
        return parse(resp.read().decode())


def try_scrape(port: int) -> Optional[Samples]:
    try:
        return scrape(port)
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return None


def value(samples: Samples, name: str, **labels: str) -> Optional[float]:
    return samples.get((name, tuple(sorted(labels.items()))))


# ----------------------------------------------------------------------------- a real run

@pytest.mark.slow
def test_a_live_run_is_scraped_step_restarts_by_cause_and_checkpoints(logdir):
    port = free_port()
    proc = launch(logdir, "--steps", "100000", "--step-delay", "0.01", "--save-steps", "100", target=TINY,
                  opts=("--metrics-port", str(port), "--quiet"))
    try:
        first = wait_for(lambda: (s := try_scrape(port)) and (value(s, "procsv_step") or 0) > 0 and s, 120,
                         what="a scrape with a step > 0")
        assert value(first, "procsv_up") == 1.0
        assert value(first, "procsv_run_state", procsv_run_state="running") == 1.0
        assert value(first, "procsv_run_info", target=TINY, logdir=os.path.abspath(logdir)) == 1.0
        assert value(first, "procsv_watchdog_process_resident_memory_bytes")  # the watchdog's own process
        later = wait_for(lambda: (s := scrape(port)) and value(s, "procsv_step") > value(first, "procsv_step") and s,
                         10, what="the step to grow between scrapes")
        assert (value(later, "procsv_steps_per_second") or 0) > 0
        committed = wait_for(lambda: (s := scrape(port)) and (value(s, "procsv_checkpoints_total") or 0) >= 1 and s,
                             60, what="a commit in the metrics")
        assert value(committed, "procsv_last_checkpoint_step") in committed_steps(logdir)
        age = value(committed, "procsv_last_checkpoint_age_seconds")
        assert age is not None and 0 <= age < 30
        assert value(committed, "procsv_last_checkpoint_commit_seconds") > 0
        assert value(committed, "procsv_restarts_total", cause="SIGKILL") is None

        os.kill(wait_role_pid(logdir, "trainer"), signal.SIGKILL)
        after = wait_for(lambda: (s := scrape(port)) and value(s, "procsv_restarts_total", cause="SIGKILL") == 1.0
                         and value(s, "procsv_trainer_attempt") == 2.0 and s, 60, what="the restart in the metrics")
        assert value(after, "procsv_up") == 1.0
        wait_for(lambda: (s := scrape(port)) and (value(s, "procsv_goodput") or 0) > 0
                 and (value(s, "procsv_steps_per_second") or 0) > 0, 60, what="attempt 2 stepping")
        assert sum(v for (name, _), v in scrape(port).items() if name == "procsv_restarts_total") == 1.0
        assert value(after, "procsv_summaries_dropped") == 0.0
    finally:
        proc.send_signal(signal.SIGTERM)
        code, out, err = finish(proc)
    assert code == 128 + signal.SIGTERM, err
    assert f"procsv: serving metrics at http://127.0.0.1:{port}/metrics" in out
    with pytest.raises((urllib.error.URLError, ConnectionError)):
        scrape(port)  # closed with the launch
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # the scrapes' connections linger in TIME_WAIT
        s.bind(("127.0.0.1", port))  # no listener is left on it
        s.listen()


@pytest.mark.slow
def test_a_port_in_use_is_one_line_and_exit_2_before_anything_starts(tmp_path):
    logdir = str(tmp_path / "run")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        out = subprocess.run([sys.executable, "-m", "procsv", "launch", TINY, "--logdir", logdir,
                              "--metrics-port", str(port)], capture_output=True, text=True, env=quiet_env(),
                             timeout=120)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and f"cannot serve metrics on 127.0.0.1:{port}" in lines[0], out.stderr
    assert "in use" in lines[0]
    assert not os.path.exists(logdir)  # nothing was started, not even the logdir
    assert not run_processes(logdir)


@pytest.mark.parametrize("flags,says", [
    (["--metrics-port", "0"], "--metrics-port must be a port number from 1 to 65535, not 0"),
    (["--metrics-port", "65536"], "from 1 to 65535, not 65536"),
    (["--metrics-port", "-5"], "from 1 to 65535, not -5"),
    (["--metrics-host", "0.0.0.0"], "--metrics-host needs --metrics-port"),
])
def test_bad_metrics_flags_are_usage_errors(tmp_path, capsys, flags, says):
    logdir = str(tmp_path / "run")
    assert main(["launch", TINY, "--logdir", logdir, *flags]) == 2
    assert says in capsys.readouterr().err
    assert not os.path.exists(logdir)


def test_a_host_that_is_not_this_machine_is_a_usage_error(tmp_path, capsys):
    logdir = str(tmp_path / "run")
    assert main(["launch", TINY, "--logdir", logdir, "--metrics-port", str(free_port()),
                 "--metrics-host", "192.0.2.1"]) == 2  # TEST-NET-1: never a local address
    assert "cannot serve metrics on 192.0.2.1:" in capsys.readouterr().err


# ----------------------------------------------------------------------------- pure parts

def _attempt(n: int, **kw: Any) -> ChildView:
    c = ChildView("trainer", "trainer", n, 100 + n, started=10.0 * n)
    for k, v in kw.items():  # (exit_code: a failure with that code, unless one is given)
        if k == "exit_code":
            k, v = "failure", kw.get("failure") or Failure("trainer", n, 100 + n, v, 0.0, "/x.log")
        if k == "hang_cause":
            c.hang.cause = v
        else:
            setattr(c, k, v)
    return c


def _failure(code: int, preempted: bool = False) -> Failure:
    return Failure("trainer", 1, 101, code, 0.0, "/x.log", exit_report=ExitReport("SIGTERM", 5) if preempted else None)


def test_restart_causes_are_known_once_and_never_change():
    assert restart_cause(_attempt(1)) is None  # noticed dead, not reaped: not counted yet
    assert restart_cause(_attempt(1, exit_code=-9, failure=_failure(-9))) == "SIGKILL"
    assert restart_cause(_attempt(1, exit_code=-11)) == "SIGSEGV"
    assert restart_cause(_attempt(1, exit_code=1)) == "exit_code"
    # a 42 is a preemption only with the trainer's exit report (issue 38, point 2); the program's own is an exit code
    assert restart_cause(_attempt(1, exit_code=42, failure=_failure(42, preempted=True))) == "preempted"
    assert restart_cause(_attempt(1, exit_code=42, failure=_failure(42))) == "exit_code"
    assert restart_cause(_attempt(1, hang_cause="hang: no step for 2 s", signalled_at=5.0)) == "hang"
    assert restart_cause(_attempt(1, hang_cause="hang: x", signalled_at=5.0, exit_code=-9)) == "hang"
    assert restart_cause(_attempt(1, signalled_at=5.0, chaos_sent=True)) == "chaos"
    assert restart_cause(_attempt(1, signalled_at=5.0, chaos_sent=True, exit_code=42)) == "chaos"
    # signalled, not by chaos (a group's stop), then SIGKILLed from outside: counted by that signal
    assert restart_cause(_attempt(1, signalled_at=5.0, exit_code=-9, failure=_failure(-9))) == "SIGKILL"
    # a group's chief stopped by the group rule (its SIGTERM sets signalled_at too) after worker1's SIGKILL:
    # counted by worker1's end, not as chaos (before: "chaos" for every group restart)
    worker1 = _attempt(1, exit_code=-9, failure=_failure(-9))
    assert restart_cause(_attempt(1, signalled_at=5.0, exit_code=-15, broken_by=worker1)) == "SIGKILL"
    assert restart_cause(_attempt(1, exit_code=-9, broken_by=_attempt(1, signalled_at=4.0, chaos_sent=True, exit_code=-9))) == "chaos"
    attempts = [_attempt(1, exit_code=-9), _attempt(2, exit_code=1), _attempt(3, exit_code=-9), _attempt(4),
                _attempt(5)]
    # attempt 4 was restarted on its death notice and is not reaped yet; attempt 5 is live
    assert restart_counts(attempts) == (("SIGKILL", 2), ("exit_code", 1))


def test_step_rate_is_per_attempt_over_a_window():
    rate = StepRate()  # over RATE_WINDOW, 10 s
    assert rate.add(0.0, 1, 0) is None
    assert rate.add(1.0, 1, 50) == 50.0
    assert rate.add(2.0, 1, 150) == 75.0
    for t in range(3, 30):
        got = rate.add(float(t), 1, 150 + 10 * (t - 2))
    assert got == pytest.approx(10.0)  # the early burst has left the window
    assert rate.add(30.0, 2, 100) is None  # a new attempt: a new window
    assert rate.add(31.0, 2, 120) == 20.0
    assert rate.add(32.0, 2, 110) is None  # the step went back: a new window


def test_the_snapshot_reads_the_view():
    view = RunView(launch_start=0.0)
    a1 = _attempt(1, ready_at=1.0, first_step_at=2.0, last_progress_at=20.0, last_work_at=20.0, work_step=200,
                  step=200, exit_code=-9, ended_at=21.0)
    a2 = _attempt(2, ready_at=22.0, restored_step=150, first_step_at=22.5, last_progress_at=30.0,
                  last_work_at=30.0, work_step=300, step=300)
    view.attempts = [a1, a2]
    view.children = {"trainer": a2, "checkpoint": ChildView("checkpoint", "checkpoint", 3, 7, 0.0),
                     "summary": ChildView("summary", "summary", 1, 8, 0.0)}
    view.step, view.commits, view.last_commit_at, view.last_commit_step, view.last_commit_secs = 300, 4, 28.0, 250, 0.2
    snap = take_snapshot(view, 30.0, 1000.0, 970.0, StepRate())
    assert snap.live and snap.run == "running" and snap.step == 300 and snap.attempt == 2
    assert snap.restarts == (("SIGKILL", 1),)
    assert snap.service_restarts == (("checkpoint", 2), ("summary", 0))
    assert snap.steps_redone == 50
    assert snap.last_checkpoint_step == 250 and snap.last_checkpoint_at == 998.0 and snap.checkpoints == 4
    assert 0 < snap.goodput <= 1
    view.run = RunState.SUCCEEDED
    assert not take_snapshot(view, 31.0, 1001.0, 970.0, StepRate()).live


def _snap(**kw: Any) -> RunSnapshot:
    base: dict[str, Any] = dict(live=True, run="running", step=1200, steps_per_sec=55.5, attempt=2,
                                restarts=(("SIGKILL", 1), ("hang", 2)), service_restarts=(("checkpoint", 0),),
                                steps_redone=40, goodput=0.9, last_checkpoint_step=1100, last_checkpoint_at=990.0,
                                last_checkpoint_secs=0.3, checkpoints=11, checkpoint_failures=1, started_at=900.0)
    base.update(kw)
    return RunSnapshot(**base)


def test_families_render_as_prometheus_text_and_parse_back(tmp_path):
    snap = _snap()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(RunCollector(lambda: snap, str(tmp_path / "missing.json"), {"target": "t", "logdir": "/l"},
                                   wall=lambda: 1002.5))
    got = parse(generate_latest(registry).decode())
    assert value(got, "procsv_up") == 1.0
    assert value(got, "procsv_step") == 1200.0 and value(got, "procsv_steps_per_second") == 55.5
    assert value(got, "procsv_restarts_total", cause="SIGKILL") == 1.0
    assert value(got, "procsv_restarts_total", cause="hang") == 2.0
    assert value(got, "procsv_last_checkpoint_age_seconds") == 12.5  # computed at the scrape
    assert value(got, "procsv_checkpoint_failures_total") == 1.0
    assert value(got, "procsv_run_state", procsv_run_state="running") == 1.0
    assert value(got, "procsv_run_state", procsv_run_state="failed") == 0.0
    assert value(got, "procsv_summaries_dropped") is None  # no stats file yet
    names = {fam.name for fam in families(_snap(goodput=None, last_checkpoint_at=None, steps_per_sec=None), 0.0, 7,
                                          {})}
    assert "procsv_goodput" not in names and "procsv_last_checkpoint_age_seconds" not in names
    assert "procsv_summaries_dropped" in names
    before = parse(generate_latest(_registry(None)).decode())
    assert value(before, "procsv_up") == 0.0 and value(before, "procsv_step") is None
    assert value(parse(generate_latest(_registry(_snap(live=False, run="stopped"))).decode()), "procsv_up") == 0.0


def test_before_this_launch_commits_the_checkpoint_age_is_the_newest_on_disk():
    view = RunView(launch_start=0.0)
    view.restored_step = 500
    snap = take_snapshot(view, 30.0, 1000.0, 970.0, StepRate(), on_disk=(500, 400.0))
    assert snap.last_checkpoint_step == 500 and snap.last_checkpoint_at == 400.0  # an earlier launch's commit
    assert value(parse(generate_latest(_registry(snap)).decode()), "procsv_last_checkpoint_age_seconds") == 1000.0 - 400.0
    view.last_commit_at, view.last_commit_step = 28.0, 600  # once this launch commits, its own
    assert take_snapshot(view, 30.0, 1000.0, 970.0, StepRate(), on_disk=(500, 400.0)).last_checkpoint_at == 998.0


def _registry(snap: Optional[RunSnapshot]) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(RunCollector(lambda: snap, "/nonexistent", {"target": "t", "logdir": "d"}, wall=lambda: 1000.0))
    return registry


@pytest.mark.slow
def test_a_relaunch_that_never_commits_still_reports_the_age_of_the_last_checkpoint(logdir):
    import json

    code, _, err = finish(launch(logdir, "--steps", "30", "--step-delay", "0.01", target=TINY,
                                 opts=("--standby", "fork", "--quiet")), 120)
    assert code == 0, err
    newest = max(committed_steps(logdir))
    with open(os.path.join(logdir, ".procsv", "checkpoints", f"model.ckpt-{newest}.json")) as fh:
        committed_at = json.load(fh)["committed_at"]
    port = free_port()
    proc = launch(logdir, "--steps", "100000", "--step-delay", "0.01", "--save-model-secs", "100000", target=TINY,
                  opts=("--metrics-port", str(port), "--standby", "fork", "--quiet"))
    try:
        got = wait_for(lambda: (s := try_scrape(port)) and (value(s, "procsv_step") or 0) > newest and s, 120,
                       what="the relaunch stepping past the restored checkpoint")
        assert (value(got, "procsv_checkpoints_total") or 0) == 0  # this launch committed nothing
        assert value(got, "procsv_last_checkpoint_step") == newest
        assert value(got, "procsv_last_checkpoint_timestamp_seconds") == pytest.approx(committed_at, abs=0.01)
        age = value(got, "procsv_last_checkpoint_age_seconds")  # the stuck-run alert's input
        assert age is not None and abs(age - (time.time() - committed_at)) < 10
    finally:
        proc.send_signal(signal.SIGTERM)
        finish(proc)


def test_a_ps_launch_counts_restarts_per_task_with_role_labels():
    # issue 43: before, only the chief's restarts (procsv_restarts) were counted under --ps
    view = RunView(launch_start=0.0)
    view.tasks_alone = True
    view.children = {"trainer": ChildView("trainer", "trainer", 3, 10, 0.0),
                     "worker1": ChildView("worker1", "worker", 2, 11, 0.0),
                     "worker2": ChildView("worker2", "worker", 1, 12, 0.0),
                     "ps0": ChildView("ps0", "ps", 2, 13, 0.0),
                     "checkpoint": ChildView("checkpoint", "checkpoint", 4, 14, 0.0)}
    snap = take_snapshot(view, 30.0, 1000.0, 970.0, StepRate())
    assert snap.task_restarts == (("chief", "chief", 2), ("ps0", "ps", 1), ("worker1", "worker", 1),
                                  ("worker2", "worker", 0))
    got = parse(generate_latest(_registry(snap)).decode())
    assert value(got, "procsv_task_restarts_total", task="chief", role="chief") == 2.0
    assert value(got, "procsv_task_restarts_total", task="worker1", role="worker") == 1.0
    assert value(got, "procsv_task_restarts_total", task="worker2", role="worker") == 0.0
    assert value(got, "procsv_task_restarts_total", task="ps0", role="ps") == 1.0
    assert not [k for k in got if k[0] == "procsv_task_restarts_total" and dict(k[1])["task"] == "checkpoint"]
    view.tasks_alone = False  # without --ps: no per-task family (a group restarts whole: procsv_restarts)
    plain = take_snapshot(view, 30.0, 1000.0, 970.0, StepRate())
    assert plain.task_restarts == ()
    assert "procsv_task_restarts" not in {fam.name for fam in families(plain, 0.0, 7, {})}
