"""procsv.keras.BackupAndRestore given Keras' own arguments and programs, in real processes under ``procsv launch``."""

from __future__ import annotations

import os
import re
from typing import Any

import numpy as np
import pytest

from conftest import PROGRAMS, committed_steps, finish, launch, lifecycle, quiet_env, run_python

pytestmark = pytest.mark.slow  # starts TensorFlow processes: not in the quick tier

WARNING = ("procsv.train: BackupAndRestore(save_before_preemption=False) has no effect: procsv always commits "
           "the position reached when it is asked to stop")


def test_save_before_preemption_false_is_accepted_with_one_warning_and_fit_runs(short_tmp):
    # Keras' argument, so switching callbacks stays a one-word change; the program makes two callbacks
    logdir = os.path.join(short_tmp, "run")
    code, out, err = finish(launch(logdir, target=os.path.join(PROGRAMS, "keras_args.py")), 180)
    assert code == 0, err
    assert "fit returned after 2 epoch(s)" in out, out
    said = [line for line in (out + err).splitlines() if WARNING in line]
    by_process = [re.match(r"\[(\S+)\]", line).group(1) for line in said]  # a hot standby runs the program too
    assert "trainer.1" in by_process and len(by_process) == len(set(by_process)), said  # once per process
    assert committed_steps(logdir)[-1] == 16  # 2 epochs of 8 batches, committed


TWO_FITS = os.path.join(PROGRAMS, "keras_two_fits.py")


def _fit_lines(out: str, prefix: str = "") -> list[str]:
    """The ``fit N ...`` lines ``keras_two_fits.py`` printed (``prefix``: of one process of a launch)."""
    return [line[len(prefix):].strip() for line in out.splitlines()
            if line.startswith(prefix) and line[len(prefix):].strip().startswith("fit ")]


def _npz(path: str) -> list[Any]:
    with np.load(path) as data:
        return [data[f"arr_{i}"] for i in range(len(data.files))]


def _same(a: list[Any], b: list[Any]) -> bool:
    return len(a) == len(b) and all(x.tobytes() == y.tobytes() for x, y in zip(a, b))


def _losses(lines: list[str], fit: int) -> list[float]:
    return [float(v) for v in next(line for line in lines if line.startswith(f"fit {fit} losses"))
            .split(" ", 3)[3].strip("[]").split(",") if v.strip()]


def test_a_sigkill_in_a_programs_second_fit_passes_the_completed_first_and_resumes_the_second_exactly(short_tmp):
    # the multi-worker tutorial's and the migration guide's pattern: fit, then fit more (another dataset), one
    # BackupAndRestore; the program SIGKILLs itself in the second fit's third epoch (a step of it committed: its
    # beginning, or a later step where that epoch-end save waited behind a slow commit at load)
    def keras_run(name: str, *extra: str) -> Any:
        return run_python([TWO_FITS, "keras", os.path.join(short_tmp, f"{name}.npz"), "--backup",
                           os.path.join(short_tmp, name), *extra], env=quiet_env(), timeout=120)

    plain = keras_run("plain")
    assert plain.returncode == 0, plain.stderr
    plain_lines, plain_weights = _fit_lines(plain.stdout), _npz(os.path.join(short_tmp, "plain.npz"))
    kill = ("--kill-at", "2", "--marker", os.path.join(short_tmp, "keras.killed"))
    assert keras_run("keras", *kill).returncode == -9
    again = keras_run("keras", *kill)
    assert again.returncode == 0, again.stderr
    # Keras' own, rerun: its first fit restores the second's backup and trains that fit's last 2 epochs on the
    # second's weights, deletes the backup, and its second fit begins at epoch 2 again (Keras leaves the
    # model's _initial_epoch as it restored it): trained twice over, not the uninterrupted weights
    theirs = _fit_lines(again.stdout)
    assert [line for line in theirs if "began" in line] == ["fit 1 began at epoch 2", "fit 2 began at epoch 2"]
    assert not _same(_npz(os.path.join(short_tmp, "keras.npz")), plain_weights)

    logdir, out_path = os.path.join(short_tmp, "run"), os.path.join(short_tmp, "procsv.npz")
    code, out, err = finish(launch(logdir, "procsv", out_path, "--kill-at", "2", "--marker",
                                   os.path.join(short_tmp, "procsv.killed"), "--logdir", logdir,
                                   target=TWO_FITS, opts=("--standby", "fork", "--audit", "every")), 240)
    assert code == 0, err
    assert "keras_two_fits: gave up" not in err, err  # the kill waited for a commit of its epoch that never came
    assert any(e["event"] == "exited" and e.get("signal") == "SIGKILL" for e in lifecycle(logdir)), (out, err)
    first, second = _fit_lines(out, "[trainer.1]"), _fit_lines(out, "[trainer.2]")
    assert first == plain_lines[:2], (first, plain_lines)  # the first fit completed, then the kill
    # the restart: the completed first fit trains nothing, the second resumes inside its third epoch
    # (before: the first fit resumed the second's position, and the second "resumed" the first's end)
    assert second[:3] == ["fit 1 began at epoch none", "fit 1 losses []", "fit 2 began at epoch 2"], (second, err)
    assert "procsv: fit 1 of this program completed before the restart: it trains nothing" in out, out
    # resumed inside its third epoch, at no batch past the kill's (after the epoch's third): from the checkpoint of
    # the epoch's beginning, or of a later step where the epoch-end save waited behind a slow commit (at load: the
    # save taken with the state of the first boundary after that commit's answer, "epoch 3, batch 2"), or from a
    # later in-memory snapshot the service held and persisted at the death (the tier's timing: seen at load 7 in
    # a fresh-clone run, "epoch 3, batch 3")
    assert re.search(r"\[trainer\.2\] procsv: fit resumes at epoch 3, batch [1-4] ", out), out
    assert _losses(second, 2) == _losses(plain_lines, 2)[2:]  # its logged loss: the training loss, of each epoch
    assert _same(_npz(out_path), plain_weights)  # each epoch of each fit trained once: the uninterrupted weights
    # --audit every (issue 71), in the same launch: an auditor runs the program as a restarted trainer does, its
    # fit 1 (completed before S1) trains nothing and does not answer, its fit 2 replays the interval from S1. The
    # last interval (S1 in fit 2, past step 24; S2 56, the final commit: the run's end waits for its verdict)
    # matches, and no interval differs (before: every interval of fit 2 went unaudited, "the program ended at step
    # 48, before step 56")
    audits = [(e["verdict"], e["start"], e["end"]) for e in lifecycle(logdir) if e["event"] == "audit"]
    assert any(verdict == "match" and start > 24 and end == 56 for verdict, start, end in audits), (audits, err[-3000:])
    assert all(verdict == "match" for verdict, _, _ in audits), (audits, err[-3000:])


FINETUNE = os.path.join(PROGRAMS, "keras_finetune.py")


def test_a_sigkill_in_the_fine_tuning_tutorials_second_fit_resumes_it_and_the_first_reports_its_epochs(short_tmp,
                                                                                                     finetune_keras):
    # freeze, fit, unfreeze, a new optimizer, fit more from history.epoch[-1]; SIGKILL at fit 2's epoch 3's end.
    # The restarted program's fit 1 (completed) trains nothing and must not restore fit 2's checkpoint into its
    # frozen model and old optimizer (before: MismatchedCheckpoint), and its History names its epochs (before:
    # empty, and history.epoch[-1] raised IndexError: a start-up crash loop)
    plain, plain_folder = finetune_keras  # (the tutorial under Keras's own callback: the same weights)
    assert plain.returncode == 0, plain.stderr
    logdir, out_path = os.path.join(short_tmp, "run"), os.path.join(short_tmp, "procsv.npz")
    code, out, err = finish(launch(logdir, "procsv", out_path, "--kill-at", "3", "--marker",
                                   os.path.join(short_tmp, "killed"), "--logdir", logdir, target=FINETUNE,
                                   opts=("--standby", "fork", "--audit", "every")), 240)
    assert code == 0, (out, err)
    assert any(e["event"] == "exited" and e.get("signal") == "SIGKILL" for e in lifecycle(logdir)), (out, err)
    second = _fit_lines(out, "[trainer.2]")
    assert second == ["fit 1 epochs [0, 1, 2]", "fit 2 epochs [3, 4, 5]"], (out, err)  # epoch 3 again: its end
    # was not yet committed (it is taken at the next batch boundary)
    assert "[trainer.2] procsv: fit 1 of this program completed before the restart: it trains nothing" in out, out
    # inside its fourth epoch, from its beginning's checkpoint or a later in-memory snapshot persisted at the death
    assert re.search(r"\[trainer\.2\] procsv: fit resumes at epoch 4, batch [1-4] ", out), out
    assert _same(_npz(out_path), _npz(os.path.join(plain_folder, "keras.npz")))  # the uninterrupted weights
    # --audit every (issue 71), in the same launch: an auditor of fit 2 restores what a restart restores, fit 1
    # only its position (fit 2's checkpoint is of the unfrozen model and its new optimizer) and fit 2 the whole
    # state; the last interval (S1 in fit 2, past step 12; S2 28, the final commit: the run's end waits for its
    # verdict) matches and no interval differs (before: the auditor restored the whole checkpoint into fit 1's
    # model, "MismatchedCheckpoint", no replay)
    audits = [(e["verdict"], e["start"], e["end"]) for e in lifecycle(logdir) if e["event"] == "audit"]
    assert any(verdict == "match" and start > 12 and end == 28 for verdict, start, end in audits), (audits, err[-3000:])
    assert all(verdict == "match" for verdict, _, _ in audits), (audits, err[-3000:])
