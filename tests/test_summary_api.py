"""The Supervisor's summary API: validation at the call site, and what reaches TensorBoard.

Fast checks drive :class:`procsv.trainer.summaries.SummaryBuffer` directly; one test runs a real
Supervisor (plain ``python`` mode: it starts its own summary and checkpoint services) and reads
the event files back with TensorBoard's ``EventAccumulator``.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from procsv.trainer.summaries import SummaryBuffer, as_step

WALL = 1_700_000_000.25


@pytest.mark.parametrize("call", [
    lambda b: b.scalar("loss", "0.5", 1, WALL),
    lambda b: b.scalar("loss", np.array(["x"]), 1, WALL),
    lambda b: b.scalars({"ok": 1.0, "loss": object()}, 1, WALL),
    lambda b: b.scalars([("loss", 1.0)], 1, WALL),
    lambda b: b.scalar("loss", 1.0, "seven", WALL),
    lambda b: b.scalar("loss", 1.0, 7.5, WALL),
    lambda b: b.histogram("w", ["a", "b"], 1, WALL),
    lambda b: b.histogram("w", np.array([True, False]), 1, WALL),
    lambda b: b.image("img", np.zeros((1, 4, 4, 3), np.int32), 1, WALL),
    lambda b: b.image("img", np.full((1, 4, 4, 3), "x"), 1, WALL),
    lambda b: b.text("t", [b"ok", 3], 1, WALL),
], ids=["str-scalar", "str-array", "one-bad-in-mapping", "not-a-mapping", "str-step", "float-step", "str-histogram",
        "bool-histogram", "int32-image", "str-image", "int-in-text"])
def test_wrong_types_raise_type_error_and_keep_nothing(call):
    buf = SummaryBuffer()
    with pytest.raises(TypeError):
        call(buf)
    assert len(buf) == 0


@pytest.mark.parametrize("call,match", [
    (lambda b: b.scalar("", 1.0, 1, WALL), "tag"),
    (lambda b: b.scalars({"  ": 1.0}, 1, WALL), "tag"),
    (lambda b: b.histogram("", [1.0], 1, WALL), "tag"),
    (lambda b: b.histogram("w", [1.0, float("nan")], 1, WALL), "NaN"),
    (lambda b: b.histogram("w", [1.0], 1, WALL, buckets=0), "buckets"),
    (lambda b: b.image("img", np.zeros((4, 4)), 1, WALL), "shape"),  # no channel axis
    (lambda b: b.image("img", np.zeros((1, 4, 4, 5)), 1, WALL), "shape"),  # 5 channels
    (lambda b: b.image("img", np.zeros((2, 1, 0, 4, 4, 3)), 1, WALL), "shape"),
    (lambda b: b.image("img", np.zeros((1, 0, 4, 3)), 1, WALL), "shape"),  # empty
    (lambda b: b.image("img", np.zeros((1, 4, 4, 3)), 1, WALL, max_outputs=0), "max_outputs"),
    (lambda b: b.text("", "hello", 1, WALL), "tag"),
    (lambda b: b.text("t", b"\xff\xfe", 1, WALL), "UTF-8"),
])
def test_bad_values_raise_value_error_naming_the_problem(call, match):
    buf = SummaryBuffer()
    with pytest.raises(ValueError, match=match):
        call(buf)
    assert len(buf) == 0


def test_accepted_forms():
    buf = SummaryBuffer()
    buf.scalar("a", np.float32(0.5), np.int64(3), WALL)
    buf.scalar("b", True, 3, WALL)
    buf.scalar("c", np.array([2.0]), 3, WALL)
    buf.histogram("h", [[1, 2], [3, 4]], 3, WALL)
    buf.image("one", np.zeros((4, 5, 3), np.uint8), 3, WALL)  # a single [h, w, c] image
    buf.image("many", np.ones((5, 4, 4, 1), np.float64), 3, WALL, max_outputs=2)
    buf.text("t", np.array([["a", "b"], ["c", "d"]]), 3, WALL)
    chunk = buf.take()
    assert [r[:3] for r in chunk.rows] == [("a", 3, 0.5), ("b", 3, 1.0), ("c", 3, 2.0)]
    items = {i.tag: (i, data) for i, data in chunk.items}
    assert items["one"][0].shape == [1, 4, 5, 3] and items["one"][0].dtype == "uint8"
    assert items["many"][0].shape == [2, 4, 4, 1] and items["many"][0].dtype == "float32"
    assert items["t"][0].shape == [2, 2]
    assert as_step(np.int32(4)) == 4


def test_logged_arrays_are_copied_at_the_call():
    buf = SummaryBuffer()
    values = np.arange(4.0)
    buf.histogram("h", values, 1, WALL)
    values[:] = -1  # the caller reuses its array right away
    (_, data), = buf.take().items
    assert np.frombuffer(data, np.float64).tolist() == [0.0, 1.0, 2.0, 3.0]


@pytest.mark.slow
def test_a_real_supervisor_refuses_bad_input_at_the_call_and_writes_the_rest(logdir):
    import tensorflow as tf
    from tensorboard.backend.event_processing import event_accumulator as ea
    from tensorboard.util import tensor_util

    import procsv

    sv = procsv.Supervisor(logdir=logdir, checkpoint=None, save_summaries_secs=None)
    with sv.managed_session() as sess:
        sess.run(lambda: None)
        with pytest.raises(TypeError, match="'loss'.*real number"):
            sv.log_scalar("loss", "not a number")
        with pytest.raises(ValueError, match="tag"):
            sv.log_scalar("", 1.0)
        with pytest.raises(ValueError, match="image 'img'.*shape"):
            sv.log_image("img", np.zeros((8, 8)))
        with pytest.raises(TypeError, match="'acc'"):
            sv.log_scalars({"acc": tf.constant([1.0, 2.0])})
        sv.log_scalar("loss", tf.constant(0.25))
        sv.log_scalars({"acc": np.float32(0.5)}, step=1)
        sv.log_histogram("weights", tf.random.normal([1000]), buckets=20)
        sv.log_image("img", tf.zeros([2, 8, 8, 3]))
        sv.log_text("note", "step one")
        sess.run(lambda: None)
        service = sv._own.processes["summary"]
        assert service.poll() is None  # the service never saw the garbage
    acc = ea.EventAccumulator(logdir, size_guidance={ea.SCALARS: 0, ea.TENSORS: 0})
    acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars("loss")] == [(1, 0.25)]
    assert [(e.step, e.value) for e in acc.Scalars("acc")] == [(1, 0.5)]
    assert tensor_util.make_ndarray(acc.Tensors("weights")[0].tensor_proto)[:, 2].sum() == 1000
    assert len(tensor_util.make_ndarray(acc.Tensors("img")[0].tensor_proto)) == 4
    assert tensor_util.make_ndarray(acc.Tensors("note")[0].tensor_proto).item() == b"step one"
    with open(os.path.join(logdir, "logs", "summary.1.log")) as fh:
        assert "Traceback" not in fh.read()
