"""Scalars logged inside a ``tf.function``: written by the step's own graph into ring buffers,
read in bulk at the hand-off.

Runs in the trainer. :meth:`GraphRings.log` runs while TensorFlow traces the user's function (any
thread): it adds a few ops to the traced graph that write the row (the values as float32 and the
step as int64) into ring-buffer variables of that call site's tags, at the index a counter
variable hands out. :meth:`GraphRings.drain` runs on the main thread at the summaries' hand-off
(:meth:`procsv.trainer.summary_methods.SummaryMethods._flush_summaries`, and before every
checkpoint snapshot): it reads each counter and, if rows were written, the ring's two variables,
and gives the rows to the summary buffer in the order they were written.

Why: an eager value logged after the step must be read from TensorFlow at once, one
tensor-to-NumPy conversion per value, about 1 us in a training loop, and each step's log call is
Python work on top (``scripts/bench_summary.py`` (c): ten eager scalars a step cost the digits step
several percent, of which reading them alone is about half). Written by the graph, a row costs the
step a handful of small ops that TensorFlow's executor runs beside the step's own, and the trainer
reads thousands of rows in three eager reads.

What differs from eager logging (documented in the README):

- ``step=`` is required (a Python int or an integer tensor such as ``optimizer.iterations``): a
  traced function cannot see the Python step counter.
- A row's wall time is the time of its hand-off (at most about :data:`~.buffer.FLUSH_EVERY` late
  while the loop runs), not of its step.
- A ring holds :data:`CAPACITY` rows; rows written beyond that between two hand-offs (a function
  called many times outside the training loop, whose step boundaries do the hand-off) overwrite the
  oldest, which are counted as dropped, as the buffer's own drops are.
- Values are stored as float32 (what TensorBoard's scalar summaries hold).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

from procsv.trainer.summaries.values import check_tag

CAPACITY = 4096  # rows each call site's ring holds between two hand-offs


@dataclass
class Drained:
    """Rows read from the rings in one drain: parallel lists, and how many were overwritten unread."""

    tags: list[str]
    steps: list[int]
    values: list[float]
    lost: int


class _Ring:
    """One call site's ring (one tuple of tags): values ``[CAPACITY, k]`` float32, steps ``[CAPACITY]``
    int64, the index of the last row written (a counter from -1), and how many rows the trainer has read."""

    def __init__(self, tf: Any, tags: tuple[str, ...]) -> None:
        self.tags = tags
        with tf.init_scope():  # created eagerly, outside the traced graph, once per tuple of tags
            self.values = tf.Variable(tf.zeros([CAPACITY, len(tags)], tf.float32), trainable=False,
                                      name="procsv_summary_ring")
            self.steps = tf.Variable(tf.zeros([CAPACITY], tf.int64), trainable=False, name="procsv_summary_steps")
            self.count = tf.Variable(tf.constant(-1, tf.int64), trainable=False, name="procsv_summary_count")
        self.read = 0  # rows read so far; the counter holds the index of the last row written (-1: none)

    def write(self, tf: Any, row: Any, step: Any) -> None:
        """Add to the graph being traced: the row's index (the counter, which starts at -1), then the
        row and its step there. Scalar-index scatters: no reshape ops (a step pays for every op)."""
        at = tf.math.floormod(self.count.assign_add(1), CAPACITY)
        tf.raw_ops.ResourceScatterUpdate(resource=self.values.handle, indices=at, updates=row)
        tf.raw_ops.ResourceScatterUpdate(resource=self.steps.handle, indices=at, updates=step)

    def drain(self, into: Drained) -> None:
        """Append the rows written since the last drain, oldest first (eager reads: main thread)."""
        total = int(self.count.numpy()) + 1
        if total == self.read:
            return
        values, steps = self.values.numpy(), self.steps.numpy()
        after = int(self.count.numpy()) + 1  # rows written meanwhile (another thread) may have overwritten some read
        first = max(self.read, after - CAPACITY)
        into.lost += first - self.read
        rows = np.arange(first, total) % CAPACITY
        into.tags += list(self.tags) * len(rows)
        into.steps += np.repeat(steps[rows], len(self.tags)).tolist()
        into.values += values[rows].reshape(-1).tolist()
        self.read = max(total, first)  # (first > total: rows after total were overwritten too, and counted)


class GraphRings:
    """The rings of every call site traced so far, by tuple of tags."""

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
        row = tf.stack([_graph_value(tf, tag, values[tag]) for tag in tags]) if tags else None
        if row is None:
            return
        with self._lock:
            ring = self._rings.get(tags)
            if ring is None:
                ring = self._rings[tags] = _Ring(tf, tags)
        ring.write(tf, row, step_t)

    def drain(self) -> Drained:
        """Every row written since the last drain (main thread: eager reads)."""
        out = Drained([], [], [], 0)
        with self._lock:
            rings = list(self._rings.values())
        for ring in rings:
            ring.drain(out)
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
