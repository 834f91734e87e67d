"""The checkpoint service writes whole checkpoints without TensorFlow: byte for byte TensorFlow's own.

Each snapshot is written twice, by the service's native path and by TensorFlow's path
(``SaveV2`` + ``MergeV2Checkpoints``), and the files compared; then read back with
``tf.train.load_checkpoint``. A real checkpoint service process is checked not to load TensorFlow.
"""

from __future__ import annotations

import filecmp
import os

import numpy as np
import pytest

from conftest import committed_steps, finish, launch, wait_for, wait_role_pid
from procsv.common import crc32c
from procsv.common.errors import CheckpointError
from procsv.ipc.messages import ArenaRef, SaveData, SaveReason, TensorSpec
from procsv.services.checkpoint import framed
from procsv.services.checkpoint.arena import ArenaView
from procsv.services.checkpoint.writer import write_snapshot, write_with_tensorflow


def _arena(size: int) -> ArenaView:
    """Snapshot memory as the trainer makes it (a memfd), mapped as the service maps it."""
    fd = os.memfd_create("procsv-test-arena")
    os.ftruncate(fd, size)
    return ArenaView(ArenaRef(f"/proc/{os.getpid()}/fd/{fd}", os.fstat(fd).st_ino, size))


def _snapshot(with_arena: bool, strings: bool) -> tuple[SaveData, list[bytes], ArenaView | None, dict[str, object]]:
    rng = np.random.default_rng(3)
    expected: dict[str, object] = {}
    specs: list[TensorSpec] = []
    frames: list[bytes] = []
    view = None
    if with_arena:
        view = _arena(64 * 4096)
        buf = view.array
        buf[:] = 0xCD
        pos = 4096  # the slot starts one page in: the writer rebases
        for key, arr in (("model/kernel/.ATTRIBUTES/VARIABLE_VALUE", rng.random((37, 11)).astype(np.float32)),
                         ("model/step/.ATTRIBUTES/VARIABLE_VALUE", np.asarray(np.int64(12345))),
                         ("optimizer/m/.ATTRIBUTES/VARIABLE_VALUE", rng.random(300)),
                         ("flags", np.array([True, False]))):
            pos = -(-pos // 64) * 64
            buf[pos:pos + arr.nbytes] = arr.reshape(-1).view(np.uint8)
            specs.append(TensorSpec(key, arr.dtype.name, list(arr.shape), offset=pos))
            expected[key] = arr
            pos += arr.nbytes
    for key, arr in (("framed/bias", rng.random(9).astype(np.float16)), ("framed/u64", np.arange(5, dtype=np.uint64)),
                     ("framed/empty", np.zeros((0, 3), np.float32))):
        specs.append(TensorSpec(key, arr.dtype.name, list(arr.shape)))
        frames.append(arr.tobytes())
        expected[key] = arr
    if strings:
        items = [b"hello", b"", b"x" * 200, bytes(range(256))]
        specs.append(TensorSpec("names", "string", [2, 2], lengths=[len(i) for i in items]))
        frames.append(b"".join(items))
        expected["names"] = np.array(items, dtype=object).reshape(2, 2)
        specs.append(TensorSpec("no_names", "string", [0, 2], lengths=[]))  # an empty string tensor
        frames.append(b"")
        expected["no_names"] = np.zeros((0, 2), dtype=object)
        graph = os.urandom(3000)
        specs.append(TensorSpec("_CHECKPOINTABLE_OBJECT_GRAPH", "string", [], lengths=[len(graph)]))
        frames.append(graph)
        expected["_CHECKPOINTABLE_OBJECT_GRAPH"] = graph
    msg = SaveData(step=7, reason=SaveReason.STEPS, basename="ckpt", tensors=specs,
                   arena=view.ref if view is not None else None)
    return msg, frames, view, expected


def _files(folder: str) -> list[str]:
    return sorted(os.listdir(folder))


@pytest.mark.parametrize("with_arena", [True, False], ids=["memory+frames", "frames-only"])
@pytest.mark.parametrize("strings", [True, False], ids=["strings", "numbers"])
def test_native_checkpoint_is_byte_identical_to_tensorflows_and_reads_back(tmp_path, with_arena, strings):
    import tensorflow as tf

    msg, frames, view, expected = _snapshot(with_arena, strings)
    (tmp_path / "mine").mkdir()
    (tmp_path / "tf").mkdir()
    mine, theirs = str(tmp_path / "mine" / "ckpt-7"), str(tmp_path / "tf" / "ckpt-7")
    known = write_snapshot(mine, msg, frames, view)
    in_arena = [t for t in msg.tensors if t.offset is not None]
    write_with_tensorflow(theirs, in_arena, [t for t in msg.tensors if t.offset is None], frames, view)
    assert _files(str(tmp_path / "mine")) == _files(str(tmp_path / "tf"))
    for name in _files(str(tmp_path / "tf")):
        assert filecmp.cmp(tmp_path / "mine" / name, tmp_path / "tf" / name, shallow=False), name
    assert set(known) == {n for n in _files(str(tmp_path / "mine")) if ".data-" in n}
    for name, crc in known.items():
        assert crc == crc32c.file_checksum(str(tmp_path / "mine" / name))
    reader = tf.train.load_checkpoint(mine)
    assert set(reader.get_variable_to_shape_map()) == set(expected)
    for key, want in expected.items():
        got = reader.get_tensor(key)
        if isinstance(want, bytes):
            assert got == want
        else:
            np.testing.assert_array_equal(got, want)
            assert got.dtype == np.asarray(want).dtype


def test_dtype_table_is_tensorflows():
    import tensorflow as tf

    for name, (enum, size) in framed.DTYPES.items():
        dtype = tf.as_dtype(name)
        assert (dtype.name, dtype.as_datatype_enum, dtype.size) == (name, enum, size)
    assert tf.string.as_datatype_enum == framed.DT_STRING


def test_a_variant_or_unknown_dtype_takes_tensorflows_path():
    assert framed.native([TensorSpec("s", "string", [1], lengths=[3]), TensorSpec("f", "float32", [2])])
    assert not framed.native([TensorSpec("it", "variant", [])])
    assert not framed.native([TensorSpec("q", "qint8", [1])])
    assert not framed.native([TensorSpec("s", "string", [1])])  # a string frame without its lengths


@pytest.mark.parametrize("spec,frame,why", [
    (TensorSpec("f", "float32", [3]), b"\0" * 8, "needs 12"),
    (TensorSpec("s", "string", [2], lengths=[1, 5]), b"abc", "add up to 6"),
    (TensorSpec("s", "string", [3], lengths=[1, 2]), b"abc", "2 string lengths"),
    (TensorSpec("n", "int32", [-1]), b"", "negative dimension"),
])
def test_a_frame_that_does_not_match_its_spec_is_refused_before_any_file(tmp_path, spec, frame, why):
    msg = SaveData(step=1, reason=SaveReason.STEPS, basename="ckpt", tensors=[spec], arena=None)
    with pytest.raises(CheckpointError, match=why):
        write_snapshot(str(tmp_path / "ckpt-1"), msg, [frame], None)
    assert os.listdir(tmp_path) == []


def _nothing() -> None:
    """A ``preexec_fn`` that does nothing: ``conftest.launch`` then starts the command as a shell does."""


@pytest.mark.slow
def test_a_launched_checkpoint_service_commits_restorable_checkpoints_without_loading_tensorflow(logdir):
    import tensorflow as tf

    # launched as from a shell (a fork of the tests' TensorFlow-importing server would seed the service
    # with TensorFlow mapped already: services/seed.py); the service never loads it itself
    proc = launch(logdir, "--steps", "300", "--save-model-secs", "0.2", "--step-delay", "0.01", preexec_fn=_nothing,
                  opts=("--standby", "fork"))  # no restart: no hot standby
    try:
        wait_for(lambda: len(committed_steps(logdir)) >= 2, 90, what="two committed checkpoints")
        service = wait_role_pid(logdir, "checkpoint")
        with open(f"/proc/{service}/maps") as fh:
            loaded = [line.split()[-1] for line in fh if "tensorflow" in line]
        assert loaded == [], f"the checkpoint service mapped TensorFlow: {sorted(set(loaded))[:3]}"
    finally:
        code, _, err = finish(proc)
    assert code == 0, err
    latest = tf.train.latest_checkpoint(logdir)
    assert latest is not None and latest.endswith("-300")
    reader = tf.train.load_checkpoint(latest)
    assert int(reader.get_tensor("global_step/.ATTRIBUTES/VARIABLE_VALUE")) == 300
