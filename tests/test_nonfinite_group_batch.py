"""A NaN in one worker's batch, in a trainer group under ``--on-nonfinite rollback``: the ordinary way a
NaN reaches a data-parallel group (issue 68). The batch's gradient all-reduces into every member's
weights, so every other member's loss is non-finite from the next step on; the step to skip is the
worker's, not the one the chief saw first. Real processes, real TensorFlow collectives, the result read
back with plain TensorFlow and compared bit for bit with the plain group run that never applied the
step. The watchdog's rules for it: ``tests/test_nonfinite_group_pure.py``.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

from conftest import PROGRAMS, final_weights, finish, launch, lifecycle
from test_group import assert_bit_equal

pytestmark = pytest.mark.slow  # starts TensorFlow processes: not in the quick tier

GROUP = ("--nproc", "2")
LOCAL_NAN = os.path.join(PROGRAMS, "group_local_nan.py")


def events(logdir: str, name: str) -> list[dict[str, Any]]:
    return [r for r in lifecycle(logdir) if r.get("event") == name]


@pytest.fixture(scope="module")
def local_nan_skipping_70(shared_result):  # type: ignore[no-untyped-def]
    """The plain group_local_nan.py run of 120 steps that never applies step 70 (the session's one, shared
    with tests/test_nonfinite_group.py by its name)."""

    def produce(folder: str) -> None:
        code, out, err = finish(launch(folder, "--steps", "120", "--skip-at", "70", target=LOCAL_NAN,
                                       opts=GROUP + ("--standby", "fork")))
        assert code == 0, err

    return final_weights(shared_result("local-nan-skip-70-of-120", produce))


def test_a_nan_in_one_workers_batch_whose_gradient_reaches_every_member_rolls_the_group_back_at_the_workers_step(
        logdir, local_nan_skipping_70):
    # each member watches its own loss; worker1's batch of step 70 holds a NaN, so the chief's own loss is
    # first non-finite at 71, and the chief, checking at its checkpoint of step 90, reports 71 first; worker1
    # reports 70 on its way out (its kept losses are checked at its end too). Before: the group skipped 71,
    # then 72, then 73, and gave up as diverging (exit 4)
    code, out, err = finish(launch(logdir, "--steps", "120", "--nan-at", "70", "--in-batch", "--save-steps", "30",
                                   target=LOCAL_NAN, opts=GROUP + ("--on-nonfinite", "rollback")))
    assert code == 0, err
    assert [r["step"] for r in events(logdir, "step_skipped")] == [70], err
    assert [r.get("rollback_step") for r in events(logdir, "restarting")] == [70], err
    detected = sorted(r["step"] for r in events(logdir, "nonfinite_detected"))
    assert detected[0] == 70 and set(detected) <= {70, 71}, detected  # worker1's 70; the chief's 71, if it checked
    said = [line for line in err.splitlines() if "the trainer group rolls back" in line]
    assert len(said) == 1 and "worker1 (pid" in said[0] and "found the loss of step 70 non-finite" in said[0], said
    assert_bit_equal(logdir, local_nan_skipping_70)


@pytest.fixture(scope="module")
def local_nan_skipping_100(shared_result):  # type: ignore[no-untyped-def]
    """The plain group_local_nan.py run of 120 steps that never applies step 100, a group snapshot step."""

    def produce(folder: str) -> None:
        code, out, err = finish(launch(folder, "--steps", "120", "--skip-at", "100", target=LOCAL_NAN,
                                       opts=GROUP + ("--standby", "fork")))
        assert code == 0, err

    return final_weights(shared_result("local-nan-skip-100-of-120", produce))


def test_a_nan_in_one_workers_batch_at_a_group_snapshot_step_rolls_the_group_back_though_the_chief_stops_on_its_weights(
        logdir, local_nan_skipping_100):
    # worker1's batch of step 100, a group snapshot step (every 50), holds a NaN: at the snapshot of 100 the chief's
    # own losses are finite but its weights are not ("the step that made them so is not known": exit 4), and its end
    # came in first; worker1 found its loss of step 100 and asked for the rollback (exit 5). Before: the group gave up
    # as diverging (exit 4, nothing skipped, no checkpoint)
    code, out, err = finish(launch(logdir, "--steps", "120", "--nan-at", "100", "--in-batch",
                                   target=LOCAL_NAN, opts=GROUP + ("--on-nonfinite", "rollback")))
    assert code == 0, err
    assert [r["step"] for r in events(logdir, "step_skipped")] == [100], err
    said = [line for line in err.splitlines() if "the trainer group rolls back" in line]
    assert len(said) == 1 and "worker1 (pid" in said[0] and "found the loss of step 100 non-finite" in said[0], said
    assert_bit_equal(logdir, local_nan_skipping_100)
