"""``/healthz`` and ``/readyz`` on ``procsv launch --metrics-port``: the pure decisions, the endpoint
in-process, and a real launch whose loop the fault point ``watchdog:loop_stall`` stalls."""

from __future__ import annotations

import os
import signal
import urllib.error
import urllib.request
from typing import Optional

import pytest

from conftest import PROGRAMS, finish, launch, quiet_env, wait_for
from procsv.watchdog.publish.metrics import MetricsServer, RunCollector
from procsv.watchdog.publish.probes import STALL_SECS, LoopPulse, healthz, readyz
from procsv.watchdog.rules.lifecycle import RunState
from procsv.watchdog.rules.state import TRAINER, WORKER, ChildView, RunView
from test_metrics import free_port, try_scrape, value

TINY = os.path.join(PROGRAMS, "tiny_train.py")


def probe(port: int, path: str, host: str = "127.0.0.1") -> Optional[int]:
    """The status code of a GET of ``path`` (None: nothing answers)."""
    try:
        with urllib.request.urlopen(f"http://{host}:{port}{path}", timeout=5) as resp:
            code: int = resp.status
            return code
    except urllib.error.HTTPError as exc:
        return exc.code
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return None


# ----------------------------------------------------------------------------- pure decisions

def test_healthz_is_503_only_after_10_s_without_a_loop_round():
    assert STALL_SECS == 10.0
    assert healthz(100.0, 100.0).code == 200
    assert healthz(100.0, 110.0).code == 200  # exactly 10 s: still turning
    late = healthz(100.0, 110.5)
    assert late.code == 503 and late.status == "503 Service Unavailable"
    assert late.text == "stalled: no watchdog loop round for 10.5 s (more than 10 s)\n"
    assert healthz(100.0, 103.0, stall_secs=2.0).code == 503


def test_readyz_is_503_until_the_first_step():
    assert readyz(False).code == 503 and readyz(False).text == "not ready: no trainer completed a step yet\n"
    assert readyz(True).code == 200 and readyz(True).status == "200 OK"


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _trainer(attempt: int, first_step_at: Optional[float] = None, role: str = TRAINER) -> ChildView:
    c = ChildView(role if role == TRAINER else f"{role}1", role, attempt, 100 + attempt, started=0.0)
    c.first_step_at = first_step_at
    return c


def test_the_loop_pulse_counts_from_the_bind_latches_readiness_and_turns_during_a_stop():
    clock = FakeClock()
    pulse = LoopPulse(clock)
    view = RunView(launch_start=clock.now)
    clock.now += 9.0
    assert pulse.answer("/healthz").code == 200  # no round yet: counted from the bind
    assert pulse.answer("/readyz").code == 503
    assert pulse.answer("/metrics") is None and pulse.answer("/healthz/") is None
    clock.now += 2.0
    assert pulse.answer("/healthz").code == 503  # 11 s since the bind, no round
    pulse.turned(view)
    assert pulse.answer("/healthz").code == 200 and pulse.answer("/readyz").code == 503
    a1 = _trainer(1)
    view.attempts, view.children = [a1], {TRAINER: a1}
    pulse.turned(view)
    assert pulse.answer("/readyz").code == 503  # started, no step yet
    a1.first_step_at = clock.now
    pulse.turned(view)
    assert pulse.answer("/readyz").code == 200
    a2 = _trainer(2)  # a restart: the new attempt has not stepped yet; the run stays ready
    view.attempts, view.children = [a1, a2], {TRAINER: a2}
    pulse.turned(view)
    assert pulse.answer("/readyz").code == 200
    view.stop_signal, view.run = signal.SIGTERM, RunState.STOPPED  # an orderly stop: the loop still turns
    for _ in range(30):
        clock.now += 1.0
        pulse.turned(view)
        assert pulse.answer("/healthz").code == 200
    clock.now += 10.5  # the loop stuck
    assert pulse.answer("/healthz").code == 503 and pulse.answer("/readyz").code == 200


def test_a_group_is_ready_when_a_member_stepped():
    pulse = LoopPulse(FakeClock())
    view = RunView(launch_start=0.0)
    view.children = {"worker1": _trainer(1, first_step_at=5.0, role=WORKER)}
    pulse.turned(view)
    assert pulse.answer("/readyz").code == 200


def test_the_endpoint_answers_probes_and_metrics_on_other_paths():
    clock = FakeClock()
    pulse = LoopPulse(clock)
    port = free_port()
    server = MetricsServer("127.0.0.1", port, RunCollector(lambda: None, "/nonexistent", {}), pulse)
    try:
        assert probe(port, "/healthz") == 200
        assert probe(port, "/readyz") == 503
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as resp:
            assert resp.read() == b"ok: the watchdog loop turns\n"
            assert resp.headers["Content-Type"] == "text/plain; charset=utf-8"
        clock.now += 10.5
        assert probe(port, "/healthz") == 503
        got = try_scrape(port)
        assert got is not None and value(got, "procsv_up") == 0.0  # /metrics is unchanged
    finally:
        server.close()
    agent = MetricsServer("127.0.0.1", port, None, pulse)  # a node agent's: the probes only
    try:
        assert probe(port, "/healthz") == 503 and probe(port, "/readyz") == 503
        assert probe(port, "/metrics") == 404
    finally:
        agent.close()


# ----------------------------------------------------------------------------- a real launch

@pytest.mark.slow
def test_a_launch_is_ready_after_its_first_step_and_unhealthy_while_its_loop_stalls(logdir, tmp_path):
    """``watchdog:loop_stall`` blocks the loop after its first round that saw a step, until the test
    creates the gate file (a loop stuck as no real fault here can make it). Before: /healthz and
    /readyz were the metrics (200 always). Now /readyz is 503 before the first step and 200 after;
    /healthz is 200 while the loop turns, 503 after 10 s without a round, 200 again once it turns,
    and 200 through the orderly stop that SIGTERM starts."""
    gate, port = str(tmp_path / "gate"), free_port()
    # (steps of 50 ms, not 10: the test waits for the loop's stall, over 10 s, and counts no step)
    proc = launch(logdir, "--steps", "100000", "--step-delay", "0.05", target=TINY,
                  opts=("--metrics-port", str(port), "--standby", "fork", "--quiet"),
                  env=quiet_env(PROCSV_FAULT="watchdog:loop_stall", PROCSV_FAULT_GATE=gate))
    stopped = False
    try:
        first = wait_for(lambda: probe(port, "/readyz"), 60, what="the endpoint to answer")
        assert first == 503  # the trainer is still importing TensorFlow
        assert probe(port, "/healthz") == 200
        wait_for(lambda: probe(port, "/readyz") == 200, 120, what="/readyz 200 after the first step")
        assert probe(port, "/healthz") == 200  # the loop stalls now, for less than 10 s so far
        wait_for(lambda: probe(port, "/healthz") == 503, 60, what="/healthz 503 while the loop stalls")
        assert probe(port, "/readyz") == 200
        with open(gate, "w"):
            pass
        wait_for(lambda: probe(port, "/healthz") == 200, 30, what="/healthz 200 once the loop turns again")
        step = value(try_scrape(port) or {}, "procsv_step") or 0
        wait_for(lambda: (value(try_scrape(port) or {}, "procsv_step") or 0) > step, 30, what="training on")
        proc.send_signal(signal.SIGTERM)
        stopped = True
        during = []
        while (code := probe(port, "/healthz")) is not None:  # the endpoint closes with the launch
            during.append(code)
        assert during and set(during) == {200}, during
    finally:
        with open(gate, "a"):
            pass
        if not stopped:
            proc.send_signal(signal.SIGTERM)
        code, _, err = finish(proc)
    assert code == 128 + signal.SIGTERM, err
