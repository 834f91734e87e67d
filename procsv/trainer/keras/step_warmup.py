"""What a Keras ``fit`` under procsv traces and instantiates before its restore: Keras' train step.

Runs in the trainer process, inside ``model.fit``, in ``procsv.keras.BackupAndRestore.on_train_begin``
(:mod:`procsv.trainer.keras.fit`) before the Supervisor prepares its session, so in a hot standby
before it waits to be promoted. Keras 3 makes its train function inside ``fit`` (``make_train_function``,
before ``on_train_begin``): a plain Python function over a ``tf.function`` of the iterator,
``multi_step_on_iterator``, which is traced and instantiated at the first batch (about 0.4 s for the
digits MLP: most of a promoted standby's time to its first batch). :func:`train_step_warm_up` finds
that ``tf.function`` and an iterator to trace it with, for :meth:`Supervisor.warm_up
<procsv.trainer.supervisor.Supervisor.warm_up>`, which traces and instantiates it without running it.

The iterator is not one over the program's dataset: making one would draw the next seed of its
shuffles (:mod:`procsv.trainer.keras.input_position`) and so change the batches of the run. It is an iterator
over a stand-in dataset of the same element spec (one element of zeros: the instantiating call is
cancelled before any op runs, and only a hot standby's run on shadow copies of the variables,
:func:`procsv.trainer.standby.warmup.run_on_shadows`, reads it), so the trace is the one the first batch
would make, and that batch finds it in the function's cache. Where no such stand-in can be made (an input that is not a plain
``tf.data`` pipeline, elements other than dense tensors, a Keras whose train function looks
otherwise, ``run_eagerly``), nothing is warmed up and the first batch traces as it always did.
"""

from __future__ import annotations

from typing import Any, Optional

from procsv.trainer.standby import warmup


def train_step_warm_up(train_function: Any, epoch_iterator: Any) -> Optional[tuple[Any, Any]]:
    """(the ``tf.function`` to warm up, an iterator to trace it with), or None if there is none."""
    import tensorflow as tf

    step = free_variables(train_function).get("multi_step_on_iterator")
    if step is None or not callable(getattr(step, "get_concrete_function", None)):
        return None  # run_eagerly, or a Keras whose train function is made otherwise
    dataset = getattr(epoch_iterator, "_distributed_dataset", None)
    if not isinstance(dataset, tf.data.Dataset):
        return None  # a distribution strategy's dataset: its iterator is the strategy's own
    stand_in = _stand_in(dataset.element_spec)
    if stand_in is None:
        return None
    return step, warmup.disposable(iter(stand_in))  # a hot standby's shadow run may read its one batch


def free_variables(fn: Any) -> dict[str, Any]:
    """The free variables of a Python function, by name (empty for anything else)."""
    code, cells = getattr(fn, "__code__", None), getattr(fn, "__closure__", None)
    if code is None or not cells:
        return {}
    out: dict[str, Any] = {}
    for name, cell in zip(code.co_freevars, cells):
        try:
            out[name] = cell.cell_contents
        except ValueError:  # an empty cell
            continue
    return out


def _stand_in(spec: Any) -> Optional[Any]:
    """A dataset of zeros with exactly this element spec, or None if it has other than dense
    numeric or boolean tensors (or the spec cannot be matched)."""
    import tensorflow as tf

    specs = tf.nest.flatten(spec)
    if not all(type(s) is tf.TensorSpec and (s.dtype.is_numeric or s.dtype == tf.bool) for s in specs):
        return None
    if any(s.shape.rank is None for s in specs):
        return None

    def zeros(i: Any) -> Any:
        n = tf.cast(i, tf.int32) + 1  # a size unknown to the trace: a None dimension stays None
        return tf.nest.pack_sequence_as(spec, [
            tf.zeros(tf.stack([n if d is None else d for d in s.shape.as_list()]) if s.shape.rank else [], s.dtype)
            for s in specs])

    dataset = tf.data.Dataset.range(1).map(zeros)
    return dataset if dataset.element_spec == spec else None
