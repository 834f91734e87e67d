"""The batches of a Keras ``fit`` since the newest committed checkpoint, kept to be trained again after a rollback.

Runs in the trainer process, inside ``model.fit`` (:mod:`procsv.trainer.keras.fit` drives it). Keras'
loop only goes forward, so when ``--on-nonfinite rollback`` restores an earlier state in place
(:mod:`procsv.trainer.nonfinite.methods`), the batches between that state and the bad one are
trained again from here: each batch ``fit`` trains is drawn by :class:`BatchReplay`'s own step
function, which is Keras' (``one_step_on_data(iterator.get_next())``, as ``multi_step_on_iterator`` runs
it) but also returns the batch it drew and the batch's own loss; the batch is kept under its
global step until a committed checkpoint is newer (a rollback never restores a state older than
the newest committed checkpoint: nothing older is needed). A batch is trained again through the
same step function, from an iterator over that one batch whose element spec is the input's, so
the same traced function runs it: the replayed steps compute what the first ones did, bit for bit.

The batch's own loss: ``logs["loss"]`` is the epoch's running mean (Keras 3), NaN for the rest of
the epoch once one batch was; the step function reads Keras' loss tracker around the step
(``total`` and ``count``, no host read) and returns what this batch added, divided by its weight.
A ``train_step`` that does not feed the loss tracker leaves the running mean, ``logs["loss"]``.

Only ``steps_per_execution=1`` and a plain (undistributed) ``tf.data`` input are kept this way:
elsewhere :attr:`BatchReplay.unsupported` says why, and a rollback there stops the run (exit 4).
"""

from __future__ import annotations

from typing import Any, Optional

from procsv.trainer.keras.step_warmup import _closure

LOSS = "loss"  # the key of the batch's own loss in what the step function returns (what LossWatch keeps)
LOGS = "logs"


class BatchReplay:
    """Keras' step with its batch kept: ``run(iterator)`` trains the next batch of ``iterator``,
    ``again(step)`` trains the batch kept for ``step`` once more; ``kept`` maps a global step to
    (epoch, batch index in it, the batch)."""

    def __init__(self, model: Any, train_function: Any, element_spec: Any, steps_per_execution: int) -> None:
        import tensorflow as tf

        self.kept: dict[int, tuple[int, int, Any]] = {}
        self.unsupported = ""
        self._spec = element_spec
        one_step = _closure(train_function).get("one_step_on_data")
        if steps_per_execution != 1:
            self.unsupported = "a Keras fit with steps_per_execution > 1 cannot be replayed batch by batch"
        elif one_step is None:
            self.unsupported = "this Keras' train function is made otherwise (no one_step_on_data)"
        elif element_spec is None:
            self.unsupported = "the input is not a plain tf.data pipeline (a distribution strategy's)"
        if self.unsupported:
            self._step: Any = None
            return
        keras_step: Any = one_step
        tracker = getattr(model, "_loss_tracker", None)
        total, count = getattr(tracker, "total", None), getattr(tracker, "count", None)

        def step(iterator: Any) -> Any:
            data = iterator.get_next()
            if total is None or count is None:
                logs = keras_step(data)
                return {LOGS: logs, LOSS: logs.get("loss", tf.constant(0.0)), "data": data}
            t0, c0 = tf.identity(total.value), tf.identity(count.value)
            logs = keras_step(data)
            added, weight = total.value - t0, count.value - c0
            fallback = tf.cast(logs.get("loss", tf.constant(0.0)), added.dtype)
            own = tf.where(weight > 0, added / tf.where(weight > 0, weight, tf.ones_like(weight)), fallback)
            return {LOGS: logs, LOSS: own, "data": data}

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
        self.kept[step] = (epoch, index, data)

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
        """Drop the batches of ``step`` and before (a committed checkpoint is at least that new)."""
        for s in [s for s in self.kept if s <= step]:
            del self.kept[s]

    def position(self, step: int) -> Optional[tuple[int, int]]:
        kept = self.kept.get(step)
        return None if kept is None else (kept[0], kept[1])
