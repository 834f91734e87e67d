"""The summary service's loop: receive summary batches, write TensorBoard event files, ack them.

Runs in the summary service process (``python -m procsv.services.summary``); imports no TensorFlow.
It binds the ROUTER socket ``summary.sock``: the trainer's DEALER sends :class:`SummaryBatch`,
:class:`SessionLogEvent` (START, STOP) and, in graph mode, :class:`GraphEvent`, the checkpoint service's DEALER sends ``SessionLog
CHECKPOINT``, the watchdog's DEALER sends :class:`RunScalars`, procsv's own scalars, written into
the run ``procsv`` (``<logdir>/procsv/``, :mod:`procsv.services.summary.procsvrun`).

Each burst of messages becomes one ``os.write`` to this process's own event file
(:mod:`procsv.services.summary.eventfile`); only then are the batches acknowledged: each
connection that sent batches of a session in the burst gets a :class:`SummaryAck` for it (the
last batch written, and any restatement asked for), so an acknowledged summary survives a crash
of this process. A restarted service knows no connection until a trainer sends again; the
trainer sends a batch at least every second, and the ack to it asks for the restatement. What is
written is fsynced every :data:`FSYNC_SECS`, at each checkpoint, at STOP and at exit. Which
batches may be written, and when ``global_step/sec`` is, follows
:mod:`procsv.services.summary.sessions`. Counters (values written, dropped, NaN or infinite scalars written) go to
``<logdir>/.procsv/summary_stats.json`` for ``procsv status`` (written first right after start:
its ``pid`` says this process is up). A message that is malformed, of another schema version, of
a kind this service does not take or with frames its header does not announce is refused by the
codec and counted by reason (``rejected`` in the stats file; one log line per reason, see
:class:`~procsv.ipc.rejections.Rejections`); a malformed item inside a valid batch is reported,
dropped and counted in ``service_dropped``. Neither ever stops the service. SIGTERM stops it (after
a short drain) when the watchdog sends it, or anyone once the watchdog is gone; one sent to every
process of the job at once is left to the watchdog, which stops the trainer first.

What a crash costs (the bound docs/guarantees.md quotes):

* Killing this service (even SIGKILL, at any moment) loses no summary. The trainer keeps every
  batch until this service has written it to its event file; the restarted service asks for what
  it has not acknowledged, and the trainer restates it after a ``SessionLog START`` at the first
  step concerned, so TensorBoard shows each tag's value at each step exactly once. The trainer
  never waits: while the service is down or slower than the trainer, summaries wait in the
  trainer's bounded buffer (100,000 scalars, 64 MiB of other summaries); beyond that the oldest are
  dropped, counted exactly, and shown in ``procsv status`` and as ``procsv/summaries_dropped``.
  The only points not restated are this service's own (``global_step/sec``,
  ``procsv/summaries_dropped``) at steps after the restatement point: at most one each per restart.
* A crash of the machine loses at most what was written in the last ``FSYNC_SECS`` (2 s): event
  files are fsynced that often, at each checkpoint, at the trainer's STOP and at exit.
* Killing the trainer loses the summaries of the steps after its last checkpoint, which the
  restarted trainer runs and logs again (its START purges the old ones). The summaries of steps up
  to that checkpoint are handed over at every step boundary while the checkpoint is being
  committed, before the commit can complete in practice (a commit takes longer than a step).
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any, Callable, Optional

import numpy as np
import zmq
from tensorboard.compat.proto import graph_pb2, meta_graph_pb2, summary_pb2

from procsv.common.bootstrap import ChildContext
from procsv.common.layout import read_json, write_json
from procsv.common.stopfrom import Authority
from procsv.common.stopwake import StopWake
from procsv.ipc.codec import ProtocolError
from procsv.ipc.columns import Columns, decode_columns
from procsv.ipc.messages import (GraphEvent, Hello, ProtoRef, Role, RunScalars, SessionLogEvent, SessionStatus,
                                 SummaryAck, SummaryBatch)
from procsv.ipc.rejections import Rejections
from procsv.ipc.transport import SUMMARY_FRAME_MAX, Received, bind_private, drain, make_socket, send
from procsv.services.summary import records
from procsv.services.summary.eventfile import EventFile
from procsv.services.summary.procsvrun import BadRunScalars, ProcsvRun
from procsv.services.summary.render import RenderError, render
from procsv.services.summary.sessions import Sessions, Verdict

FSYNC_SECS = 2.0  # written events become durable at least this often
STATS_SECS = 1.0  # summary_stats.json is rewritten at most this often (and at exit)
DROPS_SECS = 1.0  # the procsv/summaries_dropped summary is written at most this often
POLL_MS = 200
DRAIN_POLL_MS = 50
BURST_MAX = 256  # messages per write
DRAIN_SECS = 2.0
KEEP_SESSIONS = 20  # sessions remembered (for acks and in the stats file)
DROPPED_TAG = "procsv/summaries_dropped"
COLUMN_FRAMES = 1  # the scalar columns of a batch travel in one frame (see procsv.ipc.columns)
ACCEPT = frozenset({SummaryBatch, SessionLogEvent, GraphEvent, RunScalars})  # from trainers, the checkpoint service, the watchdog

_SESSION_STATUS = {SessionStatus.START: records.START, SessionStatus.STOP: records.STOP,
                   SessionStatus.CHECKPOINT: records.CHECKPOINT}


class SummaryService:
    """The summary service: its sockets, the event files it appends to, the sessions and its counters."""

    _wake: StopWake  # made in run(): SIGTERM/SIGINT, polled beside the ROUTER

    def __init__(self, ctx: ChildContext, clock: Callable[[], float] = time.monotonic) -> None:
        self.ctx = ctx
        self.clock = clock
        self.zctx: zmq.Context[Any] = zmq.Context.instance()
        self.router = make_socket(self.zctx, zmq.ROUTER, max_frame=SUMMARY_FRAME_MAX)
        bind_private(self.router, ctx.endpoints.summary)
        self.to_watchdog: Optional[zmq.Socket[Any]] = None
        if ctx.supervised:
            self.to_watchdog = make_socket(self.zctx, zmq.PUSH, linger_ms=1000)
            self.to_watchdog.connect(ctx.endpoints.watchdog)
        self.file = EventFile(ctx.layout.logdir, f"procsv-{os.getpid()}", ctx.config.launch.summary_continue)
        self.procsv_run = ProcsvRun(ctx.layout.logdir, f"procsv-{os.getpid()}")  # the watchdog's RunScalars
        self.stats_path = ctx.layout.summary_stats
        self.sessions = Sessions()
        self.encoder = records.ScalarEncoder()
        old = read_json(self.stats_path)
        old = old if isinstance(old, dict) else {}
        self.written_before = int(old.get("written", 0) or 0)
        self.by_session: dict[str, int] = dict(old.get("by_session") or {})  # trainer-side drops, cumulative
        self.service_dropped = int(old.get("service_dropped", 0) or 0)  # malformed items and batches
        self.nonfinite_before = int(old.get("nonfinite", 0) or 0)
        self.written = 0
        self.nonfinite = 0  # scalars written whose value is NaN or infinite (kept as they are, and counted)
        self.drops_written: tuple[int, int] = (0, -1)  # (total, step) of the last dropped-count summary
        self.drops_pending: Optional[tuple[int, int]] = None  # (step, total) to write once that step is over
        self.rejections = Rejections("procsv summary", os.path.relpath(self.stats_path, ctx.layout.logdir), self._say)
        self.stopping = False
        self._ack_to: dict[tuple[bytes, str], None] = {}  # (connection, session) to ack after this burst
        self._sync_now = False
        self._held: Optional[list[bytes]] = []  # CHECKPOINT logs before the trainer's first batch or log (fair-queued
        # pipes: at start the checkpoint service's could land before the graph events TF writes first)
        self._write_error: Optional[str] = None  # why the last write to the event file failed (None: it did not)
        now = clock()
        self._next_fsync = now + FSYNC_SECS
        self._next_stats = now
        self._next_drops = now

    # ------------------------------------------------------------------ loop
    def run(self) -> int:
        self._wake = StopWake(self.router, self._on_term, self._stop_authority(), "procsv summary")  # woken at once
        self._write_stats(durable=False)  # its pid says: up, socket bound
        if self.to_watchdog is not None:
            send(self.to_watchdog, Hello(Role.SUMMARY, os.getpid(), self.ctx.attempt))
        while not self.stopping:
            self._burst(POLL_MS)
            self._tick(self.clock())
        deadline = self.clock() + DRAIN_SECS
        while self.clock() < deadline and self._burst(DRAIN_POLL_MS):
            pass
        self._wake.close()
        out = self._held or []
        self._held = None
        self._flush_drops(out)
        self._write(out, self.written)
        for closing in (self.file.close, self.procsv_run.close):
            try:
                closing()
            except OSError as exc:
                self._write_failed("cannot sync the event files at exit", exc)
        self._write_stats(durable=True)
        self.router.close(0)
        return 0

    def _on_term(self, signum: int) -> None:
        self.stopping = True

    def _stop_authority(self) -> Authority:
        """Whose SIGTERM/SIGINT stops this service: the process that started it (the watchdog, or the
        trainer of a plain ``python train.py``), or anyone's once that one is gone."""
        return Authority.parent("the watchdog" if self.ctx.supervised else "the trainer that started it",
                                self.ctx.config.parent_pid)

    def _burst(self, wait_ms: int) -> int:
        """Handle what arrives within ``wait_ms`` and right after (up to BURST_MAX messages), write it
        with one os.write, then ack it; return how many messages were handled."""
        out: list[bytes] = []
        n = 0
        if not self._wake.wait(wait_ms):
            return 0
        before = self.written
        for got in drain(self.router, limit=BURST_MAX, routed=True, accept=ACCEPT):
            n += 1
            if isinstance(got, ProtocolError):
                self.rejections.count(got)
                continue
            self._handle(got, out)
        if not n:
            return 0
        self._write(out, before)
        if self._sync_now:
            self._sync_now = False
            self._sync()
            self._next_fsync = self.clock() + FSYNC_SECS
        self._send_acks()
        return n

    def _write(self, out: list[bytes], before: int) -> None:
        """Append ``out`` to the event file. When the disk refuses it (full: ENOSPC, or EIO), the
        burst is dropped and its values (``written`` since ``before``) counted in
        ``service_dropped``; the batches are still acknowledged (the trainer would otherwise hold
        them, overflow and report the service stalled), and the service runs on."""
        try:
            self.file.write(b"".join(out))
        except OSError as exc:
            lost = self.written - before
            self.written = before
            self.service_dropped += lost
            self._write_failed(f"dropped {lost} summary value(s): cannot write {self.file.path}", exc)
            return
        if self._write_error is not None:
            self._complain(f"writing {self.file.path} again ({self._write_error} before)")
            self._write_error = None

    def _sync(self) -> None:
        """fsync the event files; a refused fsync is said once, never a reason to stop."""
        try:
            self.file.sync()
            self.procsv_run.sync()
        except OSError as exc:
            self._write_failed("cannot sync the event files", exc)

    def _write_failed(self, what: str, exc: OSError) -> None:
        """Say the first failure of a run of them (a full disk fails every write until it has room)."""
        reason = exc.strerror or str(exc)
        if self._write_error is None:
            self._complain(f"{what} ({reason}); dropping and counting what cannot be written until it can")
        self._write_error = reason

    def _tick(self, now: float) -> None:
        if now >= self._next_fsync:
            self._sync()
            self._next_fsync = now + FSYNC_SECS
        if now >= self._next_stats:
            self._write_stats(durable=False)

    # ------------------------------------------------------------------ messages
    def _handle(self, got: Received, out: list[bytes]) -> None:
        msg = got.msg
        held = isinstance(msg, SessionLogEvent) and msg.status == SessionStatus.CHECKPOINT and self._held is not None
        if isinstance(msg, (SummaryBatch, SessionLogEvent)) and self._held is not None and not held:
            out.extend(self._held)  # the trainer's first batch or log: its graph events are written by now
            self._held = None
        if isinstance(msg, SummaryBatch):
            self._batch(msg, got.payload, out)
            if msg.session and got.identity is not None:
                self._ack_to[(got.identity, msg.session)] = None
        elif isinstance(msg, SessionLogEvent):
            status = _SESSION_STATUS[msg.status]
            if msg.status == SessionStatus.STOP:
                self._flush_drops(out)  # the trainer is done: its final count
            (self._held if held and self._held is not None else out).append(
                records.frame(records.session_log_event(time.time(), msg.step, status, msg.checkpoint_path)))
            if msg.status in (SessionStatus.CHECKPOINT, SessionStatus.STOP):
                self._sync_now = True
        elif isinstance(msg, GraphEvent):
            self._graph(msg, got.payload[0], out)
        elif isinstance(msg, RunScalars):
            try:
                self.procsv_run.write(msg, self.dropped())
            except (BadRunScalars, OSError) as exc:  # never a reason to stop writing the user's summaries
                self._complain(f"dropped procsv's own scalars at step {msg.step}: {exc}")
                self.service_dropped += 1

    def _batch(self, msg: SummaryBatch, payload: list[Any], out: list[bytes]) -> None:
        n_protos = len(msg.protos)  # the codec checked the frame count against the header
        n_cols = COLUMN_FRAMES if msg.columns else 0
        try:
            cols = decode_columns(payload[n_protos], msg.columns) if n_cols else Columns.empty()
        except ProtocolError as exc:
            self._complain(f"dropped a batch: {exc}")
            self.service_dropped += msg.columns + n_protos + len(msg.items)
            return
        decision = self.sessions.admit(msg.session, msg.seq, msg.resync_from, msg.purge)
        if decision.verdict != Verdict.WRITE:
            return
        if msg.session:
            self.by_session[msg.session] = max(self.by_session.get(msg.session, 0), msg.dropped_total)
        else:
            self.service_dropped += msg.dropped
        if decision.start_marker is not None:
            out.append(records.frame(records.session_log_event(time.time(), decision.start_marker, records.START)))
            if self.drops_written[1] >= decision.start_marker:  # TensorBoard just forgot that point
                self.drops_written = (-1, decision.start_marker - 1)
        below = decision.below
        if below is not None:
            cols = cols.below(below)
        out.append(self.encoder.records(cols.tags, cols.index, cols.steps, cols.values, cols.walls))
        self.written += len(cols)
        self.nonfinite += int(len(cols) - np.isfinite(cols.values).sum())
        for ref, frame in zip(msg.protos, payload[:n_protos]):
            self._proto(ref, frame, below, out)
        for item, frame in zip(msg.items, payload[n_protos + n_cols:]):
            if below is not None and item.step >= below:
                continue
            try:
                out.append(records.frame(records.summary_event(item.wall_time, item.step, render(item, frame))))
                self.written += 1
            except RenderError as exc:
                self._complain(f"dropped a summary: {exc}")
                self.service_dropped += 1
        if msg.step >= 0 and msg.session == self.sessions.current:
            self._note_drops(msg.step, out)
            rate = self.sessions.step_rate(msg.session, msg.mono, msg.step, msg.step_rate_secs)
            if rate is not None:
                summary = records.scalar_summary("global_step/sec", rate)
                out.append(records.frame(records.summary_event(msg.wall_time or time.time(), msg.step, summary)))

    def _graph(self, msg: GraphEvent, frame: Any, out: list[bytes]) -> None:
        """A graph-mode trainer's GraphDef (or MetaGraphDef): checked, then one event."""
        data = frame.bytes if hasattr(frame, "bytes") else bytes(frame)
        try:
            (meta_graph_pb2.MetaGraphDef if msg.meta else graph_pb2.GraphDef).FromString(data)
        except Exception as exc:  # a protobuf DecodeError: drop this one only
            self._complain(f"dropped a malformed {'meta graph' if msg.meta else 'graph'}: {exc}")
            self.service_dropped += 1
            return
        out.append(records.frame(records.graph_event(msg.wall_time, msg.step, data, msg.meta)))
        self._sync_now = True

    def _proto(self, ref: ProtoRef, frame: Any, below: Optional[int], out: list[bytes]) -> None:
        data = frame.bytes if hasattr(frame, "bytes") else bytes(frame)
        try:
            summary_pb2.Summary.FromString(data)  # refuse garbage here, not in TensorBoard
        except Exception as exc:  # a protobuf DecodeError: drop this one only
            self._complain(f"dropped a malformed summary proto: {exc}")
            self.service_dropped += 1
            return
        if below is not None and ref.step >= below:
            return
        out.append(records.frame(records.summary_event(ref.wall_time, ref.step, data)))
        self.written += 1

    # ------------------------------------------------------------------ bookkeeping
    def dropped(self) -> int:
        return sum(self.by_session.values()) + self.service_dropped

    def _note_drops(self, step: int, out: list[bytes]) -> None:
        """Keep the dropped count for ``step``; write the one of an earlier step once that step is over.

        At most one point per DROPS_SECS and never two at one step; each point holds the count as of
        the end of its step, so the last one written (at the latest at exit) is the final count.
        """
        pending = self.drops_pending
        if pending is not None and step > pending[0] and self.clock() >= self._next_drops:
            self._emit_drops(pending, out)
            pending = None
        total = self.dropped()
        if pending is None or step >= pending[0]:
            pending = (step, total)
        self.drops_pending = pending if pending[1] != self.drops_written[0] else None

    def _flush_drops(self, out: list[bytes]) -> None:
        """Write the pending count now (the trainer stopped, or this service does)."""
        if self.drops_pending is not None:
            self._emit_drops(self.drops_pending, out)
            self.drops_pending = None

    def _emit_drops(self, point: tuple[int, int], out: list[bytes]) -> None:
        step, total = point
        if step <= self.drops_written[1]:
            return
        self._next_drops = self.clock() + DROPS_SECS
        self.drops_written = (total, step)
        out.append(records.frame(records.summary_event(time.time(), step,
                                                       records.scalar_summary(DROPPED_TAG, float(total)))))

    def _send_acks(self) -> None:
        """After a write: tell each connection where the sessions it sent batches of stand."""
        acks = self.sessions.acks()
        for identity, session in self._ack_to:
            state = acks.get(session)
            if state is not None:  # not the case only for a session forgotten in this very burst
                send(self.router, SummaryAck(session, state["written"], state["resync_after"]), prefix=[identity])
        self._ack_to.clear()
        known = self.sessions.known
        if len(known) > KEEP_SESSIONS:
            for name in list(known)[:-KEEP_SESSIONS]:
                if name != self.sessions.current:
                    del known[name]

    def _write_stats(self, durable: bool) -> None:
        self._next_stats = self.clock() + STATS_SECS
        if len(self.by_session) > KEEP_SESSIONS:  # fold the oldest sessions into one number
            for name in list(self.by_session)[:-KEEP_SESSIONS]:
                self.service_dropped += self.by_session.pop(name)
        stats = {
            "pid": os.getpid(),
            "written": self.written_before + self.written,
            "dropped": self.dropped(),
            "nonfinite": self.nonfinite_before + self.nonfinite,
            "by_session": self.by_session,
            "service_dropped": self.service_dropped,
            "rejected": self.rejections.record(),
            "file": os.path.basename(self.file.path),
            "updated_at": time.time(),
        }
        try:
            write_json(self.stats_path, stats, durable=durable)
        except OSError as exc:
            self._complain(f"could not write {self.stats_path}: {exc}")

    def _complain(self, text: str) -> None:
        self._say(f"procsv summary: {text}")

    @staticmethod
    def _say(text: str) -> None:
        print(text, file=sys.stderr, flush=True)
