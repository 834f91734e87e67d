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
"""

from __future__ import annotations

from typing import Any, Optional

from procsv.trainer.keras.step_warmup import _closure

LOSS = "loss"  # the key of the batch's own loss in what the step function returns (what LossWatch keeps)
LOGS = "logs"
_OWN = "procsv_batch_loss"  # the batch's own loss among the logs of procsv's train step (popped before fit sees them)


class BatchReplay:
    """Keras' step with its batch kept: ``run(iterator)`` trains the next batch of ``iterator``,
    ``again(step)`` trains the batch kept for ``step`` once more; ``kept`` maps a global step to
    (epoch, batch index in it, the batch)."""

    def __init__(self, model: Any, train_function: Any, element_spec: Any, steps_per_execution: int) -> None:
        import tensorflow as tf

        self.kept: dict[int, tuple[int, int, Any]] = {}  # in the order of their steps
        self.keeping = True  # False: no rollback can come (another policy, detection off): nothing kept
        self.unsupported = ""
        self._spec = element_spec
        make = getattr(model, "_make_function", None)
        if steps_per_execution != 1:
            self.unsupported = "a Keras fit with steps_per_execution > 1 cannot be replayed batch by batch"
        elif make is None or "one_step_on_data" not in _closure(train_function):
            self.unsupported = "this Keras' train function is made otherwise (no one_step_on_data)"
        elif element_spec is None:
            self.unsupported = "the input is not a plain tf.data pipeline (a distribution strategy's)"
        if self.unsupported:
            self._step: Any = None
            return
        # Keras' own per-batch function, made by Keras around a train step that also returns the loss
        # the batch handed its loss tracker (the model's own train_step, whatever it is, does the work)
        made: Any = model._make_function(lambda data: _with_own_loss(model, data))
        keras_step: Any = _closure(made).get("one_step_on_data")

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
        if self.keeping:
            self.kept.pop(step, None)  # (a step trained again after a rollback is kept where it now is)
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
        while self.kept and next(iter(self.kept)) <= step:
            del self.kept[next(iter(self.kept))]

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
