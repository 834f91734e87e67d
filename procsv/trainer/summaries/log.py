"""The Supervisor's summaries collaborator: ``log_scalar`` ... ``summary_computed`` and their hand-off.

Runs in the trainer process. Every ``log_*`` call validates here (TypeError/ValueError in the
caller's frame) and only appends to the bounded :class:`SummaryBuffer`; the hand-off to the summary
service (:class:`SummarySender`) happens at step boundaries, when the step boundary calls
:meth:`SummaryLog.flush`. ``step`` defaults to the current step (the one running inside
``session.run``, else the last completed), read from the step state it is given.

:class:`SummaryLog` owns the buffer, the sender of the open session (made at the first hand-off,
dropped by :meth:`SummaryLog.detach`), the periodic summaries' schedule (``summary_fn``, and in
graph mode the graph's ``summary_op`` through the ``graph_summary`` callable it is given) and the
session's connection to the summary service (:meth:`SummaryLog.attach`). It reads, never writes,
the step state: the step and the watched losses (``losses``: a logged value of a watched tag is
kept for the non-finite check).
"""

from __future__ import annotations

import sys
import time
from typing import Any, Callable, Mapping, Optional, Protocol, Sequence

from procsv.common.eventsteps import logged_at_or_after
from procsv.ipc.messages import Message, SessionLogEvent, SessionStatus
from procsv.trainer.channels import TrainerChannels
from procsv.trainer.settings import Settings
from procsv.trainer.summaries.buffer import SummaryBuffer
from procsv.trainer.summaries.sender import SUMMARY_DEADLINE, SummarySender


class WatchedLosses(Protocol):
    """The non-finite watch's losses (procsv.trainer.nonfinite.losses.LossWatch), as a log call keeps them."""

    tags: Any

    def keep(self, step: int, value: Any) -> None: ...

    def keep_scalars(self, step: int, values: Mapping[str, Any]) -> None: ...


class StepView(Protocol):
    """What a log call reads of the step state (procsv.trainer.step_boundary.StepState)."""

    step: int
    losses: Optional[Any]  # a WatchedLosses, or None when nothing is watched


def _tracing() -> bool:
    """A ``tf.function`` is being traced on this thread (0.06 us when TF runs eagerly)."""
    tf = sys.modules.get("tensorflow")
    return tf is not None and not tf.executing_eagerly() and bool(tf.inside_function())


class SummaryLog:
    """The summary API of one Supervisor and the hand-off of what it logged.

    ``chief``: this trainer is the chief; ``writes``: it is, and has a logdir: only then are summaries
    written (as TF); anyone else's logged values are discarded at each hand-off. ``writer``: False for ``summary_writer=None`` (``summary_computed``
    raises, as TF). ``settings``: the Supervisor's, read live (``summary_fn``: the periodic scalars,
    None: none, every ``save_summaries_secs``; ``stop_grace_secs``)."""

    def __init__(self, state: StepView, clock: Callable[[], float], settings: Settings, *, chief: bool, writes: bool,
                 writer: bool, graph_summary: Optional[Callable[[], None]] = None,
                 deadline: float = SUMMARY_DEADLINE) -> None:
        self._state = state
        self._deadline = deadline  # s a batch may wait for its ack (the launch's PROCSV_SUMMARY_DEADLINE, else 30)
        self._clock = clock
        self._settings = settings  # save_summaries_secs, summary_fn, stop_grace_secs: read live
        self.chief = chief
        self.writes = writes
        self.writer = writer
        self.graph_summary = graph_summary  # graph mode: runs summary_op (procsv.trainer.graph.supervised)
        self.buffer = SummaryBuffer(clock)
        self.next_periodic = 0.0  # when (on the clock) the periodic summaries are next due
        self._channels: Optional[TrainerChannels] = None
        self._sender: Optional[SummarySender] = None
        self.purge_first = True  # the session's first batch writes SessionLog START (set at each prepare)
        self.session_step: Optional[int] = None  # the step the session began at (restored or initial)

    # ----------------------------------------------------------------- the session's connection
    def attach(self, channels: TrainerChannels) -> None:
        """A session is being prepared: hand-offs go through ``channels``."""
        self._channels = channels

    def detach(self) -> None:
        """The session is released (its sockets closed)."""
        self._channels = None

    def reset(self) -> None:
        """A session again after a stop: a new sender (the next hand-off makes it)."""
        self._sender = None

    def start_session(self, step: int, purge: bool, logdir: Optional[str]) -> None:
        """The session is ready at ``step``. With ``purge`` (:func:`session_start`), or when ``logdir``'s event
        files already hold a later step (a relaunch that restored nothing: its checkpoint was deleted),
        ``SessionLog START`` at the next step: TensorBoard discards every event at or after it, so re-run
        steps do not duplicate; the session's first batch writes it again. Without, neither: nothing
        logged before can be purged."""
        purge = purge or (self.writes and logdir is not None and logged_at_or_after(logdir, step + 1))
        self.session_step = step
        self.purge_first = purge
        if purge:
            self.send(SessionLogEvent(SessionStatus.START, step + 1))

    def send(self, msg: Message, payload: Sequence[Any] = ()) -> None:
        """Send ``msg`` (a session log, a graph) to the summary service now, behind what was handed off
        before it; the session must be attached."""
        assert self._channels is not None
        self._channels.to_summary(msg, payload)

    # ----------------------------------------------------------------- the API
    def log_scalar(self, tag: str, value: Any, step: Optional[int] = None) -> None:
        """Log one scalar (non-blocking). Raises TypeError/ValueError here for a bad tag or value.
        Inside a ``tf.function``: written by the graph at every call (``step=`` required; see
        :mod:`procsv.trainer.summaries.graph_rings`)."""
        if _tracing():
            self.buffer.graph.log({tag: value}, step)
            return
        state = self._state
        self.buffer.scalar(tag, value, state.step if step is None else step, time.time())
        if state.losses is not None and tag in state.losses.tags:  # a watched tag (nonfinite_tags)
            state.losses.keep(state.step if step is None else step, value)

    def log_scalars(self, values: Mapping[str, Any], step: Optional[int] = None) -> None:
        """Log several scalars of one step; if any is invalid, none is logged. Inside a ``tf.function``:
        written by the graph at every call (``step=`` required; see
        :mod:`procsv.trainer.summaries.graph_rings`)."""
        if _tracing():
            self.buffer.graph.log(values, step)
            return
        state = self._state
        self.buffer.scalars(values, state.step if step is None else step, time.time())
        if state.losses is not None:  # the watched tags (nonfinite_tags)
            state.losses.keep_scalars(state.step if step is None else step, values)

    def log_histogram(self, tag: str, values: Any, step: Optional[int] = None, buckets: Optional[int] = None,
                      description: str = "") -> None:
        """Log the distribution of ``values`` (any shape), as ``tf.summary.histogram`` (30 buckets)."""
        self.buffer.histogram(tag, values, self._state.step if step is None else step, time.time(), buckets,
                              description)

    def log_image(self, tag: str, images: Any, step: Optional[int] = None, max_outputs: int = 3,
                  description: str = "") -> None:
        """Log images: ``[k, h, w, c]`` (or one ``[h, w, c]``), c in 1-4, uint8 or floats in [0, 1]."""
        self.buffer.image(tag, images, self._state.step if step is None else step, time.time(), max_outputs,
                          description)

    def log_text(self, tag: str, text: Any, step: Optional[int] = None, description: str = "") -> None:
        """Log a string (or an array of strings), shown by TensorBoard's Text dashboard."""
        self.buffer.text(tag, text, self._state.step if step is None else step, time.time(), description)

    def summary_computed(self, sess: Any, summary: Any, global_step: Optional[int] = None) -> None:
        """Log a ``Summary`` proto (or its bytes, or a mapping of scalar tags to values).
        ``RuntimeError`` with ``summary_writer=None`` and on a non-chief (which has no writer), as TF."""
        if not self.writer or not self.chief:
            why = "Supervisor(summary_writer=None)" if self.chief else "a non-chief Supervisor: only the chief writes"
            raise RuntimeError(f"Writing a summary requires a summary writer. ({why})")
        if isinstance(summary, Mapping):  # (inside a tf.function: global_step is required, never the traced step)
            self.log_scalars(summary, global_step if global_step is not None or _tracing() else self._state.step)
            return
        self.buffer.proto(summary, self._state.step if global_step is None else global_step, time.time())

    @property
    def sender(self) -> Optional[SummarySender]:
        """The open session's sender (None before its first hand-off)."""
        return self._sender

    @property
    def summaries_dropped(self) -> int:
        """Summaries this process had to drop so far (its bounded buffer overflowed while the service lagged)."""
        return self.buffer.dropped_total

    # ----------------------------------------------------------------- at step boundaries
    def restart_periodic(self) -> None:
        """The periodic summaries are next due one ``save_summaries_secs`` from now."""
        self.next_periodic = self._clock() + (self._settings.save_summaries_secs or 0)

    def periodic(self, now: float) -> None:
        """Every ``save_summaries_secs``: the user's ``summary_fn``, and in graph mode ``summary_op``.
        (``global_step/sec`` is written by the summary service, from the step marks every batch
        carries: see ``services/summary/sessions.py``.)"""
        every, summary_fn = self._settings.save_summaries_secs, self._settings.summary_fn
        assert every
        self.next_periodic = now + every
        if summary_fn is not None:
            self.log_scalars(summary_fn())
        if self.graph_summary is not None:
            self.graph_summary()

    def wake_at(self) -> float:
        """When the sender next has time-driven work (-inf: at every boundary; inf for a worker: it only
        discards what it logged, at its progress reports)."""
        if not self.chief:
            return float("inf")
        return self._sender.wake_at if self._sender is not None else float("-inf")

    def unwritten_from(self) -> Optional[int]:
        """The lowest step with a logged summary the summary service has not confirmed written
        (None: every one is, or this process keeps none)."""
        if not self.writes:
            return None
        self.buffer.collect_graph(force=True)  # the rings may hold rows of the steps in question
        sender = self._sender
        if sender is None:
            return self.buffer.oldest_step()
        sender.poll_acks(self._state.step)  # the acks that came since the last read (every 10 ms at most)
        return sender.unwritten_from()

    def _overdue(self, sender: SummarySender) -> None:
        """The summary service has not confirmed a batch within its deadline: it is alive (else the
        watchdog would have restarted it) but stuck. The watchdog is told, and replaces it."""
        msg, sender.overdue = sender.overdue, None
        assert msg is not None and self._channels is not None
        told = self._channels.to_watchdog(msg)
        then = ("the watchdog replaces it, and what was not written is sent again" if told else
                "nothing replaces it in this mode (run under procsv launch for that)"
                if self._channels.watchdog is None else
                "the watchdog could not be told now (its queue is full): it is told when the wait has tripled")
        print(f"procsv: the summary service has not confirmed the summaries of step {msg.step} for "
              f"{msg.waited_secs:.0f} s (deadline {msg.deadline_secs:.0f} s); {then}", file=sys.stderr, flush=True)

    def flush(self, force: bool, urgent: bool = False, deadline: Optional[float] = None,
              in_flight: bool = False) -> None:
        """At a step boundary: hand off what is due (never blocks); ``urgent`` (before a snapshot):
        everything logged, the graph's rings too. ``in_flight``: a checkpoint is being committed, so
        send at every boundary: the rows of the steps it covers must leave this process before a
        crash could make the restart skip them. ``force`` (at stop): hand off everything and wait,
        up to ``EXIT_WAIT_SECS``, until the summary service has written it."""
        if not self.writes:  # only the chief writes summaries (as TF), in a logdir
            self.buffer.discard()
            return
        # what traced functions wrote into their rings: at most every FLUSH_EVERY, and all of it
        # before a snapshot (urgent) or at the stop
        self.buffer.collect_graph(force=force or urgent)
        sender = self._sender
        if sender is None:
            assert self._channels is not None
            # the first call comes from the first step's boundary, or from stop() if no step ran
            start = restate_from(self._state.step, self.session_step, self.buffer.oldest_step(), force,
                                 graph=self.graph_summary is not None)
            if start is None:  # no step ran, nothing logged: the first batch's START waits for what it carries
                return
            sender = self._sender = SummarySender(
                self.buffer, self._channels.to_summary, self._channels.summary_acks, self._settings.save_summaries_secs,
                start, deadline=self._deadline, purge_first=self.purge_first)
        if not force:
            sender.at_boundary(self._state.step, urgent=urgent or in_flight)
            if sender.overdue is not None:
                self._overdue(sender)
            return
        grace = self._settings.stop_grace_secs if deadline is None else max(0.0, deadline - self._clock())
        left = sender.close(self._state.step, min(sender.EXIT_WAIT_SECS, grace))
        if left:
            print(f"procsv: {left} summaries were not confirmed written by the summary service at exit",
                  file=sys.stderr, flush=True)


def session_start(restored: bool, restarted: bool, standard_services: bool, global_step: bool) -> bool:
    """Does a session's start write ``SessionLog START``? When its steps may repeat ones already logged
    (it restored a checkpoint, or is a restart of the trainer), or where TF's Supervisor writes one
    (``start_standard_services`` with a global step). Otherwise TF's event file has none (a graph without
    a global step, ``start_standard_services=False``), and :meth:`SummaryLog.start_session` writes one only
    when the logdir's event files hold steps the session will log again."""
    return restored or restarted or (standard_services and global_step)


def restate_from(step: int, session_step: Optional[int], oldest: Optional[int], at_stop: bool,
                 graph: bool = False) -> Optional[int]:
    """The step a session's first batch restates from: its ``SessionLog START`` (TensorBoard drops every
    event at or after it). The first hand-off comes at ``step``'s boundary (``at_stop``: from ``stop()``),
    the session began at ``session_step``, and the oldest row it holds is at ``oldest``.

    * A step ran: from ``step``. In a ``graph`` program, from ``oldest`` if it is between the step the
      session began at and ``step``: its summaries computed at the restored global step before the first
      train op (``summary_op``, ``summary_computed``) replace the dead trainer's there instead of doubling
      them, as TF's Supervisor's START at the restored step does (which drops that step's other points
      too, as TF's does). An eager program's points logged between two sessions at the step the next
      begins at keep the earlier ones beside them (``stop(close_summary_writer=False)``).
    * No step ran: the points of the step it began at are an earlier run's, kept (``step + 1``), unless
      a ``graph`` program's session logged there itself (from ``step``: replaced, as above; an eager
      one's are kept beside, as above). With nothing logged yet, before ``stop()``: None, no first
      batch yet. A graph program's runs that make no step hand off too (``StepBoundary.between_steps``),
      and the first of them comes before the summary computed at the restored step (the Supervisor
      page's loop reads the global step first): a START fixed there, at ``step + 1``, left the dead
      trainer's point at ``step`` beside the new one.
    """
    if step == session_step:
        if oldest is None:
            return step + 1 if at_stop else None
        return step if graph and oldest == step else step + 1
    start = step + 1 if at_stop else step
    if graph and oldest is not None and session_step is not None and session_step <= oldest < start:
        return oldest
    return start
