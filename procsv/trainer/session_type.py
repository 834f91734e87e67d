"""procsv's graph sessions as ``tf.compat.v1.Session`` objects to TensorFlow's own code and to programs.

Runs in the trainer process (graph mode, where TensorFlow is imported already). A TF1 program and
TensorFlow's own code check a session's type: ``Saver.save(sess, path)``, TF's own
``CheckpointSaverHook`` and ``tf.compat.v1.train.start_queue_runners(sess)`` refuse what is not a
``SessionInterface``; a program (and TF's own ``SingularMonitoredSession`` test) may ask
``isinstance(sess, tf.compat.v1.Session)``. Handing out the real ``Session`` would hide the runs made
through it from procsv's step boundary (progress to the watchdog, timed and step checkpoints), so
the sessions procsv hands out in graph mode (``managed_session()``'s, ``raw_session()``,
``step_context.session``, what hooks get) are proxies whose class is a ``Session`` subclass:

* :func:`as_tf_session` makes, once per class, the subclass of ``cls`` and ``Session``. ``cls``'s
  own methods come first, and ``cls`` must define every name of :data:`OWN` (the whole public
  surface of TF's ``BaseSession``/``Session``): they forward to the session procsv watches.
* ``Session.__init__`` is never called (``cls.__init__`` comes first and does not call it): no second
  TensorFlow session exists, and the instance has none of ``BaseSession``'s handles.
* :data:`SAFE` names keep TF's own definition because it touches no handle: ``as_default`` makes the
  proxy itself the default session (``tensor.eval()``, ``op.run()`` inside it are runs of the proxy),
  ``reset`` is a static method of the process. ``__del__`` is replaced by one that does nothing: the
  proxy owns no session, so its collection never closes the watched one (whose owner closes it once).
* every other (private) method of ``BaseSession``/``Session`` (:func:`private_methods`) forwards to
  the same method of the object named by ``inner`` (its handles are there): TF internals that some
  libraries call (``_make_callable_from_options``), runs unseen by the step boundary.

Importing procsv still imports no TensorFlow: the subclass is made on first use. A TensorFlow
upgrade that adds a method to ``BaseSession``/``Session`` is caught by the test that enumerates them
(tests/test_graph_tf_sessions.py), not silently inherited.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, TypeVar

T = TypeVar("T")

# the public surface of TF 2.21's BaseSession/Session that each proxy class defines itself
OWN = frozenset({"run", "partial_run", "partial_run_setup", "make_callable", "graph", "graph_def", "sess_str",
                 "list_devices", "close", "__enter__", "__exit__", "__init__"})
# TF's own definition kept (it uses the proxy's public methods only, or no instance at all); __del__ replaced
SAFE = frozenset({"as_default", "reset", "__del__"})
# class bookkeeping that is no behaviour
_PLUMBING = frozenset({"__module__", "__doc__", "__dict__", "__weakref__", "__annotations__", "__qualname__",
                       "__firstlineno__", "__static_attributes__"})

_MADE: dict[type, type] = {}


def session_bases() -> tuple[type, ...]:
    """TF's ``SessionInterface``, ``BaseSession``, ``Session`` (whose names the proxies account for)."""
    from tensorflow.python.client import session

    return (session.SessionInterface, session.BaseSession, session.Session)


def tf_names() -> set[str]:
    """Every name the classes of :func:`session_bases` define themselves (plumbing left out)."""
    names: set[str] = set()
    for base in session_bases():
        names.update(name for name in vars(base) if name not in _PLUMBING)
    return names


def private_methods() -> set[str]:
    """TF's private session methods (functions, not dunders): forwarded to the proxy's inner session."""
    return {name for base in session_bases() for name, value in vars(base).items()
            if inspect.isfunction(value) and name.startswith("_") and not name.startswith("__")
            and name not in OWN | SAFE}


def constants() -> set[str]:
    """TF's session class attributes that are no methods (``_DEAD_HANDLES_THRESHOLD``, the ``_Callable``
    class, API names): read off the class, the same for the proxy."""
    return {name for base in session_bases() for name, value in vars(base).items()
            if name not in _PLUMBING and not callable_member(value)} - OWN - SAFE


def callable_member(value: Any) -> bool:
    """A method or property of a class body (what would act on an instance)."""
    return inspect.isfunction(value) or isinstance(value, (property, staticmethod, classmethod))


def unaccounted() -> set[str]:
    """Names of TF's session classes that no rule of this module covers (empty for TF 2.21): a
    TensorFlow upgrade that adds a public method shows here, and its test fails."""
    return tf_names() - OWN - SAFE - private_methods() - constants()


def _forward(inner: str, name: str) -> Callable[..., Any]:
    def forwarded(self: Any, *args: Any, **kwargs: Any) -> Any:
        return getattr(getattr(self, inner), name)(*args, **kwargs)

    forwarded.__name__ = name
    forwarded.__doc__ = f"TF's private ``{name}``, on the inner session (``{inner}``)."
    return forwarded


def _owns_nothing(self: Any) -> None:
    """The proxy holds no TensorFlow session: nothing to close or delete when it is collected."""


def as_tf_session(cls: type[T], inner: str) -> type[T]:
    """``cls`` as a ``tf.compat.v1.Session`` subclass whose private TF methods run on ``getattr(self,
    inner)`` (the same subclass on every call; see the module docstring)."""
    made = _MADE.get(cls)
    if made is None:
        from tensorflow.python.client.session import Session

        missing = sorted(name for name in OWN if name not in vars(cls))
        if missing:
            raise TypeError(f"{cls.__name__} must define {missing} to stand for a tf.compat.v1.Session")
        body: dict[str, Any] = {"__module__": cls.__module__, "__doc__": cls.__doc__, "__del__": _owns_nothing}
        for name in private_methods():
            body[name] = _forward(inner, name)
        made = type(cls.__name__, (cls, Session), body)
        _MADE[cls] = made
    return made


def enter(sess: Any) -> Any:
    """A proxy's ``__enter__``, as TF's ``Session.__enter__``: its graph becomes the default graph and
    the proxy the default session (``tensor.eval()`` and ``op.run()`` inside run through it), until
    :func:`leave`; not re-entrant (TF's ``RuntimeError``)."""
    if vars(sess).get("_entered") is not None:  # (vars: a proxy's __getattr__ would read its inner session's)
        raise RuntimeError("Session context managers are not re-entrant. Use `Session.as_default()` if you want "
                           "to enter a session multiple times.")
    graph, default = sess.graph.as_default(), sess.as_default()
    sess._entered = (graph, default)
    graph.__enter__()
    return default.__enter__()


def leave(sess: Any, exc_type: Any, exc: Any, tb: Any) -> None:
    """A proxy's ``__exit__``, as TF's ``Session.__exit__``: the defaults :func:`enter` set are undone,
    then the session is closed."""
    entered = vars(sess).pop("_entered", None)
    if entered is not None:
        graph, default = entered
        default.__exit__(exc_type, exc, tb)
        graph.__exit__(exc_type, exc, tb)
    sess.close()


def make(cls: type[T], inner: str, *args: Any, **kwargs: Any) -> T:
    """An instance of ``as_tf_session(cls, inner)``."""
    return as_tf_session(cls, inner)(*args, **kwargs)


__all__ = ["OWN", "SAFE", "as_tf_session", "constants", "enter", "leave", "make", "private_methods", "session_bases", "tf_names",
           "unaccounted"]
