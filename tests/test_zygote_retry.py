"""A lost pre-warmed trainer (zygote) is started again, so a long run does not restart fresh, and
without a hot standby, for the rest of its life after one loss.

Pure: rule 13 of the decision function on a fake clock (the backoff, the limit of losses in a
row, the reset once one is ready, and a restart that never waits for a new zygote). Real: a
launch whose zygote is SIGKILLed gets a new one, and the trainer's next restart is a promotion of
the hot standby forked from it.
"""

from __future__ import annotations

import os
import signal

import pytest

from procsv.watchdog import observe
from procsv.watchdog.rules.actions import Spawn, StartZygote
from procsv.watchdog.rules.decide import Limits, zygote_retry_delay
from procsv.watchdog.rules.hang import HangLimits
from procsv.watchdog.rules.state import TRAINER, ZygoteState

from conftest import PROGRAMS, finish, launch, lifecycle, wait_for
from test_watchdog_decide import Sim, of

TINY = os.path.join(PROGRAMS, "tiny_train.py")

LIMITS = Limits(hang=HangLimits(None, None), zygote_retry_secs=10.0, zygote_retry_cap=35.0, zygote_retries=4)


def _lose(sim: Sim) -> None:
    observe.zygote_changed(sim.view, ZygoteState.LOST, 7, why="gone", now=sim.now)


def test_a_lost_zygote_is_started_again_after_a_backoff_that_doubles_and_is_capped():
    assert [zygote_retry_delay(n, LIMITS) for n in (1, 2, 3, 4)] == [10.0, 20.0, 35.0, 35.0]
    sim = Sim(LIMITS, zygote=ZygoteState.READY)
    sim.view.zygote_attempt = 1
    sim.start_trainer(steps=3)
    _lose(sim)
    assert of(sim.tick(9.9), StartZygote) == []
    assert of(sim.tick(0.1), StartZygote) == [StartZygote(2)]
    assert sim.view.zygote == ZygoteState.WARMING and of(sim.tick(100.0), StartZygote) == []  # noted: not twice
    _lose(sim)  # it died while warming up: the second loss in a row
    assert of(sim.tick(19.9), StartZygote) == [] and of(sim.tick(0.1), StartZygote) == [StartZygote(3)]
    observe.zygote_changed(sim.view, ZygoteState.READY, 8, 2.5, now=sim.now)
    sim.tick(60.0)
    _lose(sim)  # ready for only a minute: the third loss in a row
    assert of(sim.tick(34.9), StartZygote) == [] and of(sim.tick(0.1), StartZygote) == [StartZygote(4)]  # capped
    observe.zygote_changed(sim.view, ZygoteState.READY, 9, 2.5, now=sim.now)
    sim.tick(600.0)
    _lose(sim)  # this one stayed ready 10 minutes: the count starts again
    assert sim.view.zygote_losses == 1 and of(sim.tick(10.0), StartZygote) == [StartZygote(5)]


def test_after_the_limit_of_losses_in_a_row_no_zygote_is_started_any_more():
    sim = Sim(LIMITS, zygote=ZygoteState.READY)
    sim.view.zygote_attempt = 1
    sim.start_trainer(steps=3)
    for attempt in (2, 3, 4):
        _lose(sim)
        assert of(sim.tick(40.0), StartZygote) == [StartZygote(attempt)]
        observe.zygote_changed(sim.view, ZygoteState.READY, 8, 2.5, now=sim.now)  # ready, briefly
        sim.tick(5.0)
    _lose(sim)  # the fourth in a row: zygote_retries=4
    assert of(sim.tick(1000.0), StartZygote) == [] and sim.view.zygote == ZygoteState.LOST


def test_a_restart_while_a_new_zygote_warms_up_starts_fresh_at_once():
    sim = Sim(LIMITS, zygote=ZygoteState.READY)
    sim.start_trainer(steps=3)
    sim.commit(3)
    _lose(sim)
    of(sim.tick(10.0), StartZygote)
    assert sim.view.zygote == ZygoteState.WARMING
    sim.dies(TRAINER, -9)
    assert Spawn(TRAINER, TRAINER) in sim.tick(0.1) + sim.tick(0.1)  # not held for the zygote's import


def test_no_zygote_is_started_during_a_stop_or_without_a_loss_time():
    sim = Sim(LIMITS, zygote=ZygoteState.READY)
    sim.start_trainer(steps=3)
    observe.zygote_changed(sim.view, ZygoteState.LOST, 7)  # no time given: not a loss rule 13 counts from
    assert of(sim.tick(100.0), StartZygote) == []
    sim.view.zygote = ZygoteState.READY
    _lose(sim)
    sim.view.stop_signal = signal.SIGTERM
    assert of(sim.tick(100.0), StartZygote) == []


def _events(logdir: str, kind: str) -> list[dict]:
    return [e for e in lifecycle(logdir) if e["event"] == kind]


@pytest.mark.slow
def test_a_killed_zygote_is_replaced_and_restarts_promote_a_standby_forked_from_the_new_one(logdir):
    """The trainer and the standby it forked live on (the watchdog is their parent, issue 51); 10 s
    after the loss a new zygote starts; the next restart promotes the standby already there, the
    standby after it is forked from the new zygote once it is ready, and the restart after that is
    its promotion."""
    # (steps of 50 ms, not 10: the test waits for zygotes and standbys, tens of seconds, and counts no step)
    proc = launch(logdir, "--steps", "100000", "--step-delay", "0.05", "--save-model-secs", "1", target=TINY,
                  opts=("--standby", "hot"))
    try:
        ready = wait_for(lambda: _events(logdir, "standby_ready"), 120, what="a hot standby")[0]
        first = next(e["pid"] for e in _events(logdir, "spawned") if e["role"] == "zygote")
        trainer = next(e["pid"] for e in reversed(_events(logdir, "spawned")) if e["role"] == "trainer")
        os.kill(first, signal.SIGKILL)
        wait_for(lambda: _events(logdir, "zygote_gone"), 30, what="the zygote's loss")
        second = wait_for(lambda: [e for e in _events(logdir, "spawned") if e["role"] == "zygote" and e["attempt"] == 2],
                          60, what="a new zygote (10 s after the loss)")[0]
        assert second["pid"] != first
        wait_for(lambda: len(_events(logdir, "zygote_ready")) == 2, 120, what="the new zygote to be ready")
        os.kill(trainer, 0)  # the trainer and the standby the lost zygote forked live on
        os.kill(ready["pid"], 0)
        assert not [e for e in _events(logdir, "exited") if e["pid"] in (trainer, ready["pid"])]
        for round_ in (1, 2):  # the standby already there, then one forked from the new zygote
            ready_at = len(lifecycle(logdir))
            if round_ == 2:
                wait_for(lambda: [e for e in lifecycle(logdir)[ready_at:] if e["event"] == "standby_ready"], 120,
                         what="a standby forked from the new zygote")
            trainer = next(e["pid"] for e in reversed(_events(logdir, "spawned")) if e["role"] == "trainer")
            killed_at = len(lifecycle(logdir))
            os.kill(trainer, signal.SIGKILL)
            promoted = wait_for(lambda: [e for e in lifecycle(logdir)[killed_at:] if e["event"] == "spawned"
                                         and e["role"] == "trainer"], 60, what="the next trainer attempt")[0]
            assert promoted["via"] == "standby", promoted
            if round_ == 1:
                assert promoted["pid"] == ready["pid"]
    finally:
        proc.send_signal(signal.SIGTERM)
        code, out, err = finish(proc)
    assert code == 128 + signal.SIGTERM, err
    assert "starting a new pre-warmed trainer (zygote attempt 2)" in err + out
