"""Pure watchdog decisions with plain numbers: hang limits, chaos specs, the recovery report."""

from __future__ import annotations

import random
import signal

import pytest

from procsv.common.errors import UsageError
from procsv.watchdog.rules.chaos import parse_chaos
from procsv.watchdog.rules.hang import HangLimits, hang_reason
from procsv.watchdog.publish.recovery import recoveries, summarize
from procsv.watchdog.rules.state import TRAINER, ChildView

LIMITS = HangLimits(hang_timeout=10.0, startup_timeout=60.0)


def test_no_first_step_is_judged_by_the_startup_timeout():
    assert hang_reason(59.0, started=0.0, last_progress=None, busy="", stepped=False, limits=LIMITS) is None
    reason = hang_reason(61.0, started=0.0, last_progress=None, busy="", stepped=False, limits=LIMITS)
    assert reason and "--startup-timeout 60" in reason


def test_after_the_first_step_the_hang_timeout_applies():
    assert hang_reason(109.0, started=0.0, last_progress=100.0, busy="", stepped=True, limits=LIMITS) is None
    reason = hang_reason(110.5, started=0.0, last_progress=100.0, busy="", stepped=True, limits=LIMITS)
    assert reason and "10.5 s" in reason and "--hang-timeout 10" in reason


def test_a_report_before_the_first_step_leaves_the_startup_timeout_on_from_the_start():
    # a TF1 Supervisor's start-up checkpoint at session ready: a snapshot (busy), then a report not busy,
    # before any step: the first run (a long trace, an evaluation) still has --startup-timeout from the start
    busy = HangLimits(hang_timeout=10.0, startup_timeout=60.0, busy_timeout=20.0)
    assert hang_reason(15.0, started=0.0, last_progress=2.0, busy="snapshot", stepped=False, limits=busy) is None
    assert hang_reason(59.0, started=0.0, last_progress=2.5, busy="", stepped=False, limits=busy) is None
    reason = hang_reason(61.0, started=0.0, last_progress=2.5, busy="", stepped=False, limits=busy)
    assert reason and "--startup-timeout 60" in reason


def test_a_busy_trainer_is_judged_by_the_busy_limit_only():
    assert hang_reason(1e6, started=0.0, last_progress=1.0, busy="final_checkpoint", stepped=True, limits=LIMITS) is None
    busy = HangLimits(hang_timeout=10.0, startup_timeout=60.0, busy_timeout=100.0)
    assert hang_reason(100.5, started=0.0, last_progress=1.0, busy="snapshot", stepped=True, limits=busy) is None
    reason = hang_reason(101.5, started=0.0, last_progress=1.0, busy="snapshot", stepped=True, limits=busy)
    assert reason and "busy with snapshot for 100.5 s" in reason


def test_a_trainer_reading_its_input_again_gets_the_startup_timeout_from_each_report():
    # a resumed Keras fit drawing earlier epochs, long after its start: not hung while it reports
    busy = HangLimits(hang_timeout=10.0, startup_timeout=60.0, busy_timeout=20.0)
    assert hang_reason(5000.0, started=0.0, last_progress=4950.0, busy="input", stepped=False, limits=busy) is None
    reason = hang_reason(5011.0, started=0.0, last_progress=4950.0, busy="input", stepped=False, limits=busy)
    assert reason and "putting back fit's input for 61.0 s" in reason and "--startup-timeout 60" in reason


@pytest.mark.parametrize("limits", [HangLimits(None, None), HangLimits(0, 0)])
def test_zero_or_none_turns_detection_off(limits):
    assert hang_reason(1e9, started=0.0, last_progress=None, busy="", stepped=False, limits=limits) is None
    assert hang_reason(1e9, started=0.0, last_progress=1.0, busy="", stepped=True, limits=limits) is None


def test_chaos_every_is_a_fixed_delay_and_defaults_to_sigkill_of_the_trainer():
    plan = parse_chaos("every=30")
    assert plan.target == "trainer" and plan.signal == signal.SIGKILL
    assert plan.delay(random.Random(0)) == 30.0


def test_chaos_random_is_seeded_and_within_bounds():
    plan = parse_chaos("random=5:9,seed=4,target=summary,signal=TERM")
    assert plan.target == "summary" and plan.signal == signal.SIGTERM
    a = [plan.delay(random.Random(plan.seed)) for _ in range(3)]
    b = [plan.delay(random.Random(plan.seed)) for _ in range(3)]
    assert a == b and all(5 <= d <= 9 for d in a)


@pytest.mark.parametrize("spec", ["", "every", "every=0", "every=-1", "random=9:5", "random=x:y", "every=3,random=1:2",
                                  "every=3,target=zygote", "every=3,signal=HUP", "every=3,colour=red", "every=3,seed=x"])
def test_bad_chaos_specs_are_usage_errors(spec):
    with pytest.raises(UsageError) as err:
        parse_chaos(spec)
    assert "--chaos" in str(err.value)


def _attempt(attempt, started, ready_at, restored_step, first_step_at, work_step, ended_at=None, signalled_at=None):
    return ChildView(TRAINER, TRAINER, attempt, 100 + attempt, started, ready_at=ready_at, restored_step=restored_step,
                     first_step_at=first_step_at, work_step=work_step, ended_at=ended_at, signalled_at=signalled_at)


def _attempts():
    # attempt 1: steps 0->100 between t=10 and t=20, killed at 20.0, noticed 20.001
    a1 = _attempt(1, 0.0, 9.0, 0, 10.0, 100, ended_at=20.001, signalled_at=20.0)
    # attempt 2: restored step 80 (20 re-done), first step 21.0, runs to step 180 at t=31
    a2 = _attempt(2, 20.01, 20.5, 80, 21.0, 180)
    return [a1, a2]


def test_recovery_breakdown_adds_up():
    (r,) = recoveries(_attempts())
    assert r["detect_s"] == pytest.approx(0.001) and r["respawn_s"] == pytest.approx(0.009)
    assert r["restore_s"] == pytest.approx(0.49) and r["first_step_s"] == pytest.approx(0.5)
    assert r["total_s"] == pytest.approx(1.0) and r["steps_redone"] == 20
    assert summarize(_attempts())["steps_redone"] == 20
