"""A non-finite loss in a trainer group (``procsv launch --nproc 2``, MultiWorkerMirroredStrategy),
with real processes, real TensorFlow collectives and a real NaN in one step's batch.

Each member holds its own copy of the variables, so no member rolls back in place (one that did
trained out of lock with the others). Under ``--on-nonfinite rollback`` the group rolls back as a
group (issue 54 point 4): the member that finds step B's loss non-finite exits 5 after reporting B,
the watchdog records B as skipped and restarts the group, and every member restores the same state
before B (the group's in-memory snapshot, else the newest checkpoint), replays and skips B; the run
ends bit-equal to a plain group run that never applied B. Past ``--max-skips``, and under
``--on-nonfinite stop``, the run stops in order with exit code 4. The decisions' pure tests are in
``test_nonfinite_group_pure.py``.
"""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np
import pytest

from conftest import (PROGRAMS, REPO, committed_steps, final_weights, finish, launch, lifecycle, quiet_env, raw_status,
                      run_python, wait_for)
from test_group import assert_bit_equal

pytestmark = pytest.mark.slow  # starts TensorFlow processes: not in the quick tier

ARGS = ("--strategy", "multiworker", "--save-model-secs", "600", "--save-checkpoint-steps", "10",
        "--step-delay", "0.004", "--print-every-steps", "10")
# --standby fork: no standby group is prepared beside a group (two more members, each running the program up to its
# restore and its step on shadows: 0.6-1.0 CPU-s a launch, measured on four of this file's); a restart forks the next
# group from the pre-warmed trainer. No test here is about the standby group: a group rollback that promotes one is
# test_standby_group_attacks.py's, and a plain (reference) run never restarts
GROUP = ("--nproc", "2", "--standby", "fork")
# no disk checkpoint but the final one: the group's in-memory snapshots (every 50 steps) are what a rollback restores
MEMORY = ("--strategy", "multiworker", "--save-model-secs", "600", "--step-delay", "0.004", "--print-every-steps", "10")
# the restart of the group forced for its rollback (PROCSV_GROUP_ROLLBACK): the tests of that path; a rollback found at
# the group's K-th step is done in place otherwise (the tests of it: ..._in_place_...)
RESTART = quiet_env(PROCSV_GROUP_ROLLBACK="restart")
# each member's own loss watched: a NaN in worker1's alone (or, --in-batch, in its batch)
LOCAL_NAN = os.path.join(PROGRAMS, "group_local_nan.py")


def events(logdir: str, name: str) -> list[dict[str, Any]]:
    return [r for r in lifecycle(logdir) if r.get("event") == name]


def procsv_says(*args: str) -> str:
    """What ``procsv ARGS`` prints (it must succeed)."""
    done = run_python(["-m", "procsv", *args], env=quiet_env(), cwd=REPO, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


def member_log(logdir: str, log: str) -> str:
    with open(os.path.join(logdir, "logs", f"{log}.log")) as fh:
        return fh.read()


def finite_floats(prefix: str) -> int:
    """How many float tensors the checkpoint ``prefix`` holds, read back with plain TensorFlow;
    fails if any holds a NaN or an infinity."""
    import tensorflow as tf

    reader = tf.train.load_checkpoint(prefix)
    floats = 0
    for key in reader.get_variable_to_shape_map():
        value = np.asarray(reader.get_tensor(key))
        if np.issubdtype(value.dtype, np.floating):
            assert np.isfinite(value).all(), (prefix, key)
            floats += 1
    return floats


def test_a_nan_loss_in_a_group_with_stop_stops_the_whole_group_in_order_with_exit_4(logdir):
    """--on-nonfinite stop: a NaN at step 40 stops the whole group in order (exit 4), no restart, no member past it;
    every checkpoint finite."""
    # --max-restarts 1: a run that restarted the group instead ends (exit 1) after one restart. The service's
    # second commit (step 20, later at load) is held until the NaN is found: the chief's triggers at 30 and 40 meet
    # it in flight and take no snapshot there, as at load (the fresh-clone run at load 6.5, whose step-30 snapshot
    # came at 33 and its step-40 one not before the NaN's check); the chief checks its losses at 40 all the same.
    # Before, the check went with the snapshot alone: the next was the group's K-th step (50), every member trained
    # on to it, and the chief's line came after its step 50 at load, after its step 40 on a quiet machine
    gate = os.path.join(os.path.dirname(logdir), "commit_gate")
    proc = launch(logdir, *ARGS, "--steps", "80", "--nan-at-steps", "40",
                  opts=GROUP + ("--max-restarts", "1", "--on-nonfinite", "stop"),
                  env=quiet_env(PROCSV_FAULT="checkpoint:commit_stall:2", PROCSV_FAULT_GATE=gate))
    try:
        wait_for(lambda: proc.poll() is not None or events(logdir, "nonfinite_detected"), 120,
                 what="the NaN of step 40 found")
    finally:
        open(gate, "w").close()  # (the chief's stop in order waits for the commit in flight: its line names it)
    code, out, err = finish(proc)
    assert code == 4, err
    # the chief's one line (in its log, shown on the launch's output): what it found, that it
    # stopped; the launch's giving-up line repeats it
    line = [s for s in out.splitlines() if s.startswith("[trainer.1] procsv: non-finite training at step 40")]
    assert len(line) == 1, out
    assert "--on-nonfinite stop: stopping in order with exit code 4 (diverging)" in line[0]
    # commits are asynchronous, one in flight: at 4 ms a step under load the step-30 snapshot may still be
    # waiting behind step 20's commit at step 40 (seen in a fresh clone's CI); the line names the newest that is
    steps = committed_steps(logdir)
    assert steps and steps[-1] < 40, steps
    assert f"the newest committed checkpoint (step {steps[-1]}) is the newest finite one" in line[0], line[0]
    assert "procsv: giving up: the trainer is diverging" in err and line[0].split("procsv: ", 1)[1] in err
    assert "restarts together" not in err, err  # (when worker1's exit 4 came in first: the chief's stop is no restart)
    # found once, never rolled back in place, and the group was not restarted
    # (worker1, its loss of 40 NaN too, may find it as well before its stop: a record naming the chief as its peer,
    # the same finding, repeats 0)
    found = events(logdir, "nonfinite_detected")
    assert [r["step"] for r in found if r.get("peer") is None] == [40] and {r["step"] for r in found} == {40}, found
    assert sum(r["repeats"] for r in found) == 1, found
    assert not events(logdir, "rolled_back") and not events(logdir, "step_skipped")
    assert not events(logdir, "restarting")
    spawned = sorted((r["role"], r["attempt"]) for r in events(logdir, "spawned") if r["role"] in ("trainer", "worker1"))
    assert spawned == [("trainer", 1), ("worker1", 1)]
    assert [r.get("code") for r in events(logdir, "exited") if r["role"] == "trainer"] == [4]
    # no member trained past the poisoned step: the worker did not run on alone to the end
    assert "[worker1.1] digits: step 50" not in out and "digits: finished" not in out, out
    assert (raw_status(logdir) or {}).get("exit_code") == 4
    # every committed checkpoint is finite; the newest is from before the poisoned step (above)
    assert committed_steps(logdir) == steps
    for step in steps:
        assert finite_floats(os.path.join(logdir, f"model.ckpt-{step}")) > 0


def test_a_nan_only_a_workers_own_loss_shows_at_the_last_step_with_stop_ends_the_run_with_exit_4_naming_it(logdir):
    """--on-nonfinite stop, worker1's own loss of the last step (120) alone NaN (no gradient): the chief commits its
    final checkpoint and exits 0, worker1 finds it at its end and stops (exit 4): the run ends 4, its one line
    naming the step and worker1; no restart; every checkpoint finite. Worker1's session ends a second after its
    loop (``--tail-secs 1``): the chief's 0 waits for that end, sending worker1 nothing, so its end is its own."""
    # before: nothing checked a worker's kept losses at its end under stop (the chief's final checkpoint checks
    # the chief's alone), and the run ended 0 with no line at all; and then (issue 68) with the tail, the chief's 0
    # was judged at once and the run's finishing SIGTERM reached worker1 first: no check (an end not its own), exit 0
    code, out, err = finish(launch(logdir, "--steps", "120", "--nan-at", "120", "--tail-secs", "1", target=LOCAL_NAN,
                                   opts=GROUP + ("--on-nonfinite", "stop")))
    assert code == 4, err
    line = [s for s in out.splitlines() if "procsv: non-finite training at step" in s]
    assert len(line) == 1 and line[0].startswith("[worker1.1] procsv: non-finite training at step 120: the loss of "
                                                 "step 120 is NaN or infinite; --on-nonfinite stop: stopping in order "
                                                 "with exit code 4 (diverging)"), out
    # it claims nothing of the chief's checkpoints, which it does not know (the chief committed step 120)
    assert "this member saves no checkpoint; the chief's of step 120 or later, if any, hold that step's update" \
        in line[0], line[0]
    # the launch's giving-up line names the member and repeats its line
    assert "procsv: giving up: the trainer is diverging" in err, err
    assert "worker1 attempt 1 (pid" in err and line[0].split("procsv: ", 1)[1] in err, err
    worker1 = [r["pid"] for r in events(logdir, "spawned") if r["role"] == "worker1"]
    assert [(r["pid"], r["step"]) for r in events(logdir, "nonfinite_detected")] == [(worker1[0], 120)]
    assert not events(logdir, "restarting") and not events(logdir, "step_skipped") and not events(logdir, "rolled_back")
    ends = {r["role"]: r.get("code") for r in events(logdir, "exited") if r["role"] in ("trainer", "worker1")}
    assert ends["worker1"] == 4 and ends["trainer"] in (0, 42), ends  # (42: the group's SIGTERM before its stop began)
    assert (raw_status(logdir) or {}).get("exit_code") == 4
    steps = committed_steps(logdir)
    for step in steps:
        assert finite_floats(os.path.join(logdir, f"model.ckpt-{step}")) > 0


def plain_skipping(shared_result, steps: str) -> dict[str, Any]:
    """The final weights of a plain group run of 120 steps that never applies ``steps`` (made once, shared)."""

    def produce(folder: str) -> None:
        code, out, err = finish(launch(folder, *MEMORY, "--steps", "120", "--skip-steps", steps,
                                       opts=GROUP))
        assert code == 0, err

    return final_weights(shared_result(f"group-skip-{steps.replace(',', '-')}-of-120", produce))


@pytest.fixture(scope="module")
def plain_skipping_70_110(shared_result):
    return plain_skipping(shared_result, "70,110")


def test_two_nan_losses_in_a_group_with_rollback_restart_the_group_twice_each_from_the_newest_snapshot_before_its_step(
        logdir, plain_skipping_70_110):
    """--on-nonfinite rollback: a NaN at step 70 restarts the group as a rollback from its in-memory snapshot of 50,
    skipping 70; a second NaN at 110 restarts it again, from its snapshot of 100 (the second rollback's bound is its
    own step); counted as rollbacks everywhere; bit-equal to the plain run without 70 and 110."""
    # issue 54 point 4 (before: exit 4, the group stopped)
    # (the restart forced: found at the group's K-th step 100, the group would roll back in place, tested below)
    # the second NaN: found merging tests, the first rollback's bound (70) was still in force at the second (the
    # group of in-memory snapshots commits nothing to disk, which would have ended it): attempt 3's chief passed over
    # the snapshot of step 100 ("not before step 70") and, nothing committed, trained again from step 0 (the weights
    # bit-equal all the same: only the restored records and the logs tell the 100 steps lost)
    code, out, err = finish(launch(logdir, *MEMORY, "--steps", "120", "--nan-at-steps", "70,110",
                                   opts=GROUP + ("--on-nonfinite", "rollback"), env=RESTART))
    assert code == 0, err
    # found by the members that checked before the group stopped (the chief; the worker too, when it
    # checked first): steps 70 and 110, and the group acted once each: one skip, one restart, no in-place rollback
    detected = events(logdir, "nonfinite_detected")
    assert detected and {r["step"] for r in detected} == {70, 110}, detected
    assert [r["step"] for r in events(logdir, "step_skipped")] == [70, 110]
    assert len(events(logdir, "restarting")) == 2 and not events(logdir, "rolled_back")
    spawned = sorted((r["role"], r["attempt"]) for r in events(logdir, "spawned") if r["role"] in ("trainer", "worker1"))
    assert spawned == [("trainer", 1), ("trainer", 2), ("trainer", 3), ("worker1", 1), ("worker1", 2), ("worker1", 3)]
    assert [r.get("code") for r in events(logdir, "exited") if r["role"] == "trainer"][-1] == 0
    for attempt in (1, 2):
        assert 5 in [r.get("code") for r in events(logdir, "exited")
                     if r["role"] in ("trainer", "worker1") and r["attempt"] == attempt]
    # every member of each new group restored the group's in-memory snapshot of the newest step before the
    # one it rolls back (50, then 100), replayed, and skipped it (its input consumed: the batch of a step is its own)
    restored = events(logdir, "restored")
    assert [(r["source"], r["step"]) for r in restored] == [("memory", 50), ("memory", 100)], restored
    for log in ("trainer.2", "worker1.2"):
        text = member_log(logdir, log)
        assert "procsv: restored step 50 from the group's in-memory snapshot of step 50" in text, log
        assert "procsv: skipping step 70 again (this run skipped it before); training on from step 71" in text, log
    for log in ("trainer.3", "worker1.3"):
        text = member_log(logdir, log)
        assert "procsv: restored step 100 from the group's in-memory snapshot of step 100" in text, log
        assert "procsv: skipping step 110 again (this run skipped it before); training on from step 111" in text, log
        assert "not before step" not in text and "from step 0" not in text, log
    # the launch says what happened; status.json and the report count the skips, and the group's
    # rollbacks as rollbacks, not restarts; each step found non-finite once, however many members
    # reported it (before: "restarts 1", "0 rollback(s)", "2 time(s) found non-finite" when both members
    # found it, and the single trainer's "(NaN or infinite loss twice)")
    said = [s for s in err.splitlines() if s.startswith("procsv: the trainer group rolls back: ")]
    assert len(said) == 2 and "found the loss of step 70 non-finite" in said[0], err
    assert "found the loss of step 110 non-finite" in said[1], err
    status = raw_status(logdir) or {}
    assert status.get("skipped_steps") == [70, 110] and status.get("exit_code") == 0, status
    assert (status.get("restarts"), status.get("rollbacks"), status.get("group_rollbacks")) == (0, 2, 2), status
    assert status.get("nonfinite_detected") == 2, status
    assert [p.get("restarts") for p in status["processes"] if p.get("role") in ("trainer", "worker1")] == [0, 0]
    assert sum(r["repeats"] for r in detected) == 2 and [r["peer"] for r in detected][0] is None, detected
    assert [r["rollback_step"] for r in events(logdir, "restarting")] == [70, 110]
    with open(os.path.join(logdir, "logs", "report.json")) as fh:
        saved = json.load(fh)
    assert saved["skipped_steps"] == [70, 110], saved
    assert (saved["restarts"], saved["rollbacks"], saved["group_rollbacks"]) == (0, 2, 2), saved
    assert [r["rollback_step"] for r in saved["recoveries"]] == [70, 110], saved
    shown = procsv_says("status", logdir)
    assert "  step 120, restarts 0," in shown, shown
    assert "non-finite: 2 rollback(s) of the trainer group (restarted, every member skipping the step), 2 step(s) " \
           "skipped: 70, 110; 2 time(s) found non-finite" in shown, shown
    report = procsv_says("report", logdir)
    assert "procsv report: 0 restart(s), 2 rollback(s) of the trainer group, " in report, report
    assert "group rollback: step 70 skipped (non-finite loss)" in report, report
    assert "group rollback: step 110 skipped (non-finite loss)" in report, report
    assert "attempt 2 restored step 50 in " in report and "attempt 3 restored step 100 in " in report, report
    assert "  group rollback at " in report and "  restart at " not in report, report
    assert "non-finite: 2 rollback(s) of the trainer group (restarted, every member skipping the step), 2 step(s) " \
           "skipped (NaN or infinite loss): 70, 110; 2 time(s) found non-finite" in report, report
    # bit-equal to the plain group run that never applied steps 70 and 110
    assert_bit_equal(logdir, plain_skipping_70_110)
    # what the rollback cost: from the first detection to the new group's first step
    first = next(r for r in events(logdir, "first_step") if r["time"] > detected[0]["time"])
    print(f"group rollback: {first['time'] - detected[0]['time']:.3f} s from the detection of step 70 to the group's "
          "first step after it")


@pytest.fixture(scope="module")
def local_nan_skipping_70(shared_result):
    """The final weights of a plain group_local_nan.py run of 120 steps that never applies step 70 (made once, shared).
    Its worker prepares its session with ``start_standard_services=False`` (TF's Supervisor runs them on the chief
    alone; the weights are the same): it ends, as it did before the group's verdict at the K-th steps, which it left
    out (its checkpoint work off), leaving the chief waiting in the exchange at step 50 (hung, restarted, hung)."""

    def produce(folder: str) -> None:
        code, out, err = finish(launch(folder, "--steps", "120", "--skip-at", "70", "--workers-no-services",
                                       target=LOCAL_NAN, opts=GROUP))
        assert code == 0, err

    return final_weights(shared_result("local-nan-skip-70-of-120", produce))


def assert_worker1_rolled_the_group_back_once_at_70(logdir: str, code: int, err: str, restarted_log: str,
                                                     plain: dict[str, Any]) -> None:
    """worker1 found step 70 alone and exited 5 once; the group restarted once, skipped 70 (as
    ``restarted_log`` says) and ended bit-equal to the plain run that never applied it."""
    assert code == 0, err
    assert [r["step"] for r in events(logdir, "nonfinite_detected")] == [70]
    assert [r["step"] for r in events(logdir, "step_skipped")] == [70]
    assert len(events(logdir, "restarting")) == 1
    assert [r.get("code") for r in events(logdir, "exited") if r["role"] == "worker1"] == [5, 0]
    assert "procsv: skipping step 70 again (this run skipped it before)" in member_log(logdir, restarted_log)
    assert_bit_equal(logdir, plain)


def test_a_loss_spike_in_one_workers_batch_under_on_spike_rollback_rolls_the_group_back_and_skips_it_bit_equal(
        logdir, local_nan_skipping_70):
    """--on-spike rollback in a group (issue 68): worker1's batch of step 70 scaled, the group's loss (the chief's,
    ``strategy.reduce``) ~50x its median; the chief finds it, exits 5, the group restarts from its snapshot of 50 and
    every member skips 70: bit-equal to the plain group run that never applied it. No replay first (the data's)."""
    # before: the launch refused --on-spike rollback with --nproc (exit 2, nothing started)
    code, out, err = finish(launch(logdir, "--steps", "120", "--spike-at", "70", target=LOCAL_NAN,
                                   opts=GROUP + ("--on-spike", "rollback"), env=RESTART))  # (the restart forced)
    assert code == 0, err
    spiked = events(logdir, "spike_detected")
    assert [(r["step"], r["onset"], r["action"]) for r in spiked] == [(70, 70, "rollback")], spiked
    assert spiked[0]["loss"] > 30 * spiked[0]["median"], spiked  # (~50x: the spike is the test's, not a noisy step's)
    assert [r["step"] for r in events(logdir, "step_skipped")] == [70]
    assert [r["rollback_step"] for r in events(logdir, "restarting")] == [70]
    assert not events(logdir, "nonfinite_detected") and not events(logdir, "rolled_back")
    assert not events(logdir, "spike_replayed")  # a group's spike is taken as the data's
    assert [r.get("code") for r in events(logdir, "exited") if r["role"] == "trainer"] == [5, 0]
    chief = [s for s in out.splitlines() if s.startswith("[trainer.1] procsv: the loss of step 70 spiked")]
    assert len(chief) == 1 and "--on-spike rollback in a trainer group: asking for the group's restart (exit code 5)" \
        in chief[0] and "skips step 70" in chief[0], out
    said = [s for s in err.splitlines() if s.startswith("procsv: the trainer group rolls back: ")]
    assert len(said) == 1 and "trainer (pid " in said[0] and "found a loss spike at step 70 (its onset)" in said[0], err
    for log in ("trainer.2", "worker1.2"):
        assert "procsv: skipping step 70 again (this run skipped it before); training on from step 71" \
            in member_log(logdir, log), log
    status = raw_status(logdir) or {}
    assert status.get("skipped_steps") == [70] and (status.get("restarts"), status.get("rollbacks")) == (0, 1), status
    assert_bit_equal(logdir, local_nan_skipping_70)


def assert_rolled_back_in_place_once_at_70(logdir: str, code: int, err: str) -> list[dict[str, Any]]:
    """The group rolled back in place once, past step 70, from every member's copy of step 50: no member restarted
    (no ``restarting`` record, the first members ran to the end: same pids, exit 0), one ``rolled_back`` of the
    group, step 70 skipped once, counted as a rollback of the group in place; returns the ``rolled_back`` records."""
    assert code == 0, err
    assert not events(logdir, "restarting") and not events(logdir, "restarted"), err
    spawned = sorted((r["role"], r["attempt"]) for r in events(logdir, "spawned") if r["role"] in ("trainer", "worker1"))
    assert spawned == [("trainer", 1), ("worker1", 1)], spawned
    first = {r["pid"] for r in events(logdir, "spawned") if r["role"] in ("trainer", "worker1")}
    ends = [(r["pid"], r.get("code")) for r in events(logdir, "exited") if r["role"] in ("trainer", "worker1")]
    assert sorted(ends) == sorted((pid, 0) for pid in first), ends
    rolled = events(logdir, "rolled_back")
    assert [(r["step"], r["restored_step"], r["source"], r["skip"], r["group"]) for r in rolled] == \
        [(70, 50, "memory", True, True)], rolled
    assert [r["step"] for r in events(logdir, "step_skipped")] == [70]
    status = raw_status(logdir) or {}
    assert status.get("skipped_steps") == [70] and status.get("exit_code") == 0, status
    assert (status.get("restarts"), status.get("rollbacks"), status.get("group_rollbacks"),
            status.get("group_in_place")) == (0, 1, 1, 1), status
    for log in ("trainer.1", "worker1.1"):
        text = member_log(logdir, log)
        assert "the group's verdict at step 100: every member restored its in-memory copy of step 50 in place" in text \
            and "then skipping step 70" in text, log
    return rolled


def test_a_nan_in_one_workers_batch_rolls_the_group_back_in_place_with_no_member_restarted_bit_equal(
        logdir, local_nan_skipping_70):
    """The ordinary field case (issue 68): a NaN in one element of worker1's batch of step 70, whose gradient
    all-reduces to NaN on every member (worker1's loss NaN at 70, the chief's from 71). At the group's K-th step 100
    every member's finding is exchanged; every member restores its own in-memory copy of step 50 in place, replays
    and skips 70: no member restarted, the run bit-equal to the plain group run that never applied 70. Before: the
    member that found it exited 5 and the watchdog restarted the whole group (0.6-1.0 s at load)."""
    code, out, err = finish(launch(logdir, "--steps", "120", "--nan-at", "70", "--in-batch", target=LOCAL_NAN,
                                   opts=GROUP + ("--on-nonfinite", "rollback")))
    assert_rolled_back_in_place_once_at_70(logdir, code, err)
    detected = events(logdir, "nonfinite_detected")
    assert [(r["step"], r["repeats"]) for r in detected] == [(70, 1)] and "worker1" in detected[0]["what"], detected
    shown = procsv_says("status", logdir)
    assert "non-finite: 1 rollback(s) of the trainer group (in place, every member skipping the step), 1 step(s) " \
           "skipped: 70; 1 time(s) found non-finite" in shown, shown
    report = procsv_says("report", logdir)
    assert "procsv report: 0 restart(s), 1 rollback(s) of the trainer group, " in report, report
    assert_bit_equal(logdir, local_nan_skipping_70)
    secs = events(logdir, "rolled_back")[0]["time"] - detected[0]["time"]
    print(f"group rollback in place: the restore {events(logdir, 'rolled_back')[0]['secs']:.3f} s ({secs:.3f} s between "
          "the records)")


def test_a_loss_spike_in_one_workers_batch_rolls_the_group_back_in_place_bit_equal(logdir, local_nan_skipping_70):
    """--on-spike rollback: worker1's batch of step 70 scaled (the group's loss ~50x): the chief finds it at the
    group's K-th step 100, every member restores its copy of step 50 in place and skips 70; no member restarted;
    bit-equal to the plain group run that never applied it."""
    code, out, err = finish(launch(logdir, "--steps", "120", "--spike-at", "70", target=LOCAL_NAN,
                                   opts=GROUP + ("--on-spike", "rollback")))
    assert_rolled_back_in_place_once_at_70(logdir, code, err)
    spiked = events(logdir, "spike_detected")
    assert [(r["step"], r["onset"], r["action"]) for r in spiked] == [(70, 70, "rollback")], spiked
    assert not events(logdir, "nonfinite_detected") and not events(logdir, "spike_replayed")
    assert_bit_equal(logdir, local_nan_skipping_70)


def test_a_nan_one_worker_sees_alone_is_found_though_its_next_group_snapshot_is_not_taken_and_rolls_the_group_back_once_though_the_chief_fails_first(  # noqa: E501
        logdir, local_nan_skipping_70):
    """worker1's lone NaN at 70 is found although its next group snapshot is not taken (its copies never held);
    rolled back once, bit-equal. And (one run for both: before, a launch each) the NaN only worker1 sees rolls the
    group back once though the finite chief fails first in its next collective."""
    # the program watches each member's own loss: only worker1 finds step 70 and exits 5; the chief,
    # whose loss and weights are finite, fails in its next collective, and its death notice can come
    # in before its exit status. Before: the group restarted without the skip, again and again
    # (16 restarts in 57 s, never skipping 70, until the watchdog failed)
    # worker1's in-memory copy of step 50 is never held (a fault point of the checkpoint service), so
    # it is not acknowledged: within the grace (5 s) worker1 takes no snapshot at step 100, the first
    # after its NaN at step 70, as on a busy machine where the acknowledgment or a free slot comes
    # late. Before: its losses were checked only before a snapshot it took (the final checkpoint is
    # the chief's), so step 70 was never found and the group trained to 120 and exited 0
    env = quiet_env(PROCSV_FAULT="checkpoint:group_copy_missing:1", PROCSV_GROUP_ROLLBACK="restart")
    code, out, err = finish(launch(logdir, "--steps", "120", "--nan-at", "70", target=LOCAL_NAN,
                                   opts=GROUP + ("--on-nonfinite", "rollback"), env=env))
    assert_worker1_rolled_the_group_back_once_at_70(logdir, code, err, "worker1.2", local_nan_skipping_70)
    assert "procsv: skipping step 70 again (this run skipped it before)" in member_log(logdir, "trainer.2")


def test_a_nan_one_worker_sees_alone_after_which_the_chief_committed_restores_the_checkpoint_before_it_and_so_do_the_groups_failing_after(  # noqa: E501
        logdir, local_nan_skipping_70):
    """The chief committed step 90 after worker1's lone NaN at 70: the group rolled back restores a state before 70,
    not 90. A group that fails after the rollback of 70, before committing again (at 80), is restarted from a state
    before 70 (60), not the old 90. The chief's step 90 committed with 70 applied is rewritten by a group that skipped
    70; a later failure (at 95) restores 60 or the new 90, never the old; bit-equal. (One run for the three: before,
    a launch each, then two: the failure at 80 one of its own, the one at 95 in the rollback's group.)"""
    # the chief checkpoints every 30 steps and checks only its own losses: it commits step 90 after
    # worker1's NaN at step 70, which worker1 finds at its next group snapshot step (100). Before: the
    # restarted group restored that newest checkpoint (step 90, past 70: the skip had nothing left to
    # skip) though the launch said every member restores the newest state before step 70; the run
    # ended with step 70 applied. Now the group restarted for its rollback of B restores the newest
    # state before B (the checkpoint of step 60), replays and skips 70
    # the group rolled back from step 60 fails at step 80 (the chief's os._exit(5), attempt 2 only), before it
    # commits step 90 again. Before: the third group, an ordinary restart, restored the newest checkpoint, the
    # first step 90 (with step 70 applied), undoing the rollback; the run ended with 120 optimizer updates, not
    # the 119 of the plain run that never applied 70
    # the third group, from step 60 again, commits step 90 again, then the chief ends at step 95 (os._exit(5) in
    # attempt 3 only: a failure, no checkpoint of its own) and the next group restores step 90. Before: the service
    # kept the first step 90 (with step 70 applied: "step 90 is committed already; not written again") and the
    # next attempt restored it, undoing the rollback; the run ended with step 70 applied
    code, out, err = finish(launch(logdir, "--steps", "120", "--nan-at", "70", "--save-steps", "30",
                                   "--chief-dies-at", "80@2", "--chief-dies-at", "95@3",
                                   target=LOCAL_NAN, opts=GROUP + ("--on-nonfinite", "rollback")))
    assert code == 0, err
    records = lifecycle(logdir)
    first_restart = next(i for i, r in enumerate(records) if r.get("event") == "restarting")
    assert any(r.get("event") == "checkpoint_committed" and r["step"] > 70 for r in records[:first_restart]), \
        "the premise: the chief committed a step past 70 before the group's rollback"
    # worker1 found step 70 alone and exited 5 once (the second and third groups' ends are the chief's exit 5 at
    # steps 80 and 95)
    worker1_ends = [r.get("code") for r in events(logdir, "exited") if r["role"] == "worker1"]
    assert worker1_ends[0] == 5 and worker1_ends[-1] == 0 and len(worker1_ends) == 4, worker1_ends
    assert "procsv: skipping step 70 again (this run skipped it before)" in member_log(logdir, "trainer.2")
    assert [r["step"] for r in events(logdir, "nonfinite_detected")] == [70]
    assert [r["step"] for r in events(logdir, "step_skipped")] == [70]
    assert [r.get("rollback_step") for r in events(logdir, "restarting")] == [70, None, None], err
    # the rollback's group and the one after its failure at 80 restore step 60; the fourth restores a state of
    # the rolled-back timeline: step 60 again while a checkpoint taken after step 70 before the rollback is not
    # yet passed by a commit of a group after it (the watchdog's PROCSV_ROLLBACK_BEFORE), else the rewritten 90
    restored = [r["step"] for r in events(logdir, "restored")]
    assert restored[:2] == [60, 60] and restored[2] in (60, 90) and len(restored) == 3, err
    assert_bit_equal(logdir, local_nan_skipping_70)


def test_a_group_past_max_skips_stops_in_order_with_exit_4_as_a_single_trainer_does(logdir):
    """Past --max-skips (1): step 40 skipped by a group rollback, step 70 stops the group in order with exit 4, as a
    single trainer does."""
    # --max-skips 1: step 40 is skipped (a group rollback), step 70 would be the second skip
    code, out, err = finish(launch(logdir, *ARGS, "--steps", "100", "--nan-at-steps", "40,70",
                                   opts=GROUP + ("--max-skips", "1", "--max-restarts", "1")))
    assert code == 4, err
    assert [r["step"] for r in events(logdir, "step_skipped")] == [40]
    assert len(events(logdir, "restarting")) == 1
    # no group snapshot before step 40 (every 50 steps): the rollback restored the newest checkpoint
    restored = events(logdir, "restored")
    assert len(restored) == 1 and restored[0]["source"] == "disk" and restored[0]["step"] < 40, restored
    assert "procsv: skipping step 40 again" in member_log(logdir, "worker1.2")
    line = [s for s in out.splitlines() if s.startswith("[trainer.2] procsv: non-finite training at step 70")]
    assert len(line) == 1, out
    assert "--on-nonfinite rollback: stopping in order with exit code 4 (diverging)" in line[0]
    assert "(no rollback: step 70 would be skip 2 within 1000 steps (--max-skips 1; skipped so far: 40))" in line[0]
    assert "procsv: giving up: the trainer is diverging" in err
    assert [r.get("code") for r in events(logdir, "exited") if r["role"] == "trainer"] == [5, 4]
    assert (raw_status(logdir) or {}).get("exit_code") == 4
    steps = committed_steps(logdir)
    assert steps and steps[-1] < 70, steps
    for step in steps:
        assert finite_floats(os.path.join(logdir, f"model.ckpt-{step}")) > 0


NAN_TRAIN = os.path.join(PROGRAMS, "nan_train.py")


def test_a_single_trainers_own_exit_5_after_a_skipped_step_is_an_ordinary_failure_not_a_group_rollback(logdir):
    """A lone trainer's own exit 5 after it skipped a step in place is an ordinary failure (a restart), not a group
    rollback of that step."""
    # a lone trainer under --on-nonfinite rollback skips step 20 in place (found twice), then its program
    # exits 5 by itself at step 40 (once: the next attempt goes on). Before: judged as a group's rollback
    # of step 20, met "again": the launch gave up with exit 4 ("the trainer group is diverging")
    code, out, err = finish(launch(logdir, "--nan-at", "20", "--exit-at", "40", "--steps", "60", target=NAN_TRAIN,
                                   opts=("--on-nonfinite", "rollback", "--standby", "fork")))
    assert code == 0, err
    assert "trainer group" not in err and "diverging" not in err, err
    assert [r.get("code") for r in events(logdir, "exited") if r["role"] == "trainer"] == [5, 0]
    restarting = events(logdir, "restarting")
    assert [(r["attempt"], r["rollback_step"]) for r in restarting] == [(2, None)], restarting
    assert "exited with code 5" in restarting[0]["error"], restarting
    assert [r["step"] for r in events(logdir, "step_skipped")] == [20]
    status = raw_status(logdir) or {}
    assert (status.get("restarts"), status.get("rollbacks"), status.get("group_rollbacks")) == (1, 2, 0), status
    assert status.get("skipped_steps") == [20] and status.get("exit_code") == 0, status


def test_a_group_rollback_whose_checkpoints_before_the_step_were_deleted_by_retention_refuses_with_exit_4(logdir):
    """A group rollback of 70 whose checkpoints before 70 were deleted by retention refuses in one line and the
    launch gives up with exit 4 (no silent restart from 0)."""
    # as above (the chief commits 30, 60, 90; worker1 finds its NaN of step 70 at step 100), but the
    # program keeps one checkpoint (max_to_keep=1), and worker1's in-memory copy of step 50 is never held
    # (a fault point of the checkpoint service: with it, the group restores step 50 from memory, a state
    # before 70): when the group rolls back 70, only step 90 is committed. Before: the chief passed it
    # over, found nothing below 70 and trained again from step 0, silently. Now it says so in one line
    # and exits 4, and the launch gives up as diverging: no restart (issue 66)
    env = quiet_env(PROCSV_FAULT="checkpoint:group_copy_missing:1", PROCSV_GROUP_ROLLBACK="restart")
    code, out, err = finish(launch(logdir, "--steps", "120", "--nan-at", "70", "--save-steps", "30", "--max-to-keep", "1",
                                   target=LOCAL_NAN, env=env,
                                   # (the worker waits for the pin of a chief that refused: it ends at the stop's SIGKILL)
                                   opts=GROUP + ("--on-nonfinite", "rollback", "--stop-grace-secs", "3")))
    assert code == 4, err
    assert [r.get("rollback_step") for r in events(logdir, "restarting")] == [70], err  # the rollback's restart only
    assert committed_steps(logdir) == [90]
    chief = member_log(logdir, "trainer.2").splitlines()
    said = [line for line in chief if "the trainer group rolls back step 70" in line and "exit code 4" in line]
    assert len(said) == 1 and "from step 90" in said[0], chief[-20:]
    second = {r["pid"] for r in events(logdir, "spawned") if r["attempt"] == 2}
    assert second and not [r for r in events(logdir, "restored") + events(logdir, "initialized") if r["pid"] in second], \
        err  # the refusing group restored nothing, initialized nothing
    assert "giving up: the trainer is diverging" in err, err
