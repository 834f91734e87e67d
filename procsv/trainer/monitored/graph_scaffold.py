"""``Scaffold``'s graph-mode pieces: TensorFlow's defaults for a TF1 graph program.

Runs in the trainer process, in its main thread (``Scaffold.finalize()``, called by a
MonitoredSession before its session is created). In graph mode a :class:`procsv.train.Scaffold`
holds TF's fields (``init_op``, ``ready_op``, ``ready_for_local_init_op``, ``local_init_op``,
``summary_op``, ``saver``, ``init_feed_dict``, ``local_init_feed_dict``, ``init_fn``); the ones
not given are made here as TF makes them: picked from the graph's collection (``INIT_OP``,
``READY_OP``, ``SUMMARY_OP``, ``SAVERS``, ...) or created and added to it
(:func:`get_or_default`). :func:`fill_defaults` makes them; :func:`finalize_graph` then freezes
the graph, as TF's ``Scaffold.finalize()`` does (the session creator builds the Supervisor in
between, which adds its own few ops).
"""

from __future__ import annotations

import logging
from typing import Any, Callable

logger = logging.getLogger("procsv.train")


def get_or_default(arg_name: str, collection_key: str, default_constructor: Callable[[], Any]) -> Any:
    """The one item of the default graph's collection ``collection_key``, or a new one from
    ``default_constructor`` (added to the collection); ``RuntimeError`` if it holds several, as TF."""
    import tensorflow as tf

    elements = tf.compat.v1.get_collection(collection_key)
    if elements:
        if len(elements) > 1:
            raise RuntimeError(f'More than one item in the collection "{collection_key}". Please indicate which one '
                               f"to use by passing it to the tf.Scaffold constructor as: "
                               f"tf.Scaffold({arg_name}=item to use)")
        return elements[0]
    op = default_constructor()
    if op is not None:
        tf.compat.v1.add_to_collection(collection_key, op)
    return op


def default_local_init_op() -> Any:
    """TF's default ``local_init_op``: local variables, tables and local resources."""
    import tensorflow as tf
    from tensorflow.python.ops import resources

    return tf.group(tf.compat.v1.local_variables_initializer(), tf.compat.v1.tables_initializer(),
                    resources.initialize_resources(resources.local_resources()))


def _default_init_op() -> Any:
    import tensorflow as tf
    from tensorflow.python.ops import resources

    return tf.group(tf.compat.v1.global_variables_initializer(),
                    resources.initialize_resources(resources.shared_resources()),
                    tf.compat.v1.get_collection("saved_model_initializers"))


def _default_ready_op() -> Any:
    import tensorflow as tf
    from tensorflow.python.ops import resources

    return tf.concat([tf.compat.v1.report_uninitialized_variables(), resources.report_uninitialized_resources()], 0)


def _default_ready_for_local_init_op() -> Any:
    import tensorflow as tf
    from tensorflow.python.ops import resources

    return tf.concat([tf.compat.v1.report_uninitialized_variables(tf.compat.v1.global_variables()),
                      resources.report_uninitialized_resources(resources.shared_resources())], 0)


def _default_saver() -> Any:
    from tensorflow.python.training import saver as training_saver

    return training_saver._get_saver_or_default()


def fill_defaults(scaffold: Any) -> None:
    """Give ``scaffold`` TF's default for every piece it was not given (see the module docstring)."""
    import tensorflow as tf

    keys = tf.compat.v1.GraphKeys
    if scaffold.init_op is None:
        scaffold.init_op = get_or_default("init_op", keys.INIT_OP, _default_init_op)
    if scaffold.ready_op is None:
        scaffold.ready_op = get_or_default("ready_op", keys.READY_OP, _default_ready_op)
    if scaffold.ready_for_local_init_op is None:
        scaffold.ready_for_local_init_op = get_or_default("ready_for_local_init_op", keys.READY_FOR_LOCAL_INIT_OP,
                                                          _default_ready_for_local_init_op)
    if scaffold.local_init_op is None:
        scaffold.local_init_op = get_or_default("local_init_op", keys.LOCAL_INIT_OP, default_local_init_op)
    if scaffold.summary_op is None:
        scaffold.summary_op = get_or_default("summary_op", keys.SUMMARY_OP, tf.compat.v1.summary.merge_all)
    if scaffold.saver is None:
        scaffold.saver = _default_saver()
    if isinstance(scaffold.saver, tf.train.Checkpoint):  # as TF: its objects' variables, by their keys
        from tensorflow.python.checkpoint import graph_view

        scaffold.saver = tf.compat.v1.train.Saver(
            var_list=graph_view.ObjectGraphView(scaffold.saver).frozen_saveable_objects(), sharded=True)
    else:
        scaffold.saver.build()


def finalize_graph() -> None:
    """Freeze the default graph (no op may be added while the session runs), as TF."""
    import tensorflow as tf

    tf.compat.v1.get_default_graph().finalize()
    logger.info("Graph was finalized.")


__all__ = ["get_or_default", "default_local_init_op", "fill_defaults", "finalize_graph"]
