"""The watched losses of the steps since the last check, checked in bulk.

Runs in the trainer's main thread. Each step's returned loss (a scalar, or the ``"loss"`` entry of
a dict) and each scalar logged under a watched tag is kept as it is: a host value (a Python or
NumPy number) is looked at at once, which costs no read; a tensor stays on its device (a variable,
TensorFlow's or Keras 3's, is read into one there, one op: kept as itself, the check judged what it
held at the check, not at its step). Nothing is read from a device at a step. Every :data:`CHUNK` kept tensors are added, on the device, to a
running sum of all kept since the last check (one op, no read: under 1 us per step; float16 ones
summed per chunk and added in float32, see :data:`CHUNK`); the sum is
finite exactly when every loss is, or else finite ones overflowed it (then the values, read, clear
them). :meth:`LossWatch.check` runs where procsv reads the state anyway (before a snapshot; at the
final checkpoint): it adds the few kept since the last chunk the same way and reads the sum, one
host read for all of them; only when it is not finite are the values read (one more) to find the
first bad step. A check before an in-memory snapshot used to stack every loss since the last one
(~600 at the tier's interval: 1.1 ms of the snapshot's charge, issue 54); then it stacked the
fewer than :data:`CHUNK` kept since the last chunk and judged them with three more ops (stack,
is-finite, all, and-ed with the chunks' verdict: 0.22 ms of the charge, quiet); now it runs one op,
the sum, before its read (a sum is no NaN/Inf test by itself only where it overflows, and that
case is told apart by the read of the values, which a NaN needs anyway).

With a ``sink`` (loss-spike detection, :mod:`procsv.trainer.nonfinite.spike`, which needs every value)
the chunks are joined on the device instead of summed (each chunk's stack added to the values kept
since the last check, one op of two inputs: one kernel, built by :meth:`LossWatch.warm`) and a check
reads those values, still one host read, judges them for NaN on the host, and hands the finite ones,
with their steps, to the sink; host values (a graph program's) are kept for it too.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Optional

import numpy as np

CHUNK = 64  # kept scalars stacked into one tensor and judged on the device (ops, no read) past this many
# float16 losses: each chunk's sum is added to a float32 total. float16 tops out at 65504, which 10 s
# of a fast loop's losses of 10 pass: the sum was then not finite at every check, and each check read
# every value again (11 ms for 10,000 losses at load 6, against 0.25 ms for float32). A chunk of 64
# overflows its own sum only for losses above ~1000 (then the values are read, as for any overflow)


Sink = Callable[[np.ndarray, np.ndarray], None]  # the steps, and the finite losses a check read of them


class LossWatch:
    """The losses kept since the last :meth:`check`: host values already judged (``host_bad``: the
    first non-finite one's step), device scalars with their steps (``pending``), the ``chunks`` of
    earlier ones (their steps and scalars, padded to :data:`CHUNK`, read only to find a bad one), and
    the sum of every chunked one (``total``: a scalar tensor on the device, None before the first
    chunk, and with a ``sink``). ``reads`` counts the host reads :meth:`check` made. Given a ``sink``:
    every check hands it the finite values it read (and the finite host values kept since the last)."""

    def __init__(self, tags: tuple[str, ...], sink: Optional[Sink] = None) -> None:
        self.tags = frozenset(tags)
        self._sink = sink
        self._host: list[tuple[int, float]] = []  # finite host values, for the sink
        self._joined: Any = None  # with a sink: the chunks' stacks joined, on the device
        self.host_bad: Optional[int] = None
        self.pending: list[Any] = []
        self.steps: list[int] = []
        self.chunks: list[tuple[list[int], Any]] = []  # (steps, their scalars stacked, or a list at a check)
        self.total: Any = None
        self.reads = 0
        self._zeros: dict[Any, Any] = {}  # a scalar zero per dtype (padding, the first sum's start)
        # with a sink: the checks that found every value finite by their sum and left the values for
        # later (each one's chunks, their values joined on the device, its finite host values): drain()
        self._unread: list[tuple[list[tuple[list[int], Any]], Any, list[tuple[int, float]]]] = []

    @property
    def feeds(self) -> bool:
        """Whether every finite value is kept too (a sink, the loss-spike rule, is fed)."""
        return self._sink is not None

    def warm(self) -> None:
        """Build the kernels a check of float32 losses runs, once, before the first step (a hot
        standby: before its promotion): the sum and the stack of the one size :meth:`_compact`
        pads to (:data:`CHUNK`, and the running sum). A first check of a size otherwise built its kernel
        on the step path: 3-33 ms each at load, the first snapshots of every restarted trainer
        charged that much. One size since every stack is padded to 64 (eleven, powers of two up to
        1024, before: a hot standby was ready 0.3 s later at load, issue 54)."""
        import tensorflow as tf

        if not tf.executing_eagerly():  # a graph program: its losses are host values (session.run's)
            return
        zeros = [self._zero(tf.float32)] * CHUNK
        stack = tf.raw_ops.Pack(values=zeros, axis=0)
        tf.raw_ops.AddN(inputs=zeros + zeros[:1]).numpy()
        if self._sink is not None:
            self._finite_sum(self._join(stack, stack)).numpy()

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
            self._host_value(step, float(value))
            return
        dtype = getattr(value, "dtype", None)
        if dtype is None or getattr(value, "ndim", getattr(getattr(value, "shape", None), "rank", None)) != 0:
            return  # not a scalar: not a loss procsv watches
        if hasattr(value, "handle"):  # a variable (TensorFlow's or Keras 3's): what it holds now, read on its
            read = self._read(value)  # device (no host read); kept as itself, the check read it later
            if read is not None:
                value, dtype = read, read.dtype
        if isinstance(value, (np.generic, np.ndarray)) or not hasattr(value, "device"):  # on the host already
            # (NumPy 2's scalars and arrays have a .device too: "cpu", not a TensorFlow device)
            try:
                host = float(value)
            except (TypeError, ValueError):
                return
            self._host_value(step, host)
            return
        if not getattr(dtype, "is_floating", False):
            return
        self.pending.append(value)
        self.steps.append(step)
        if len(self.pending) >= CHUNK:
            self._compact()

    def keep_host(self, step: int, value: float) -> None:
        """The loss of ``step``, a value on the host already (a graph run's fetched float): judged at once
        (and kept for the sink, if finite)."""
        self._host_value(step, value)

    def _host_value(self, step: int, value: float) -> None:
        """A value on the host already: judged at once (and kept for the sink, if finite)."""
        if not math.isfinite(value):
            if self.host_bad is None or step < self.host_bad:
                self.host_bad = step
        elif self._sink is not None:
            self._host.append((step, value))

    def _compact(self, stack: bool = True) -> None:
        """Add the pending scalars to the running sum; keep them for finding a bad one, stacked into
        one tensor (a step's, so that the loop frees them as it goes: ~400 scalars held to the
        check and freed there cost that check 0.25 ms) or, at a check (``stack`` False), as they are.
        With a sink: their stack joined to the values kept (no sum), at a check too."""
        if not self.pending:
            return
        import tensorflow as tf

        # padded to CHUNK with zeros: TF caches a kernel per input count, and a count never seen
        # before cost 8-13 ms to build at load (the check before an in-memory snapshot, ~400 losses:
        # more than the copy; issue 54). One count, one kernel, built by warm()
        pad = CHUNK - len(self.pending)
        pending = self.pending + [self._zero(self.pending[-1].dtype)] * pad
        steps = self.steps  # (the padding's zeros are no step's: a chunk's first len(steps) values are its own)
        if self._sink is not None:  # every value is read at the check: joined, not summed
            chunk = self._stack(pending)
            self._joined = chunk if self._joined is None else self._join(self._joined, chunk)
            self.chunks.append((steps, None))
            self.pending, self.steps = [], []
            return
        try:  # one op: the kept scalars share a dtype, as a loop's losses do
            if pending[0].dtype == tf.float16:  # its sum is added in float32 (two ops more: see the note at CHUNK)
                total = self.total if self.total is not None else self._zero(tf.float32)
                chunk = tf.raw_ops.Cast(x=tf.raw_ops.AddN(inputs=pending), DstT=tf.float32)
                self.total = tf.raw_ops.AddN(inputs=[chunk, total])
            else:
                total = self.total if self.total is not None else self._zero(pending[0].dtype)
                self.total = tf.raw_ops.AddN(inputs=pending + [total])
        except (TypeError, ValueError, tf.errors.InvalidArgumentError):  # mixed dtypes: one op each
            total = self.total if self.total is not None else self._zero(tf.float64)
            self.total = tf.raw_ops.AddN(inputs=[tf.cast(v, tf.float64) for v in pending + [total]])
        self.chunks.append((steps, self._stack(pending) if stack else pending))
        self.pending, self.steps = [], []

    @staticmethod
    def _read(var: Any) -> Any:
        """A variable's value now, as a tensor on its device (None: not a variable read this way, or a
        graph program's, whose losses are session.run's host values)."""
        import tensorflow as tf

        if not tf.executing_eagerly():
            return None
        try:
            return tf.raw_ops.ReadVariableOp(resource=var.handle, dtype=tf.as_dtype(var.dtype))
        except (TypeError, ValueError, AttributeError, tf.errors.OpError):
            return None

    @staticmethod
    def _join(kept: Any, chunk: Any) -> Any:
        """``chunk``'s values after ``kept``'s, on the device (one op; float64 if their dtypes differ)."""
        import tensorflow as tf

        try:
            return tf.raw_ops.ConcatV2(values=[kept, chunk], axis=0)
        except (TypeError, ValueError, tf.errors.InvalidArgumentError):
            return tf.raw_ops.ConcatV2(values=[tf.cast(kept, tf.float64), tf.cast(chunk, tf.float64)], axis=0)

    @staticmethod
    def _stack(values: list[Any]) -> Any:
        import tensorflow as tf

        try:  # one op: the kept scalars share a dtype, as a loop's losses do
            return tf.raw_ops.Pack(values=values, axis=0)
        except (TypeError, ValueError, tf.errors.InvalidArgumentError):
            return tf.stack([tf.cast(v, tf.float64) for v in values])  # mixed dtypes: one op each

    def _zero(self, dtype: Any) -> Any:
        """A scalar zero of ``dtype`` (one tensor per dtype, made once)."""
        zero = self._zeros.get(dtype)
        if zero is None:
            import tensorflow as tf

            zero = self._zeros[dtype] = tf.zeros((), dtype)
        return zero

    def check(self, defer: bool = False) -> Optional[int]:
        """The first step kept since the last check whose loss is NaN or infinite (None: none);
        forgets what it checked. One host read for all the kept device scalars (their running sum),
        one more if that is not finite (a NaN or an infinity among them, or finite ones whose sum
        overflowed: their values, read, tell which). With a sink, one read of the values themselves,
        whose finite ones (and the finite host values kept) go to the sink; or, ``defer``, one read of
        their sum (one op on the device), as without a sink, and the values are left on the device for
        :meth:`drain` to read and hand to the sink later (the check before an in-memory snapshot under
        ``--on-spike warn``, whose judgement need not stop the loop there: issue 68). Whatever a check
        hands the sink, the deferred values of the checks before it are handed first."""
        first = self.host_bad
        self.host_bad = None
        host, self._host = self._host, []
        if self.pending:
            self._compact(stack=False)
        chunks, self.chunks = self.chunks, []
        total, self.total = self.total, None
        joined, self._joined = self._joined, None
        if self._sink is None:
            if not chunks:
                return first
            self.reads += 1
            if math.isfinite(float(total.numpy())):  # the one read: the sum of every kept loss
                return first
        elif defer:
            if chunks:
                self.reads += 1
            if not chunks or math.isfinite(float(self._finite_sum(joined).numpy())):  # the one read
                if chunks or host:
                    self._unread.append((chunks, joined, host))
                return first
            self.drain()  # (not finite: the values are read now, the earlier ones handed over first)
        else:
            self.drain()
        steps, values = self._values(chunks, joined)
        finite = self._feed(host, steps, values)
        if finite.all():  # (without a sink: finite, their sum overflowed)
            return first
        found = int(steps[~finite].min())
        return found if first is None else min(first, found)

    @property
    def unread(self) -> bool:
        """Values checked are left on the device for :meth:`drain` (a deferred check's)."""
        return bool(self._unread)

    def drain(self) -> None:
        """Read the values the deferred checks left on the device (one read each) and hand them to
        the sink, oldest first (a later value of a step replaces an earlier one there)."""
        unread, self._unread = self._unread, []
        for chunks, joined, host in unread:
            self._feed(host, *self._values(chunks, joined))

    def _feed(self, host: list[tuple[int, float]], steps: np.ndarray, values: np.ndarray) -> np.ndarray:
        """Hand the finite ``host`` values and the finite ``values`` (of ``steps``) to the sink, if
        any; returns which of ``values`` are finite."""
        finite: np.ndarray = np.isfinite(values)
        if self._sink is not None and (host or finite.any()):
            self._sink(np.concatenate([np.asarray([s for s, _ in host], dtype=np.int64), steps[finite]]),
                       np.concatenate([np.asarray([v for _, v in host], dtype=np.float64), values[finite]]))
        return finite

    @staticmethod
    def _finite_sum(joined: Any) -> Any:
        """The sum of the joined values, on the device (one op; float16 ones added in float32, see
        :data:`CHUNK`): finite exactly when every value is, or else finite ones overflowed it."""
        import tensorflow as tf

        if joined.dtype == tf.float16:
            joined = tf.raw_ops.Cast(x=joined, DstT=tf.float32)
        return tf.raw_ops.Sum(input=joined, axis=0)

    def _values(self, chunks: list[tuple[list[int], Any]], joined: Any) -> tuple[np.ndarray, np.ndarray]:
        """The kept values of ``chunks`` (``joined``: all of them, joined on the device already) and
        their steps, in one host read (none without a chunk)."""
        if not chunks:
            return np.zeros(0, dtype=np.int64), np.zeros(0)
        import tensorflow as tf

        stacked = joined
        if stacked is None:
            stacks = [self._stack(kept) if isinstance(kept, list) else kept for _, kept in chunks]
            stacked = stacks[0] if len(stacks) == 1 else tf.concat([tf.cast(c, tf.float64) for c in stacks], 0)
        self.reads += 1
        read = np.asarray(stacked.numpy(), dtype=np.float64)
        if all(len(s) == CHUNK for s, _ in chunks[:-1]):  # (every chunk whole but the last: the padding is at the end)
            values = read[:len(chunks) * CHUNK - (CHUNK - len(chunks[-1][0]))]
        else:
            values = read[np.concatenate([np.arange(len(s)) + CHUNK * i for i, (s, _) in enumerate(chunks)])]
        steps = np.fromiter((s for chunk_steps, _ in chunks for s in chunk_steps), dtype=np.int64, count=len(values))
        return steps, values

    def forget(self) -> None:
        """Drop everything kept (after a restore: those steps are undone); what deferred checks
        checked goes to the sink first (the restore's rewind of the sink drops what it undid)."""
        self.drain()
        self.host_bad = None
        self.pending, self.steps, self.chunks = [], [], []
        self._host = []
        self.total = self._joined = None
