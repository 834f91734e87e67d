"""The Supervisor's summary methods (a mixin): ``log_scalar`` ... ``summary_computed``, and the
hand-off of what was logged at step boundaries (``_flush_summaries``).

Runs in the trainer process. Every call validates here (TypeError/ValueError in the caller's
frame) and only appends to a bounded buffer; the hand-off to the summary service happens at step
boundaries. ``step`` defaults to the current step (the one running inside ``session.run``, else
the last completed).
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any, Callable, Mapping, Optional

from procsv.common import env
from procsv.common.layout import Layout
from procsv.trainer.step_boundary import StepState
from procsv.trainer.summaries import SummaryBuffer, SummarySender
from procsv.trainer.summaries.sender import SUMMARY_DEADLINE
from procsv.trainer.tf1_args import Tf1Choices


def _tracing() -> bool:
    """A ``tf.function`` is being traced on this thread (0.06 us when TF runs eagerly)."""
    tf = sys.modules.get("tensorflow")
    return tf is not None and not tf.executing_eagerly() and bool(tf.inside_function())


class SummaryMethods:
    """The Supervisor's summary API (``log_*``, ``summary_computed``, ...): a mixin over its buffer and clock."""

    _summaries: SummaryBuffer
    _state: StepState
    _tf1: Tf1Choices
    _channels: Any
    _ckpt: Any
    _clock: Callable[[], float]
    _next_summary: float
    save_summaries_secs: Optional[float]
    is_chief: bool
    layout: Optional[Layout]  # None: no logdir (plain python), so no summaries are written (as TF)
    stop_grace_secs: float
    summary_fn: Optional[Callable[[], Mapping[str, Any]]]
    _graph_summary: Callable[[], None]

    def log_scalar(self, tag: str, value: Any, step: Optional[int] = None) -> None:
        """Log one scalar (non-blocking). Raises TypeError/ValueError here for a bad tag or value.
        Inside a ``tf.function``: written by the graph at every call (``step=`` required; see
        :mod:`procsv.trainer.summaries.graph_rings`)."""
        if _tracing():
            self._summaries.graph.log({tag: value}, step)
            return
        self._summaries.scalar(tag, value, self._state.step if step is None else step, time.time())
        if self._state.losses is not None and tag in self._state.losses.tags:  # a watched tag (nonfinite_tags)
            self._state.losses.keep(self._state.step if step is None else step, value)

    def log_scalars(self, values: Mapping[str, Any], step: Optional[int] = None) -> None:
        """Log several scalars of one step; if any is invalid, none is logged. Inside a ``tf.function``:
        written by the graph at every call (``step=`` required; see
        :mod:`procsv.trainer.summaries.graph_rings`)."""
        if _tracing():
            self._summaries.graph.log(values, step)
            return
        self._summaries.scalars(values, self._state.step if step is None else step, time.time())
        if self._state.losses is not None:  # the watched tags (nonfinite_tags)
            self._state.losses.keep_scalars(self._state.step if step is None else step, values)

    def log_histogram(self, tag: str, values: Any, step: Optional[int] = None, buckets: Optional[int] = None,
                      description: str = "") -> None:
        """Log the distribution of ``values`` (any shape), as ``tf.summary.histogram`` (30 buckets)."""
        self._summaries.histogram(tag, values, self._state.step if step is None else step, time.time(), buckets,
                                  description)

    def log_image(self, tag: str, images: Any, step: Optional[int] = None, max_outputs: int = 3,
                  description: str = "") -> None:
        """Log images: ``[k, h, w, c]`` (or one ``[h, w, c]``), c in 1-4, uint8 or floats in [0, 1]."""
        self._summaries.image(tag, images, self._state.step if step is None else step, time.time(), max_outputs,
                              description)

    def log_text(self, tag: str, text: Any, step: Optional[int] = None, description: str = "") -> None:
        """Log a string (or an array of strings), shown by TensorBoard's Text dashboard."""
        self._summaries.text(tag, text, self._state.step if step is None else step, time.time(), description)

    def summary_computed(self, sess: Any, summary: Any, global_step: Optional[int] = None) -> None:
        """Log a ``Summary`` proto (or its bytes, or a mapping of scalar tags to values).
        ``RuntimeError`` with ``summary_writer=None``, as TF."""
        if not self._tf1.writer:
            raise RuntimeError("Writing a summary requires a summary writer (Supervisor(summary_writer=None)).")
        if isinstance(summary, Mapping):  # (inside a tf.function: global_step is required, never the traced step)
            self.log_scalars(summary, global_step if global_step is not None or _tracing() else self._state.step)
            return
        self._summaries.proto(summary, self._state.step if global_step is None else global_step, time.time())

    @property
    def summaries_dropped(self) -> int:
        """Summaries this process had to drop so far (its bounded buffer overflowed while the service lagged)."""
        return self._summaries.dropped_total

    # ----------------------------------------------------------------- at step boundaries
    def _periodic_summaries(self, now: float) -> None:
        """Every ``save_summaries_secs``: the user's ``summary_fn``, and in graph mode ``summary_op``. (``global_step/sec`` is written by the
        summary service, from the step marks every batch carries: see ``services/summary/sessions.py``.)"""
        assert self.save_summaries_secs
        self._next_summary = now + self.save_summaries_secs
        if self.summary_fn is not None:
            self.log_scalars(self.summary_fn())
        if self._tf1.graph is not None:
            self._graph_summary()  # graph mode: summary_op (procsv.trainer.graph.supervised)

    def _summaries_unwritten_from(self) -> Optional[int]:
        """The lowest step with a logged summary the summary service has not confirmed written
        (None: every one is, or this process keeps none)."""
        if not self.is_chief or self.layout is None:
            return None
        self._summaries.collect_graph(force=True)  # the rings may hold rows of the steps in question
        sender: Optional[SummarySender] = getattr(self, "_summary_sender", None)
        if sender is None:
            return self._summaries.oldest_step()
        sender.poll_acks(self._state.step)  # the acks that came since the last read (every 10 ms at most)
        return sender.unwritten_from()

    def _summaries_overdue(self, sender: SummarySender) -> None:
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

    def _flush_summaries(self, force: bool, urgent: bool = False, deadline: Optional[float] = None) -> None:
        """At a step boundary: hand off what is due (never blocks). ``force`` (at stop): hand off
        everything and wait, up to ``EXIT_WAIT_SECS``, until the summary service has written it."""
        if not self.is_chief or self.layout is None:  # only the chief writes summaries (as TF), in a logdir
            self._summaries.discard()
            return
        # what traced functions wrote into their rings: at most every FLUSH_EVERY, and all of it
        # before a snapshot (urgent) or at the stop
        self._summaries.collect_graph(force=force or urgent)
        sender = getattr(self, "_summary_sender", None)
        if sender is None:
            assert self._channels is not None
            # the first call comes from the first step's boundary, or from stop() if no step ran
            start = self._state.step if not force else self._state.step + 1
            sender = self._summary_sender = SummarySender(
                self._summaries, self._channels.to_summary, self._channels.summary_acks, self.save_summaries_secs,
                start, deadline=float(os.environ.get(env.SUMMARY_DEADLINE, SUMMARY_DEADLINE)))
        if not force:
            # while a checkpoint is being committed, send at every boundary: the rows of the steps it
            # covers must leave this process before a crash could make the restart skip them
            sender.at_boundary(self._state.step, urgent=urgent or getattr(self._ckpt, "in_flight", None) is not None)
            if sender.overdue is not None:
                self._summaries_overdue(sender)
            return
        grace = self.stop_grace_secs if deadline is None else max(0.0, deadline - self._clock())
        left = sender.close(self._state.step, min(sender.EXIT_WAIT_SECS, grace))
        if left:
            print(f"procsv: {left} summaries were not confirmed written by the summary service at exit",
                  file=sys.stderr, flush=True)
