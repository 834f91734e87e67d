"""procsv's graph sessions as ``tf.compat.v1`` sessions to TensorFlow's own code.

Runs in the trainer process (graph mode, where TensorFlow is imported already). TensorFlow checks a
session's type where a TF1 program hands one over: ``Saver.save(sess, path)``, TF's own
``CheckpointSaverHook`` (which calls it), ``tf.compat.v1.train.start_queue_runners(sess)`` all refuse
what is not a ``tensorflow.python.client.session.SessionInterface``. procsv's session classes stay
free of a TensorFlow import (importing procsv imports no TensorFlow); :func:`as_tf_session` makes,
once per class, the subclass that is also TF's ``SessionInterface``, and the sessions procsv hands out
in graph mode are of that subclass. The class's own methods come first: ``SessionInterface`` only adds
its type (its methods raise ``NotImplementedError``, so each class defines ``graph``, ``sess_str``,
``run``, ``partial_run_setup`` and ``partial_run`` itself).
"""

from __future__ import annotations

from typing import Any, TypeVar

T = TypeVar("T")

_MADE: dict[type, type] = {}


def as_tf_session(cls: type[T]) -> type[T]:
    """``cls`` with ``SessionInterface`` among its bases (the same subclass on every call)."""
    made = _MADE.get(cls)
    if made is None:
        from tensorflow.python.client.session import SessionInterface

        made = type(cls.__name__, (cls, SessionInterface), {"__module__": cls.__module__,
                                                             "__doc__": cls.__doc__})
        _MADE[cls] = made
    return made


def make(cls: type[T], *args: Any, **kwargs: Any) -> T:
    """An instance of ``as_tf_session(cls)``."""
    return as_tf_session(cls)(*args, **kwargs)


__all__ = ["as_tf_session", "make"]
