"""Complete state: a resumed run takes exactly the batches an uninterrupted one takes (tf.data iterator)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from conftest import PROGRAMS, committed_steps, quiet_env

pytestmark = pytest.mark.slow

PROGRAM = os.path.join(PROGRAMS, "iterator_train.py")


def _run(logdir: str, steps: int) -> list[str]:
    out = subprocess.run([sys.executable, PROGRAM, "--logdir", logdir, "--steps", str(steps)], capture_output=True,
                         text=True, env=quiet_env(), timeout=180)
    assert out.returncode == 0, out.stderr
    return out.stdout.splitlines()


def test_a_resumed_run_continues_the_tf_data_iterator_exactly(tmp_path, logdir):
    straight = _run(str(tmp_path / "straight"), 23)
    first = _run(logdir, 11)
    saved = committed_steps(logdir)
    # every 5 steps (a trigger while one is in flight waits for it: at most one in flight), and the end
    assert saved[0] == 5 and saved[-1] == 11 and set(saved) <= {5, 6, 7, 8, 9, 10, 11}
    resumed = _run(logdir, 23)
    assert "procsv: restored step 11 from model.ckpt-11" in resumed
    batches = lambda lines: [l for l in lines if l.startswith("step ")]  # noqa: E731
    assert batches(first) == batches(straight)[:11]
    assert batches(resumed) == batches(straight)[11:]  # same shuffle buffer, same position
    assert resumed[-1] == straight[-1] and resumed[-1].startswith("total ")  # the counter and the string too
    assert committed_steps(logdir)[-1] == 23
