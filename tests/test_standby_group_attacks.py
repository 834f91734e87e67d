"""Attacks on the standby group (``procsv launch --nproc 2`` on one host) with real processes, real
collectives, real NaNs and real signals: what the issue 54 review found, each a behaviour the
standby group must keep (a promoted group is the group a forked restart would have started).

Each test launches ``procsv.examples.digits --strategy multiworker`` as a group of two, waits until
the standby group (two members forked with the next attempt's ``TF_CONFIG``) says it is ready, and
reads the outcome back from the lifecycle log, the members' logs and the final checkpoint (plain
TensorFlow), against a plain group run.
"""

from __future__ import annotations

import os
import signal

import pytest

from conftest import PROGRAMS, finish, launch, quiet_env, raw_status, wait_for, wait_role_pid
from test_group import GROUP, K, assert_bit_equal, events, group_started, sigkill_mid_interval
from test_standby_group import standby_group_ready

pytestmark = pytest.mark.slow  # starts TensorFlow processes: not in the quick tier

# SB's group at 100 ms a step, not 40: these runs wait for standby groups to be ready (seconds, more under load)
# while the group steps on, and a group step costs ~11 ms of CPU (both members), a sleep none
SB_SLOW = ("--strategy", "multiworker", "--save-model-secs", "1000", "--step-delay", "0.1", "--print-every-steps", "1")
# late enough for the standby group to be ready before it (asserted), early enough to end soon: 90 steps of 200 ms
# (18 s) before it, not 160 of SB_SLOW (16 s; 220 steps, the NaN at 180, found at the group's snapshot of step 200):
# the NaN at 110, after the group's last snapshot (100, every K = 50), is found at the final checkpoint and rolled
# back to the snapshot of 100: 100 group steps fewer (~11 ms of CPU each, both members). The same launch is the
# final checkpoint's finding's (before, a launch of its own in test_nonfinite_group.py, compared with the plain
# run this one is: one launch and one plain group run fewer in a session)
NAN_AT = 110
STEPS = 120
NAN_RUN = ("--strategy", "multiworker", "--save-model-secs", "1000", "--step-delay", "0.2", "--print-every-steps", "1")


@pytest.fixture(scope="module")
def plain_skipping_late(shared_result):
    """The final weights of a plain group run of STEPS steps that never applies step NAN_AT (made once per session:
    ``test_nonfinite_group.plain_skipping``)."""
    from test_nonfinite_group import plain_skipping

    return plain_skipping(shared_result, str(NAN_AT))


def test_a_nan_after_the_groups_last_snapshot_found_at_the_final_checkpoint_rolls_back_a_group_whose_standby_group_was_ready_skipping_it_bit_equal(  # noqa: E501
        logdir, plain_skipping_late):
    """A NaN at step 110, after the group's last snapshot, is found at the chief's final checkpoint and rolls the
    group back too (from the snapshot of 100). The group rollback promotes a standby group forked before the NaN:
    it still skips the step, and the run ends bit-equal. (One run for both: before, the final checkpoint's finding
    had a launch of its own in ``test_nonfinite_group.py``, no standby group prepared.)"""
    from test_nonfinite_group import member_log

    # step 110 is after the last group snapshot (100, every 50 steps) of a 120-step run: no snapshot checks
    # its loss before the loop ends, only the chief's final checkpoint does (before: exit 4, the group stopped
    # and the run lost every step since its newest checkpoint on disk); its restart is not forced (found at a K-th
    # step, the group would roll back in place, promoting nothing): found at the final checkpoint, it restarts
    # the standby group was forked before the NaN, with the PROCSV_SKIP_STEPS of that time (none): a group
    # rollback that promotes it restarts a group that does not know the step it must skip
    proc = launch(logdir, *NAN_RUN, "--steps", str(STEPS), "--nan-at-steps", str(NAN_AT),
                  opts=GROUP + ("--on-nonfinite", "rollback"))
    try:
        group_started(logdir, 1)
        standby_group_ready(logdir, 2)
        step = (raw_status(logdir) or {}).get("step", 0)
        assert step < NAN_AT - 20, f"the standby group was ready only at step {step}: the test proves nothing"
    finally:
        code, out, err = finish(proc, timeout=300)
    assert code == 0, err
    assert {r["step"] for r in events(logdir, "nonfinite_detected")} == {NAN_AT}
    assert [r["step"] for r in events(logdir, "step_skipped")] == [NAN_AT], err
    assert len(events(logdir, "restarting")) == 1 and not events(logdir, "rolled_back"), err
    assert {e["role"] for e in events(logdir, "spawned") if e["attempt"] == 2 and e["via"] == "standby"} == \
        {"trainer", "worker1"}  # (the standby group promoted)
    assert [r.get("code") for r in events(logdir, "exited") if r["role"] == "trainer"] == [5, 0]
    restored = events(logdir, "restored")
    assert len(restored) == 1 and restored[0]["source"] == "memory" and restored[0]["step"] == 100, restored
    for log in ("trainer.2", "worker1.2"):
        assert f"procsv: skipping step {NAN_AT} again (this run skipped it before); training on from step " \
            f"{NAN_AT + 1}" in member_log(logdir, log), log
    assert (raw_status(logdir) or {}).get("skipped_steps") == [NAN_AT]
    assert_bit_equal(logdir, plain_skipping_late)


def test_members_killed_in_a_row_each_after_a_newer_group_snapshot_are_replaced_at_once_every_time(logdir):
    """Members SIGKILLed in a row (more than --max-restarts), each after a newer group snapshot: each is progress,
    so every standby promotion is at once and the run never gives up."""
    # a month-long run loses a member now and then; each group here trains past a new in-memory snapshot of
    # the group (held by the checkpoint service, restored by the next group: the group's progress) before
    # its member is SIGKILLed. Before: only a checkpoint committed to disk counted as progress, so every
    # kill was one more failure without progress: the standby group waited out a backoff of 1, 2, 4, ...
    # 30 s before its promotion (MTTR 0.12, 1.2, 2.1, 4.0, 8.8, 16, 31 s seen) and the run gave up after
    # --max-restarts kills. Three kills: one more than --max-restarts 2, as few as show it
    proc = launch(logdir, *SB_SLOW, "--steps", "100000", opts=GROUP + ("--max-restarts", "2"))
    kills = 3
    try:
        group_started(logdir, 1)
        base = 0
        for attempt in range(1, kills + 1):
            standby_group_ready(logdir, attempt + 1)
            role = "worker1" if attempt % 2 else "trainer"
            sigkill_mid_interval(logdir, role, f"{role}.{attempt}", base + K)  # past a snapshot newer than base
            group_started(logdir, attempt + 1)
            base = events(logdir, "restored")[-1]["step"]
    finally:
        proc.send_signal(signal.SIGTERM)
        code, out, err = finish(proc)
    assert code == 128 + signal.SIGTERM, err
    restored = events(logdir, "restored")
    assert [r["source"] for r in restored] == ["memory"] * kills, restored
    steps = [r["step"] for r in restored]
    assert steps == sorted(set(steps)), steps  # every group restored a newer snapshot: progress each time
    restarting = events(logdir, "restarting")
    assert [r["delay"] for r in restarting] == [0.0] * kills, restarting
    assert not events(logdir, "gave_up")


WARM_ONE_FAILS = os.path.join(PROGRAMS, "group_warm_one_fails.py")


def test_a_standby_group_whose_one_member_fails_its_shadow_run_is_still_promoted_at_a_members_death(logdir):
    """A standby group one of whose members failed its shadow run still says ready and is promoted whole at a
    member's death."""
    # worker1's warm-up batch fails the step's own check (an Assert, no state of its own) before the step's
    # all-reduce; the standby chief, whose batch passes, waits in that all-reduce for a peer that never comes:
    # seen, the standby chief in futex_wait with no 'ready' line for 20 s, each kill forking the group (1.8 s,
    # 1.6 s to the first step, against 0.13-0.47 s promoted) and each new standby group stuck the same way
    proc = launch(logdir, "--steps", "100000", target=WARM_ONE_FAILS, opts=GROUP)
    try:
        group_started(logdir, 1)
        wait_for(lambda: [e for e in events(logdir, "standby_ready") if e["attempt"] == 2], 120,
                 what="worker1's standby saying ready (its shadow run failed)")
        wait_for(lambda: len([e for e in events(logdir, "standby_ready") if e["attempt"] == 2]) >= 2, 60,
                 what="the standby chief ready too")
        os.kill(wait_role_pid(logdir, "worker1"), signal.SIGKILL)
        group_started(logdir, 2)
    finally:
        proc.send_signal(signal.SIGTERM)
        finish(proc)
    assert {e["role"] for e in events(logdir, "spawned") if e["attempt"] == 2 and e["via"] == "standby"} == \
        {"trainer", "worker1"}
