"""Where ``model.fit``'s input stands, and whether it can be put back exactly.

Runs in the trainer process, inside ``model.fit`` (called by :mod:`procsv.trainer.keras_fit`).
Keras keeps its input pipeline in locals of ``fit`` (the epoch iterator); :func:`fit_frame` finds
them. A resumed ``fit`` starts at the interrupted epoch; :func:`replay_epochs` first runs the
input of the epochs before it the way ``fit`` would have -- every batch drawn, none trained on -- so
that a shuffle seeded once per run (NumPy arrays with ``shuffle=True``, a seeded
``tf.data`` ``shuffle(..., reshuffle_each_iteration=True)``, a generator's own per-epoch order) is in
the state the uninterrupted run had. :func:`inexact_reasons` tells, at start, which inputs cannot
be put back exactly (an unseeded shuffle) so that it is said instead of happening silently.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from typing import Any, Optional

from procsv.common.errors import UsageError

_SHUFFLE_OPS = {"ShuffleDataset", "ShuffleDatasetV2", "ShuffleDatasetV3", "ShuffleAndRepeatDataset",
                "ShuffleAndRepeatDatasetV2"}


@dataclass
class FitInput:
    """What ``fit`` was called with, as far as resuming needs it."""

    epoch_iterator: Any  # keras' EpochIterator of this fit call
    x: Any
    shuffle: Any
    steps_per_epoch: Optional[int]
    epochs: int


def fit_frame() -> FitInput:
    """The ``fit`` call this callback runs in (Keras 3's TensorFlow trainer)."""
    frame = sys._getframe(1)
    while frame is not None:
        names = frame.f_locals
        if frame.f_code.co_name == "fit" and "epoch_iterator" in names:
            return FitInput(names["epoch_iterator"], names.get("x"), names.get("shuffle", True),
                            names.get("steps_per_epoch"), int(names.get("epochs", 1)))
        frame = frame.f_back  # type: ignore[assignment]  # None ends the loop
    raise UsageError("procsv.keras.BackupAndRestore works inside Keras 3's model.fit (TensorFlow backend); "
                     "no fit() call was found around the callback")


def check_finite(inp: FitInput, steps: Optional[int]) -> None:
    """An infinite dataset without ``steps_per_epoch`` has no epochs to resume into: refuse it."""
    import tensorflow as tf

    if steps is None and isinstance(inp.x, tf.data.Dataset) \
            and int(inp.x.cardinality()) == int(tf.data.INFINITE_CARDINALITY):
        raise UsageError("model.fit got an infinite dataset without steps_per_epoch: an epoch never ends, so "
                         "there is no position to resume at; pass steps_per_epoch=N to fit()")


def build_state(model: Any, inp: FitInput) -> None:
    """Create every variable a checkpoint of ``fit`` holds before it is restored: the compiled
    metrics' and loss trackers' (Keras creates them when the train step is first traced, which on
    a resume comes after batches were skipped and after the restore) and the optimizer's slots.
    Built from the input's element spec: no batch is drawn."""
    compiled = [getattr(model, name, None) for name in ("_compile_metrics", "_compile_loss")]
    if any(c is not None and not c.built for c in compiled):
        spec = inp.epoch_iterator._distributed_dataset.element_spec
        try:
            model._symbolic_build(data_batch=spec)
        except Exception as exc:
            raise UsageError(f"procsv.keras.BackupAndRestore could not build the model's compiled metrics before "
                             f"fit() ({type(exc).__name__}: {exc}); build the model first (call it on a batch)")
    if not model.optimizer.built:
        model.optimizer.build(model.trainable_variables)


def _unseeded_shuffles(dataset: Any) -> int:
    """How many shuffle stages of ``dataset`` draw their seed at random (seed and seed2 both 0)."""
    from tensorflow.core.framework import graph_pb2

    graph = graph_pb2.GraphDef()
    try:
        graph.ParseFromString(dataset._as_serialized_graph().numpy())
    except Exception:  # a dataset TF cannot serialize (a py_function): nothing to say about it
        return 0
    consts = {n.name: list(n.attr["value"].tensor.int64_val) for n in graph.node if n.op == "Const"}
    count = 0
    for node in graph.node:
        if node.op in _SHUFFLE_OPS and len(node.input) >= 4:
            seeds = [consts.get(name.lstrip("^"), [None]) for name in node.input[2:4]]
            if seeds == [[0], [0]]:
                count += 1
    return count


def inexact_reasons(inp: FitInput) -> list[str]:
    """Why a resumed fit of this input would not see the batches an uninterrupted one sees."""
    import keras
    import tensorflow as tf
    from tensorflow.python.eager import context

    reasons: list[str] = []
    x = inp.x
    if isinstance(x, tf.data.Dataset):
        if _unseeded_shuffles(x):
            reasons.append("the tf.data pipeline shuffles without a seed: pass shuffle(..., seed=N) or call "
                           "keras.utils.set_random_seed(N) before building it")
    elif isinstance(x, keras.utils.PyDataset) or callable(getattr(x, "__next__", None)):
        pass  # a generator's order is its own: documented, not detectable
    elif inp.shuffle and inp.shuffle != "batch" and context.global_seed() is None:
        reasons.append("fit(shuffle=True) with no global seed: call keras.utils.set_random_seed(N) first")
    try:
        from tensorflow.python.framework import config as tf_config

        if not tf_config.is_op_determinism_enabled():
            reasons.append("op determinism is off: bit-identical weights need "
                           "tf.config.experimental.enable_op_determinism()")
    except (ImportError, AttributeError):
        pass
    return reasons


def replay_epochs(inp: FitInput, epochs: int) -> tuple[int, float]:
    """Draw the input of ``epochs`` whole epochs as ``fit`` would, training on none of it; returns
    (batches drawn, seconds). Keras' own epoch loop is used, so its per-epoch hooks (a PyDataset's
    ``on_epoch_end``, a new iterator per epoch, an unknown dataset size learnt at the first epoch's
    end) happen exactly as in the uninterrupted run."""
    t0 = time.monotonic()
    drawn = 0
    it = inp.epoch_iterator
    for _ in range(epochs):
        with it.catch_stop_iteration():
            for begin, end, iterator in it:
                for _ in range(end - begin + 1):
                    next(iterator)
                    drawn += 1
    return drawn, time.monotonic() - t0
