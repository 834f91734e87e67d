"""Explicit saves (``sv.saver.save``, the stop's final checkpoint) are never refused because procsv's
own queue to the checkpoint service is full: under ``procsv launch`` (the in-memory tier on, as by
default) a save waits for a slot of the snapshot memory (the in-memory snapshot still waiting for its
summaries is dropped: the save is newer) and for room in the socket's queue, up to
``stop_grace_secs``."""

from __future__ import annotations

import os

import pytest

from conftest import PROGRAMS, committed_steps, finish, launch, lifecycle

pytestmark = pytest.mark.slow  # starts TensorFlow processes: not in the quick tier

PROGRAM = os.path.join(PROGRAMS, "graph_saves.py")


def test_a_save_at_every_step_and_the_final_checkpoint_all_commit_under_the_in_memory_tier(logdir):
    """20 runs each followed by ``sv.saver.save``, then one more run: the standard services' checkpoint
    of the initialized step commits first (step 0, ``periodic``: TF's checkpoint thread saves once as
    it starts), every save returns its checkpoint and commits (steps 1 to 20, reason ``steps``), the
    stop commits step 21 (``final``),
    the launch exits 0, and no save was refused (before: the second save already failed with "could
    not be handed to the checkpoint service (queue full)", a ``CheckpointError``, and the trainer
    restarted again and again)."""
    code, out, err = finish(launch(logdir, "20", target=PROGRAM, opts=("--standby", "fork")),
                            timeout=300)  # (no restart: no hot standby)
    assert code == 0, err[-3000:]
    assert [line.split()[-1] for line in out.splitlines() if "saved " in line] == [str(n) for n in range(1, 21)]
    assert "finished at step 21" in out
    assert "queue full" not in err and "did not commit" not in err, err[-3000:]
    commits = [(e["step"], e["reason"]) for e in lifecycle(logdir) if e["event"] == "checkpoint_committed"]
    assert commits == [(0, "periodic")] + [(n, "steps") for n in range(1, 21)] + [(21, "final")]
    assert committed_steps(logdir) == list(range(0, 22))
