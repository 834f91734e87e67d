"""The summary service's loop: receive summary batches, write TensorBoard event files.

Runs in the summary service process (``python -m services.summary``). It binds the PULL socket
``summary.sock``; the trainer pushes :class:`SummaryBatch` and :class:`SessionLogEvent`, the
checkpoint service pushes ``SessionLog CHECKPOINT``. Events go through TensorBoard's own
``EventFileWriter`` (flushed every :data:`FLUSH_SECS` seconds and at exit), in TensorBoard's
TF-free mode, so this process never imports TensorFlow and starts in well under a second.
A malformed message is reported and dropped; it never stops the service.
"""

from __future__ import annotations

import os
import signal
import sys
import time
import types
from typing import Any, Optional

import zmq

from ipc.codec import ProtocolError, decode
from ipc.messages import Hello, SessionLogEvent, SummaryBatch
from ipc.transport import make_socket, send
from procsv.child import ChildContext

FLUSH_SECS = 2.0
POLL_MS = 200
DRAIN_SECS = 2.0

# TensorBoard's documented switch to its TF-free stub: keeps TensorFlow out of this process.
sys.modules.setdefault("tensorboard.compat.notf", types.ModuleType("tensorboard.compat.notf"))

from tensorboard.compat.proto import event_pb2, summary_pb2  # noqa: E402
from tensorboard.summary.writer.event_file_writer import EventFileWriter  # noqa: E402

_SESSION_STATUS = {
    "start": event_pb2.SessionLog.START,
    "stop": event_pb2.SessionLog.STOP,
    "checkpoint": event_pb2.SessionLog.CHECKPOINT,
}


class SummaryService:
    def __init__(self, ctx: ChildContext) -> None:
        self.ctx = ctx
        self.zctx = zmq.Context.instance()
        self.pull = make_socket(self.zctx, zmq.PULL)
        self.pull.bind(ctx.endpoints.summary)
        self.to_watchdog: Optional[zmq.Socket] = None
        if ctx.supervised:
            self.to_watchdog = make_socket(self.zctx, zmq.PUSH, linger_ms=1000)
            self.to_watchdog.connect(ctx.endpoints.watchdog)
        self.writer = EventFileWriter(
            ctx.layout.logdir, max_queue_size=10000, flush_secs=FLUSH_SECS, filename_suffix=f".procsv.{os.getpid()}"
        )
        self.dropped_total = 0
        self.stopping = False

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self._on_term)
        signal.signal(signal.SIGINT, self._on_term)
        if self.to_watchdog is not None:
            send(self.to_watchdog, Hello("summary", os.getpid(), self.ctx.attempt))
        while not self.stopping:
            if self.pull.poll(POLL_MS, zmq.POLLIN):
                self._handle(self.pull.recv_multipart(copy=False))
        deadline = time.monotonic() + DRAIN_SECS
        while time.monotonic() < deadline and self.pull.poll(50, zmq.POLLIN):
            self._handle(self.pull.recv_multipart(copy=False))
        self.writer.close()  # flushes
        self.pull.close(0)
        return 0

    def _on_term(self, signum: int, frame: Any) -> None:
        self.stopping = True

    def _handle(self, frames: list[Any]) -> None:
        try:
            msg, payload = decode(frames)
        except ProtocolError as exc:
            print(f"procsv summary: dropped a malformed message: {exc}", file=sys.stderr, flush=True)
            return
        if isinstance(msg, SummaryBatch):
            self._write_batch(msg, payload)
        elif isinstance(msg, SessionLogEvent):
            status = _SESSION_STATUS.get(msg.status)
            if status is None:
                print(f"procsv summary: unknown session status {msg.status!r}", file=sys.stderr, flush=True)
                return
            log = event_pb2.SessionLog(status=status, checkpoint_path=msg.checkpoint_path)
            self.writer.add_event(event_pb2.Event(wall_time=time.time(), step=msg.step, session_log=log))
            if msg.status in ("checkpoint", "stop"):
                self.writer.flush()

    def _write_batch(self, msg: SummaryBatch, payload: list[Any]) -> None:
        for row in msg.scalars:
            try:
                tag, step, value, wall = str(row[0]), int(row[1]), float(row[2]), float(row[3])
            except (IndexError, TypeError, ValueError):
                print(f"procsv summary: dropped a malformed scalar row {row!r:.80}", file=sys.stderr, flush=True)
                continue
            summ = summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag=tag, simple_value=value)])
            self.writer.add_event(event_pb2.Event(wall_time=wall, step=step, summary=summ))
        for row, frame in zip(msg.protos, payload):
            try:
                summ = summary_pb2.Summary.FromString(frame.bytes if hasattr(frame, "bytes") else bytes(frame))
                step, wall = int(row[0]), float(row[1])
            except Exception as exc:  # a protobuf DecodeError or a bad row: drop this one only
                print(f"procsv summary: dropped a malformed summary proto: {exc}", file=sys.stderr, flush=True)
                continue
            self.writer.add_event(event_pb2.Event(wall_time=wall, step=step, summary=summ))
        if msg.dropped:
            self.dropped_total += msg.dropped
            last_step = int(msg.scalars[-1][1]) if msg.scalars else 0
            summ = summary_pb2.Summary(
                value=[summary_pb2.Summary.Value(tag="procsv/summaries_dropped", simple_value=self.dropped_total)]
            )
            self.writer.add_event(event_pb2.Event(wall_time=time.time(), step=last_step, summary=summ))
