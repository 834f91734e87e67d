"""procsv.keras.BackupAndRestore: Keras fit under procsv launch, killed for real, resumed exactly.

Every run here is the built-in example ``procsv.examples.keras_fit`` (the digits MLP, 45 batches
an epoch) in real processes. "Bit-identical" compares the final weights with those of a plain
``fit`` of the same program without any callback, run in a process of its own (one for the plain
fits of every input kind, one after another).
"""

from __future__ import annotations

import fcntl
import json
import os
import random
import re
import shutil
import signal
import sys
import time
from typing import Any

import numpy as np
import pytest
import tensorflow as tf
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from conftest import (PROGRAMS, REPO, run_python, committed_steps, finish, launch, lifecycle, quiet_env, raw_status,
                      sigkill_attempts_after_their_commits, status_json, trainer_of_attempt, wait_for)

pytestmark = pytest.mark.slow  # starts TensorFlow processes: not in the quick tier

EXAMPLE = "procsv.examples.keras_fit"
BATCHES_PER_EPOCH = 45  # ceil(1438 training digits / 32)
KINDS = ("tfdata", "numpy", "pydataset")
# for the launches whose trainer is never replaced (no restart, nothing about restarts asserted): no hot
# standby is made to wait unused (--standby fork: the pre-warmed trainer only). Of the launches that
# restart it, the tf.data one of the three SIGKILLs keeps the default (a fit resumed by a promoted standby,
# what users get); the others fork their restarts: each standby prepared after a promotion cost ~0.6 CPU-s
NO_STANDBY = ("--standby", "fork")


_PLAIN_FITS = """
import sys
from procsv.examples.keras_fit import main
folder, epochs = sys.argv[1], sys.argv[2]
for kind in sys.argv[3:]:
    assert main(["--no-callback", "--input", kind, "--epochs", epochs, "--weights-out", f"{folder}/{kind}.npz"]) == 0
"""


def _plain_fits(epochs: int, folder: str) -> None:
    """The plain fit of the example (no callback) of every input kind, one after another in one process
    (one start of TensorFlow, not three): each seeds Keras and makes its model and input anew."""
    done = run_python(["-c", _PLAIN_FITS, folder, str(epochs), *KINDS], env=quiet_env(), cwd=REPO, timeout=300)
    assert done.returncode == 0, done.stderr


@pytest.fixture(scope="module")
def reference(shared_result):
    """reference(kind, epochs): the final weights of an uninterrupted plain fit (computed once per
    session for every kind, whichever pytest-xdist worker first needs one: several tests compare with
    the same one)."""
    cache: dict[tuple[str, int], list[np.ndarray]] = {}

    def get(kind: str, epochs: int) -> list[np.ndarray]:
        if (kind, epochs) not in cache:
            folder = shared_result(f"keras-references-{epochs}", lambda f: _plain_fits(epochs, f))
            cache[(kind, epochs)] = _weights(os.path.join(folder, f"{kind}.npz"))
        return cache[(kind, epochs)]

    return get


def _weights(path: str) -> list[np.ndarray]:
    with np.load(path) as data:
        return [data[f"arr_{i}"] for i in range(len(data.files))]


def _bit_identical(a: list[np.ndarray], b: list[np.ndarray]) -> bool:
    return len(a) == len(b) and all(x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes()
                                    for x, y in zip(a, b))


def _position(prefix: str) -> tuple[int, int, int]:
    """(epoch, batch done in it, batches trained in all) of a committed checkpoint, read by TF (the program's
    first fit: ``fit/epoch`` is the epoch alone, :mod:`procsv.trainer.keras.resume`)."""
    reader = tf.train.load_checkpoint(prefix)
    get = reader.get_tensor
    return (int(get("fit/epoch/.ATTRIBUTES/VARIABLE_VALUE")), int(get("fit/batch/.ATTRIBUTES/VARIABLE_VALUE")),
            int(get("global_step/.ATTRIBUTES/VARIABLE_VALUE")))


def _resumes(out: str) -> list[tuple[int, int, int]]:
    """The (epoch, batch, batches trained) of every "fit resumes at ..." line, 1-based as printed."""
    return [(int(e), int(b), int(n)) for e, b, n in
            re.findall(r"fit resumes at epoch (\d+), batch (\d+) \((\d+) batches trained", out)]


@pytest.mark.parametrize("kind", KINDS)
def test_three_sigkills_at_random_batches_resume_mid_epoch_and_end_bit_identical(kind, short_tmp, reference):
    logdir, out_path = os.path.join(short_tmp, "run"), os.path.join(short_tmp, "w.npz")
    epochs = 4  # 180 batches; each attempt is killed within ~0.3 s of its first commit (every 7 batches)
    proc = launch(logdir, "--input", kind, "--epochs", str(epochs), "--save-freq", "7", "--batch-delay", "0.02",
                  "--weights-out", out_path, target=EXAMPLE, opts=() if kind == "tfdata" else NO_STANDBY)
    try:
        sigkill_attempts_after_their_commits(logdir, 3, random.Random(kind), 0.3)  # each at a random batch
    finally:
        code, out, err = finish(proc, 300)
    assert code == 0, err
    deaths = [e for e in lifecycle(logdir) if e["event"] == "exited" and e["role"] == "trainer"
              and e.get("signal") == "SIGKILL"]
    assert len(deaths) == 3
    resumes = _resumes(out)
    assert len(resumes) == 3, out
    for epoch, batch, trained in resumes:  # each resume lands on the batch after the restored one
        assert trained == (epoch - 1) * BATCHES_PER_EPOCH + batch - 1
    assert any(batch > 1 for _, batch, _ in resumes), resumes  # at least one resume in mid-epoch
    assert status_json(logdir)["step"] == epochs * BATCHES_PER_EPOCH
    assert _bit_identical(_weights(out_path), reference(kind, epochs))


FULL_EPOCHS = 4  # as the SIGTERM tests' fits: one plain reference serves them all


def _full_fit(folder: str) -> None:
    code, out, err = finish(launch(os.path.join(folder, "run"), "--epochs", str(FULL_EPOCHS), "--weights-out",
                                   os.path.join(folder, "w.npz"), target=EXAMPLE, opts=NO_STANDBY), 300)
    assert code == 0, err


@pytest.fixture
def full_fit(shared_result) -> str:
    """The folder of one uninterrupted fit under procsv launch (``run/`` its logdir, ``w.npz`` its final
    weights), made once per session: one test reads it, another resumes a copy of it."""
    return shared_result(f"keras-fit-full-{FULL_EPOCHS}", _full_fit)


def test_a_full_fit_under_procsv_equals_plain_fit_and_logs_its_scalars_through_the_summary_service(
        full_fit, reference):
    logdir, out_path = os.path.join(full_fit, "run"), os.path.join(full_fit, "w.npz")
    assert _bit_identical(_weights(out_path), reference("tfdata", FULL_EPOCHS))  # the callback changes nothing
    # the completed fit's final commit: past its last epoch (a rerun of the program's fit trains nothing of it)
    assert _position(tf.train.latest_checkpoint(logdir)) == (FULL_EPOCHS, 0, FULL_EPOCHS * BATCHES_PER_EPOCH)
    acc = EventAccumulator(logdir, size_guidance={"tensors": 0, "scalars": 0})
    acc.Reload()
    tags = set(acc.Tags()["tensors"]) | set(acc.Tags()["scalars"])
    for tag in ("epoch_loss", "epoch_accuracy", "epoch_val_loss", "epoch_val_accuracy", "epoch_learning_rate",
                "batch_loss", "batch_learning_rate"):
        assert tag in tags, tags
    assert [step for step, _ in _scalar_events(acc, "epoch_loss")] == list(range(FULL_EPOCHS))
    batch_lr = _scalar_events(acc, "batch_learning_rate")  # logged with the batch scalars (Adam(1e-3))
    assert batch_lr and all(value == pytest.approx(1e-3) for _, value in batch_lr), batch_lr
    assert not [f for f in os.listdir(logdir) if f.startswith("events.out") and "procsv" not in f]


def _scalar_events(acc: EventAccumulator, tag: str) -> list[tuple[int, float]]:
    """(step, value) of every event of a scalar ``tag`` (written as a tensor or as a plain scalar)."""
    if tag in acc.Tags()["tensors"]:
        return [(e.step, float(tf.make_ndarray(e.tensor_proto))) for e in acc.Tensors(tag)]
    return [(e.step, e.value) for e in acc.Scalars(tag)]


BATCH_DELAY = 0.02  # --batch-delay of the SIGTERM tests: a batch takes at least this long
SIGNAL_MARGIN = 0.25  # seconds a test may take from reading the status to its signal taking effect


def _wait_mid_second_epoch(logdir: str) -> int:
    """Wait until the trainer is past the first epoch and a signal sent now is sure to land in
    mid-epoch; returns the step seen then. ``status.json``'s step is up to half a second old (it is
    written every 0.5 s, from a ``Progress`` up to 0.1 s old), long enough for the epoch to end
    meanwhile; but a batch takes at least BATCH_DELAY, so the batches done by the time the signal
    takes effect are bounded: the wait ends only when that bound is still short of the epoch's end."""
    def mid_epoch_step() -> int:
        st = raw_status(logdir) or {}
        step: int = st.get("step", 0)
        age = time.time() - st.get("updated_at", 0.0)
        most = step + int((age + 0.1 + SIGNAL_MARGIN) / BATCH_DELAY) + 1  # batches done at the latest
        done, late = step % BATCHES_PER_EPOCH, most - step // BATCHES_PER_EPOCH * BATCHES_PER_EPOCH
        return step if step > BATCHES_PER_EPOCH and done > 0 and late < BATCHES_PER_EPOCH - 1 else 0

    seen: int = wait_for(mid_epoch_step, 120, interval=0.02, what="a batch early in an epoch, past the first epoch")
    return seen


def _launch_and_sigterm_mid_epoch(logdir: str, out_path: str, *extra: str) -> tuple[int, int, int]:
    proc = launch(logdir, "--epochs", "4", "--batch-delay", str(BATCH_DELAY), "--weights-out", out_path, *extra,
                  target=EXAMPLE, opts=NO_STANDBY)
    try:
        _wait_mid_second_epoch(logdir)
        proc.send_signal(signal.SIGTERM)
    finally:
        code, out, err = finish(proc, 300)
    assert code == 128 + signal.SIGTERM, err
    assert not os.path.exists(out_path)  # a stopped fit is no finished fit
    return _position(tf.train.latest_checkpoint(logdir))


def _sigterm_mid_epoch_with_delete_checkpoint(folder: str) -> None:
    logdir = os.path.join(folder, "run")
    os.makedirs(logdir)
    with open(os.path.join(logdir, "notes.txt"), "w") as fh:
        fh.write("mine")
    _launch_and_sigterm_mid_epoch(logdir, os.path.join(folder, "w.npz"), "--delete-checkpoint")


def _relaunch_stopped_mid_epoch(seed: str, folder: str) -> None:
    """A copy of the stopped fit ``seed`` (``run/``) relaunched to its end with ``--delete-checkpoint`` (final
    weights ``w.npz``); what the stopped fit held before (its newest checkpoint's position, the step of
    its status.json, its committed steps) and the relaunch's exit code and output go to ``result.json``."""
    logdir, out_path = os.path.join(folder, "run"), os.path.join(folder, "w.npz")
    shutil.copytree(seed, logdir, ignore=shutil.ignore_patterns("lock"))
    position = _position(tf.train.latest_checkpoint(logdir))
    before = {"position": position, "status_step": status_json(logdir)["step"], "committed": committed_steps(logdir)}
    code, out, err = finish(launch(logdir, "--epochs", "4", "--weights-out", out_path, "--delete-checkpoint",
                                   target=EXAMPLE, opts=NO_STANDBY), 300)
    with open(os.path.join(folder, "result.json"), "w") as fh:
        json.dump({**before, "code": code, "out": out, "err": err}, fh)


@pytest.fixture(scope="module")
def stopped_mid_epoch(shared_result) -> str:
    """The logdir of one fit (tfdata, 4 epochs, save_freq "epoch", ``--delete-checkpoint``, a file
    ``notes.txt`` of the user's beside it) that ``procsv launch`` stopped on SIGTERM in mid-epoch,
    past the first epoch (exit 143, no final weights written: asserted when it is made), made once
    per session: its newest checkpoint is the stop's commit, the one before it the end of epoch 1.
    Tests copy it (or relaunch a copy): it is read-only."""
    return os.path.join(shared_result("keras-fit-sigterm-mid-epoch", _sigterm_mid_epoch_with_delete_checkpoint), "run")


@pytest.fixture(scope="module")
def stopped_mid_epoch_relaunched(shared_result, stopped_mid_epoch) -> dict[str, Any]:
    """One fit (tfdata, 4 epochs, save_freq "epoch", ``--delete-checkpoint``, a file ``notes.txt`` of
    the user's beside it) that ``procsv launch`` stopped on SIGTERM in mid-epoch, past the first epoch
    (exit 143, no final weights written: asserted when it is made), then a copy of it relaunched to
    its end with ``--delete-checkpoint`` as well. Both runs are made once per session; the two tests
    below look at the same relaunch (each relaunched a copy of its own before, one of them without
    ``--delete-checkpoint``, which acts only once the fit completes). Keys: ``logdir`` (the relaunched
    copy, after its end), ``out_path`` (its final weights), ``position``, ``status_step`` and
    ``committed`` (of the stopped fit, read before the relaunch), ``code``, ``out``, ``err`` (the
    relaunch's)."""
    seed = stopped_mid_epoch
    folder = shared_result("keras-fit-sigterm-mid-epoch-relaunched", lambda f: _relaunch_stopped_mid_epoch(seed, f))
    with open(os.path.join(folder, "result.json")) as fh:
        result: dict[str, Any] = json.load(fh)
    result["position"] = tuple(result["position"])
    return {**result, "logdir": os.path.join(folder, "run"), "out_path": os.path.join(folder, "w.npz")}


def test_sigterm_mid_epoch_commits_the_batch_that_finished_and_a_relaunch_resumes_there(
        stopped_mid_epoch, stopped_mid_epoch_relaunched, reference):
    # the stopped fit ran with delete_checkpoint, which acts only once a fit completes (the test below)
    run = stopped_mid_epoch_relaunched
    epoch, batch, trained = run["position"]
    assert 0 < batch < BATCHES_PER_EPOCH and trained == epoch * BATCHES_PER_EPOCH + batch
    # the stop's commit holds the epoch's training metrics at that batch (the loss's and accuracy's counts: the
    # samples of its batches so far), not those of fit's validation at the epoch's end, which runs after a stop
    # too and refilled them (its 359 samples): a resume put them back at the epoch's start, and an audit's replay to
    # that step found them differ (a false mismatch)
    stop = tf.train.load_checkpoint(tf.train.latest_checkpoint(stopped_mid_epoch))
    counts = [float(stop.get_tensor(f"metrics/{v}/.ATTRIBUTES/VARIABLE_VALUE")) for v in ("v1", "v3")]
    assert counts == [batch * 32.0] * 2, (counts, batch)
    assert run["status_step"] == trained == run["committed"][-1]
    code, out, err = run["code"], run["out"], run["err"]
    assert code == 0, err
    assert _resumes(out) == [(epoch + 1, batch + 1, trained)]
    # past the first epoch, a seeded tf.data shuffle is put back without reading its earlier epochs
    assert f"input of {epoch} epoch(s) put back in" in out and "no batch drawn" in out, out
    assert _bit_identical(_weights(run["out_path"]), reference("tfdata", 4))


def test_sigterm_to_the_trainer_itself_commits_its_batch_exits_42_and_the_launch_restarts_it_there(
        short_tmp, reference):
    # a preemption of the trainer alone (not of the launch, as above): "saved, restart me", and
    # the watchdog restarts it at once; save_freq is "epoch", so a mid-epoch resume is the stop's commit
    logdir, out_path = os.path.join(short_tmp, "run"), os.path.join(short_tmp, "w.npz")
    proc = launch(logdir, "--epochs", "4", "--batch-delay", str(BATCH_DELAY), "--weights-out", out_path,
                  target=EXAMPLE, opts=NO_STANDBY)
    try:
        seen = _wait_mid_second_epoch(logdir)
        os.kill(wait_for(lambda: trainer_of_attempt(logdir, 1), 30, what="trainer attempt 1"), signal.SIGTERM)
    finally:
        code, out, err = finish(proc, 300)
    assert code == 0, err
    exits = [e for e in lifecycle(logdir) if e["event"] == "exited" and e["role"] == "trainer"]
    assert [(e["attempt"], e.get("code")) for e in exits] == [(1, 42), (2, 0)], exits
    (epoch, batch, trained), = _resumes(out)
    assert 1 < batch <= BATCHES_PER_EPOCH and trained == (epoch - 1) * BATCHES_PER_EPOCH + batch - 1
    assert trained >= seen  # the batches done when the signal came, not an older checkpoint's
    assert status_json(logdir)["step"] == 4 * BATCHES_PER_EPOCH
    assert _bit_identical(_weights(out_path), reference("tfdata", 4))  # no batch trained twice or skipped


def test_a_corrupt_newest_backup_falls_back_to_the_previous_one_and_still_ends_bit_identical(
        stopped_mid_epoch, short_tmp, reference):
    """A copy of the fit stopped in mid-epoch (its newest backup the stop's commit, the one before it
    epoch 1's end: each test stopped a fit of its own before, this one with ``--save-freq 5``), its
    newest backup's data corrupted by one flipped byte: the relaunch says so, resumes from the
    previous backup and ends bit-identical to the plain fit."""
    logdir, out_path = os.path.join(short_tmp, "run"), os.path.join(short_tmp, "w.npz")
    shutil.copytree(stopped_mid_epoch, logdir, ignore=shutil.ignore_patterns("lock"))
    steps = committed_steps(logdir)
    assert len(steps) >= 2
    newest = f"model.ckpt-{steps[-1]}"
    data = sorted(f for f in os.listdir(logdir) if f.startswith(newest + ".data"))
    with open(os.path.join(logdir, data[0]), "r+b") as fh:  # one flipped byte in the middle
        fh.seek(os.path.getsize(fh.name) // 2)
        byte = fh.read(1)
        fh.seek(-1, os.SEEK_CUR)
        fh.write(bytes([byte[0] ^ 0xFF]))
    previous = _position(os.path.join(logdir, f"model.ckpt-{steps[-2]}"))
    code, out, err = finish(launch(logdir, "--epochs", "4", "--weights-out", out_path, target=EXAMPLE,
                                   opts=NO_STANDBY), 300)
    assert code == 0, err
    assert newest in err + out  # said, not silent
    assert _resumes(out) == [(previous[0] + 1, previous[1] + 1, previous[2])]
    assert _bit_identical(_weights(out_path), reference("tfdata", 4))


def test_delete_checkpoint_removes_only_procsvs_checkpoint_files_when_fit_completes(short_tmp):
    logdir = os.path.join(short_tmp, "run")
    os.makedirs(logdir)
    with open(os.path.join(logdir, "notes.txt"), "w") as fh:
        fh.write("mine")
    done = run_python(["-m", EXAMPLE, "--logdir", logdir, "--epochs", "1", "--save-freq", "10", "--delete-checkpoint"],
                      env=quiet_env(), cwd=REPO, timeout=300)
    assert done.returncode == 0, done.stderr
    left = sorted(os.listdir(logdir))
    assert "notes.txt" in left and any(f.startswith("events.out.tfevents") for f in left)
    assert not [f for f in left if f.startswith("model.ckpt") or f == "checkpoint"], left
    assert committed_steps(logdir) == [] and tf.train.latest_checkpoint(logdir) is None


def test_delete_checkpoint_keeps_the_backup_of_an_interrupted_fit_and_deletes_only_procsvs_once_it_completes(
        stopped_mid_epoch_relaunched, reference):
    # as Keras: the backup goes only when fit completes; a stopped fit is no completed fit
    run = stopped_mid_epoch_relaunched
    logdir = run["logdir"]
    epoch, batch, trained = run["position"]
    assert run["committed"][-1] == trained and 0 < batch < BATCHES_PER_EPOCH
    code, out, err = run["code"], run["out"], run["err"]
    assert code == 0, err
    assert _resumes(out) == [(epoch + 1, batch + 1, trained)]
    assert _bit_identical(_weights(run["out_path"]), reference("tfdata", 4))
    left = sorted(os.listdir(logdir))
    assert "notes.txt" in left and any(f.startswith("events.out.tfevents") for f in left)
    assert not [f for f in left if f.startswith("model.ckpt") or f == "checkpoint"], left
    assert committed_steps(logdir) == [] and tf.train.latest_checkpoint(logdir) is None


def _delete_under_a_restore(folder: str) -> None:
    """One fit of an epoch (``--save-freq 10 --delete-checkpoint --unseeded``) launched in ``run/`` while
    this process holds the shared flock a restoring trainer holds on ``.procsv/restore.lock``, until the
    checkpoint service says it deletes the checkpoints once the restore ends; what was there then, and
    the launch's exit code and output go to ``result.json``."""
    logdir = os.path.join(folder, "run")
    os.makedirs(os.path.join(logdir, ".procsv"))
    lock = os.open(os.path.join(logdir, ".procsv", "restore.lock"), os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(lock, fcntl.LOCK_SH)  # as a restoring trainer holds it
    proc = launch(logdir, "--epochs", "1", "--save-freq", "10", "--delete-checkpoint", "--unseeded", target=EXAMPLE,
                  opts=NO_STANDBY)
    try:
        log = os.path.join(logdir, "logs", "checkpoint.1.log")
        wait_for(lambda: proc.poll() is not None or (os.path.exists(log) and "deleting the checkpoints once"
                                                     in open(log).read()), 300, what="the service's deletion")
        then = {"alive": proc.poll() is None, "committed": committed_steps(logdir),
                "latest": tf.train.latest_checkpoint(logdir)}
    finally:
        os.close(lock)  # the restore ends
        code, out, err = finish(proc, 120)
    with open(os.path.join(folder, "result.json"), "w") as fh:
        json.dump({**then, "code": code, "out": out, "err": err}, fh)


@pytest.fixture(scope="module")
def deleted_under_a_restore(shared_result) -> dict[str, Any]:
    """The launch of :func:`_delete_under_a_restore`, made once per session: the two tests below look at
    it (each made a launch of its own before; ``--unseeded``, the other test's, changes only the order
    of the batches, which nothing here compares). Keys: ``logdir`` (after the launch's end), ``alive``,
    ``committed``, ``latest`` (when the service said it would delete), ``code``, ``out``, ``err``."""
    folder = shared_result("keras-fit-delete-under-a-restore", _delete_under_a_restore)
    with open(os.path.join(folder, "result.json")) as fh:
        result: dict[str, Any] = json.load(fh)
    return {**result, "logdir": os.path.join(folder, "run")}


def test_delete_checkpoint_deletes_through_the_checkpoint_service_which_waits_for_a_restore(deleted_under_a_restore):
    # before: the trainer unlinked the files itself (a second writer, invariant 1), under a restore
    # in progress too (a shared flock on .procsv/restore.lock): here it deleted them at once
    run = deleted_under_a_restore
    logdir, code, err = run["logdir"], run["code"], run["err"]
    assert run["alive"] and run["committed"], "deleted under a restore"
    assert run["latest"] is not None
    assert code == 0, err
    assert committed_steps(logdir) == [] and tf.train.latest_checkpoint(logdir) is None
    assert not [f for f in os.listdir(logdir) if f.startswith("model.ckpt") or f == "checkpoint"]
    with open(os.path.join(logdir, "logs", "checkpoint.1.log")) as fh:
        assert "deleted " in fh.read()  # by the service


def test_an_unseeded_shuffle_is_said_at_start(deleted_under_a_restore):
    code, out, err = deleted_under_a_restore["code"], deleted_under_a_restore["out"], deleted_under_a_restore["err"]
    assert code == 0, err
    lines = [line for line in (out + err).splitlines() if "will not be bit-exact" in line]
    assert lines and "shuffles without a seed" in lines[0], err


def test_an_infinite_dataset_without_steps_per_epoch_is_one_clear_error_and_no_restart(short_tmp):
    logdir = os.path.join(short_tmp, "run")
    code, out, err = finish(launch(logdir, "infinite", target=os.path.join(PROGRAMS, "keras_bad.py")), 180)
    assert code != 0
    assert "UsageError: model.fit got an infinite dataset without steps_per_epoch" in err
    assert "pass steps_per_epoch=N to fit()" in err
    assert len([e for e in lifecycle(logdir) if e["event"] == "spawned" and e.get("role") == "trainer"]) == 1
    assert committed_steps(logdir) == []


def test_a_changed_model_on_resume_is_an_error_naming_the_variable(full_fit, short_tmp):
    logdir = os.path.join(short_tmp, "run")  # a copy of a completed fit of the 64-unit model
    shutil.copytree(os.path.join(full_fit, "run"), logdir, ignore=shutil.ignore_patterns("lock"))
    kept = committed_steps(logdir)
    code, out, err = finish(launch(logdir, "--epochs", str(FULL_EPOCHS + 1), "--hidden", "32", target=EXAMPLE), 300)
    assert code != 0
    assert "MismatchedCheckpoint" in err and "model" in err and "kernel" in err, err
    assert committed_steps(logdir) == kept  # the checkpoint of the other model is kept as it was


def test_fit_on_a_model_never_compiled_is_kerass_clear_error_and_no_restart_storm(short_tmp):
    logdir = os.path.join(short_tmp, "run")
    code, out, err = finish(launch(logdir, "uncompiled", target=os.path.join(PROGRAMS, "keras_bad.py")), 180)
    assert code != 0
    assert "must call `compile()` before" in err, err
    spawns = [e for e in lifecycle(logdir) if e["event"] == "spawned" and e.get("role") == "trainer"]
    assert 1 <= len(spawns) <= 2, spawns  # the start-up failure policy: one retry at most, then it gives up
    assert "giving up" in err and committed_steps(logdir) == []


def test_fit_on_a_model_never_built_is_one_clear_error_and_no_restart(short_tmp):
    logdir = os.path.join(short_tmp, "run")
    code, out, err = finish(launch(logdir, "unbuilt", target=os.path.join(PROGRAMS, "keras_bad.py")), 180)
    assert code != 0
    assert ("UsageError: procsv.keras.BackupAndRestore: model 'no_input' is not built; build it before fit() "
            "(give it a keras.Input, or call it on a batch)") in err, err
    spawns = [e for e in lifecycle(logdir) if e["event"] == "spawned" and e.get("role") == "trainer"]
    assert len(spawns) == 1, spawns  # a UsageError before the first step: given up at once
    assert "the trainer cannot start: UsageError" in err and committed_steps(logdir) == []


def test_a_resume_reading_its_input_longer_than_the_startup_timeout_is_not_killed_as_hung(short_tmp):
    # a PyDataset is drawn again on resume (1 s an epoch here): 12 epochs take longer than
    # --startup-timeout 10 s, yet the trainer reports as it reads, and the watchdog gives each report the limit
    logdir = os.path.join(short_tmp, "run")
    program = os.path.join(PROGRAMS, "keras_slow_input.py")
    proc = launch(logdir, "14", target=program, opts=NO_STANDBY)
    try:
        wait_for(lambda: committed_steps(logdir) and committed_steps(logdir)[-1] >= 120, 180,
                 what="the commit of epoch 12")
    finally:
        proc.send_signal(signal.SIGTERM)
        code, out, err = finish(proc, 120)
    assert code == 128 + signal.SIGTERM, err
    epochs_done = committed_steps(logdir)[-1] // 10
    code, out, err = finish(launch(logdir, "14", target=program, opts=("--startup-timeout", "10", *NO_STANDBY)), 180)
    assert code == 0, err
    put_back = re.search(r"input of (\d+) epoch\(s\) put back in ([\d.]+) s, (\d+) batches drawn", out)
    assert put_back, out
    assert int(put_back.group(1)) >= 12 and int(put_back.group(3)) == 10 * int(put_back.group(1))
    assert float(put_back.group(2)) > 10.0  # longer than --startup-timeout: the reports kept it alive
    events = lifecycle(logdir)
    assert not [e for e in events if e["event"] == "hang_detected"], events
    trainer_exits = [(e["attempt"], e.get("code")) for e in events if e["event"] == "exited" and e["role"] == "trainer"]
    assert trainer_exits == [(1, 42), (1, 0)], events  # stopped, then the relaunch's one trainer: never restarted
    assert "fit returned" in out and epochs_done >= 12
