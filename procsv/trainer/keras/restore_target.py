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

And what Keras' own checkpoint leaves out: :func:`seed_states`, the state of the random numbers of the layers
that draw them in training (``Dropout``, ``GaussianNoise``: a Keras ``SeedGenerator`` each, whose state Keras 3
tracks apart from the layer's weights, so ``tf.train.Checkpoint(model=...)`` saves none of it). The fit's checkpoint
holds them (``seeds/...``), and :class:`WholeOrPosition` restores them where the checkpoint has them: a resumed
fit draws the numbers the uninterrupted one would have, and is bit-exact (before, it drew others: measured, a
seeded ``Dropout`` fit SIGKILLed once ended with other weights than one never killed).
"""

from __future__ import annotations

from typing import Any, Optional


def seed_states(model: Any) -> dict[str, Any]:
    """The state variables (``tf.Variable``) of the Keras ``SeedGenerator`` of every layer of ``model`` (``Dropout``,
    ``GaussianNoise``, ...; a layer nested in another's attributes too), keyed by where the layer sits in the model
    (the path of attributes to it from the model, breadth first, then the generator's attribute:
    ``_functional._operations.2.seed_generator``): what the fit's checkpoint adds as ``seeds`` so that a restore
    puts back the random numbers' state. Not by the layer's name: Keras names a layer from a count kept by the
    process (``dropout_1``), which a restarted program can count otherwise (a base model loaded from a file the
    first run saved keeps its names, and the next ``Dropout`` made is ``dropout`` again: measured, the head's
    state restored into the base's generator). Empty for a model that draws none."""
    import keras
    import tensorflow as tf

    view = tf.train.TrackableView(model)
    paths: dict[int, str] = {id(model): ""}
    queue = [model]
    states: dict[str, Any] = {}
    seen: set[int] = set()
    while queue:
        obj = queue.pop(0)
        if isinstance(obj, keras.layers.Layer):
            for attr, gen in vars(obj).items():
                if isinstance(gen, keras.random.SeedGenerator) and id(gen) not in seen:
                    seen.add(id(gen))
                    states[f"{paths[id(obj)]}.{attr}".lstrip(".")] = gen.state.value
        for name, child in view.children(obj).items():
            if id(child) not in paths:
                paths[id(child)] = f"{paths[id(obj)]}.{name}".lstrip(".")
                queue.append(child)
    return states


class Nothing:
    """Restores nothing of the checkpoint (an empty ``tf.train.Checkpoint``'s restore, its values expected
    to be left over)."""

    def restore(self, path: str) -> Any:
        import tensorflow as tf

        status = tf.train.Checkpoint().restore(path)
        status.expect_partial()
        return status


class WholeOrPosition:
    """Restores ``whole`` (the fit's checkpoint object, but its ``seeds``); if the checkpoint does not match it,
    only ``position`` (a ``tf.train.Checkpoint`` of the fit's position variables), with ``mismatch`` saying why
    (None: the whole state was restored). A mismatch found mid-restore may have assigned some variables of
    ``whole`` already: a fit that goes on after one trains nothing on them (the next fit restores them). With the
    whole state, ``seeds`` (a ``tf.train.Checkpoint`` of :func:`seed_states`) where the checkpoint holds them; one
    written before they were saved holds none (``unseeded``: True, the states left as they are: said by the fit);
    one whose states are not all this model's (``unmatched_seeds``: a layer that draws random numbers added or moved,
    or keys of another version) restores those it has and leaves the others as they are (said by the fit)."""

    def __init__(self, whole: Any, position: Any, seeds: Any = None) -> None:
        self._whole = whole
        self._position = position
        self._seeds = seeds
        self.mismatch: Optional[str] = None
        self.unseeded = False
        self.unmatched_seeds = False

    def restore(self, path: str) -> Any:
        self.mismatch, self.unseeded, self.unmatched_seeds = None, False, False
        try:
            status = self._whole.restore(path)
            status.assert_existing_objects_matched()
            status.expect_partial()  # the checkpoint's values it lacks (seeds, global_step) are restored by others
            if self._seeds is not None:
                import tensorflow as tf

                saved = tf.train.load_checkpoint(path).get_variable_to_shape_map()
                self.unseeded = not any(key.startswith("seeds/") for key in saved)
                seeded = self._seeds.restore(path)
                seeded.expect_partial()
                if not self.unseeded:
                    try:  # (states of other layers, or other paths: the model changed, or an older procsv's names)
                        seeded.assert_existing_objects_matched()
                    except AssertionError:
                        self.unmatched_seeds = True
            return status
        except (AssertionError, ValueError) as exc:  # ValueError: "incompatible tensor with shape ... name ..."
            self.mismatch = str(exc).splitlines()[0]
        status = self._position.restore(path)
        status.expect_partial()
        return status


__all__ = ["Nothing", "WholeOrPosition", "seed_states"]
