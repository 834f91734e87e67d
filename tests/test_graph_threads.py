"""TF1 programs that train from threads: steps run by threads other than the one that prepared the
session count, for the step boundaries (checkpoints, progress) and for the watchdog's hang rule."""

from __future__ import annotations

import os

import pytest

from conftest import PROGRAMS, committed_steps, finish, launch, lifecycle

pytestmark = pytest.mark.slow  # starts TensorFlow processes: not in the quick tier

PROGRAM = os.path.join(PROGRAMS, "graph_threads.py")


def test_a_program_training_from_threads_is_seen_stepping_and_its_final_checkpoint_holds_its_last_step(logdir):
    """Under ``procsv launch --hang-timeout 3``, two threads train for several seconds while the main
    thread waits in ``coord.join``: the watchdog sees the first step and steady progress (one trainer,
    never restarted as hung), its finished step is the program's final global step, and the final
    checkpoint is that step (before: no step was seen at all, the trainer finished "at step 0" and
    no checkpoint held the trained state). The first step is a completed one: the Supervisor's start-up
    checkpoint of step 0 before any run is not (it was, and --startup-timeout ended at session ready)."""
    code, out, err = finish(launch(logdir, "600", target=PROGRAM, opts=("--hang-timeout", "3", "--standby", "fork")),
                                   timeout=300)  # (no restart: no hot standby)
    assert code == 0, err[-3000:]
    final = int(next(line for line in out.splitlines() if "final global step" in line).split()[-1])
    assert final >= 600
    events = lifecycle(logdir)
    firsts = [e for e in events if e["event"] == "first_step"]
    assert len(firsts) == 1 and firsts[0]["step"] >= 1, firsts  # a completed step's (not the start-up snapshot's)
    assert len([e for e in events if e["event"] == "spawned" and e["role"] == "trainer"]) == 1  # never hung
    assert [e["step"] for e in events if e["event"] == "finished"] == [final]
    assert committed_steps(logdir)[-1] == final
