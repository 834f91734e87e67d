"""procsv.services.summary.records, eventfile, render, sessions: pure parts of the summary service.

Every hand-encoded record is checked against protobuf's own serializer and read back with
TensorBoard's reader; the delivery and step-rate rules are driven directly.
"""

from __future__ import annotations

import json
import os
import struct

import numpy as np
import pytest
from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c
from tensorboard.util import tensor_util

from procsv.ipc.messages import SummaryItem
from procsv.services.summary import records
from procsv.common.eventnames import next_file_name
from procsv.services.summary.eventfile import EventFile
from procsv.services.summary.render import RenderError, buckets, render
from procsv.services.summary.sessions import Decision, Sessions, Verdict

WALL = 1_700_000_000.25


def read_records(path: str) -> list[event_pb2.Event]:
    """Parse a TFRecord file, checking both CRCs with TensorBoard's own implementation."""
    out = []
    with open(path, "rb") as fh:
        data = fh.read()
    pos = 0
    while pos < len(data):
        (n,) = struct.unpack_from("<Q", data, pos)
        (crc_len,) = struct.unpack_from("<I", data, pos + 8)
        assert crc_len == masked_crc32c(data[pos:pos + 8])
        body = data[pos + 12:pos + 12 + n]
        (crc_body,) = struct.unpack_from("<I", data, pos + 12 + n)
        assert crc_body == masked_crc32c(body)
        out.append(event_pb2.Event.FromString(body))
        pos += 16 + n
    return out


@pytest.mark.parametrize("data", [b"", b"x", b"hello world" * 50, bytes(range(256))])
def test_record_framing_matches_tensorboard(data):
    framed = records.frame(data)
    assert framed[:8] == struct.pack("<Q", len(data)) and framed[12:12 + len(data)] == data
    assert struct.unpack_from("<I", framed, 8)[0] == masked_crc32c(framed[:8])
    assert struct.unpack_from("<I", framed, 12 + len(data))[0] == masked_crc32c(data)


@pytest.mark.parametrize("n", [1, 127, 128, 300, 2**31, 2**63 - 1, -1, -(2**40)])
def test_varint_matches_protobuf(n):
    ev = event_pb2.Event(step=n)
    assert b"\x10" + records.varint(n) == ev.SerializeToString()
    assert records.varint(0) == b"\x00"


@pytest.mark.parametrize("wall,step", [(WALL, 10), (0.0, 0), (WALL, 0), (0.0, 7), (WALL, -3)])
def test_summary_event_is_what_protobuf_serializes(wall, step):
    summ = summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag="loss", simple_value=0.5)])
    expected = event_pb2.Event(wall_time=wall, step=step, summary=summ).SerializeToString()
    assert records.summary_event(wall, step, records.scalar_summary("loss", 0.5)) == expected


def test_session_log_and_file_version_events_are_what_protobuf_serializes():
    for status in (records.START, records.STOP, records.CHECKPOINT):
        log = event_pb2.SessionLog(status=status, checkpoint_path="/r/model.ckpt-5" if status == 3 else "")
        expected = event_pb2.Event(wall_time=WALL, step=5, session_log=log).SerializeToString()
        path = "/r/model.ckpt-5" if status == 3 else ""
        assert records.session_log_event(WALL, 5, status, path) == expected
    assert records.file_version_event(WALL) == event_pb2.Event(wall_time=WALL,
                                                                file_version="brain.Event:2").SerializeToString()


def test_graph_and_meta_graph_events_are_what_protobuf_serializes():
    from tensorboard.compat.proto import graph_pb2, meta_graph_pb2, node_def_pb2

    graph = graph_pb2.GraphDef(node=[node_def_pb2.NodeDef(name="x", op="Const")]).SerializeToString()
    meta = meta_graph_pb2.MetaGraphDef(graph_def=graph_pb2.GraphDef.FromString(graph)).SerializeToString()
    assert records.graph_event(WALL, 0, graph) == event_pb2.Event(wall_time=WALL, graph_def=graph).SerializeToString()
    assert records.graph_event(WALL, 4, meta, meta=True) == event_pb2.Event(wall_time=WALL, step=4,
                                                                             meta_graph_def=meta).SerializeToString()


def test_the_service_writes_a_graph_event_only_when_its_frame_parses():
    """A GraphEvent whose frame is no GraphDef is dropped, counted and said once, and the next one
    is written (the summary service goes on)."""
    from types import SimpleNamespace

    from tensorboard.compat.proto import graph_pb2, node_def_pb2

    from procsv.ipc.messages import GraphEvent
    from procsv.services.summary.service import SummaryService

    said: list[str] = []
    service = SimpleNamespace(service_dropped=0, _sync_now=False, _complain=said.append)
    out: list[bytes] = []
    SummaryService._graph(service, GraphEvent(0, WALL), b"\x0a\xff", out)  # type: ignore[arg-type]
    assert out == [] and service.service_dropped == 1 and "dropped a malformed graph" in said[0]
    graph = graph_pb2.GraphDef(node=[node_def_pb2.NodeDef(name="x", op="Const")]).SerializeToString()
    SummaryService._graph(service, GraphEvent(0, WALL), graph, out)  # type: ignore[arg-type]
    assert out == [records.frame(records.graph_event(WALL, 0, graph))] and service._sync_now


def test_scalar_encoder_groups_runs_of_one_step_into_one_event(tmp_path):
    tags = ["loss", "accuracy", "a/long/tag/ünïcode"]
    index = np.array([0, 1, 2, 0, 1, 0])
    steps = np.array([7, 7, 7, 8, 8, 7])
    values = np.array([0.5, 1.0, -2.0, 0.25, float("nan"), 3.0])
    walls = WALL + np.arange(6.0)
    blob = records.ScalarEncoder().records(tags, index, steps, values, walls)
    path = tmp_path / "f"
    path.write_bytes(blob)
    events = read_records(str(path))
    assert [(e.step, e.wall_time) for e in events] == [(7, WALL), (8, WALL + 3), (7, WALL + 5)]
    got = [[(v.tag, v.simple_value) for v in e.summary.value] for e in events]
    assert got[0] == [("loss", 0.5), ("accuracy", 1.0), ("a/long/tag/ünïcode", -2.0)]
    assert got[1][0] == ("loss", 0.25) and np.isnan(got[1][1][1])
    assert got[2] == [("loss", 3.0)]


def test_event_file_is_read_by_tensorboard_with_purge_on_start(tmp_path):
    from tensorboard.backend.event_processing import event_accumulator as ea

    f = EventFile(str(tmp_path), "procsv-test")
    enc = records.ScalarEncoder()
    steps = np.arange(1, 11)
    f.write(enc.records(["loss"], np.zeros(10, np.int64), steps, steps * 1.0, WALL + steps * 1.0))
    f.write(records.frame(records.session_log_event(WALL + 20, 6, records.START)))  # a restart from step 5
    steps = np.arange(6, 9)
    f.write(enc.records(["loss"], np.zeros(3, np.int64), steps, -steps * 1.0, WALL + 30 + steps))
    f.close()
    acc = ea.EventAccumulator(str(tmp_path), size_guidance={ea.SCALARS: 0})
    acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars("loss")] == [(1, 1), (2, 2), (3, 3), (4, 4), (5, 5), (6, -6),
                                                                   (7, -7), (8, -8)]


def test_each_new_event_file_sorts_after_the_existing_ones(tmp_path):
    later = "events.out.tfevents.%010d.host.procsv-1" % 4_000_000_000  # a file "from the future"
    (tmp_path / later).write_bytes(b"")
    name = next_file_name(str(tmp_path), 1_700_000_000.0, "procsv-2")
    assert name > later and name.startswith("events.out.tfevents.4000000001.")
    assert next_file_name(str(tmp_path / "missing"), 1_700_000_000.9, "x").startswith(
        "events.out.tfevents.1700000000.")
    a = EventFile(str(tmp_path), "procsv-3")
    b = EventFile(str(tmp_path), "procsv-3")  # same second, same tag: still a new, later file
    assert os.path.basename(b.path) > os.path.basename(a.path)
    a.close()
    b.close()


def test_a_continued_event_file_is_the_newest_one_of_that_tag_cut_back_to_its_whole_records(tmp_path):
    """A summary writer kept open across a plain python run's sessions (``stop(close_summary_writer=False)``):
    the next summary service continues the earlier one's file, after its last whole record (a torn
    tail is cut off), with no second file-version record; an older file is never continued."""
    from tensorboard.backend.event_processing.event_file_loader import RawEventFileLoader

    enc = records.ScalarEncoder()
    first = EventFile(str(tmp_path), "procsv-1")
    first.write(enc.records(["loss"], np.zeros(1, np.int64), np.array([1]), np.array([1.0]), np.array([WALL])))
    first.close()
    with open(first.path, "ab") as torn:
        torn.write(records.frame(records.scalar_summary("x", 1.0))[:9])  # a record cut short
    second = EventFile(str(tmp_path), "procsv-2", continue_tag="procsv-1")
    assert second.path == first.path
    second.write(enc.records(["loss"], np.zeros(1, np.int64), np.array([2]), np.array([2.0]), np.array([WALL])))
    second.close()
    events = [event_pb2.Event.FromString(r) for r in RawEventFileLoader(first.path).Load()]
    assert [e.WhichOneof("what") for e in events] == ["file_version", "summary", "summary"]
    assert [e.step for e in events[1:]] == [1, 2]
    third = EventFile(str(tmp_path), "procsv-3")  # a newer file: procsv-1's is no longer continued
    third.close()
    fourth = EventFile(str(tmp_path), "procsv-4", continue_tag="procsv-1")
    assert fourth.path not in (first.path, third.path)
    fourth.close()


# ----------------------------------------------------------------------------- render
def _item(kind, shape, dtype, **kw):
    return SummaryItem(kind, "t", 3, WALL, dtype, list(shape), **kw)


def test_histogram_buckets_match_tensorboard():
    from tensorboard.plugins.histogram.summary_v2 import histogram_pb

    rng = np.random.default_rng(0)
    for data, k in [(rng.normal(size=1000), 30), (np.arange(10.0), 4), (np.full(5, 2.0), 3), (np.zeros(0), 30)]:
        ref = tensor_util.make_ndarray(histogram_pb("t", data, buckets=k).value[0].tensor)
        np.testing.assert_allclose(buckets(data, k), ref)


def test_render_histogram_image_and_text_as_tf2_tensor_summaries():
    values = np.linspace(-1, 1, 100)
    h = summary_pb2.Summary.FromString(render(_item("histogram", values.shape, "float64", buckets=5),
                                              values.tobytes()))
    assert h.value[0].metadata.plugin_data.plugin_name == "histograms"
    assert tensor_util.make_ndarray(h.value[0].tensor).shape == (5, 3)
    pixels = (np.arange(2 * 3 * 4 * 3) % 256).astype(np.uint8).reshape(2, 3, 4, 3)
    im = summary_pb2.Summary.FromString(render(_item("image", pixels.shape, "uint8"), pixels.tobytes()))
    assert im.value[0].metadata.plugin_data.plugin_name == "images"
    parts = tensor_util.make_ndarray(im.value[0].tensor)
    assert parts[0] == b"4" and parts[1] == b"3" and len(parts) == 4
    assert all(p.startswith(b"\x89PNG\r\n\x1a\n") for p in parts[2:])
    text = json.dumps(["a", "ü"]).encode()
    tx = summary_pb2.Summary.FromString(render(_item("text", [2], "json"), text))
    assert tx.value[0].metadata.plugin_data.plugin_name == "text"
    assert tensor_util.make_ndarray(tx.value[0].tensor).tolist() == [b"a", "ü".encode()]


@pytest.mark.parametrize("values,k", [(np.random.default_rng(5).normal(size=1000), 30), (np.arange(10.0), 4),
                                      (np.full(5, 2.0), 3), (np.zeros(0), 30), (np.arange(6.0).reshape(2, 3), 2)])
def test_rendered_histogram_is_byte_identical_to_tensorboards_histogram_pb(values, k):
    from tensorboard.plugins.histogram.summary_v2 import histogram_pb

    item = _item("histogram", values.shape, "float64", buckets=k, description="weights")
    assert render(item, values.tobytes()) == histogram_pb("t", values, buckets=k,
                                                          description="weights").SerializeToString()


@pytest.mark.parametrize("strings,shape", [(["hello"], [1]), (["a", "ü", ""], [3]), ([["x", "y"], ["z", "w"]], [2, 2])])
def test_rendered_text_is_byte_identical_to_tensorboards_text_pb(strings, shape):
    from tensorboard.plugins.text.summary_v2 import text_pb

    item = _item("text", shape, "json", description="notes")
    expected = text_pb("t", np.array(strings, dtype=object), description="notes").SerializeToString()
    assert render(item, json.dumps(strings).encode()) == expected


@pytest.mark.parametrize("channels,mode", [(1, "L"), (2, "LA"), (3, "RGB"), (4, "RGBA")])
def test_png_decodes_with_pillow_to_the_same_pixels(channels, mode):
    import io

    from PIL import Image

    from procsv.services.summary.render import png

    img = np.random.default_rng(channels).integers(0, 256, size=(5, 7, channels), dtype=np.uint8)
    data = png(img)
    with Image.open(io.BytesIO(data)) as checked:
        checked.verify()  # every chunk's CRC and the chunk sequence
    with Image.open(io.BytesIO(data)) as decoded:
        assert decoded.format == "PNG" and decoded.mode == mode and decoded.size == (7, 5)
        assert (np.asarray(decoded).reshape(5, 7, channels) == img).all()


@pytest.mark.parametrize("item,frame", [
    (_item("image", [2, 2, 2], "uint8"), bytes(8)),  # not [k, h, w, c]
    (_item("image", [1, 2, 2, 5], "uint8"), bytes(20)),  # 5 channels
    (_item("histogram", [10], "float64"), bytes(8)),  # frame too short
    (_item("histogram", [1], "no-such-dtype"), bytes(8)),
    (_item("text", [1], "json"), b"\xff not json"),
    (_item("audio", [1], "float32"), bytes(4)),
])
def test_render_refuses_inconsistent_items(item, frame):
    with pytest.raises(RenderError):
        render(item, frame)


# ----------------------------------------------------------------------------- sessions
def test_first_batch_restates_then_batches_are_written_in_order():
    s = Sessions()
    d = s.admit("A", 1, resync_from=11)
    assert d.verdict == Verdict.WRITE and d.start_marker == 11 and s.current == "A"
    assert s.admit("A", 2, None).verdict == Verdict.WRITE
    assert s.admit("A", 2, None).verdict == Verdict.STALE
    assert s.acks() == {"A": {"written": 2, "resync_after": 0}}


def test_an_unknown_session_or_a_gap_asks_for_a_restatement():
    s = Sessions()  # a restarted service: it never saw session A
    assert s.admit("A", 7, None).verdict == Verdict.RESYNC
    assert s.admit("A", 8, None).verdict == Verdict.RESYNC
    assert s.acks()["A"] == {"written": 0, "resync_after": 8}
    d = s.admit("A", 9, resync_from=40)
    assert d.verdict == Verdict.WRITE and d.start_marker == 40
    assert s.acks()["A"] == {"written": 9, "resync_after": 0}
    assert s.admit("A", 11, None).verdict == Verdict.RESYNC  # 10 was lost
    assert s.acks()["A"]["resync_after"] == 11


def test_a_replaced_session_is_written_only_below_its_successors_start():
    s = Sessions()
    s.admit("old", 1, resync_from=1)
    s.admit("new", 1, resync_from=101)  # a restarted trainer resumed from step 100
    d = s.admit("old", 2, None)  # the dead trainer's last batch arrives late
    assert d.verdict == Verdict.WRITE and d.below == 101
    assert s.admit("new", 2, None).below is None


def test_a_replaced_sessions_late_restatement_neither_purges_nor_takes_over():
    s = Sessions()
    s.admit("old", 1, resync_from=1)
    s.admit("new", 1, resync_from=101)
    assert s.admit("new", 2, None) == Decision(Verdict.WRITE)  # acknowledged: written at any step
    d = s.admit("old", 5, resync_from=90)  # the dead trainer had asked to restate from 90
    assert d.verdict == Verdict.WRITE and d.start_marker is None and d.below == 101
    assert s.current == "new"
    assert s.admit("new", 3, None) == Decision(Verdict.WRITE)  # not cut below the old one's start
    assert s.acks()["new"] == {"written": 3, "resync_after": 0}


def test_anonymous_batches_are_written_as_they_come():
    assert Sessions().admit("", 0, None).verdict == Verdict.WRITE


def test_step_rate_is_written_every_period_from_marks_of_the_current_session():
    s = Sessions()
    s.admit("A", 1, resync_from=1)
    assert s.step_rate("A", 100.0, 10, every=2.0) is None  # first mark
    assert s.step_rate("A", 101.0, 20, every=2.0) is None  # not due
    assert s.step_rate("A", 102.5, 60, every=2.0) == pytest.approx(50 / 2.5)
    assert s.step_rate("A", 103.5, 60, every=2.0) is None  # the step stands still, not yet a whole period
    assert s.step_rate("A", 105.0, 60, every=2.0) == 0.0  # a whole period: 0.0 at it, as TF's step counter thread
    assert s.step_rate("A", 106.0, 100, every=2.0) is None  # not due (a period from the last rate written)
    assert s.step_rate("A", 107.5, 100, every=2.0) == pytest.approx(40 / 2.5)
    assert s.step_rate("A", 200.0, 500, every=None) is None
    s.admit("B", 1, resync_from=51)  # a restart: the next rate never spans it
    assert s.step_rate("A", 300.0, 900, every=2.0) is None
    assert s.step_rate("B", 300.0, 60, every=2.0) is None
    assert s.step_rate("B", 303.0, 90, every=2.0) == pytest.approx(10.0)
