"""procsv.keras.BackupAndRestore given Keras' own arguments, in real processes under ``procsv launch``."""

from __future__ import annotations

import os
import re

import pytest

from conftest import PROGRAMS, committed_steps, finish, launch

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
