"""The commit protocol, in one process: snapshot -> shared memory -> store, read back by plain TensorFlow.

Real parts throughout (the trainer's snapshot code, a real memfd arena, the service's writer and
store, TensorFlow's readers); only the processes are folded into one.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from procsv.ipc.messages import SaveData
from procsv.common.errors import CheckpointError, CorruptCheckpoint
from procsv.common.layout import Layout, write_json
from procsv.common.manifests import Manifest, list_committed, manifest_path, verify
from procsv.trainer.checkpoint.snapshot import Plan, SnapshotArena, plan, take
from procsv.services.checkpoint import writer as writer_mod
from procsv.services.checkpoint.arena import ArenaCache
from procsv.services.checkpoint.store import CheckpointStore


class Clock:
    def __init__(self, t: float = 1_700_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def make_state(tf):
    ds = tf.data.Dataset.range(1000).shuffle(50, seed=3).batch(4)
    state = {
        "w": tf.Variable(tf.random.stateless_normal([33, 17], seed=[1, 2])),
        "bias": tf.Variable(tf.zeros([17], tf.float64)),
        "step": tf.Variable(0, dtype=tf.int64),
        "vocab": tf.Variable(["alpha", "", "gamma\x00delta"]),
        "flag": tf.Variable(True),
    }
    it = iter(ds)
    ckpt = tf.train.Checkpoint(it=it, **state)
    _ = ckpt.save_counter
    return ckpt, state, it


class Harness:
    """The trainer's snapshot and the service's commit, wired through a real memfd arena."""

    def __init__(self, logdir: str, clock: Clock | None = None) -> None:
        self.layout = Layout(logdir)
        self.layout.create()
        self.clock = clock or Clock()
        self.store = CheckpointStore(self.layout, self.clock)
        self.store.recover()
        self.arena: SnapshotArena | None = None
        self.views = ArenaCache()

    def arena_for(self, n: int) -> SnapshotArena:
        if self.arena is None or self.arena.slot_size < n:
            self.arena = SnapshotArena(n)
            self.arena.populate(False)
        return self.arena

    def save(self, ckpt, step: int, max_to_keep: int = 5, hours: float | None = None, known: Plan | None = None,
             attempt: int = 0):
        self.clock.t += 1.0  # commits happen after the store started
        ckpt.save_counter.assign_add(1)
        snap = take(ckpt, lambda n: (self.arena_for(n), 4096), known)
        msg = SaveData(step, "test", "model.ckpt", snap.specs, self.arena.ref() if self.arena else None)
        view = self.views.get(msg.arena) if msg.arena else None
        manifest, retired = self.store.commit(
            step=step, reason="test", basename="model.ckpt", max_to_keep=max_to_keep, keep_every_n_hours=hours,
            write=lambda tmp: writer_mod.write_snapshot(tmp, msg, snap.frames, view), attempt=attempt)
        self.deferred = self.store.delete(retired)  # what a restore in progress kept from deletion
        return manifest


def test_committed_checkpoint_restores_with_plain_tensorflow_including_iterator_and_strings(tmp_path):
    import tensorflow as tf

    ckpt, state, it = make_state(tf)
    for _ in range(3):
        next(it)
    state["w"].assign_add(tf.ones_like(state["w"]))
    state["step"].assign(123)
    h = Harness(str(tmp_path / "run"))
    manifest = h.save(ckpt, 123)
    expected_next = [next(it).numpy().tolist() for _ in range(5)]
    verify(h.layout, manifest)
    assert all(set(meta) == {"size", "crc32c"} for meta in manifest.files.values())
    assert sorted(manifest.files) == ["model.ckpt-123.data-00000-of-00002", "model.ckpt-123.data-00001-of-00002",
                                      "model.ckpt-123.index"]

    latest = tf.train.latest_checkpoint(h.layout.logdir)
    assert latest == os.path.join(h.layout.logdir, "model.ckpt-123")
    fresh, fresh_state, fresh_it = make_state(tf)
    fresh.restore(latest).assert_consumed()
    for key in ("w", "bias", "step", "vocab", "flag"):
        assert np.array_equal(fresh_state[key].numpy(), state[key].numpy()), key
    assert fresh_state["vocab"].numpy().tolist() == [b"alpha", b"", b"gamma\x00delta"]
    assert [next(fresh_it).numpy().tolist() for _ in range(5)] == expected_next  # the input position
    manager = tf.train.CheckpointManager(fresh, h.layout.logdir, max_to_keep=5, checkpoint_name="model.ckpt")
    assert (manager.latest_checkpoint, manager.checkpoints) == (latest, [latest])
    names = dict(tf.train.list_variables(latest))
    assert names["w/.ATTRIBUTES/VARIABLE_VALUE"] == [33, 17]


def test_snapshots_reusing_a_plan_reuse_its_layout_and_redo_it_when_a_variable_changes_shape(tmp_path):
    import tensorflow as tf

    flex = tf.Variable(tf.zeros([4]), shape=tf.TensorShape(None))
    state = {"half": tf.Variable(tf.ones([3, 5], tf.float16)), "flex": flex, "step": tf.Variable(0, dtype=tf.int64)}
    ckpt = tf.train.Checkpoint(**state)
    _ = ckpt.save_counter
    known = plan(ckpt)
    h = Harness(str(tmp_path / "run"))
    h.save(ckpt, 1, known=known)
    first = known.layout
    assert first is not None and sorted(first.names) == ["float16", "float32", "int64", "int64"]  # save_counter too
    expected = []
    for step, new_flex in ((2, None), (3, tf.range(10, dtype=tf.float32))):
        state["half"].assign_add(tf.ones([3, 5], tf.float16))
        state["step"].assign(step)
        if new_flex is not None:
            flex.assign(new_flex)  # another shape: the layout the plan holds no longer fits
        specs = dict(first.made)
        h.save(ckpt, step, known=known)
        assert (known.layout is first) == (new_flex is None)
        if new_flex is None:  # the same shapes at the same offsets: the very spec objects (the codec reuses their text)
            assert first.made and all(first.made[i][1] is spec for i, (_, spec) in specs.items())
        expected.append({k: v.numpy().copy() for k, v in state.items()})
        fresh = {"half": tf.Variable(tf.zeros([3, 5], tf.float16)), "flex": tf.Variable([0.0], shape=tf.TensorShape(None)),
                 "step": tf.Variable(0, dtype=tf.int64)}
        tf.train.Checkpoint(**fresh).restore(tf.train.latest_checkpoint(h.layout.logdir)).assert_consumed()
        for key, value in fresh.items():
            assert value.dtype == state[key].dtype, key
            assert np.array_equal(value.numpy(), expected[-1][key]), (step, key)
    assert expected[-1]["flex"].tolist() == list(range(10))


def test_retention_keeps_max_to_keep_and_never_touches_files_procsv_did_not_write(tmp_path):
    import tensorflow as tf

    logdir = tmp_path / "run"
    logdir.mkdir()
    (logdir / "notes.txt").write_text("mine")
    user = tf.train.Checkpoint(v=tf.Variable([1.0]))
    user.write(str(logdir / "model.ckpt-3"))  # the user's own checkpoint with procsv's basename
    user.write(str(logdir / "other.ckpt-1"))
    foreign = sorted(os.listdir(logdir))
    ckpt, state, _ = make_state(tf)
    h = Harness(str(logdir))
    for step in (10, 20, 30, 40, 50, 60):
        h.save(ckpt, step, max_to_keep=2)
    assert [m.step for m in list_committed(h.layout)] == [50, 60]
    names = set(os.listdir(logdir))
    assert set(foreign) <= names
    assert not any(n.startswith(("model.ckpt-10.", "model.ckpt-20.", "model.ckpt-40.")) for n in names)
    state_text = (logdir / "checkpoint").read_text()
    assert 'model_checkpoint_path: "model.ckpt-60"' in state_text and "model.ckpt-40" not in state_text
    with pytest.raises(CheckpointError, match="model.ckpt-3.index already exists in the logdir"):
        h.save(ckpt, 3)
    assert set(foreign) <= set(os.listdir(logdir))
    assert os.listdir(h.layout.tmp) == [] and [m.step for m in list_committed(h.layout)] == [50, 60]


def test_keep_checkpoint_every_n_hours_preserves_old_ones_on_disk(tmp_path):
    import tensorflow as tf

    clock = Clock()
    ckpt, _, _ = make_state(tf)
    h = Harness(str(tmp_path / "run"), clock)
    for step in range(1, 9):
        clock.t += 1800  # half an hour between checkpoints
        h.save(ckpt, step, max_to_keep=2, hours=1.0)
    committed = list_committed(h.layout)
    assert [m.step for m in committed][-2:] == [7, 8]
    preserved = [m.step for m in committed if m.reason == "preserved"]
    assert preserved and all(b - a >= 2 for a, b in zip(preserved, preserved[1:]))
    for m in committed:
        verify(h.layout, m)


def test_recover_removes_unfinished_writes_and_rolls_back_only_uncommitted_procsv_files(tmp_path):
    import tensorflow as tf

    ckpt, _, _ = make_state(tf)
    h = Harness(str(tmp_path / "run"))
    h.save(ckpt, 5)
    logdir = h.layout.logdir
    os.makedirs(os.path.join(h.layout.tmp, "model.ckpt-9.abc", "model.ckpt-9_temp"))
    for name in ("model.ckpt-9.index", "model.ckpt-9.data-00000-of-00001", "keep-me.txt"):
        with open(os.path.join(logdir, name), "w") as fh:
            fh.write("half")
    write_json(os.path.join(h.layout.manifests, "model.ckpt-9.pending"),
               {"files": ["model.ckpt-9.index", "model.ckpt-9.data-00000-of-00001", "keep-me.txt", "../escape"]})
    notes = CheckpointStore(h.layout).recover()
    assert any("removed unfinished write" in n for n in notes) and any("rolled back" in n for n in notes)
    assert os.listdir(h.layout.tmp) == []
    names = set(os.listdir(logdir))
    assert "keep-me.txt" in names and not any(n.startswith("model.ckpt-9.") for n in names)
    assert tf.train.latest_checkpoint(logdir) == os.path.join(logdir, "model.ckpt-5")


@pytest.mark.parametrize("damage", ["flip", "truncate"])
def test_verify_catches_damage_and_the_service_retires_corrupt_checkpoints_past_the_restored_step(tmp_path, damage):
    import tensorflow as tf

    ckpt, _, _ = make_state(tf)
    h = Harness(str(tmp_path / "run"))
    for step in (10, 20, 30):
        h.save(ckpt, step)
    newest = list_committed(h.layout)[-1]
    data = os.path.join(h.layout.logdir, sorted(n for n in newest.files if ".data-" in n)[0])
    with open(data, "r+b") as fh:
        if damage == "flip":
            fh.seek(40)
            byte = fh.read(1)
            fh.seek(40)
            fh.write(bytes([byte[0] ^ 0xFF]))
        else:
            fh.truncate(os.path.getsize(data) - 3)
    with pytest.raises(CorruptCheckpoint, match="model.ckpt-30"):
        verify(h.layout, newest)
    verify(h.layout, list_committed(h.layout)[-2])
    notes = h.store.quarantine_corrupt_after(20)
    assert len(notes) == 1 and "model.ckpt-30" in notes[0]
    assert [m.step for m in list_committed(h.layout)] == [10, 20]
    assert tf.train.latest_checkpoint(h.layout.logdir).endswith("model.ckpt-20")
    h.save(ckpt, 30)  # the step commits again, cleanly
    verify(h.layout, list_committed(h.layout)[-1])


def test_an_audits_rollback_quarantines_the_wrong_timeline_after_s1_never_s1_nor_a_later_attempts_checkpoint(tmp_path):
    """Trainer attempt 1 committed 10, 20, 35, 50 and was rolled back to 20 (issue 71); attempt 2 committed 28. The
    quarantine of 20, 28, 35 and 50 (20 and 28 listed wrongly on purpose) moves 35 and 50 only, files and manifests,
    and the state file no longer names them: TensorFlow's latest is the new timeline's 28."""
    import tensorflow as tf

    ckpt, _, _ = make_state(tf)
    h = Harness(str(tmp_path / "run"))
    for step in (10, 20, 35, 50):
        h.save(ckpt, step, attempt=1)
    h.save(ckpt, 28, attempt=2)
    assert [(m.step, m.attempt) for m in list_committed(h.layout)] == [(10, 1), (20, 1), (28, 2), (35, 1), (50, 1)]
    notes = h.store.quarantine_wrong(20, 1, [20, 28, 35, 50], "audit: host h computed steps 20-35 wrongly")
    assert len(notes) == 1 and "quarantined model.ckpt-35, model.ckpt-50, committed after step 20 by a timeline an " \
        "audit rolled back (audit: host h computed steps 20-35 wrongly)" in notes[0], notes
    assert [m.step for m in list_committed(h.layout)] == [10, 20, 28]
    assert tf.train.latest_checkpoint(h.layout.logdir).endswith("model.ckpt-28")
    state = tf.train.get_checkpoint_state(h.layout.logdir)
    assert [os.path.basename(p) for p in state.all_model_checkpoint_paths] == ["model.ckpt-10", "model.ckpt-20",
                                                                               "model.ckpt-28"]
    assert not [n for n in os.listdir(h.layout.logdir) if n.startswith(("model.ckpt-35.", "model.ckpt-50."))]
    for step in (35, 50):
        moved = os.listdir(h.layout.quarantined(f"model.ckpt-{step}"))
        assert f"model.ckpt-{step}.json" in moved and f"model.ckpt-{step}.index" in moved, moved
    assert h.store.quarantine_wrong(20, 1, [35, 50], "again") == []  # (a late one told twice: nothing left to move)


def test_version_1_manifests_with_zlib_crc32_are_still_read_and_verified(tmp_path):
    import zlib

    import tensorflow as tf

    ckpt, _, _ = make_state(tf)
    h = Harness(str(tmp_path / "run"))
    new = h.save(ckpt, 7)
    files = {}
    for name, meta in new.files.items():
        with open(os.path.join(h.layout.logdir, name), "rb") as fh:
            files[name] = {"size": meta["size"], "crc32": zlib.crc32(fh.read())}
    old = dict(Manifest(7, new.prefix, files, new.committed_at, "test").to_json(), version=1)
    write_json(manifest_path(h.layout, new.prefix), old)
    (read,) = list_committed(h.layout)
    assert read.files == files
    verify(h.layout, read)
    data = os.path.join(h.layout.logdir, sorted(n for n in files if ".data-" in n)[0])
    with open(data, "r+b") as fh:
        byte = fh.read(1)
        fh.seek(0)
        fh.write(bytes([byte[0] ^ 0x01]))
    with pytest.raises(CorruptCheckpoint, match="fails its CRC-32 check"):
        verify(h.layout, read)


def test_a_step_committed_again_is_kept_if_intact_and_rewritten_if_a_bit_flipped_since(tmp_path):
    import tensorflow as tf

    ckpt, state, _ = make_state(tf)
    h = Harness(str(tmp_path / "run"))
    first = h.save(ckpt, 10)
    again = h.save(ckpt, 10)  # the same step once more (a final checkpoint right after a restore)
    assert again == first  # intact: never rewritten
    data = os.path.join(h.layout.logdir, sorted(n for n in first.files if ".data-" in n)[0])
    with open(data, "r+b") as fh:  # same size, one byte different: only the checksum can tell
        fh.seek(40)
        byte = fh.read(1)
        fh.seek(40)
        fh.write(bytes([byte[0] ^ 0xFF]))
    rewritten = h.save(ckpt, 10)
    verify(h.layout, rewritten)
    assert os.listdir(h.layout.quarantine)  # the damaged copy is set aside, not deleted
    fresh, fresh_state, _ = make_state(tf)
    fresh.restore(tf.train.latest_checkpoint(h.layout.logdir)).assert_existing_objects_matched()
    assert np.array_equal(fresh_state["w"].numpy(), state["w"].numpy())
