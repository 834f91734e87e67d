"""Non-finite training (issue 41) on real processes: exit code 4 "diverging" under ``procsv launch``,
detection of a non-finite loss, never committing a poisoned state, and the ``--on-nonfinite`` policies."""

from __future__ import annotations

import os
import re
import signal

import numpy as np
import pytest
import tensorflow as tf

from conftest import (PROGRAMS, run_python, committed_steps, finish, launch, lifecycle, quiet_env, raw_status, skipped_steps,
                      status_json, wait_for, wait_role_pid)
from plain_runs import run_plain_programs

EXIT_TRAIN = os.path.join(PROGRAMS, "exit_train.py")
NAN_TRAIN = os.path.join(PROGRAMS, "nan_train.py")
NAN_MONITORED = os.path.join(PROGRAMS, "nan_monitored.py")
NAN_GRAPH = os.path.join(PROGRAMS, "nan_graph.py")
# every launch here: no hot standby prepared beside the trainer (a restart forks one from the pre-warmed trainer);
# no test here is about the standby
FORK = ("--standby", "fork")

# The plain runs (no watchdog) that never applied step 25: the references a rolled-back run must
# equal bit for bit. Each is the program run as `python <program> <args> --final-checkpoint <folder>/model.ckpt-N`
# (N its last step), all of them in one process (``run_plain_programs``: one TensorFlow import for the five), in
# this order: nan_graph.py turns eager execution off for the rest of its process, so it comes last. No logdir, no
# procsv service: the final state is written with TF's own Checkpoint (nan_graph.py: Saver), named the folder's
# newest. With --logdir each run started its checkpoint and summary services: the six runs (one the twin of a run
# with no checkpoint schedule, the same run without a logdir) took 6.4 s of CPU, 3.0 of them the --input iterator
# run's, whose checkpoint service loaded TensorFlow for the iterator's state; the five now 0.9
PLAIN_RUNS: dict[str, tuple[str, tuple[str, ...]]] = {
    "skip-25": (NAN_TRAIN, ("--skip-at", "25")),  # (and the twin of a run with no checkpoint on disk: no schedule)
    "skip-21-23-25": (NAN_TRAIN, ("--skip-at", "21", "--skip-at", "23", "--skip-at", "25", "--steps", "30")),
    "iterator-skip-25": (NAN_TRAIN, ("--input", "iterator", "--skip-at", "25")),
    "monitored-skip-25": (NAN_MONITORED, ("--skip-at", "25")),
    "graph-skip-25": (NAN_GRAPH, ("--skip-at", "25")),
}
PLAIN_LAST_STEP = {NAN_TRAIN: 60, NAN_MONITORED: 40, NAN_GRAPH: 40}  # each program's default --steps


@pytest.fixture(scope="module")
def plain_runs(shared_result) -> dict[str, str]:  # type: ignore[no-untyped-def]
    """name -> the folder of that plain run of PLAIN_RUNS (its final checkpoint), made once per test session."""
    def final(where: str, program: str, args: tuple[str, ...]) -> str:
        last = int(args[args.index("--steps") + 1]) if "--steps" in args else PLAIN_LAST_STEP[program]
        return os.path.join(where, "model.ckpt" if program == NAN_GRAPH else f"model.ckpt-{last}")  # (Saver: -N)

    def produce(folder: str) -> None:
        run_plain_programs([(program, [*args, "--final-checkpoint", final(os.path.join(folder, name), program, args)])
                            for name, (program, args) in PLAIN_RUNS.items()], env=quiet_env(), cwd=folder)

    folder = shared_result("nonfinite-plain-runs", produce)
    return {name: os.path.join(folder, name) for name in PLAIN_RUNS}


def _events(logdir: str, kind: str, role: str = "") -> list[dict]:
    return [e for e in lifecycle(logdir) if e["event"] == kind and (not role or e.get("role") == role)]


@pytest.mark.slow
def test_a_trainer_that_exits_4_ends_the_launch_diverging_failed_no_restart_on_failure_runs(logdir, tmp_path):
    # before: a trainer's exit 4 was a failure like any other: restarted (at once after progress)
    calls = tmp_path / "calls.txt"
    proc = launch(logdir, "--exit-at-step", "5", "--exit-code", "4", target=EXIT_TRAIN,
                  opts=FORK + ("--max-restarts", "5", "--on-failure", f"echo $PROCSV_EXIT_CODE >> {calls}"))
    code, out, err = finish(proc, 180)
    assert code == 4, err
    assert len(_events(logdir, "spawned", "trainer")) == 1
    assert not _events(logdir, "restarting")
    assert "giving up: the trainer is diverging" in err, err
    assert calls.read_text() == "4\n"
    st = status_json(logdir)
    assert st is not None and st["state"] == "failed"


def _checkpoint_values(prefix: str) -> dict[str, np.ndarray]:
    reader = tf.train.load_checkpoint(prefix)
    return {k: reader.get_tensor(k) for k in reader.get_variable_to_shape_map() if "VARIABLE_VALUE" in k}


def _assert_finite(prefix: str) -> None:
    values = _checkpoint_values(prefix)
    assert values, prefix
    for key, value in values.items():
        if key.startswith("low/"):
            assert np.isinf(value).all()  # running_min: legitimately +inf, kept as it is
        elif np.issubdtype(np.asarray(value).dtype, np.floating):
            assert np.isfinite(value).all(), (prefix, key, value)


def _all_committed_are_finite(logdir: str) -> list[int]:
    steps = committed_steps(logdir)
    for step in steps:
        _assert_finite(os.path.join(logdir, f"model.ckpt-{step}"))
    return steps


@pytest.mark.slow
def test_weights_that_turn_nan_are_never_committed_and_continue_trains_on(logdir):
    # before: every checkpoint after step 25 (and the final one at 60) held NaN weights and momentum,
    # and tf.train.latest_checkpoint pointed at one of them
    proc = launch(logdir, "--how", "weights", "--nan-at", "25", target=NAN_TRAIN,
                  opts=FORK + ("--on-nonfinite", "continue"))
    code, out, err = finish(proc, 180)
    assert code == 0, err
    latest = tf.train.latest_checkpoint(logdir)
    assert latest is not None and int(latest.rsplit("-", 1)[1]) < 25, latest
    _assert_finite(latest)
    steps = _all_committed_are_finite(logdir)
    assert steps and max(steps) < 25, steps
    said = out + err  # the trainer's lines are echoed with its prefix
    assert "non-finite training at step" in said and "w/.ATTRIBUTES/VARIABLE_VALUE" in said, said
    assert "the final checkpoint is not committed" in said, said
    assert len(_events(logdir, "spawned", "trainer")) == 1  # no restart: a kept-out final is no failure
    assert status_json(logdir)["state"] == "succeeded"


@pytest.mark.slow
def test_a_nan_loss_with_on_nonfinite_stop_stops_in_order_exit_4_and_the_newest_checkpoint_is_finite(logdir):
    proc = launch(logdir, "--how", "return", "--nan-at", "25", target=NAN_TRAIN, opts=FORK + ("--on-nonfinite", "stop"))
    code, out, err = finish(proc, 180)
    assert code == 4, err
    assert "non-finite training at step 25: the loss of step 25 is NaN or infinite" in err, err
    assert "giving up: the trainer is diverging" in err, err
    found = _events(logdir, "nonfinite_detected")  # told to the watchdog before the trainer stopped
    assert [(e["step"], e["what"]) for e in found] == [(25, "the loss of step 25 is NaN or infinite")], found
    assert not _events(logdir, "rolled_back") and not _events(logdir, "step_skipped")
    latest = tf.train.latest_checkpoint(logdir)
    assert latest is not None and int(latest.rsplit("-", 1)[1]) < 25, latest
    _all_committed_are_finite(logdir)
    assert len(_events(logdir, "spawned", "trainer")) == 1
    assert status_json(logdir)["state"] == "failed"


@pytest.mark.parametrize("how", ["dict", "log"])
@pytest.mark.slow
def test_plain_python_with_on_nonfinite_stop_exits_4_on_a_nan_loss(tmp_path, how):
    logdir = str(tmp_path / "run")
    done = run_python([NAN_TRAIN, "--logdir", logdir, "--how", how, "--nan-at", "25", "--policy", "stop"],
                      env=quiet_env(), timeout=180)
    assert done.returncode == 4, done.stderr
    assert "non-finite training at step 25" in done.stderr, done.stderr
    assert "nan_train: ended" not in done.stdout  # the program did not go on after the block
    latest = tf.train.latest_checkpoint(logdir)
    assert latest is None or int(latest.rsplit("-", 1)[1]) < 25
    if latest is not None:
        _assert_finite(latest)


def test_a_returned_loss_is_checked_in_bulk_at_the_snapshot_not_read_at_every_step(tmp_path, monkeypatch):
    # the step's loss tensor is kept, not read: the reads of the whole run are those procsv made
    # anyway plus one per check (at a snapshot), however many steps ran
    from tensorflow.python.framework import ops

    import procsv

    monkeypatch.setenv("PROCSV_MEMORY_SNAPSHOTS", "0")
    reads = [0]
    real = ops._EagerTensorBase.numpy

    def counting(self):  # type: ignore[no-untyped-def]
        reads[0] += 1
        return real(self)

    monkeypatch.setattr(ops._EagerTensorBase, "numpy", counting)

    def run(name: str, returns_loss: bool) -> tuple[int, procsv.Supervisor, tf.Variable]:
        w = tf.Variable(tf.ones([4]))

        @tf.function
        def train(x):  # type: ignore[no-untyped-def]
            err = w * x - 1.0
            w.assign_sub(0.01 * err * x)
            return tf.reduce_sum(err * err)

        sv = procsv.Supervisor(logdir=str(tmp_path / name), checkpoint={"w": w}, save_model_secs=600,
                               save_checkpoint_steps=50, on_nonfinite="continue")
        with sv.managed_session() as sess:
            before = reads[0]
            for s in range(1, 301):
                x = tf.fill([4], float("nan") if s == 120 else 1.0 + (s % 7) / 10)
                out = sess.run(lambda: train(x))
                assert returns_loss or out is not None
                if not returns_loss:
                    sess.run(lambda: None)  # the same steps' work, nothing returned: nothing watched
            during = reads[0] - before
        return during, sv, w

    watched, sv, _ = run("watched", True)
    assert sv._rollback.watch.first is not None and sv._rollback.watch.first.first_step == 120
    checks = sv._rollback.watch.losses.reads
    assert 1 <= checks <= 2 * 300 // 50 + 2, checks  # one read per check (two where a NaN was found)
    assert watched < 300 // 2, watched  # nowhere near one read per step
    latest = tf.train.latest_checkpoint(str(tmp_path / "watched"))
    assert latest is not None and int(latest.rsplit("-", 1)[1]) < 120
    _assert_finite(latest)


def _values(logdir: str) -> dict[str, bytes]:
    latest = tf.train.latest_checkpoint(logdir)
    assert latest is not None and latest.endswith("model.ckpt-60"), latest
    return {k: v.tobytes() for k, v in _checkpoint_values(latest).items()}


@pytest.mark.slow
def test_rollback_skips_a_poisoned_step_and_the_weights_equal_a_plain_run_that_never_applied_it(logdir, plain_runs):
    # before: no rollback; the run trained on NaN weights and committed them. Now (the default under
    # procsv launch): restore step 20 in place, replay, retry step 25, skip it, train on to 60
    code, out, err = finish(launch(logdir, "--nan-at", "25", target=NAN_TRAIN, opts=FORK), 240)
    said = out + err
    assert code == 0, said
    assert "retrying step 25 once" in said and "skipped step 25" in said, said
    assert len(_events(logdir, "spawned", "trainer")) == 1  # in place: no process restart
    _all_committed_are_finite(logdir)
    plain = plain_runs["skip-25"]  # python nan_train.py --skip-at 25
    rolled, baseline = _values(logdir), _values(plain)
    assert rolled.keys() == baseline.keys()
    for key in ("w/.ATTRIBUTES/VARIABLE_VALUE", "m/.ATTRIBUTES/VARIABLE_VALUE", "global_step/.ATTRIBUTES/VARIABLE_VALUE"):
        assert rolled[key] == baseline[key], key  # bit-equal


@pytest.mark.slow
def test_more_skips_than_max_skips_within_the_window_stop_the_run_with_exit_4(logdir):
    # each poisoned step a checkpoint interval after the one before: every rollback restores a newer
    # snapshot (20, then 30 or later, ...), so the snapshot bound (3 restores of one snapshot
    # followed by a non-finite within 10 steps) never trips first; the 4th skip does (the
    # checkpoint of step 60 finds 57's loss at the latest: --steps 70)
    nan_at = [a for s in (21, 33, 45, 57) for a in ("--nan-at", str(s))]
    code, out, err = finish(launch(logdir, *nan_at, "--steps", "70", target=NAN_TRAIN,
                                   opts=FORK + ("--max-skips", "3")),
                            300)
    said = out + err
    assert code == 4, said
    for step in (21, 33, 45):
        assert f"skipped step {step} " in said, said
    assert "skipped step 57" not in said
    assert "--max-skips 3" in said and "giving up: the trainer is diverging" in said, said
    _all_committed_are_finite(logdir)
    assert status_json(logdir)["state"] == "failed"


@pytest.mark.slow
def test_rollback_then_a_sigkill_of_the_trainer_still_ends_bit_equal_to_the_plain_run(logdir, plain_runs):
    # the restarted trainer resumes from the newest committed (finite) state; if that is before the
    # poisoned step it meets it again and skips it again: the result is the same either way
    proc = launch(logdir, "--nan-at", "25", "--step-delay", "0.05", target=NAN_TRAIN, opts=FORK)
    log = os.path.join(logdir, "logs", "trainer.1.log")
    try:
        wait_for(lambda: os.path.exists(log) and "skipped step 25" in open(log).read(), 180, what="step 25 skipped")
        # the preemption comes after the watchdog wrote the skip down (its record is written off its loop: a
        # kill right after the trainer's line could come first, under load)
        wait_for(lambda: _events(logdir, "step_skipped"), 30, what="the step_skipped record")
        wait_for(lambda: (raw_status(logdir) or {}).get("step", 0) >= 32, 120, what="training past the skip")
        os.kill(wait_role_pid(logdir, "trainer"), signal.SIGKILL)
        code, out, err = finish(proc, 240)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert code == 0, err
    assert len(_events(logdir, "spawned", "trainer")) == 2  # the kill's restart, and no other
    _all_committed_are_finite(logdir)
    plain = plain_runs["skip-25"]  # python nan_train.py --skip-at 25
    rolled, baseline = _values(logdir), _values(plain)
    for key in ("w/.ATTRIBUTES/VARIABLE_VALUE", "m/.ATTRIBUTES/VARIABLE_VALUE", "global_step/.ATTRIBUTES/VARIABLE_VALUE"):
        assert rolled[key] == baseline[key], key


@pytest.mark.slow
def test_a_step_skipped_before_the_whole_launch_was_killed_is_skipped_again_by_the_relaunch(logdir, plain_runs):
    # the field's case: the job is preempted (every process killed at once) after the skip of step 25 and
    # before a checkpoint past it; its relaunch restores step 20 and meets step 25 again. The watchdog
    # reads the earlier launch's skipped steps once at its start and tells its trainer, which skips the
    # step at once instead of finding it non-finite, rolling back and retrying it again
    args = ("--nan-at", "25", "--save-steps", "20", "--step-delay", "0.15")
    proc = launch(logdir, *args, target=NAN_TRAIN, opts=FORK)
    log = os.path.join(logdir, "logs", "trainer.1.log")
    try:
        wait_for(lambda: os.path.exists(log) and "skipped step 25" in open(log).read(), 180, what="step 25 skipped")
        # the preemption comes after the watchdog wrote the skip down (its record is written off its loop: a
        # kill right after the trainer's line could come first, under load)
        wait_for(lambda: _events(logdir, "step_skipped"), 30, what="the step_skipped record")
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
    assert max(committed_steps(logdir)) < 25, committed_steps(logdir)  # the premise: nothing past the skip
    assert [e["step"] for e in _events(logdir, "step_skipped")] == [25]
    code, out, err = finish(launch(logdir, *args, target=NAN_TRAIN, opts=FORK), 240)
    assert code == 0, err
    said = out + err
    assert "skipping step 25 again (this run skipped it before)" in said, said
    records = lifecycle(logdir)
    relaunch = max(i for i, e in enumerate(records) if e["event"] == "launch")
    assert relaunch > 0 and not [e for e in records[relaunch:] if e["event"] in ("nonfinite_detected", "rolled_back")], said
    # the relaunch's status and report name the step the run skipped, though this launch found nothing
    # (before: report.json's skipped_steps listed this launch's own skips only: none)
    assert skipped_steps(logdir) == [25] and (raw_status(logdir) or {}).get("skipped_steps") == [25]
    _all_committed_are_finite(logdir)
    plain = plain_runs["skip-25"]  # python nan_train.py --skip-at 25
    rolled, baseline = _values(logdir), _values(plain)
    for key in ("w/.ATTRIBUTES/VARIABLE_VALUE", "m/.ATTRIBUTES/VARIABLE_VALUE", "global_step/.ATTRIBUTES/VARIABLE_VALUE"):
        assert rolled[key] == baseline[key], key


@pytest.mark.slow
def test_rollback_restores_the_in_memory_snapshot_in_place_when_no_checkpoint_is_on_disk(logdir, plain_runs):
    # before: the rollback read the newest committed checkpoint from disk only; with none on disk
    # before the poisoned step (--save-steps 1000) there was nothing to roll back to. Now the
    # trainer's own in-memory snapshot of a step before 25 is verified and restored in place. The
    # tier takes a share of the loop's time (default 1 %): under load a first snapshot that looked
    # expensive put the next one past step 25 (the NaN was then met at the final checkpoint, exit 4),
    # so the tier gets its largest share here and holds snapshots of the steps before 25
    code, out, err = finish(launch(logdir, "--nan-at", "25", "--save-steps", "1000", "--step-delay", "0.04",
                                   target=NAN_TRAIN, opts=FORK, env=quiet_env(PROCSV_MEMORY_SNAPSHOTS="0.5")), 240)
    said = out + err
    assert code == 0, said
    assert [s for s in committed_steps(logdir) if 0 < s < 60] == []  # nothing on disk to roll back to
    restored = re.findall(r"restored step (\d+) from the in-memory snapshot", said)
    assert len(restored) == 1 and 0 < int(restored[0]) < 25, said  # the retry's rollback
    # the skip's: the state of step 24, kept in memory when the retry began (no second replay)
    assert "restored step 24 from the state kept before the retry" in said, said
    assert "skipped step 25" in said, said
    assert len(_events(logdir, "spawned", "trainer")) == 1
    plain = plain_runs["skip-25"]  # python nan_train.py --skip-at 25 (no checkpoint schedule)
    rolled, baseline = _values(logdir), _values(plain)
    for key in ("w/.ATTRIBUTES/VARIABLE_VALUE", "m/.ATTRIBUTES/VARIABLE_VALUE", "global_step/.ATTRIBUTES/VARIABLE_VALUE"):
        assert rolled[key] == baseline[key], key  # bit-equal


@pytest.mark.slow
def test_bad_inputs_are_skipped_up_to_max_skips_and_a_snapshot_turning_non_finite_after_3_restores_stops_the_run(
        logdir, plain_runs):
    # one run, both bounds. Steps 21, 23 and 25 have NaN inputs: each is retried and skipped from the
    # same step-20 checkpoint, 3 skips, which --max-skips 3 allows (issue 68: the third used to stop
    # the run on the snapshot's restore bound, exit 4 at step 25); the checkpoint of step 30 then equals
    # a plain run that never applied them. Steps 31, 33, 35 and 37 are transient faults (each NaN once,
    # after the rollback for the one before; finite when retried): nothing to skip, and the snapshot of
    # step 30 turns non-finite within 10 steps of each of 3 restores (33, 35, 37; 31 is 11 steps after
    # the last restore, of step 20):
    # diverging, exit 4 (disk only: the snapshot restored is the checkpoint of step 20, then of 30)
    # --wait-checkpoint 20, 30: steps 21 and 31 wait for those commits, the premise (seen once in a full
    # run: at load, the step-20 snapshot was not taken yet when 21 failed, the first restore was step 10's)
    bad = [a for s in (21, 23, 25) for a in ("--nan-at", str(s))]
    transient = [a for s in (31, 33, 35, 37) for a in ("--transient-nan-at", str(s))]
    code, out, err = finish(launch(logdir, *bad, *transient, "--steps", "45", "--wait-checkpoint", "20",
                                   "--wait-checkpoint", "30", target=NAN_TRAIN, opts=FORK,
                                   env=quiet_env(PROCSV_MEMORY_SNAPSHOTS="0")), 300)
    said = out + err
    assert code == 4, said
    assert all(f"skipped step {s} " in said for s in (21, 23, 25)), said
    assert all(f"step {s} was finite when retried" in said for s in (31, 33, 35)), said
    assert "skipped step 3" not in said, said
    assert ("the snapshot of step 30 turned non-finite within 10 steps of each of 3 restores (at steps 33, 35, 37)"
            in said), said
    assert "giving up: the trainer is diverging" in said, said
    assert [e["step"] for e in _events(logdir, "step_skipped")] == [21, 23, 25]
    assert len(_events(logdir, "spawned", "trainer")) == 1  # no restart
    assert status_json(logdir)["state"] == "failed"
    _all_committed_are_finite(logdir)
    prefix = os.path.join(logdir, "model.ckpt-30")
    rolled, baseline = (_checkpoint_values(p) for p in (prefix, os.path.join(plain_runs["skip-21-23-25"], "model.ckpt-30")))
    for key in ("w/.ATTRIBUTES/VARIABLE_VALUE", "m/.ATTRIBUTES/VARIABLE_VALUE", "global_step/.ATTRIBUTES/VARIABLE_VALUE"):
        assert rolled[key].tobytes() == baseline[key].tobytes(), key  # bit-equal


@pytest.mark.slow
def test_a_skipped_step_consumes_its_element_of_a_checkpointed_tf_data_iterator(logdir, plain_runs):
    # before: the skip called no step function, so the poisoned element 25 stayed next in the
    # iterator and step 26 took it: non-finite again, skipped again, ... until exit 4. Now the skip
    # takes and discards it: one skip, and the weights equal a plain run that discarded element 25
    code, out, err = finish(launch(logdir, "--input", "iterator", "--nan-at", "25", "--wait-checkpoint", "10",
                                   target=NAN_TRAIN, opts=FORK), 240)
    said = out + err
    assert code == 0, said
    assert "skipped step 25" in said and said.count("skipped step") == 1, said
    plain = plain_runs["iterator-skip-25"]  # python nan_train.py --input iterator --skip-at 25
    rolled, baseline = _values(logdir), _values(plain)
    for key in ("w/.ATTRIBUTES/VARIABLE_VALUE", "m/.ATTRIBUTES/VARIABLE_VALUE", "global_step/.ATTRIBUTES/VARIABLE_VALUE"):
        assert rolled[key] == baseline[key], key  # bit-equal
    # the data position: each final checkpoint's iterator restored into one whose map yields the
    # element's index: past the elements the program's map had already made (prefetched, restored
    # as they were: values in [1, 1.6]), the first index is where the input goes on; the same
    position = _next_index(logdir)
    assert position == 60 == _next_index(plain), position  # steps 1-60 took elements 0-59


def _next_index(where: str) -> int:
    """The index of the element the program would take next from the final checkpoint's iterator.

    Restored into an iterator whose map yields each element's index, it first yields the elements
    the program's map had already made (tf.data's injected prefetch: how many depends on the
    timing; restored as the program made them, values ``1 + (k % 7) / 10``), then indices from where
    the input goes on. The next element is that first index less the elements buffered before it,
    and each buffered element must be the program's element of its index."""
    it = iter(tf.data.Dataset.range(1_000_000).map(lambda k: tf.fill([4], tf.cast(k, tf.float32))))
    tf.train.Checkpoint(input=it).read(tf.train.latest_checkpoint(where)).expect_partial()
    buffered: list[float] = []
    for _ in range(100):
        value = float(next(it).numpy()[0])
        if value >= 2:
            first = int(value) - len(buffered)
            made = [float(np.float32(1.0) + np.float32(k % 7) / np.float32(10)) for k in range(first, int(value))]
            assert buffered == made, (where, first, buffered)
            return first
        buffered.append(value)
    raise AssertionError(f"no index within 100 elements of {where}")


def _monitored_values(where: str) -> dict[str, bytes]:
    latest = tf.train.latest_checkpoint(where)
    assert latest is not None and latest.endswith("model.ckpt-40"), latest
    return {k: v.tobytes() for k, v in _checkpoint_values(latest).items()}


@pytest.mark.slow
def test_procsv_train_a_poisoned_step_watched_by_a_nan_tensor_hook_is_rolled_back_and_skipped(logdir, plain_runs):
    # before: the NanTensorHook read its tensor after the run and raised NanLossDuringTrainingError
    # before procsv could roll back. Now procsv watches the hook's tensor (kept, checked in bulk),
    # rolls back, skips step 25, and the hook never sees the NaN
    code, out, err = finish(launch(logdir, "--nan-at", "25", target=NAN_MONITORED, opts=FORK), 240)
    said = out + err
    assert code == 0, said
    assert "skipped step 25" in said and "NaN loss during training" not in said, said
    assert len(_events(logdir, "spawned", "trainer")) == 1
    _all_committed_are_finite(logdir)
    plain = plain_runs["monitored-skip-25"]  # python nan_monitored.py --skip-at 25
    rolled, baseline = _monitored_values(logdir), _monitored_values(plain)
    for key in ("w/.ATTRIBUTES/VARIABLE_VALUE", "m/.ATTRIBUTES/VARIABLE_VALUE", "global_step/.ATTRIBUTES/VARIABLE_VALUE"):
        assert rolled[key] == baseline[key], key  # bit-equal


@pytest.mark.slow
def test_procsv_train_a_poisoned_region_that_trips_the_bound_stops_with_exit_4(logdir, tmp_path):
    # steps 21 and 23: the second skip is over --max-skips 1 (the checkpoint of step 30 finds each
    # at the latest): the step boundary inside sess.run gives up. The program's NanTensorHook
    # (fail_on_nan_loss=True) watches the loss: its run raises the hook's NanLossDuringTrainingError (issue
    # 67; before, procsv's own exit 4, a SystemExit), which the program lets escape: the trainer exits 4 and the
    # watchdog judges it diverging (exit 4, no restart), not a program's failure (exit 1)
    code, out, err = finish(launch(logdir, "--nan-at", "21", "--nan-at", "23", target=NAN_MONITORED,
                                   opts=FORK + ("--max-skips", "1")), 240)
    said = out + err
    assert code == 4, said
    assert "skipped step 21" in said and "skipped step 23" not in said and "--max-skips 1" in said, said
    assert "non-finite training at step 23" in said and "the program's NanTensorHook(fail_on_nan_loss=True) raises " \
        "NanLossDuringTrainingError" in said, said
    assert "giving up: the trainer is diverging" in said, said
    assert status_json(logdir)["state"] == "failed"
    _all_committed_are_finite(logdir)
    # step 40's NaN, the last step's, is found when the loop ends (no snapshot after it before the end): it is
    # rolled back, retried and skipped there as anywhere else, the StopAtStepHook's stop at 40 asked again by
    # the replay (the session's end finishes the training, d43630e); before that the final checkpoint's check
    # gave up with exit 4, and before that the session's quiet stop ended 0 with its last step poisoned
    done = run_python([NAN_MONITORED, "--logdir", str(tmp_path / "plain"), "--nan-at", "40"], env=quiet_env(),
                      timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "non-finite training at step 40" in done.stderr and "(found when the loop ended)" in done.stderr
    assert "skipped step 40" in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert "inside the replay after" not in done.stderr and "nan_monitored: done at step 40" in done.stdout, done.stdout + done.stderr
    _all_committed_are_finite(str(tmp_path / "plain"))


def _graph_values(where: str) -> dict[str, bytes]:
    latest = tf.train.latest_checkpoint(where)
    assert latest is not None and latest.endswith("model.ckpt-40"), latest
    reader = tf.train.load_checkpoint(latest)
    return {k: reader.get_tensor(k).tobytes() for k in ("w", "w/Momentum", "global_step")}


@pytest.mark.slow
def test_graph_mode_a_poisoned_step_whose_fetched_loss_is_nan_is_rolled_back_and_skipped(logdir, plain_runs):
    # before: a TF1 program's fetched loss was not watched (NumPy 2's scalars were taken for device
    # tensors and dropped), only the snapshot's weights were seen non-finite: the bad step unknown,
    # the run stopped with exit 4. Now the run's value for the tensor named "loss" is kept, the
    # variables are restored by name from model.ckpt-20, the global step is assigned past step 25
    code, out, err = finish(launch(logdir, "--nan-at", "25", target=NAN_GRAPH, opts=FORK), 240)
    said = out + err
    assert code == 0, said
    assert "restored step 20 from model.ckpt-20" in said and "skipped step 25" in said, said
    assert len(_events(logdir, "spawned", "trainer")) == 1
    plain = plain_runs["graph-skip-25"]  # python nan_graph.py --skip-at 25
    rolled, baseline = _graph_values(logdir), _graph_values(plain)
    for step in committed_steps(logdir):
        reader = tf.train.load_checkpoint(os.path.join(logdir, f"model.ckpt-{step}"))
        assert np.isfinite(reader.get_tensor("w")).all() and np.isfinite(reader.get_tensor("w/Momentum")).all()
    assert rolled == baseline  # bit-equal: w, its momentum slot, the global step


@pytest.mark.slow
def test_graph_mode_a_poisoned_region_that_trips_the_bound_stops_with_exit_4(logdir):
    code, out, err = finish(launch(logdir, "--nan-at", "21", "--nan-at", "23", target=NAN_GRAPH,
                                   opts=FORK + ("--max-skips", "1")), 240)
    said = out + err
    assert code == 4, said
    assert "skipped step 21" in said and "skipped step 23" not in said and "--max-skips 1" in said, said
    assert "giving up: the trainer is diverging" in said, said
    assert status_json(logdir)["state"] == "failed"


def _nan_graph_model(nan_at: int):
    """A TF1 graph whose input is computed in the graph from the global step (the step a run makes,
    ``s``): NaN at step ``nan_at``; its loss tensor is named ``objective``, so procsv's watch of
    tensors named ``loss`` does not see it: only a NanTensorHook does."""
    gs = tf.compat.v1.train.get_or_create_global_step()
    w = tf.compat.v1.get_variable("w", initializer=tf.ones([4]))
    s = gs + 1
    x = tf.where(tf.equal(s, nan_at), tf.fill([4], float("nan")), tf.fill([4], 1.0 + tf.cast(s % 7, tf.float32) / 10))
    err = w * x - 1.0
    objective = tf.reduce_sum(err * err, name="objective")
    train_op = tf.compat.v1.train.MomentumOptimizer(0.01, 0.9).minimize(objective, global_step=gs)
    return gs, x, objective, train_op


@pytest.mark.usefixtures("fresh_train_api")
@pytest.mark.slow
def test_graph_mode_a_nan_tensor_hooks_nan_is_rolled_back_and_skipped_bit_equal_to_a_plain_session_loop(logdir, tmp_path,
                                                                                                     capfd):
    # before: a graph MonitoredTrainingSession's NanTensorHook read its tensor after the run and raised
    # NanLossDuringTrainingError at step 25 (procsv watched only fetches named "loss"). Now procsv keeps
    # the hook's value as the step's loss and never calls the hook: the check before the snapshot of
    # step 30 finds step 25, restores model.ckpt-20, retries step 25 once, then skips it. A run that
    # makes no step still reaches the hook (nothing procsv would roll back)
    from procsv import train

    class CommitWait(tf.compat.v1.train.SessionRunHook):
        """After each run, wait until the snapshot in flight (if any) is answered: each snapshot
        is then taken at its step (10, 20, 30), never held back by the one before, whatever the
        machine's load (the training loop itself runs 40 steps in well under a second)."""

        def after_run(self, run_context, run_values):
            sv = run_context.session.supervisor
            assert sv._keeper.agent.wait_in_flight(sv._channels, sv.step, sv._clock() + 120)

    with tf.Graph().as_default():
        gs, x, objective, train_op = _nan_graph_model(25)
        hooks = [train.StopAtStepHook(last_step=40), train.NanTensorHook(objective), CommitWait()]
        with train.MonitoredTrainingSession(checkpoint_dir=logdir, hooks=hooks, save_checkpoint_steps=10,
                                            save_checkpoint_secs=None, save_summaries_steps=None,
                                            log_step_count_steps=None) as sess:
            # a run that makes no step has nothing to roll back: the hook sees its NaN, as TF's
            with pytest.raises(train.NanLossDuringTrainingError):
                sess.run(objective, feed_dict={x: [float("nan")] * 4})
            while not sess.should_stop():
                sess.run(train_op)
    said = "".join(capfd.readouterr())
    assert "restored step 20 from model.ckpt-20" in said and "skipped step 25" in said, said
    assert "NaN loss during training" not in said, said
    assert _all_graph_committed_are_finite(logdir)[-1] == 40
    plain = str(tmp_path / "plain")
    with tf.Graph().as_default():  # the same graph in a plain session loop that never applies step 25
        gs, x, objective, train_op = _nan_graph_model(25)
        skip = tf.compat.v1.assign_add(gs, 1)
        saver = tf.compat.v1.train.Saver()
        with tf.compat.v1.Session() as plain_sess:
            plain_sess.run(tf.compat.v1.global_variables_initializer())
            for s in range(1, 41):
                plain_sess.run(skip if s == 25 else train_op)
            saver.save(plain_sess, os.path.join(plain, "model.ckpt"), global_step=40)
    assert _graph_values(logdir) == _graph_values(plain)  # bit-equal: w, its momentum slot, the global step


def _all_graph_committed_are_finite(logdir: str) -> list[int]:
    steps = committed_steps(logdir)
    for step in steps:
        reader = tf.train.load_checkpoint(os.path.join(logdir, f"model.ckpt-{step}"))
        assert np.isfinite(reader.get_tensor("w")).all() and np.isfinite(reader.get_tensor("w/Momentum")).all(), step
    return steps
