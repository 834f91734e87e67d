"""A restore racing a commit and its retention: a checkpoint being restored is never deleted.

The restarted trainer lists the committed checkpoints, then verifies and restores the newest; the
dead attempt's last commit may land meanwhile (the in-memory tier off, a group's chief, or a commit
longer than ``RECOVER_WAIT``), and with ``max_to_keep=1`` its retention retires the very checkpoint
being restored. The trainer side is the real ``CheckpointAgent`` with TensorFlow in this process;
the commit and its deletion run in a second, real process (the store the checkpoint service runs),
started at the one moment the race needs: after the listing, before the first file is read.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import HERE, quiet_env
from procsv.common.manifests import list_committed, restore_lock_path
from procsv.trainer.checkpoint import restore_at_start
from test_checkpoint_store import Harness, make_state
from test_restore_faults import FakeTime, _agent

COMMIT_20 = """
import json, sys
sys.path.insert(0, {tests!r})
import tensorflow as tf
from test_checkpoint_store import Clock, Harness, make_state
h = Harness({logdir!r}, Clock(1_800_000_000.0))
ckpt, state, _ = make_state(tf)
ckpt.global_step = state["step"]
state["step"].assign(20)
h.save(ckpt, 20, max_to_keep=1)
print(json.dumps([m.prefix for m in (h.deferred or [])]))
"""


@pytest.fixture
def at_10(tmp_path):
    """A logdir whose one committed checkpoint is step 10 (max_to_keep=1)."""
    import tensorflow as tf

    ckpt, state, _ = make_state(tf)
    ckpt.global_step = state["step"]
    h = Harness(str(tmp_path / "run"))
    state["step"].assign(10)
    h.save(ckpt, 10, max_to_keep=1)
    return h


def _commit_20_meanwhile(monkeypatch, h: Harness) -> list[list[str]]:
    """On the restore's first verify: commit step 20 with max_to_keep=1 in another process and wait
    for it (its retention retires step 10); returns what that process's deletion left for later."""
    real_verify = restore_at_start.verify
    told: list[list[str]] = []

    def verify(layout, manifest, **kw):
        if not told:
            out = subprocess.run([sys.executable, "-c", COMMIT_20.format(tests=HERE, logdir=h.layout.logdir)],
                                 capture_output=True, text=True, env=quiet_env(), timeout=120)
            assert out.returncode == 0, out.stderr
            told.append(json.loads(out.stdout.strip().splitlines()[-1]))
        return real_verify(layout, manifest, **kw)

    monkeypatch.setattr(restore_at_start, "verify", verify)
    return told


def _restored_step(tf_path: str) -> int:
    import tensorflow as tf

    step = tf.Variable(0, dtype=tf.int64)
    tf.train.Checkpoint(step=step).restore(tf_path).expect_partial()
    return int(step.numpy())


def test_retention_does_not_delete_the_checkpoint_being_restored(at_10, monkeypatch):
    told = _commit_20_meanwhile(monkeypatch, at_10)
    agent, state = _agent(at_10.layout, FakeTime(), allow_reinit=True)
    skipped = agent.restore_or_init(lambda: pytest.fail("started from step 0 over a good checkpoint"))
    assert told == [["model.ckpt-10"]]  # the commit landed, its deletion waited for the restore
    assert skipped == [] and agent.restored_from.endswith("model.ckpt-10") and int(state["step"].numpy()) == 10
    layout = at_10.layout
    assert [m.step for m in list_committed(layout)] == [10, 20]
    assert at_10.store.delete([list_committed(layout)[0]]) == []  # the restore is over: now it goes
    assert [m.step for m in list_committed(layout)] == [20]
    assert not [n for n in os.listdir(layout.logdir) if n.startswith("model.ckpt-10.")]
    import tensorflow as tf

    latest = tf.train.latest_checkpoint(layout.logdir)
    assert latest.endswith("model.ckpt-20") and _restored_step(latest) == 20


def test_without_the_lock_a_checkpoint_retired_mid_restore_is_not_called_corrupt(at_10, monkeypatch, capsys):
    """Where the lock cannot be taken (here its file is a directory), the deletion goes ahead; the
    restore finds a file gone with its manifest, lists again and restores the new newest."""
    os.mkdir(restore_lock_path(at_10.layout))
    told = _commit_20_meanwhile(monkeypatch, at_10)
    agent, state = _agent(at_10.layout, FakeTime(), allow_reinit=True)
    skipped = agent.restore_or_init(lambda: pytest.fail("started from step 0 over a good checkpoint"))
    assert told == [[]]  # deleted at once
    assert skipped == [] and agent.restored_from.endswith("model.ckpt-20") and int(state["step"].numpy()) == 20
    err = capsys.readouterr().err
    assert "checkpoint model.ckpt-10 was retired while being read" in err and "corrupt" not in err


def test_the_lock_a_restore_and_a_deletion_take(tmp_path):
    """Shared by restores, exclusive and never waited for by the deletion; a restore waits (bounded,
    on an injected clock) for a deletion in progress, then goes on without it."""
    from procsv.common.layout import Layout
    from procsv.common.manifests import restoring, retiring

    layout = Layout(str(tmp_path / "run"))
    layout.create()
    with restoring(layout) as a, restoring(layout) as b:
        assert a and b
        with retiring(layout) as free:
            assert not free
    with retiring(layout) as free:
        assert free
        fake = FakeTime()
        with restoring(layout, wait_secs=0.5, clock=fake.clock, sleep=fake.sleep) as held:
            assert not held and 0.5 <= sum(fake.pauses) < 0.52
    with restoring(layout) as held:
        assert held
