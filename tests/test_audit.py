"""--audit (issue 71) with real processes: one launch whose trainer has one bit of one weight flipped.

CPU: one digits launch of 1200 steps under ``--audit every`` (checkpoints every 400 steps; the trainer sleeps
20 ms a step) with a hot standby and six auditors at SCHED_IDLE, each a fork of the zygote replaying 400 steps,
and 400 steps trained again after the rollback: about 14 CPU-s (measured: see the commit).
"""

from __future__ import annotations

import re

import pytest

from conftest import final_weights, finish, launch, lifecycle, quiet_env, run_python, status_json

pytestmark = pytest.mark.slow


def test_a_flipped_bit_in_the_last_interval_is_caught_after_the_trainer_finished_rolled_back_and_bit_equal(
        logdir, clean_weights) -> None:
    """The bit flips after step 1000, in the launch's last interval (800-1200): its verdict can only come after
    the trainer's final checkpoint. Under --audit every the run does not end before it: two replays agree with
    each other, not with the trainer; the trainer on this host is named (the audit record, its restart's cause,
    status.json, procsv status and report) and trains again from step 800; the run ends succeeded, its weights
    bit-equal to a clean run's."""
    env = quiet_env(PROCSV_FAULT="trainer:bitflip:1000")
    code, out, err = finish(launch(logdir, "--steps", "1200", "--save-model-secs", "1000", "--save-checkpoint-steps",
                                   "400", "--step-delay", "0.02", opts=("--audit", "every"), env=env), timeout=300)
    assert code == 0, err[-3000:]
    events = lifecycle(logdir)
    audits = [(e["verdict"], e["start"], e["end"]) for e in events if e["event"] == "audit"]
    wrong = [e for e in events if e["event"] == "audit" and e["verdict"] == "trainer"]
    assert len(wrong) == 1 and (wrong[0]["start"], wrong[0]["end"]) == (800, 1200), audits
    assert ("match", 400, 800) in audits and ("match", 800, 1200) in audits, audits  # ... and again after it
    host = wrong[0]["host"]
    assert host and any("kernel" in d or "_trainable_variables" in d for d in wrong[0]["differ"]), wrong
    assert f"the trainer on host {host} computed steps 800-1200 wrongly" in err
    assert "the trainer had finished; it trains again from step 800" in err
    restarting = [e for e in events if e["event"] == "restarting"]
    assert [e["error"] for e in restarting] == [f"audit: host {host} computed steps 800-1200 wrongly"], restarting
    assert [e["step"] for e in events if e["event"] == "restored"] == [800]
    st = status_json(logdir)
    assert st["state"] == "succeeded" and st["audit"]["miscomputed"] == {host: 1}, st["audit"]
    assert st["audit"]["verdicts"]["trainer"] == 1 and st["spikes"]["transient_faults"] == {host: 1}
    shown = run_python(["-m", "procsv", "status", logdir], env=quiet_env(), timeout=120)
    assert re.search(rf"audit \(every\): .*computed wrongly \(rolled back\), by host: {re.escape(host)} 1",
                     shown.stdout), shown.stdout
    shown = run_python(["-m", "procsv", "report", logdir], env=quiet_env(), timeout=120)
    assert "1 rollback(s) by an audit" in shown.stdout and f"audit: host {host} computed" in shown.stdout, shown.stdout
    a, b = clean_weights, final_weights(logdir)
    assert a.keys() == b.keys()
    for key in a:
        assert (a[key] == b[key]).all(), f"{key} differs after the audit's rollback"
