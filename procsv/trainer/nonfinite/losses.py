"""The watched losses of the steps since the last check, checked in bulk.

Runs in the trainer's main thread. Each step's returned loss (a scalar, or the ``"loss"`` entry of
a dict) and each scalar logged under a watched tag is kept as it is: a host value (a Python or
NumPy number) is looked at at once, which costs no read; a tensor stays on its device. Nothing is
read from a device at a step. Every :data:`CHUNK` kept tensors are stacked into one and judged on
the device (a few ops, no read: about 1 us per step), their verdict folded into one running
boolean; :meth:`LossWatch.check` runs where procsv reads the state anyway (before a snapshot; at the
final checkpoint): it judges the few kept since the last chunk the same way and reads that one
boolean, one host read for all of them; only when it says something is non-finite are the
values read (one more) to find the first bad step. A check before an in-memory snapshot used to
stack every loss since the last one (~600 at the tier's interval: 1.1 ms of the snapshot's
charge, issue 54); it now stacks fewer than :data:`CHUNK`.
"""

from __future__ import annotations

import math
from typing import Any, Optional

import numpy as np

CHUNK = 64  # kept scalars stacked into one tensor and judged on the device (ops, no read) past this many


class LossWatch:
    """The losses kept since the last :meth:`check`: host values already judged (``host_bad``: the
    first non-finite one's step), device scalars with their steps (``pending``), stacked ``chunks``
    of earlier ones, and whether every stacked one is finite (``finite``: a boolean tensor on the
    device, None before the first chunk). ``reads`` counts the host reads :meth:`check` made."""

    def __init__(self, tags: tuple[str, ...]) -> None:
        self.tags = frozenset(tags)
        self.host_bad: Optional[int] = None
        self.pending: list[Any] = []
        self.steps: list[int] = []
        self.chunks: list[tuple[list[int], Any]] = []
        self.finite: Any = None
        self.reads = 0
        self._axis: Any = None  # the axis a chunk is judged along (a tensor, made once)

    def warm(self) -> None:
        """Build the kernels a check of float32 losses runs, once, before the first step (a hot
        standby: before its promotion): a stack of the one size :meth:`_compact` pads to
        (:data:`CHUNK`), and the judgement of it. A first check of a size otherwise built its kernel
        on the step path: 3-33 ms each at load, the first snapshots of every restarted trainer
        charged that much. One size since every stack is padded to 64 (eleven, powers of two up to
        1024, before: a hot standby was ready 0.3 s later at load, issue 54)."""
        import tensorflow as tf

        if not tf.executing_eagerly():  # a graph program: its losses are host values (session.run's)
            return
        stacked = tf.raw_ops.Pack(values=[tf.constant(0.0)] * CHUNK, axis=0)
        tf.raw_ops.LogicalAnd(x=tf.constant(True), y=self._judge(stacked)).numpy()

    def keep_step(self, step: int, out: Any) -> None:
        """The value step ``step`` returned: its loss is kept (anything else is ignored)."""
        if isinstance(out, dict):
            out = out.get("loss")
            if out is None:
                return
        self.keep(step, out)

    def keep_scalars(self, step: int, values: Any) -> None:
        """Scalars logged for ``step`` (a mapping of tags to values): the watched tags' are kept."""
        if not self.tags:
            return
        for tag, value in values.items():
            if tag in self.tags:
                self.keep(step, value)

    def keep(self, step: int, value: Any) -> None:
        if isinstance(value, (float, int)):
            if not math.isfinite(value) and (self.host_bad is None or step < self.host_bad):
                self.host_bad = step
            return
        dtype = getattr(value, "dtype", None)
        if dtype is None or getattr(value, "ndim", getattr(getattr(value, "shape", None), "rank", None)) != 0:
            return  # not a scalar: not a loss procsv watches
        if isinstance(value, (np.generic, np.ndarray)) or not hasattr(value, "device"):  # on the host already
            # (NumPy 2's scalars and arrays have a .device too: "cpu", not a TensorFlow device)
            try:
                finite = bool(math.isfinite(float(value)))
            except (TypeError, ValueError):
                return
            if not finite and (self.host_bad is None or step < self.host_bad):
                self.host_bad = step
            return
        if not getattr(dtype, "is_floating", False):
            return
        self.pending.append(value)
        self.steps.append(step)
        if len(self.pending) >= CHUNK:
            self._compact()

    def _compact(self) -> None:
        if not self.pending:
            return
        import tensorflow as tf

        # padded to CHUNK with the last value (which judges its own step again): TF caches a kernel
        # per input count, and a count never seen before cost 8-13 ms to build at load (the check
        # before an in-memory snapshot, ~400 losses: more than the copy; issue 54). One count, one
        # kernel, built by warm(); the padding costs a few microseconds
        pad = CHUNK - len(self.pending)
        pending, steps = self.pending + [self.pending[-1]] * pad, self.steps + [self.steps[-1]] * pad
        try:  # one op: the kept scalars share a dtype, as a loop's losses do
            stacked = tf.raw_ops.Pack(values=pending, axis=0)
        except (TypeError, ValueError, tf.errors.InvalidArgumentError):
            stacked = tf.stack([tf.cast(v, tf.float64) for v in pending])  # mixed dtypes: one op each
        if stacked.dtype != tf.float64 and stacked.dtype != tf.float32:
            stacked = tf.cast(stacked, tf.float64)  # float16/bfloat16: concatenable with the others
        self.chunks.append((steps, stacked))
        self.pending, self.steps = [], []
        finite = self._judge(stacked)  # judged on the device: nothing read
        self.finite = finite if self.finite is None else tf.raw_ops.LogicalAnd(x=self.finite, y=finite)

    def _judge(self, stacked: Any) -> Any:
        """Whether every value of ``stacked`` is finite, as a boolean on its device: the raw ops, not
        tf.stack/reduce_all/logical_and, whose Python wrappers (name scopes, conversions, the axis
        made anew each time) were a third of the check before an in-memory snapshot (0.35 of 0.45 ms
        at load, with the stack: issue 54)."""
        import tensorflow as tf

        if self._axis is None:
            self._axis = tf.constant([0])
        return tf.raw_ops.All(input=tf.raw_ops.IsFinite(x=stacked), axis=self._axis)

    def check(self) -> Optional[int]:
        """The first step kept since the last check whose loss is NaN or infinite (None: none);
        forgets what it checked. One host read for all the kept device scalars, one more if any is bad."""
        first = self.host_bad
        self.host_bad = None
        if self.pending:
            self._compact()
        if not self.chunks:
            return first
        import tensorflow as tf

        chunks, self.chunks = self.chunks, []
        finite, self.finite = self.finite, None
        self.reads += 1
        if bool(finite.numpy()):  # the one read: every chunk's verdict, folded on the device
            return first
        steps = [s for chunk_steps, _ in chunks for s in chunk_steps]
        values = chunks[0][1] if len(chunks) == 1 else tf.concat([tf.cast(c, tf.float64) for _, c in chunks], 0)
        self.reads += 1
        bad = np.flatnonzero(~np.isfinite(values.numpy()))
        found = min(steps[int(i)] for i in bad)
        return found if first is None else min(first, found)

    def forget(self) -> None:
        """Drop everything kept (after a restore: those steps are undone)."""
        self.host_bad = None
        self.pending, self.steps, self.chunks = [], [], []
        self.finite = None
