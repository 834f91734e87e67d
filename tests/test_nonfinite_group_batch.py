"""A NaN in one worker's batch, in a trainer group under ``--on-nonfinite rollback``: the ordinary way a
NaN reaches a data-parallel group (issue 68). The batch's gradient all-reduces into every member's
weights, so every other member's loss is non-finite from the next step on; the step to skip is the
worker's, not the one the chief saw first. Real processes, real TensorFlow collectives, the result read
back with plain TensorFlow and compared bit for bit with the plain group run that never applied the
steps. The watchdog's rules for it: ``tests/test_nonfinite_group_pure.py``.

One launch (``poisoned``) holds three cases, one after the other: worker1's batch of step 70 (between
group snapshots; the chief reports 71 first at its checkpoint of step 90), then, in the group rolled back
from it, worker1's batch of step 100 (a group snapshot step: the chief stops on its weights), then, in
the group rolled back from that, worker1's own loss of the last step, 120, alone (no gradient: every
weight finite; the chief commits its final checkpoint of step 120 and ends, worker1 finds it at its end, which
comes a second after its loop: ``--tail-secs 1``, its program's own wind-down inside the session).
Each test reads its own rollback from it; all compare the end with one plain run that never applied 70,
100 nor 120.
"""

from __future__ import annotations

import json
import os
from typing import Any

import pytest

from conftest import PROGRAMS, final_weights, finish, kill_leftovers, launch, lifecycle
from test_group import assert_bit_equal

pytestmark = pytest.mark.slow  # starts TensorFlow processes: not in the quick tier

GROUP = ("--nproc", "2")
LOCAL_NAN = os.path.join(PROGRAMS, "group_local_nan.py")


def events(logdir: str, name: str) -> list[dict[str, Any]]:
    return [r for r in lifecycle(logdir) if r.get("event") == name]


@pytest.fixture(scope="module")
def local_nan_skipping_70_100_and_120(shared_result):  # type: ignore[no-untyped-def]
    """The final weights of a plain group_local_nan.py run of 120 steps that never applies steps 70, 100 and
    120 (made once, shared)."""

    def produce(folder: str) -> None:
        code, out, err = finish(launch(folder, "--steps", "120", "--skip-at", "70", "--skip-at", "100",
                                       "--skip-at", "120", target=LOCAL_NAN, opts=GROUP + ("--standby", "fork")))
        assert code == 0, err

    return final_weights(shared_result("local-nan-skip-70-100-120-of-120", produce))


@pytest.fixture(scope="module")
def poisoned(shared_result) -> tuple[str, int, str, list[int]]:  # type: ignore[no-untyped-def]
    """The launch whose worker1 has a NaN in its batch of step 70, then of step 100, then in its own loss
    alone at the last step, 120: (logdir, code, stderr, the pids of the first group's members, trainer and
    worker1). Made once per session
    (``shared_result``: both tests read it, on whichever worker each runs). Once it ended, every process
    of the run still alive is killed: each test fails if one was."""
    def produce(folder: str) -> None:
        logdir = os.path.join(folder, "run")
        code, out, err = finish(launch(logdir, "--steps", "120", "--nan-at", "70", "--nan-at", "100", "--in-batch",
                                       "--loss-nan-at", "120", "--save-steps", "30", "--tail-secs", "1",
                                       target=LOCAL_NAN,
                                       opts=GROUP + ("--on-nonfinite", "rollback")), timeout=300)
        with open(os.path.join(folder, "result.json"), "w") as fh:
            json.dump({"code": code, "err": err, "leftovers": kill_leftovers(logdir)}, fh)

    folder = shared_result("local-nan-in-batch-70-100-loss-120-of-120", produce)
    logdir = os.path.join(folder, "run")
    with open(os.path.join(folder, "result.json")) as fh:
        result = json.load(fh)
    assert not result["leftovers"], f"processes of the run were left behind: {result['leftovers']}"
    first = [r["pid"] for r in events(logdir, "spawned") if r["attempt"] == 1 and r["role"] in ("trainer", "worker1")]
    return logdir, result["code"], result["err"], first


def rollback_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if "the trainer group rolls back" in line]


def test_a_nan_in_one_workers_batch_whose_gradient_reaches_every_member_rolls_the_group_back_at_the_workers_step(
        poisoned, local_nan_skipping_70_100_and_120):
    """Worker1's NaN batch of step 70 (the chief's own loss first non-finite at 71, reported first at its
    checkpoint of step 90; worker1 reports 70 on its way out): the group skips 70, not 71, 72, 73 (before:
    it did, and gave up as diverging, exit 4); the run ends bit-equal to the plain run."""
    logdir, code, err, first = poisoned
    assert code == 0, err
    assert [r["step"] for r in events(logdir, "step_skipped")] == [70, 100, 120], err  # (100, 120: the next tests')
    assert [r.get("rollback_step") for r in events(logdir, "restarting")] == [70, 100, 120], err
    detected = sorted(r["step"] for r in events(logdir, "nonfinite_detected") if r["pid"] in first)
    assert detected and detected[0] == 70 and set(detected) <= {70, 71}, detected  # worker1's 70; the chief's 71, if it checked
    said = rollback_lines(err)
    assert len(said) == 3 and "worker1 (pid" in said[0] and "found the loss of step 70 non-finite" in said[0], said
    assert_bit_equal(logdir, local_nan_skipping_70_100_and_120)


def test_a_nan_in_one_workers_batch_at_a_group_snapshot_step_rolls_the_group_back_though_the_chief_stops_on_its_weights(
        poisoned, local_nan_skipping_70_100_and_120):
    """Worker1's NaN batch of step 100, a group snapshot step (every 50), in the group rolled back from 70:
    at the snapshot the chief's own losses are finite but its weights are not (it exits 4, "the step that
    made them so is not known"), and its end may come in first; worker1 found its loss of step 100 and asks
    for the rollback (exit 5). The group skips 100 too (before: it gave up as diverging, exit 4, nothing
    skipped, no checkpoint), and the run ends bit-equal to the plain run."""
    logdir, code, err, first = poisoned
    assert code == 0, err
    assert [r["step"] for r in events(logdir, "step_skipped")] == [70, 100, 120], err
    assert [r.get("rollback_step") for r in events(logdir, "restarting")] == [70, 100, 120], err
    said = rollback_lines(err)
    assert len(said) == 3 and "worker1 (pid" in said[1] and "found the loss of step 100 non-finite" in said[1], said
    # the fallback: the group's verdict at 100 found it, but the members restarted for 70 hold no copy of a step before
    # 100 of their own (their state came from the service's copies of 50): not in place, the group's restart
    assert not events(logdir, "rolled_back"), err
    with open(os.path.join(logdir, "logs", "trainer.2.log")) as fh:
        assert "not rolled back in place (no in-memory copy of one step before step 100 is held by every member" \
            in fh.read()
    assert_bit_equal(logdir, local_nan_skipping_70_100_and_120)


def test_a_nan_in_worker1s_own_loss_of_the_last_step_rolls_the_group_back_though_the_chief_committed_that_step_and_ended(
        poisoned, local_nan_skipping_70_100_and_120):
    """Worker1's own loss of the last step, 120, alone is NaN (no gradient: every weight finite), in the group
    rolled back from 100: the chief, whose losses are finite, commits its final checkpoint of step 120 and
    ends; worker1 finds the NaN at its end and asks for the rollback (exit 5). The group skips 120 on every
    member and commits step 120 again in place of the chief's (before: the chief's exit 0 ended the run 0,
    step 120 applied; and a group restored from its in-memory snapshot had its final checkpoint of 120
    answered "committed already; not written again"); the run ends bit-equal to the plain run. Worker1's session
    ends a second after its loop (``--tail-secs 1``): the chief's 0 waits for its end, and the watchdog sends it
    nothing meanwhile (before, issue 68: the chief's 0 was judged at once, no report having come in; the run ended
    0 with step 120 applied, worker1's exit 5 only settled after ``finished``)."""
    logdir, code, err, first = poisoned
    assert code == 0, err
    records = lifecycle(logdir)
    restarts = [i for i, r in enumerate(records) if r.get("event") == "restarting"]
    assert [records[i].get("rollback_step") for i in restarts] == [70, 100, 120], err
    third = records[restarts[1]:restarts[2]]  # the group rolled back from 100, up to its own rollback
    # the premise: the chief committed step 120, with its update, and ended (0: it finished; 42 only if the group's
    # SIGTERM, sent once worker1 ended, came before its stop began); worker1 found 120 alone and asked (exit 5)
    assert [r["step"] for r in third if r.get("event") == "checkpoint_committed"][-1:] == [120], third
    ends = {r["role"]: (r.get("code"), r["pid"]) for r in third
            if r.get("event") == "exited" and r["role"] in ("trainer", "worker1") and r["attempt"] == 3}
    assert ends["worker1"][0] == 5 and ends["trainer"][0] in (0, 42), ends
    found = [(r["pid"], r["step"]) for r in third if r.get("event") == "nonfinite_detected"]
    assert found == [(ends["worker1"][1], 120)], found  # worker1's alone: the chief's losses are finite
    said = rollback_lines(err)
    assert len(said) == 3 and "worker1 (pid" in said[2] and "found the loss of step 120 non-finite" in said[2], said
    # every member of the next group skipped 120, and the chief committed step 120 again: the newest checkpoint
    # is the rolled-back timeline's (read back below, bit for bit)
    for log in ("trainer.4", "worker1.4"):
        with open(os.path.join(logdir, "logs", f"{log}.log")) as fh:
            assert "procsv: skipping step 120 again (this run skipped it before)" in fh.read(), log
    after = records[restarts[2]:]
    assert [r["step"] for r in after if r.get("event") == "checkpoint_committed"] == [120], after
    assert [r["step"] for r in events(logdir, "step_skipped")] == [70, 100, 120], err
    assert_bit_equal(logdir, local_nan_skipping_70_100_and_120)
