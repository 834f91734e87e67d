"""Turning a ``tf.train.Checkpoint`` into frames for the checkpoint service.

Runs in the trainer, at a step boundary. It gathers the same key -> tensor list and serialized
object graph that ``Checkpoint.write()`` would save, so that the service, which has no model,
writes a checkpoint that plain ``tf.train.Checkpoint.restore`` loads. The private TF route is
feature-detected once (:func:`self_test`) so that a TF release that moves it fails loudly at
start, not silently at the first save.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ipc.messages import TensorSpec
from procsv.errors import UnsupportedState

GRAPH_KEY = "_CHECKPOINTABLE_OBJECT_GRAPH"


def _serialize(ckpt: Any) -> tuple[list[Any], Any]:
    import tensorflow as tf

    view = tf.__internal__.tracking.ObjectGraphView(ckpt)
    named, graph_proto, _ = view.serialize_object_graph()
    return named, graph_proto


def self_test(ckpt: Any) -> None:
    """Raise UnsupportedState now if this TF release lacks the snapshot route procsv uses."""
    try:
        _serialize(ckpt)
    except (AttributeError, TypeError, ValueError) as exc:
        raise UnsupportedState(
            f"this TensorFlow release does not offer the checkpoint snapshot API procsv needs ({exc})"
        ) from None


def snapshot(ckpt: Any) -> tuple[list[TensorSpec], list[Any]]:
    """Return the tensor specs and one frame (host bytes) per tensor, object graph last."""
    named, graph_proto = _serialize(ckpt)
    specs: list[TensorSpec] = []
    frames: list[Any] = []
    for saveable in named:
        for spec in saveable.specs:
            if spec.slice_spec:
                raise UnsupportedState(f"{spec.name}: partitioned (sliced) variables are not supported")
            tensor = spec.tensor() if callable(spec.tensor) else spec.tensor
            _add(specs, frames, spec.name, tensor.numpy(), tensor.dtype.name)
    _add(specs, frames, GRAPH_KEY, np.array(graph_proto.SerializeToString(), dtype=object), "string")
    return specs, frames


def _add(specs: list[TensorSpec], frames: list[Any], key: str, arr: Any, dtype: str) -> None:
    arr = np.asarray(arr)
    if dtype == "string":
        items = [x if isinstance(x, bytes) else bytes(x) for x in arr.reshape(-1).tolist()]
        specs.append(TensorSpec(key, "string", list(arr.shape), [len(x) for x in items]))
        frames.append(b"".join(items))
        return
    if arr.dtype == object:
        raise UnsupportedState(f"{key}: tensors of dtype {dtype} cannot be checkpointed by procsv")
    specs.append(TensorSpec(key, dtype, list(arr.shape)))
    frames.append(np.ascontiguousarray(arr))
