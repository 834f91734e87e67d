"""The batches of a Keras ``fit`` since the newest committed checkpoint, kept to be trained again after a rollback.

Runs in the trainer process, inside ``model.fit`` (:mod:`procsv.trainer.keras.fit` drives it). Keras'
loop only goes forward, so when ``--on-nonfinite rollback`` restores an earlier state in place
(:mod:`procsv.trainer.nonfinite.rollback`), the batches between that state and the bad one are
trained again from here: each batch ``fit`` trains is drawn by :class:`BatchReplay`'s own step
function, which is Keras' (``one_step_on_data(iterator.get_next())``, as ``multi_step_on_iterator`` runs
it) but also returns the batch it drew and the batch's own loss; the batch is kept under its
global step until a committed checkpoint is newer (a rollback never restores a state older than
the newest committed checkpoint: nothing older is needed). A batch is trained again through the
same step function, from an iterator over that one batch whose element spec is the input's, so
the same traced function runs it: the replayed steps compute what the first ones did, bit for bit.

The batch's own loss: ``logs["loss"]`` is the epoch's running mean (Keras 3), NaN for the rest of
the epoch once one batch was. The step function is made by Keras (``model._make_function``, as
``fit`` makes its own) around the model's ``train_step`` with the loss tracker's ``update_state``
listened to while it is traced: the loss the batch hands the tracker is returned beside the logs
(a tensor among the step's outputs: no host read). A ``train_step`` that does not feed the loss
tracker is watched through ``logs["loss"]``.

Only ``steps_per_execution=1`` and a plain (undistributed) ``tf.data`` input are kept this way:
elsewhere :attr:`BatchReplay.unsupported` says why, and a rollback there stops the run (exit 4).

What is kept is bounded: the batches since the newest in-memory snapshot or committed checkpoint
(whichever is newer: :meth:`BatchReplay.forget_through`), and at most ``cap_bytes`` of them. Past
the cap no batch is kept until a snapshot covers the last one left out (so the kept batches always
follow the restored state without a gap), and :func:`over_cap_line` is said once: a non-finite loss
before that snapshot restores the newest finite state, trains the batches kept after it again and
continues with ``fit``'s next batch (the batches left out are not trained again: exact except for
them). The same fallback, with nothing kept at all, serves a Keras version the replay is not tested
with (:data:`TESTED_KERAS`, :func:`untested_keras_line`, said at ``fit`` start).
"""

from __future__ import annotations

import os
import sys
from typing import Any, Optional

from procsv.trainer.keras.step_warmup import free_variables

LOSS = "loss"  # the key of the batch's own loss in what the step function returns (what LossWatch keeps)
LOGS = "logs"
_OWN = "procsv_batch_loss"  # the batch's own loss among the logs of procsv's train step (popped before fit sees them)
# the Keras versions the replay (model._make_function, the one_step_on_data closure, the loss
# tracker's update_state listened to) is tested with; another one gets the fallback, said at fit start
TESTED_KERAS = ("3.15.",)  # prefixes of keras.__version__
CAP_SHARE = 0.1  # the default cap on the batches kept: this share of the host's memory,
CAP_MAX = 512 << 20  # and at most this: a large-batch image model's 10 s of batches is not gigabytes


def keras_tested(version: str) -> bool:
    """``version`` (``keras.__version__``) is one the replay is tested with."""
    return version.startswith(TESTED_KERAS)


def untested_keras_line(version: str) -> str:
    return (f"procsv: warning: Keras {version} is not one procsv's rollback replay is tested with "
            f"({', '.join(v + 'x' for v in TESTED_KERAS)}): fit's batches are not kept, and a non-finite loss "
            "restores the newest finite state and continues with fit's next batch (the batches since that "
            "state are not trained again, said then; with no batch left, fit stops with exit code 4)")


def over_cap_line(cap: int) -> str:
    return (f"procsv: warning: the batches kept for a rollback's replay reached their cap ({cap / 2**20:.0f} MiB, "
            "BackupAndRestore(replay_memory_bytes=...)); no more are kept until the next snapshot: a non-finite "
            "loss before it restores the newest finite state, trains the kept batches again and continues with "
            "fit's next batch (the batches past the cap are not trained again, said then; with no batch left, fit stops "
            "with exit code 4)")


def default_cap() -> int:
    """:data:`CAP_SHARE` of the host's physical memory, at most :data:`CAP_MAX`, in bytes."""
    try:
        return min(CAP_MAX, int(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") * CAP_SHARE))
    except (ValueError, OSError):
        return CAP_MAX


def nbytes(data: Any) -> int:
    """The bytes of a batch's tensors, from their shapes and dtypes (no host read)."""
    import tensorflow as tf

    total = 0
    for t in tf.nest.flatten(data):
        n = t.shape.num_elements() if getattr(t, "shape", None) is not None else None
        size = getattr(getattr(t, "dtype", None), "size", 0) or 0
        total += (n or 0) * size
    return total


class BatchReplay:
    """Keras' step with its batch kept: ``run(iterator)`` trains the next batch of ``iterator``,
    ``again(step)`` trains the batch kept for ``step`` once more; ``kept`` maps a global step to
    (epoch, batch index in it, the batch), at most ``cap_bytes`` of them (``kept_bytes``)."""

    def __init__(self, model: Any, train_function: Any, element_spec: Any, steps_per_execution: int,
                 cap_bytes: int = 1 << 62, off: bool = False) -> None:
        import tensorflow as tf

        self.kept: dict[int, tuple[int, int, Any]] = {}  # in the order of their steps
        self.cap_bytes = cap_bytes
        self.kept_bytes = 0
        self._sizes: dict[int, int] = {}
        self._left_out: Optional[int] = None  # the newest step not kept (past the cap) no snapshot covers yet
        self.said_cap = False
        self.keeping = True  # False: no rollback can come (another policy, detection off): nothing kept
        self.unsupported = ""
        self.off = off  # a Keras the replay is not tested with: none of its private API is used, nothing kept
        self._spec = element_spec
        if off:
            self._step: Any = None
            return
        make = getattr(model, "_make_function", None)
        if steps_per_execution != 1:
            self.unsupported = "a Keras fit with steps_per_execution > 1 cannot be replayed batch by batch"
        elif make is None or "one_step_on_data" not in free_variables(train_function):
            self.unsupported = "this Keras' train function is made otherwise (no one_step_on_data)"
        elif element_spec is None:
            self.unsupported = "the input is not a plain tf.data pipeline (a distribution strategy's)"
        if self.unsupported:
            self._step = None
            return
        # Keras' own per-batch function, made by Keras around a train step that also returns the loss
        # the batch handed its loss tracker (the model's own train_step, whatever it is, does the work)
        made: Any = model._make_function(lambda data: _with_own_loss(model, data))
        keras_step: Any = free_variables(made).get("one_step_on_data")

        def one_step_keeping_its_batch(iterator: Any) -> Any:
            data = iterator.get_next()
            logs = dict(keras_step(data))
            own = logs.pop(_OWN)
            return {LOGS: logs, LOSS: own, "data": data}

        step = one_step_keeping_its_batch
        self._step = step if model.run_eagerly else tf.function(step, reduce_retracing=True)

    @property
    def traced(self) -> Any:
        """The ``tf.function`` of the step (None: none, or Keras runs eagerly), for a warm-up."""
        return self._step if callable(getattr(self._step, "get_concrete_function", None)) else None

    def run(self, iterator: Any) -> dict[str, Any]:
        """Train the next batch of ``iterator`` (Keras' step); returns {"logs", "loss", "data"}."""
        out: dict[str, Any] = self._step(iterator)
        return out

    def keep(self, step: int, epoch: int, index: int, data: Any) -> None:
        """Keep ``data`` for ``step`` unless that passes the cap (then say so, once, and keep nothing
        more until a snapshot covers ``step``)."""
        if not self.keeping:
            return
        self._drop(step)  # (a step trained again after a rollback is kept where it now is)
        size = nbytes(data)
        if self._left_out is not None or self.kept_bytes + size > self.cap_bytes:
            self._left_out = step if self._left_out is None else max(self._left_out, step)
            if not self.said_cap:
                self.said_cap = True
                print(over_cap_line(self.cap_bytes), file=sys.stderr, flush=True)
            return
        self.kept[step] = (epoch, index, data)
        self._sizes[step] = size
        self.kept_bytes += size

    def _drop(self, step: int) -> None:
        if self.kept.pop(step, None) is not None:
            self.kept_bytes -= self._sizes.pop(step, 0)

    def again(self, step: int) -> dict[str, Any]:
        """Train the batch kept for ``step`` once more, through the same traced step."""
        import tensorflow as tf

        _, _, data = self.kept[step]
        spec = self._spec

        def relax(*parts: Any) -> Any:  # the kept batch's shapes, declared as loosely as the input's
            flat = tf.nest.flatten(parts[0] if len(parts) == 1 else parts)
            shaped = [tf.raw_ops.PlaceholderWithDefault(input=t, shape=s.shape)
                      for t, s in zip(flat, tf.nest.flatten(spec))]
            return tf.nest.pack_sequence_as(spec, shaped)

        dataset = tf.data.Dataset.from_tensors(data).map(relax)
        return self.run(iter(dataset))

    def forget_through(self, step: int) -> None:
        """Drop the batches of ``step`` and before (an in-memory snapshot or a committed checkpoint
        is at least that new: a rollback restores nothing older)."""
        while self.kept and next(iter(self.kept)) <= step:
            self._drop(next(iter(self.kept)))
        if self._left_out is not None and self._left_out <= step:
            self._left_out = None  # the batches left out are behind every state a rollback restores

    def position(self, step: int) -> Optional[tuple[int, int]]:
        kept = self.kept.get(step)
        return None if kept is None else (kept[0], kept[1])


def _with_own_loss(model: Any, data: Any) -> Any:
    """``model.train_step(data)``'s logs, and the loss the batch handed Keras' loss tracker (its
    ``update_state`` is listened to while the step is traced; a step that hands it none, or more
    than one, is watched through ``logs["loss"]``)."""
    import tensorflow as tf

    tracker = getattr(model, "_loss_tracker", None)
    seen: list[Any] = []
    if tracker is None:
        logs = model.train_step(data)
    else:
        own_attr = "update_state" in vars(tracker)
        previous = vars(tracker).get("update_state")
        listened = tracker.update_state

        def update_state(values: Any, sample_weight: Any = None) -> Any:
            seen.append(values)
            return listened(values, sample_weight=sample_weight)

        object.__setattr__(tracker, "update_state", update_state)
        try:
            logs = model.train_step(data)
        finally:
            if own_attr:
                object.__setattr__(tracker, "update_state", previous)
            else:
                object.__delattr__(tracker, "update_state")
    logs = dict(logs)
    if len(seen) == 1 and getattr(seen[0], "shape", None) is not None and seen[0].shape.rank == 0:
        logs[_OWN] = tf.cast(seen[0], tf.float32)
    else:
        logs[_OWN] = tf.cast(logs.get("loss", 0.0), tf.float32)
    return logs
