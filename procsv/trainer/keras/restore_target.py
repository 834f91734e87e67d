"""What a Keras ``fit``'s restore restores: the whole state, only its position, or nothing of it.

Runs in the trainer process, as a ``fit`` begins: :class:`procsv.trainer.keras.fit.BackupAndRestore` hands
one of these to its Supervisor's restore (:meth:`procsv.trainer.frontend.port.FrontEnd.restore_into`), in
place of the checkpoint object; the restore sets the global step from the checkpoint it chose either way.

- :class:`Nothing`: a fit after a fit of the same directory completed in this process. The model in
  memory is the state (or newer: the program changed it since, e.g. unfroze a base model and compiled a
  new optimizer: TensorFlow's fine-tuning tutorial), so nothing of the checkpoint is restored, whose
  structure may not even match it any more; the fit's checkpoints continue its step count.
- :class:`WholeOrPosition`: any other fit. The whole state, as before; when the checkpoint does not match
  the model (a later fit's, of a model the program unfroze and compiled again after this fit), only the
  position (which fit, which epoch), and the mismatch is kept for the fit to judge: a fit that completed
  before the restart (:mod:`procsv.trainer.keras.resume`) trains nothing and goes on; any other fit
  raises :class:`~procsv.common.errors.MismatchedCheckpoint`, as before.

And what no restore restores: :func:`unrestored_random`, the layers whose random numbers' state is not in the
checkpoint (said at ``fit`` start: a resume is not exact).
"""

from __future__ import annotations

from typing import Any, Optional


def unrestored_random(model: Any) -> list[str]:
    """The names of ``model``'s layers that draw random numbers from a Keras ``SeedGenerator`` (``Dropout``,
    ``GaussianNoise``, ...), whose state the fit's checkpoint does not hold (Keras 3 tracks it apart from the
    layer's weights): a resumed fit, or an auditor's replay, draws other numbers than the uninterrupted run."""
    import keras
    import tensorflow as tf

    layers = [o for o in tf.train.TrackableView(model).descendants() if isinstance(o, keras.layers.Layer)]
    if isinstance(model, keras.layers.Layer):
        layers.insert(0, model)
    return sorted({layer.name for layer in layers  # (a layer nested in another's attributes too)
                   if any(isinstance(v, keras.random.SeedGenerator) for v in vars(layer).values())})


class Nothing:
    """Restores nothing of the checkpoint (an empty ``tf.train.Checkpoint``'s restore, its values expected
    to be left over)."""

    def restore(self, path: str) -> Any:
        import tensorflow as tf

        status = tf.train.Checkpoint().restore(path)
        status.expect_partial()
        return status


class WholeOrPosition:
    """Restores ``whole`` (the fit's checkpoint object); if the checkpoint does not match it, only
    ``position`` (a ``tf.train.Checkpoint`` of the fit's position variables), with ``mismatch`` saying why
    (None: the whole state was restored). A mismatch found mid-restore may have assigned some variables of
    ``whole`` already: a fit that goes on after one trains nothing on them (the next fit restores them)."""

    def __init__(self, whole: Any, position: Any) -> None:
        self._whole = whole
        self._position = position
        self.mismatch: Optional[str] = None

    def restore(self, path: str) -> Any:
        self.mismatch = None
        try:
            status = self._whole.restore(path)
            status.assert_existing_objects_matched()
            return status
        except (AssertionError, ValueError) as exc:  # ValueError: "incompatible tensor with shape ... name ..."
            self.mismatch = str(exc).splitlines()[0]
        status = self._position.restore(path)
        status.expect_partial()
        return status


__all__ = ["Nothing", "WholeOrPosition", "unrestored_random"]
