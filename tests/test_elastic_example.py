"""``procsv.examples.elastic_digits``: exactly-once samples and a final state equal to a plain run's.

A group of two on one host (``procsv launch --nproc 2``) has its chief SIGKILLed after a commit, then
the next group's worker after a commit of its own; each restarted group runs again the steps after
its restore. From the members' sample logs: every step's
latest run covers the global positions without a gap or an overlap, each epoch holds each sample
once, and the final checkpoint equals, bit for bit, a plain ``MultiWorkerMirroredStrategy`` run
(no procsv) with the same membership schedule. The reference itself is shown able to tell
schedules apart (a change of world changes the result), and the exactly-once check able to fail.
The plain runs are made once (``plain_segments``): a group of two to step 20, then from its checkpoint
a group of two (the launch's reference) beside a group of one (the change of world).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import numpy as np
import pytest
from conftest import committed_steps, finish, launch, lifecycle, quiet_env, wait_for, wait_role_pid
from elastic_helpers import (TARGET, assert_exactly_once, checkpoint_weights, effective_steps, finish_segment, procsv_weights,
                             read_records, schedule, start_segment, weights_equal)

N_TRAIN = 1438  # load_data's training part: 1797 digits, a fifth held out
B = 16
STEPS = 60  # 60 * 2 * 16 = 1920 positions: one complete epoch and a third
MODEL = ("--batch-size", str(B), "--seed", "3")


def _run_killing_chief_then_worker(logdir: str, args: tuple[str, ...]) -> tuple[int, str]:
    """Launch the group of two; SIGKILL its chief after the first commit (the next group restores it and
    runs the steps after it again), then the next group's worker after a commit of its own; (code, stderr)."""
    proc = launch(logdir, *args, target=TARGET, opts=("--nproc", "2", "--standby", "fork"))  # no hot group: less CPU
    try:
        wait_for(lambda: [s for s in committed_steps(logdir) if s > 0], 120, what="a committed checkpoint")
        os.kill(wait_role_pid(logdir, "trainer"), signal.SIGKILL)
        restored = wait_for(lambda: [r["step"] for r in lifecycle(logdir) if r.get("event") == "restored"], 120,
                            what="the restore")[0]
        wait_for(lambda: [s for s in committed_steps(logdir) if s > restored], 120, what="a commit after the restore")
        os.kill(wait_role_pid(logdir, "worker1"), signal.SIGKILL)
    finally:
        code, _, err = finish(proc)
    return code, err


@pytest.fixture(scope="module")
def plain_segments(shared_result) -> dict[str, str]:  # type: ignore[no-untyped-def]
    """The plain runs (no procsv), made once per session (``shared_result``): a group of two to step 20
    (``first``, with a sample log ``log``), then from its checkpoint, side by side, a group of one
    (``shrunk``, logging into ``log`` too) and a group of two (``kept``) to step STEPS: ``kept`` is the
    plain run of a constant group of two, the reference of the launch below."""
    def produce(folder: str) -> None:
        first, log = os.path.join(folder, "w2-20"), os.path.join(folder, "log")
        finish_segment(start_segment(2, 20, first, None, (*MODEL, "--sample-log", log)))
        shrunk, kept = os.path.join(folder, f"w1-{STEPS}"), os.path.join(folder, f"w2-{STEPS}")
        finish_segment(start_segment(1, STEPS, shrunk, first, (*MODEL, "--sample-log", log))
                       + start_segment(2, STEPS, kept, first, MODEL))

    folder = shared_result("elastic-plain-segments", produce)
    return {"first": os.path.join(folder, "w2-20"), "log": os.path.join(folder, "log"),
            "shrunk": os.path.join(folder, f"w1-{STEPS}"), "kept": os.path.join(folder, f"w2-{STEPS}")}


@pytest.mark.slow
def test_a_group_with_members_sigkilled_consumes_each_sample_once_and_ends_equal_to_the_plain_run(
        logdir, tmp_path, plain_segments):
    """A group whose chief, then next worker, is SIGKILLed after a commit consumes each sample once per epoch and
    ends bit-equal to the plain run of its schedule (a constant group of two: ``plain_segments``' ``kept``)."""
    samples = str(tmp_path / "samples")
    args = (*MODEL, "--steps", str(STEPS), "--save-checkpoint-steps", "5", "--save-model-secs", "1000",
            "--step-delay", "0.05", "--print-every-steps", "100000", "--sample-log", samples)
    expected = [(1, STEPS, 2)]  # the group restarts as the same two (one host): its schedule, checked below
    code, err = _run_killing_chief_then_worker(logdir, args)
    want = checkpoint_weights(plain_segments["kept"])  # the plain run of ``expected``, in two segments (20, then 40)
    assert code == 0, err
    restarting = [r for r in lifecycle(logdir) if r.get("event") == "restarting"]
    assert [r["error"].split(" (")[0] for r in restarting] == ["trainer attempt 1", "worker1 attempt 2"], restarting
    records = read_records(samples)
    steps = effective_steps(samples)
    assert {r["attempt"] for r in records} == {1, 2, 3}
    assert len(records) > 2 * STEPS  # a restarted group ran again the steps after its restore
    assert_exactly_once(steps, N_TRAIN, epochs_complete=1)
    assert schedule(steps) == expected  # the reference ran the schedule the log shows
    got = procsv_weights(logdir)
    assert sorted(got) == sorted(want)
    differ = [k for k in want if not np.array_equal(got[k], want[k])]
    assert not differ, f"differ from the plain run: {differ}"


@pytest.mark.slow
def test_the_reference_tells_a_change_of_world_from_a_constant_world(plain_segments):
    """The plain reference itself: a change of world (2 then 1) ends unequal to a constant world, and its sample log
    shows the schedule."""
    # steps 1..20 with W=2, then 21..STEPS with W=1 or W=2 (both from the same checkpoint, side by side)
    a, b = checkpoint_weights(plain_segments["shrunk"]), checkpoint_weights(plain_segments["kept"])
    position = "position/.ATTRIBUTES/VARIABLE_VALUE"
    assert int(a[position]) == 20 * 2 * B + (STEPS - 20) * B and int(b[position]) == STEPS * 2 * B
    assert not weights_equal(a, b)
    # the log of the group of two, then one: the one takes the positions where the two left them
    steps = effective_steps(plain_segments["log"])
    assert schedule(steps) == [(1, 20, 2), (21, STEPS, 1)]
    assert steps[21][0]["position"] == 20 * 2 * B and {r["batch"] for s in steps.values() for r in s} == {B}
    assert_exactly_once(steps, N_TRAIN, epochs_complete=0)  # (20 * 32 + 40 * 16 = 1280 positions: no epoch whole)


def _log(folder: str, records: list[dict[str, object]]) -> str:
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "samples-r0-p1.jsonl"), "w") as fh:
        fh.writelines(json.dumps(r) + "\n" for r in records)
    return folder


def test_assert_exactly_once_fails_on_a_duplicated_or_a_missing_step(tmp_path):
    """The exactly-once check passes a good log and fails a missing step, a missing rank, a duplicated step, a
    sample seen twice."""
    from procsv.examples.elastic_digits import sample_ids

    n, b = 10, 2
    # a group of two, then one: 5 steps of 4 positions, then 2 steps of 2 = 24 positions, two full epochs
    plan = [(s, 2) for s in range(1, 6)] + [(s, 1) for s in (6, 7)]
    good, pos = [], 0
    for step, world in plan:
        for r in range(world):
            good.append({"attempt": 1, "step": step, "world": world, "rank": r, "batch": b, "position": pos,
                         "first": pos + r * b, "samples": sample_ids(0, n, pos + r * b, b).tolist()})
        pos += world * b
    assert_exactly_once(effective_steps(_log(str(tmp_path / "good"), good)), n, 2)
    assert schedule(effective_steps(str(tmp_path / "good"))) == [(1, 5, 2), (6, 7, 1)]
    # a later attempt that ran step 3 again wins over the first run of it
    rerun = good + [dict(r, attempt=2) for r in good if r["step"] >= 3]
    assert_exactly_once(effective_steps(_log(str(tmp_path / "rerun"), rerun)), n, 2)

    missing = [r for r in good if r["step"] != 4]  # a step nobody logged
    with pytest.raises(AssertionError, match="steps missing"):
        assert_exactly_once(effective_steps(_log(str(tmp_path / "missing"), missing)), n, 2)
    one_rank = [r for r in good if not (r["step"] == 4 and r["rank"] == 1)]  # a rank missing from a step
    with pytest.raises(AssertionError, match="ranks logged"):
        assert_exactly_once(effective_steps(_log(str(tmp_path / "one_rank"), one_rank)), n, 2)
    # step 4 took step 3's positions again (a duplicated step: its samples twice, the next ones never)
    dup = [dict(r, position=r["position"] - 4, first=r["first"] - 4,
                samples=sample_ids(0, n, r["first"] - 4, b).tolist()) if r["step"] == 4 else r for r in good]
    with pytest.raises(AssertionError, match="starts at position"):
        assert_exactly_once(effective_steps(_log(str(tmp_path / "dup"), dup)), n, 2)
    # positions right, but a sample id logged twice within an epoch (the mapping broken)
    twice = [dict(r, samples=[r["samples"][0]] * b) if r["step"] == 2 and r["rank"] == 0 else r for r in good]
    with pytest.raises(AssertionError, match="seen more than once"):
        assert_exactly_once(effective_steps(_log(str(tmp_path / "twice"), twice)), n, 2)


def test_keep_global_batch_refuses_a_batch_the_group_cannot_split(tmp_path):
    """--keep-global-batch that the group's size does not divide is refused in one line (exit 2)."""
    from procsv.cluster import make_tf_config

    proc = subprocess.run([sys.executable, "-m", TARGET, "--plain", "--plain-to", "1", "--plain-save",
                           str(tmp_path / "x"), "--keep-global-batch", "33"], capture_output=True, text=True,
                          env=quiet_env(TF_CONFIG=make_tf_config(["127.0.0.1:1", "127.0.0.1:2"], 0)), timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1] == \
        "elastic_digits: --keep-global-batch 33 cannot be kept by a group of 2: it must be a multiple of the group's size"


def test_keep_global_batch_splits_the_global_batch_among_the_group():
    """--keep-global-batch splits the global batch among the group's members; --batch-size is per member."""
    from procsv.examples.elastic_digits import parse_args, per_replica_batch

    kept = parse_args(["--keep-global-batch", "32"])
    assert [per_replica_batch(kept, w) for w in (1, 2, 4, 8)] == [32, 16, 8, 4]
    assert [per_replica_batch(parse_args(["--batch-size", "16"]), w) for w in (1, 2, 3)] == [16, 16, 16]
    for w in (3, 64):
        with pytest.raises(ValueError, match=f"group of {w}"):
            per_replica_batch(kept, w)
