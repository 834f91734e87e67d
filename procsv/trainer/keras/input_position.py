"""Where ``model.fit``'s input stands, and whether it can be put back exactly.

Runs in the trainer process, inside ``model.fit`` (called by :mod:`procsv.trainer.keras.fit`).
Keras keeps its input pipeline in locals of ``fit`` (the epoch iterator); :func:`fit_frame` finds
them. A resumed ``fit`` starts at the interrupted epoch; :func:`replay_epochs` first runs the
input of the epochs before it the way ``fit`` would have, training on none of it, so that a
shuffle seeded once per run (NumPy arrays with ``shuffle=True``, a seeded ``tf.data``
``shuffle(..., reshuffle_each_iteration=True)``, a generator's own per-epoch order) is in the
state the uninterrupted run had. Where the only state an epoch leaves behind is its shuffles' seeds
(:func:`draw_reason` finds none other in the pipeline's graph), making each epoch's iterator is
enough: a seeded shuffle draws its next seed when an iterator over it is made, not as it is read,
so no batch of those epochs is read again. Otherwise every batch is drawn. :func:`inexact_reasons`
tells, at start, which inputs cannot be put back exactly (an unseeded shuffle) so that it is said
instead of happening silently."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

from procsv.common.errors import UsageError

_SHUFFLE_OPS = {"ShuffleDataset", "ShuffleDatasetV2", "ShuffleDatasetV3", "ShuffleAndRepeatDataset",
                "ShuffleAndRepeatDatasetV2"}
# the stateful ops a pipeline may hold and still be put back at an epoch without reading the epochs
# before it: the shuffles (their per-epoch seed is drawn when an iterator is made) and the sources
# that read tensors or files (their state is what they read); and the graph's return values. Any
# other stateful op (a stateful random op or a variable in a map, a py_function, a generator,
# tf.data's RandomDataset) may change with every element read: those epochs are drawn.
_SEED_ONLY_STATEFUL = _SHUFFLE_OPS | {
    "TensorSliceDataset", "TensorDataset", "RangeDataset", "SparseTensorSliceDataset", "TFRecordDataset",
    "TFRecordDatasetV2", "FixedLengthRecordDataset", "FixedLengthRecordDatasetV2", "TextLineDataset",
    "_Retval", "_Arg"}
_CACHE_OPS = {"CacheDataset", "CacheDatasetV2"}  # allowed in memory (an empty file name) only
REPORT_EVERY = 2.0  # seconds between the reports of a replay that draws


@dataclass
class FitInput:
    """What ``fit`` was called with, as far as resuming needs it."""

    epoch_iterator: Any  # keras' EpochIterator of this fit call
    x: Any
    shuffle: Any
    steps_per_epoch: Optional[int]
    epochs: int
    callbacks: Any = None  # fit's CallbackList
    initial_epoch: int = 0  # fit's own argument


def fit_frame() -> FitInput:
    """The ``fit`` call this callback runs in (Keras 3's TensorFlow trainer)."""
    frame = sys._getframe(1)
    while frame is not None:
        names = frame.f_locals
        if frame.f_code.co_name == "fit" and "epoch_iterator" in names:
            return FitInput(names["epoch_iterator"], names.get("x"), names.get("shuffle", True),
                            names.get("steps_per_epoch"), int(names.get("epochs", 1)), names.get("callbacks"),
                            int(names.get("initial_epoch") or 0))
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
    """Create every variable a checkpoint of ``fit`` holds before it is restored: the layers' (a
    subclassed model's ``build(shape)`` creates none), the compiled metrics' and loss trackers' (Keras creates them when the train step is first traced, which on
    a resume comes after batches were skipped and after the restore) and the optimizer's slots.
    Built from the input's element spec: no batch is drawn."""
    compiled = [getattr(model, name, None) for name in ("_compile_metrics", "_compile_loss")]
    # a subclassed model built by ``model.build(shape)`` is "built" with no variable of its layers
    # (Keras creates them when fit first traces the step): build its layers too, as fit's own
    # symbolic build does, or the optimizer below would be built for no variable
    layers = getattr(model, "_flatten_layers", None)
    unbuilt = layers is not None and not all(layer.built for layer in layers())
    if unbuilt or any(c is not None and not c.built for c in compiled):
        spec = inp.epoch_iterator._distributed_dataset.element_spec
        try:
            model._symbolic_build(data_batch=spec)
        except Exception as exc:
            raise UsageError(f"procsv.keras.BackupAndRestore could not build the model's compiled metrics before "
                             f"fit() ({type(exc).__name__}: {exc}); build the model first (call it on a batch)")
    if not model.optimizer.built:
        model.optimizer.build(model.trainable_variables)


def _graph(dataset: Any) -> Any:
    """The GraphDef of a ``tf.data`` pipeline (its functions in ``library``), or None if TF cannot
    serialize it."""
    from tensorflow.core.framework import graph_pb2

    graph = graph_pb2.GraphDef()
    try:
        graph.ParseFromString(dataset._as_serialized_graph().numpy())
    except Exception:  # a dataset TF cannot serialize (a py_function): nothing to say about it
        return None
    return graph


def _unseeded_shuffles(dataset: Any) -> int:
    """How many shuffle stages of ``dataset`` draw their seed at random (seed and seed2 both 0)."""
    graph = _graph(dataset)
    if graph is None:
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


def draw_reason(inp: FitInput) -> Optional[str]:
    """Why the epochs before a resumed one must be drawn batch by batch; None if making each
    epoch's iterator, as ``fit`` does, puts the input where it was (a ``tf.data`` pipeline whose
    only state across epochs is its shuffles' seeds, a new iterator every epoch, one batch a step)."""
    import tensorflow as tf
    from tensorflow.python.framework import op_def_registry

    it = inp.epoch_iterator
    dataset = getattr(it, "_distributed_dataset", None)
    if not isinstance(dataset, tf.data.Dataset):
        return "the input is not a tf.data pipeline Keras iterates as it is"
    if it.steps_per_epoch is not None:
        return "steps_per_epoch is set: an epoch goes on reading where the one before stopped"
    if int(getattr(it, "steps_per_execution", 1) or 1) != 1:
        return "steps_per_execution > 1"
    if not it.data_adapter.num_batches:  # an epoch ends when a read fails, which only reading finds
        return ("the pipeline's number of batches is unknown (declare it with "
                "dataset.apply(tf.data.experimental.assert_cardinality(N)))")
    graph = _graph(dataset)
    if graph is None:
        return "TensorFlow cannot serialize the pipeline"
    strings = {n.name: list(n.attr["value"].tensor.string_val) for n in graph.node if n.op == "Const"}
    nodes = list(graph.node) + [n for f in graph.library.function for n in f.node_def]
    for node in nodes:
        if node.op in _SEED_ONLY_STATEFUL:
            continue
        if node.op in _CACHE_OPS and len(node.input) >= 2 and strings.get(node.input[1]) == [b""]:
            continue  # cache() in memory: filled by whichever epoch first reads to the end, with the same elements
        op = op_def_registry.get(node.op)
        if op is None or op.is_stateful:
            return f"the pipeline holds the stateful op {node.op}"
    return None


@dataclass
class Replay:
    """What :func:`replay_epochs` did: the batches it drew, the seconds it took, and why it drew
    them (None: it drew none)."""

    drawn: int
    secs: float
    draw_reason: Optional[str]


def replay_epochs(inp: FitInput, epochs: int, report: Optional[Callable[[], None]] = None,
                  report_every: float = REPORT_EVERY, clock: Callable[[], float] = time.monotonic) -> Replay:
    """Put the input where it was after ``epochs`` whole epochs, training on none of it. Keras' own
    epoch loop is used, so its per-epoch hooks (a PyDataset's ``on_epoch_end``, a new iterator per
    epoch, a dataset size learnt at the first epoch's end) happen exactly as in the uninterrupted
    run; each epoch's batches are drawn unless :func:`draw_reason` says none need be. While it
    draws, ``report()`` is called every ``report_every`` seconds (the trainer tells the watchdog it
    is still at it: reading many epochs again may take longer than any start-up allowance), the
    first time right after the first batch drawn. ``clock``: the monotonic clock it times with."""
    t0 = clock()
    next_report = t0  # the first batch drawn is reported at once, then every report_every seconds
    drawn = 0
    it = inp.epoch_iterator
    reason = draw_reason(inp) if epochs else None
    for _ in range(epochs):
        with it.catch_stop_iteration():
            for begin, end, iterator in it:
                if reason is not None:
                    for _ in range(end - begin + 1):
                        next(iterator)
                        drawn += 1
                    if report is not None and clock() >= next_report:
                        report()
                        next_report = clock() + report_every
    return Replay(drawn, clock() - t0, reason)
