"""Scalars logged inside a ``tf.function``: written by the step's own graph into ring buffers,
read in bulk at the hand-off.

Runs in the trainer. :meth:`GraphRings.log` runs while TensorFlow traces the user's function (any
thread): it adds a dozen ops to the traced graph that write the row (the values as float32 and the
step as int64) into the ring-buffer variables of that tuple of tags, at the index a counter
variable hands out, and then mark the row complete. :meth:`GraphRings.drain` runs on the main
thread at the summaries' hand-off (:meth:`procsv.trainer.summaries.log.SummaryLog.flush`,
and before every checkpoint snapshot): per ring with new rows, a few eager reads (the counter,
the marks, the values and steps), and the complete rows go to the summary buffer in the order
they were written. The functions may run on any thread: a row begun and not yet complete ends
the read (see :meth:`_Ring.drain`). One set of rings per process (:data:`PROCESS_RINGS`).

Why: an eager value logged after the step must be read from TensorFlow at once, one
tensor-to-NumPy conversion per value, about 1 us in a training loop, and each step's log call is
Python work on top (``scripts/bench_summary.py`` (c): ten eager scalars a step cost the digits step
several percent, of which reading them alone is about half). Written by the graph, a row costs the
step a dozen small ops that TensorFlow's executor runs beside the step's own, and the trainer
reads thousands of rows in a few eager reads.

What differs from eager logging (documented in docs/python-api.md, "The Supervisor API"):

- ``step=`` is required (a Python int or an integer tensor such as ``optimizer.iterations``): a
  traced function cannot see the Python step counter.
- A row's wall time is the time of the read that takes it (up to a step plus about
  :data:`~.buffer.FLUSH_EVERY` after its step ran), not of its step.
- A ring holds :data:`CAPACITY` rows; rows written beyond that between two reads (a function
  called many times outside the training loop, whose step boundaries do the reads) overwrite the
  oldest, which are counted as dropped, as the buffer's own drops are.
- A function that logs this way cannot be exported with ``tf.saved_model.save``: no model tracks
  the rings' variables.
- Values are stored as float32 (what TensorBoard's scalar summaries hold).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

from procsv.trainer.summaries.values import check_tag

CAPACITY = 4096  # rows each ring (one per tuple of tags) holds between two reads
INCOMPLETE_GRACE = 1.0  # seconds a row begun on another thread may take to complete before it counts as lost


@dataclass
class Drained:
    """Rows read from the rings in one drain: parallel lists, and how many were overwritten unread."""

    tags: list[str]
    steps: list[int]
    values: list[float]
    lost: int


class _Ring:
    """One tuple of tags' ring (every call site logging exactly these tags writes into it): values
    ``[CAPACITY, k]`` float32, steps ``[CAPACITY]`` int64, and for each slot the index of the row
    last completed there (``seq``, int64); the index of the last row begun (a counter from -1); and
    how many rows the trainer has read."""

    def __init__(self, tf: Any, tags: tuple[str, ...]) -> None:
        self.tags = tags
        with tf.init_scope():  # created eagerly, outside the traced graph, once per tuple of tags
            self.values = tf.Variable(tf.zeros([CAPACITY, len(tags)], tf.float32), trainable=False,
                                      name="procsv_summary_ring")
            self.steps = tf.Variable(tf.zeros([CAPACITY], tf.int64), trainable=False, name="procsv_summary_steps")
            self.seq = tf.Variable(tf.fill([CAPACITY], tf.constant(-1, tf.int64)), trainable=False,
                                   name="procsv_summary_seq")
            self.count = tf.Variable(tf.constant(-1, tf.int64), trainable=False, name="procsv_summary_count")
        self.read = 0  # rows read (or counted lost) so far: the index of the next row to read
        self._waiting: Optional[tuple[int, float]] = None  # (row, since when) begun but not completed

    def write(self, tf: Any, row: Any, step: Any) -> None:
        """Add to the graph being traced: the row's index (the counter), the row and its step there,
        then (after both) the slot's ``seq``: the row is complete. Scalar-index scatters, no
        reshapes: a step pays for every op. The index is taken without waiting for the values (they
        come at the end of a step: only two writes then follow them); a call that fails between
        taking it and writing leaves a row that is never complete (see :meth:`drain`)."""
        index = self.count.assign_add(1)
        at = tf.math.floormod(index, CAPACITY)
        done = [tf.raw_ops.ResourceScatterUpdate(resource=self.values.handle, indices=at, updates=row),
                tf.raw_ops.ResourceScatterUpdate(resource=self.steps.handle, indices=at, updates=step)]
        with tf.control_dependencies(done):
            tf.raw_ops.ResourceScatterUpdate(resource=self.seq.handle, indices=at, updates=index)

    def drain(self, into: Drained, now: float) -> None:
        """Append the rows completed since the last drain, oldest first (eager reads: main thread).

        A row begun but not completed (its function is running on another thread) ends the read:
        it and the rows after it are read next time. One still not completed after
        :data:`INCOMPLETE_GRACE` seconds (its function failed between taking the index and writing)
        counts as lost. Rows overwritten before they were read (more than CAPACITY behind) count as lost."""
        total = int(self.count.numpy()) + 1
        if total == self.read:
            return
        # the marks first: a row marked complete had its values and step written before its mark,
        # so they are read after it (a row overwritten meanwhile is caught by the count read after)
        seq = self.seq.numpy()
        values, steps = self.values.numpy(), self.steps.numpy()
        first = max(self.read, int(self.count.numpy()) + 1 - CAPACITY)  # rows written meanwhile may overwrite some
        into.lost += first - self.read
        if first >= total:  # more than CAPACITY rows were written during these reads: all counted lost
            self.read = first
            return
        index = np.arange(first, total)
        slots = index % CAPACITY
        marks = seq[slots]
        end = total
        incomplete = np.flatnonzero(marks < index)
        if len(incomplete):
            row = first + int(incomplete[0])
            if self._waiting is None or self._waiting[0] != row:
                self._waiting = (row, now)
            if now - self._waiting[1] < INCOMPLETE_GRACE:
                end = row
        n = end - first
        good = marks[:n] == index[:n]  # (a mark above its row: overwritten since; below: never completed)
        into.lost += n - int(good.sum())
        rows = slots[:n][good]
        into.tags += list(self.tags) * len(rows)
        into.steps += np.repeat(steps[rows], len(self.tags)).tolist()
        into.values += values[rows].reshape(-1).tolist()
        self.read = max(end, first)


class GraphRings:
    """The rings of every call site traced so far, by tuple of tags. One per process
    (:data:`PROCESS_RINGS`): a function keeps writing where it was traced, whichever Supervisor
    runs it later (TF's retry loop makes a new one per attempt), so every Supervisor reads them all."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._rings: dict[tuple[str, ...], _Ring] = {}

    def __bool__(self) -> bool:
        return bool(self._rings)

    def log(self, values: Any, step: Any) -> None:
        """While a ``tf.function`` is traced: validate (TypeError/ValueError naming the tag, at the
        trace) and add the ops that write this row at every call."""
        import tensorflow as tf

        if type(values) is not dict and not hasattr(values, "items"):
            raise TypeError(f"expected a mapping of summary tags to values, got {type(values).__name__}")
        if tf.distribute.has_strategy():
            raise TypeError("log_scalar(s) inside a tf.function run under a tf.distribute strategy is not supported: "
                            "return the values from the step function and log them after sess.run")
        tags = tuple(values)
        for tag in tags:
            check_tag(tag)
        step_t = _graph_step(tf, step)
        if not tags:
            return
        row = tf.stack([_graph_value(tf, tag, values[tag]) for tag in tags])
        with self._lock:
            ring = self._rings.get(tags)
            if ring is None:
                ring = self._rings[tags] = _Ring(tf, tags)
        ring.write(tf, row, step_t)

    def drain(self, now: Optional[float] = None) -> Drained:
        """Every row completed since the last drain (main thread: eager reads); ``now``: the
        monotonic clock, for rows begun on another thread and not completed yet."""
        import tensorflow as tf

        out = Drained([], [], [], 0)
        with self._lock:
            rings = list(self._rings.values())
        if not rings:
            return out
        # the rings are eager variables: read them eagerly, also from a TF1 graph session's boundary
        # inside a ``tf.Graph().as_default()`` block (an eager function logged in this process earlier)
        with tf.init_scope():
            if not tf.executing_eagerly():  # eager execution is off in this process: no eager ring to read
                return out
            for ring in rings:
                ring.drain(out, time.monotonic() if now is None else now)
        return out


def _graph_value(tf: Any, tag: str, value: Any) -> Any:
    """``value`` as a float32 scalar tensor of the traced graph; TypeError naming the tag if it is
    not one real number (known at the trace from its dtype and static shape)."""
    try:
        t = tf.convert_to_tensor(value)
    except (TypeError, ValueError):
        raise TypeError(f"summary {tag!r}: expected one real number, got {type(value).__name__}") from None
    if not (t.dtype.is_floating or t.dtype.is_integer or t.dtype.is_bool):
        raise TypeError(f"summary {tag!r}: expected one real number, got a tensor of dtype {t.dtype.name}")
    n = t.shape.num_elements()
    if n is not None and n != 1:
        raise TypeError(f"summary {tag!r}: expected one real number, got a tensor of shape {t.shape.as_list()}")
    t = tf.cast(t, tf.float32)  # no op if it is float32 already
    return t if t.shape.rank == 0 else tf.reshape(t, [])


def _graph_step(tf: Any, step: Optional[Any]) -> Any:
    """The row's step as an int64 scalar tensor; TypeError if there is none or it is no integer."""
    if step is None:
        raise TypeError("log_scalar(s) inside a tf.function needs step= (an int or an integer tensor such as "
                        "optimizer.iterations): the traced function cannot see the Supervisor's step counter")
    try:
        t = tf.convert_to_tensor(step)
    except (TypeError, ValueError):
        raise TypeError(f"summary step must be an integer, got {type(step).__name__}") from None
    if not t.dtype.is_integer or t.shape.num_elements() not in (None, 1):
        raise TypeError(f"summary step must be one integer, got a tensor of dtype {t.dtype.name}, shape "
                        f"{t.shape.as_list() if t.shape.rank is not None else '(unknown)'}")
    t = tf.cast(t, tf.int64)
    return t if t.shape.rank == 0 else tf.reshape(t, [])


PROCESS_RINGS = GraphRings()  # what every Supervisor's summary buffer reads (see GraphRings)
