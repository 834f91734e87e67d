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
import signal

import pytest

from conftest import HERE, PROGRAMS, committed_steps, finish, launch, quiet_env, run_python, wait_for
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
            out = run_python(["-c", COMMIT_20.format(tests=HERE, logdir=h.layout.logdir)], env=quiet_env(), timeout=120)
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


@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.slow
def test_a_process_forked_in_init_fn_does_not_hold_the_restore_lock_so_retention_still_deletes(tmp_path):
    """Issue 51, point 6: ``init`` (the program's ``init_fn``) ran under the restore lock; a process
    forked there inherited its descriptor (O_CLOEXEC is not close-on-fork) and held the shared lock
    while it lived, so retention never deleted a checkpoint again and a long run filled its disk.
    Real launch: a fresh logdir (nothing to restore, so init runs), a child forked in init_fn that
    lives as long as the trainer, a commit every 5 steps, max_to_keep 5."""
    import psutil

    from procsv.common.layout import Layout
    from procsv.common.manifests import retiring

    logdir, forked = str(tmp_path / "run"), str(tmp_path / "forked")
    proc = launch(logdir, "--steps", "100000", "--step-delay", "0.01", "--save-steps", "5", "--fork-in-init", forked,
                  target=os.path.join(PROGRAMS, "tiny_train.py"), opts=("--standby", "fork"))
    try:
        wait_for(lambda: proc.poll() is not None or (committed_steps(logdir) or [0])[-1] >= 60, 180,
                 what="twelve commits")
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        with open(forked) as fh:
            child = psutil.Process(int(fh.read()))
        assert child.is_running() and child.status() != psutil.STATUS_ZOMBIE  # it still lives
        # retention keeps the newest 5 (a commit may land between the listing and its deletion)
        kept = wait_for(lambda: (c := committed_steps(logdir)) and c[-1] >= 60 and len(c) <= 5 and c, 60,
                        what="retention to delete the older checkpoints")
        assert kept[0] > 5, kept


        def free() -> bool:
            with retiring(Layout(logdir)) as got:
                return got

        # no restore holds the lock (retention itself holds it a moment while it deletes)
        assert wait_for(free, 10, what="the restore lock free")
    finally:
        proc.send_signal(signal.SIGTERM)
        code, out, err = finish(proc, 120)
    assert code == 128 + signal.SIGTERM, err[-3000:]
