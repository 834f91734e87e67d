"""``Supervisor.warm_up``: the functions a trainer traces and instantiates before its restore.

Runs in the trainer, in ``prepare_or_wait_for_session`` before the restore (and so, in a hot
standby, before it waits to be promoted). A ``tf.function``'s first step pays three costs on top
of the step: tracing (Python runs the function body into a graph, ``get_concrete_function``),
instantiating (TF's runtime optimizes, places and partitions that graph once), and creating the
executor and its kernels (at the first run). For the digits step here they were about 150, 70 and
45 ms. The first can be had without running anything; so can the second (:func:`instantiate`);
the third only by running the step, which would change the program's variables, and is left to
the first step.

How :func:`instantiate` gets the second without running the function: it calls the traced function
under a ``CancellationManager`` that is already cancelled. TF instantiates the function (the
kernel of the call is made before it runs), then its function runtime refuses to start a
cancelled call ("Function was cancelled before it was started", in
``FunctionLibraryRuntimeImpl::Run``) before any op of the body runs. A call that returns instead
would have run the step: that is an error here, raised before anything is restored or trained
(tests/test_warm_up.py pins the behaviour of the TensorFlow installed).

In a group (``--nproc`` > 1) the Supervisor only traces: a group's step runs collectives with the
other trainers, and a cancelled call of such a function has not been tried.
"""

from __future__ import annotations

from typing import Any

from procsv.common.errors import UnsupportedState


def trace_and_instantiate(fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any], instantiate_too: bool) -> bool:
    """Trace ``fn`` for these arguments and, if ``instantiate_too``, instantiate what was traced.
    Returns whether it was instantiated."""
    concrete = fn.get_concrete_function(*args, **kwargs)
    return instantiate(concrete, args, kwargs) if instantiate_too else False


def instantiate(concrete: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Have TensorFlow instantiate ``concrete`` (a traced function) without running it. Returns
    False where this TensorFlow offers no way (the private module moved, or the call's arguments
    are refused in Python, before TensorFlow sees the call): the first step then pays the
    instantiation, as it would without this. Any other error propagates: one from TensorFlow's
    runtime is the error the first step would raise (an instantiation that fails), or a sign that
    something ran, which must not pass silently."""
    import tensorflow as tf

    try:
        from tensorflow.python.eager import cancellation
        manager = cancellation.CancellationManager()
        manager.start_cancel()
        scope = cancellation.CancellationManagerContext(manager)
    except (ImportError, AttributeError):
        return False
    try:
        with scope:
            concrete(*args, **kwargs)
    except tf.errors.CancelledError:
        return True  # instantiated, and refused before its first op
    except (TypeError, ValueError):  # the arguments did not bind: the call never reached TensorFlow
        return False
    raise UnsupportedState(
        f"this TensorFlow release ran {getattr(concrete, 'name', 'a function')!r} although its call was cancelled "
        "(procsv instantiates the functions given to Supervisor.warm_up with a cancelled call); the step it ran "
        "changed the model before the restore. Remove the warm_up call, or report this with `pip show tensorflow`")
