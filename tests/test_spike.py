"""Loss spikes (issue 68) on real processes: ``--on-spike rollback`` under ``procsv launch`` skips a
spiking batch and ends bit-equal to a plain run that never saw it; ``stop`` and ``warn`` in plain
python (a few steps each). The rule itself, the record and each policy's course are tested purely in
``tests/test_spike_pure.py``.

``tests/programs/spike_train.py`` is a custom eager loop whose batch of step s is a function of s
alone; ``--spike-at 65`` scales that batch 7-fold, its loss jumping ~50x (15 against a median of
0.3; the rule's window there is 40 losses, at least 30 before a step is judged).
"""

from __future__ import annotations

import os
import pathlib
import re

import numpy as np
import pytest
import tensorflow as tf

from conftest import (PROGRAMS, finish, launch, lifecycle, quiet_env, run_python, sigkill_where_it_says, skipped_steps,
                      status_json)
from plain_runs import run_plain_programs
from procsv.status import render as render_status

SPIKE_TRAIN = os.path.join(PROGRAMS, "spike_train.py")
KERAS_NAN = os.path.join(PROGRAMS, "keras_nan.py")
KEYS = ("w/.ATTRIBUTES/VARIABLE_VALUE", "m/.ATTRIBUTES/VARIABLE_VALUE", "global_step/.ATTRIBUTES/VARIABLE_VALUE")


def _events(logdir: str, kind: str) -> list[dict]:
    return [e for e in lifecycle(logdir) if e["event"] == kind]


def _final(logdir: str, step: int = 90) -> dict[str, bytes]:
    latest = tf.train.latest_checkpoint(logdir)
    assert latest is not None and latest.endswith(f"model.ckpt-{step}"), latest
    reader = tf.train.load_checkpoint(latest)
    return {k: reader.get_tensor(k).tobytes() for k in KEYS}


@pytest.mark.slow
def test_a_spike_under_on_spike_rollback_is_skipped_and_the_run_ends_bit_equal_to_a_plain_run_without_its_batch(
        logdir: str, tmp_path: pathlib.Path) -> None:
    # before: no rule looked at a finite loss; the spike's update stayed in the weights. Now the check
    # before the next snapshot (step 70's, or an in-memory one's before it) flags step 65 and restores the
    # newest snapshot before it in place; the replay gives step 65 its loss again, bit for bit (the data's,
    # not the machine's), so the next check restores once more, the replay skips 65, and trains on to 90
    code, out, err = finish(launch(logdir, "--spike-at", "65", target=SPIKE_TRAIN,  # (no restart: no hot standby)
                                   opts=("--on-spike", "rollback", "--standby", "fork")),
                            240)
    said = out + err
    assert code == 0, said
    (found,) = _events(logdir, "spike_detected")
    assert (found["step"], found["onset"], found["action"]) == (65, 65, "rollback"), found
    assert found["loss"] > 40 * found["median"] and found["median"] < found["threshold"] < found["loss"], found
    (replayed,) = _events(logdir, "spike_replayed")
    assert (replayed["step"], replayed["reproduced"], replayed["replay_loss"]) == (65, True, found["loss"]), replayed
    first, second = _events(logdir, "rolled_back")  # to replay it, then to skip it
    assert (first["step"], first["skip"], second["step"], second["skip"]) == (65, False, 65, True), (first, second)
    assert 30 <= first["restored_step"] < 65 and 30 <= second["restored_step"] < 65, (first, second)
    assert [e["step"] for e in _events(logdir, "step_skipped")] == [65]
    assert "replaying step 65 to tell a transient fault of the machine from the data's; training on" in said, said
    assert "and so again when replayed, bit for bit; --on-spike rollback: restored step " in said, said
    assert "then skipping step 65; training on" in said and said.count("spiked") == 2, said
    assert [e["role"] for e in _events(logdir, "spawned")].count("trainer") == 1  # in place: no restart
    # procsv status --json (the watchdog's view of the run, issue 68): the spike seen, the last one as its record
    # says it; its replay found it the data's: no transient fault, no suspect host (suspect from 3, the default)
    status = status_json(logdir)
    assert status is not None
    spikes = status["spikes"]
    assert (spikes["seen"], spikes["by_action"], spikes["transient_faults"], spikes["suspect_hosts"],
            spikes["suspect_after"]) == (1, {"rollback": 1}, {}, [], 3), spikes
    assert spikes["last"] == {k: found[k] for k in ("step", "onset", "loss", "threshold", "median", "action")}, spikes
    assert f"  loss spikes: 1 seen (rollback 1); the last at step 65: loss {found['loss']:.3g} against a threshold " \
        f"of {found['threshold']:.3g}, rollback" in render_status(status, logdir), render_status(status, logdir)
    plain = os.path.join(tmp_path, "plain")  # python spike_train.py --skip-at 65: never saw that batch
    run_plain_programs([(SPIKE_TRAIN, ("--logdir", plain, "--skip-at", "65"))], env=quiet_env())
    rolled_back, baseline = _final(logdir), _final(plain)
    for key in KEYS:
        assert rolled_back[key] == baseline[key], key  # bit-equal
    spiked = os.path.join(tmp_path, "spiked")  # (and the spike's update was a real one: not equal to it)
    run_plain_programs([(SPIKE_TRAIN, ("--logdir", spiked, "--spike-at", "65", "--on-spike", "off"))], env=quiet_env())
    assert not np.array_equal(np.frombuffer(_final(spiked)[KEYS[0]], np.float32),
                              np.frombuffer(baseline[KEYS[0]], np.float32))


@pytest.mark.slow
def test_in_plain_python_warn_says_it_and_trains_on_and_stop_exits_4_without_a_checkpoint_of_the_spike(
        tmp_path: pathlib.Path) -> None:
    base = ("--spike-at", "45", "--steps", "50", "--window", "20", "--min-history", "15", "--step-delay", "0")
    warned = run_python([SPIKE_TRAIN, "--logdir", os.path.join(tmp_path, "warn"), *base],  # (warn: the default)
                        env=quiet_env(), timeout=180)
    assert warned.returncode == 0, warned.stderr
    assert warned.stderr.count("procsv: the loss of step 45 spiked: ") == 1, warned.stderr
    assert "; --on-spike warn: training on" in warned.stderr and "spike_train: ended at step 50" in warned.stdout
    stopped_dir = os.path.join(tmp_path, "stop")
    stopped = run_python([SPIKE_TRAIN, "--logdir", stopped_dir, *base, "--on-spike", "stop", "--save-steps", "5"],
                         env=quiet_env(), timeout=180)
    assert stopped.returncode == 4, stopped.stderr
    assert "--on-spike stop: stopping in order with exit code 4 (diverging), without a checkpoint of this state " \
           "(the newest committed checkpoint is of step " in stopped.stderr, stopped.stderr
    assert "spike_train: ended" not in stopped.stdout
    latest = tf.train.latest_checkpoint(stopped_dir)
    assert latest is not None and int(latest.rsplit("-", 1)[1]) < 45, latest


@pytest.mark.slow
def test_in_plain_python_a_monitored_sessions_spike_is_skipped_and_a_transient_one_kept_each_bit_equal(
        tmp_path: pathlib.Path) -> None:
    # procsv.train's eager MonitoredTrainingSession takes the custom loop's path (it takes no on_spike: the
    # launch's variable says rollback here, as procsv launch --on-spike rollback would); the rule's defaults.
    # A transient spike (step 65's batch scaled the first time this process runs it only, as a miscomputed
    # step would be) is rolled back and replayed, and, the replay's loss of step 65 not being the first one,
    # kept: the run ends bit-equal to one that never spiked (nothing skipped; the spike's update undone)
    folder = {name: os.path.join(tmp_path, name) for name in ("rolled", "plain", "transient", "clean")}
    common = ("--monitored", "--steps", "190", "--step-delay", "0.002")
    run_plain_programs([(SPIKE_TRAIN, ("--logdir", folder["rolled"], "--spike-at", "165", *common)),
                        (SPIKE_TRAIN, ("--logdir", folder["plain"], "--skip-at", "165", *common)),
                        (SPIKE_TRAIN, ("--logdir", folder["transient"], "--transient-at", "65")),
                        (SPIKE_TRAIN, ("--logdir", folder["clean"]))],
                       env=quiet_env(PROCSV_ON_SPIKE="rollback"))  # (the plain runs have no spike to roll back)
    assert _final(folder["rolled"], 190) == _final(folder["plain"], 190)
    assert _final(folder["transient"]) == _final(folder["clean"])


@pytest.mark.slow
def test_in_plain_python_a_keras_fits_spike_is_skipped_and_a_transient_one_kept_bit_equal_to_a_fit_without_the_batch(
        tmp_path: pathlib.Path) -> None:
    # before: BackupAndRestore refused --on-spike rollback at fit's start (UsageError). Now fit's batches are kept
    # for a spike's replay as for a NaN's: keras_nan.py, 6 epochs of 10 batches, a target with noise (a flat
    # noisy loss), BackupAndRestore(on_spike="rollback") with the rule's window 20, min_history 15. Batch 37's
    # loss is 50x the first time it is computed only (step 38, a miscomputed step): restored, replayed, not
    # again: kept. Batch 49 is scaled 7-fold (step 50, loss ~50x): replayed, again bit for bit: skipped. The fit
    # ends bit-equal to a plain fit whose batch 49 has sample weight 0 (SGD: no update) and batch 37 is plain
    common = ("--epochs", "6", "--noise", "0.5", "--op-determinism")
    rolled, plain = os.path.join(tmp_path, "rolled.npz"), os.path.join(tmp_path, "plain.npz")
    done = run_plain_programs([(KERAS_NAN, ("--backup-dir", os.path.join(tmp_path, "run"), "--on-spike", "rollback",
                                            "--spike-at", "49", "--transient-at", "37", "--weights-out", rolled,
                                            *common)),
                               (KERAS_NAN, ("--no-callback", "--zero-weight-at", "49", "--weights-out", plain,
                                            *common))], env=quiet_env())
    said = done.stdout + done.stderr
    assert "procsv: the loss of step 38 spiked: " in said and "replaying step 38 to tell a transient fault" in said, said
    assert "procsv: the loss spike at step 38 did not come again when replayed" in said, said
    assert said.count("procsv: the loss of step 50 spiked: ") == 2, said
    assert "and so again when replayed, bit for bit; --on-spike rollback: restored step " in said, said
    assert "then skipping step 50; training on" in said and "fit done: 59 iterations" in said, said
    with np.load(rolled) as a, np.load(plain) as b:
        assert len(a.files) == len(b.files) == 5  # 4 weights, then the optimizer's iteration count
        for key in a.files[:4]:
            assert a[key].dtype == b[key].dtype and a[key].tobytes() == b[key].tobytes(), key  # bit-equal
        assert int(a[a.files[4]]) == 59 and int(b[b.files[4]]) == 60  # the skipped batch counts no iteration


@pytest.mark.slow
def test_a_keras_fits_spike_and_nan_skips_survive_a_restart_from_a_checkpoint_older_than_them(
        logdir: str, tmp_path: pathlib.Path) -> None:
    # before: a restarted fit did not skip again the steps this run had skipped (NonfiniteRollback.resume left
    # Keras fit out: fit's resume draws batches by position), and the new trainer had no loss history to find
    # the spike again: it trained batch 49. Now the watchdog's skipped steps reach fit too, and fit's loop draws
    # such a step's batch and trains none. keras_nan.py, 6 epochs of 10 batches, checkpoints every 30 batches,
    # no in-memory snapshot: batch 42's input is NaN (step 43: rolled back, retried, skipped), batch 49 is
    # scaled 7-fold (step 50: spiked, replayed, again bit for bit, skipped); the trainer is SIGKILLed after
    # batch 53, before the checkpoint of step 60: the restarted one restores an older one (step 31) and skips 43 and 50 again.
    # Bit-equal to a plain fit whose batches 42 and 49 have sample weight 0 (SGD: no update)
    common = ("--epochs", "6", "--noise", "0.5", "--op-determinism")
    rolled, plain = os.path.join(tmp_path, "rolled.npz"), os.path.join(tmp_path, "plain.npz")
    kill_file = os.path.join(tmp_path, "kill-me")
    proc = launch(logdir, "--on-spike", "rollback", "--spike-at", "49", "--nan-at", "42", "--save-freq", "30",
                  "--kill-after", "53", "--kill-file", kill_file, "--weights-out", rolled, *common, target=KERAS_NAN,
                  opts=("--standby", "fork"), env=quiet_env(PROCSV_MEMORY_SNAPSHOTS="0"))  # (the restart: a fork)
    code, out, err = sigkill_where_it_says(proc, logdir, kill_file, "batch 53")
    said = out + err
    assert code == 0, said
    assert re.search(r"was killed by SIGKILL; restart(ed|ing in \d)", said) and "skipped step 43 (" in said, said
    assert "and so again when replayed, bit for bit; --on-spike rollback: restored step " in said, said
    assert [e["step"] for e in _events(logdir, "restored")][-1] < 43, said  # older than both skips
    for step in (43, 50):  # the restarted trainer's own lines
        assert f"[trainer.2] procsv: skipping step {step} again (this run skipped it before)" in said, said
    assert skipped_steps(logdir) == [43, 50], said
    assert said.count("procsv: the loss of step 50 spiked: ") == 2, said  # (the restarted trainer trains no spike)
    run_plain_programs([(KERAS_NAN, ("--no-callback", "--zero-weight-at", "42", "--zero-weight-at", "49",
                                     "--weights-out", plain, *common))], env=quiet_env())
    with np.load(rolled) as a, np.load(plain) as b:
        for key in a.files[:4]:
            assert a[key].dtype == b[key].dtype and a[key].tobytes() == b[key].tobytes(), key  # bit-equal
        assert int(a[a.files[4]]) == 58 and int(b[b.files[4]]) == 60  # the skipped batches count no iteration


@pytest.mark.slow
def test_in_plain_python_a_keras_fits_spike_whose_batches_are_not_kept_gets_no_verdict(tmp_path: pathlib.Path) -> None:
    # before: with the batches since the restored state not kept (here none: replay_memory_bytes=0), the rollback
    # went on with fit's next batches as the steps from the restored one, and the spike's "replay" at step 50 judged
    # another batch's loss: "did not come again when replayed": taken for a transient fault of the machine. Now the
    # verdict is dropped, said in the rollback's line (keras_nan.py, 9 epochs of 10 batches, batch 49 scaled 7-fold)
    done = run_python([KERAS_NAN, "--backup-dir", os.path.join(tmp_path, "run"), "--on-spike", "rollback",
                       "--spike-at", "49", "--epochs", "9", "--noise", "0.5", "--op-determinism",
                       "--replay-memory-mib", "0"], env=quiet_env(), timeout=180)
    assert done.returncode == 0, done.stderr
    said = done.stdout + done.stderr
    assert "procsv: the loss of step 50 spiked: " in said and "of fit's batches are not trained again" in said, said
    assert "; step 50 not replayed: no verdict on whose the spike was; training on" in said, said
    assert "did not come again when replayed" not in said and "transient fault" not in said, said
