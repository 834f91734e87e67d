"""``Supervisor.warm_up``: the functions a trainer traces and instantiates before its restore.

Runs in the trainer, in ``prepare_or_wait_for_session`` before the restore (and so, in a hot
standby, before it waits to be promoted). A ``tf.function``'s first step pays three costs on top
of the step: tracing (Python runs the function body into a graph, ``get_concrete_function``),
instantiating (TF's runtime optimizes, places and partitions that graph once), and creating the
executor and its kernels (at the first run). For the digits step here they were about 150, 70 and
45 ms. The first can be had without running anything; so can the second (:func:`instantiate`);
the third only by running the step. Running it on the program's variables would change them, so a
hot standby, which has idle time before its promotion, runs it once on shadow copies of them
(:func:`run_on_shadows`, where the step keeps no state of its own); any other trainer leaves the
third to its first step.

How :func:`instantiate` gets the second without running the function: it calls the traced function
under a ``CancellationManager`` that is already cancelled. TF instantiates the function (the
kernel of the call is made before it runs), then its function runtime refuses to start a
cancelled call ("Function was cancelled before it was started", in
``FunctionLibraryRuntimeImpl::Run``) before any op of the body runs. A call that returns instead
would have run the step: that is an error here, raised before anything is restored or trained
(tests/test_warm_up.py pins the behaviour of the TensorFlow installed).

In a group (``--nproc`` > 1) the Supervisor only traces: a group's step runs collectives with the
other trainers, and a cancelled call of such a function has not been tried. A standby group's
members (:mod:`procsv.watchdog.rules.standby`) also run the step once on shadows, all at the same
time, so its collectives run among them: a collective keeps no state of the program's, and a
captured variable handle the step does not list among its variables (the collectives' ordering
token) is shadowed too. The members must all run it or all skip it: one that does not reach the
step's collective (its warm-up batch fails the step's own check, a memory refusal read at another
moment, a program whose step differs by task) leaves the others waiting in that collective for good.
The memory rule reads one figure for the whole group (``PROCSV_SHADOW_MEMORY``: the memory available
when the watchdog forked the group), so that members of the same step refuse or run alike.
So a member whose run does not complete, whatever the reason, never says ready: it exits with
:data:`~procsv.common.exitcodes.EXIT_NO_SHADOW_RUN`, the watchdog kills the rest of the group and
prepares another with ``PROCSV_SHADOW_RUN=0`` in every member's environment (and so every later
group of the run): its members skip the run alike and their first step makes the kernels
(:func:`procsv.watchdog.rules.standby.gone`). No timeout ever ends a member's wait in a shadow
collective: the collectives' instance keys are fixed at trace time, so a pending shadow all-reduce
could pair with a peer's first real step and change the weights silently.
"""

from __future__ import annotations

import weakref
from typing import Any, Callable

from procsv.common.bootstrap import ChildConfig
from procsv.common.errors import UnsupportedState
from procsv.common.exitcodes import EXIT_NO_SHADOW_RUN


class WarmUps:
    """The functions a Supervisor was asked to warm up (``Supervisor.warm_up``), until they are: owns
    the list, each entry traced once (a later session after a stop finds the trace in place)."""

    def __init__(self) -> None:
        self._pending: list[tuple[Any, tuple[Any, ...], dict[str, Any]]] = []

    def warm_up(self, fn: Any, *args: Any, **kwargs: Any) -> None:
        """Trace ``fn`` (a ``tf.function``, e.g. the train step) for these example arguments when the
        session is prepared, before the restore, and have TensorFlow instantiate the traced function
        (optimize and place its graph); in a hot standby before it waits, so that a promoted
        standby's first step pays neither. Nothing runs: no variable changes, no summary (this
        module's docstring says how). In a group (``--nproc`` > 1) it is only traced (a standby group's
        member also runs it on shadows). Give arguments of the loop's shapes and dtypes (numpy arrays
        or tensors; another shape is traced again at its first call, as always)."""
        if not callable(getattr(fn, "get_concrete_function", None)):
            raise TypeError(f"Supervisor.warm_up takes a tf.function, not {type(fn).__name__}")
        self._pending.append((fn, args, kwargs))

    def run(self, alone: bool, standby: bool, config: ChildConfig = ChildConfig()) -> None:
        """Trace (and, ``alone``: not in a group, instantiate) every pending function; in a hot
        ``standby`` also run each once on shadows of its variables (idle time: make its kernels too),
        unless a standby group's members were told to skip that (``config.shadow_run``: the watchdog's
        ``PROCSV_SHADOW_RUN=0``; ``config.shadow_memory``: the group's one memory figure). A standby
        group's member whose run does not complete exits with ``EXIT_NO_SHADOW_RUN`` (the module's
        docstring says why)."""
        shadows = standby and (alone or config.shadow_run)
        if standby and not shadows:
            print("procsv: standby group member: this run's standby groups skip the step's run on shadows (a member "
                  "of an earlier one could not run it): its first step makes its kernels", flush=True)
        for fn, args, kwargs in self._pending:
            trace_and_instantiate(fn, args, kwargs, instantiate_too=alone)
            if shadows:  # (a standby group: every member runs it, its collectives among them)
                if standby_run(fn, args, kwargs, frozenset() if alone else COLLECTIVES,
                               config.shadow_memory) and not alone:
                    raise SystemExit(EXIT_NO_SHADOW_RUN)
        self._pending = []


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


# ------------------------------------------------------------------------------ shadow run
# Stateful ops whose only state is in their resource inputs: with every captured resource a shadow
# variable, running them changes nothing of the program's. Any other stateful op (a kernel that keeps
# its own random state, a print, a Python callback, a summary write, a collective) refuses the run.
_SAFE_STATEFUL = frozenset({
    "ReadVariableOp", "AssignVariableOp", "AssignAddVariableOp", "AssignSubVariableOp", "VarIsInitializedOp",
    "VariableShape", "StatefulPartitionedCall", "Assert",
    "RngReadAndSkip", "RngSkip", "StatefulUniform", "StatefulUniformInt", "StatefulUniformFullInt",
    "StatefulStandardNormalV2", "StatefulTruncatedNormal", "StatefulRandomBinomial",
})
# a standby group's collectives: every member runs the step on shadows at the same time (the module's docstring)
COLLECTIVES = frozenset({"CollectiveReduceV2", "CollectiveReduceV3", "CollectiveGatherV2", "CollectiveBcastSendV2",
                         "CollectiveBcastRecvV2", "CollectiveAllToAllV2", "CollectiveAllToAllV3",
                         "CollectiveReduceScatterV2", "CollectiveInitializeCommunicator", "CollectiveAssignGroupV2"})
_SAFE_PREFIXES = ("Resource",)  # ResourceApplyAdam, ResourceScatterAdd, ResourceGather...: on their resource input
_ITERATOR_OPS = frozenset({"IteratorGetNext", "IteratorGetNextSync", "IteratorGetNextAsOptional"})
_DISPOSABLE: "weakref.WeakSet[Any]" = weakref.WeakSet()  # iterators procsv made for a warm-up: theirs to spend
MEMORY_SHARE = 0.25  # shadows may take at most this share of the memory available


class _Refused(Exception):
    """Raised inside the intercepted call, before anything runs."""


def disposable(iterator: Any) -> Any:
    """Mark an iterator procsv made for a warm-up (a stand-in, never the program's): a shadow run may
    read from it. Returns it."""
    _DISPOSABLE.add(iterator)
    return iterator


def unsafe_ops(graph_def: Any, also_safe: frozenset[str] = frozenset()) -> list[str]:
    """The stateful op types in ``graph_def`` (and the functions of its library) that keep state or
    have effects outside their resource inputs (``also_safe`` aside), sorted."""
    from tensorflow.python.framework import op_def_registry

    found: set[str] = set()
    nodes = list(graph_def.node)
    for fdef in graph_def.library.function:
        nodes += list(fdef.node_def)
    for node in nodes:
        op_def = op_def_registry.get(node.op)
        if op_def is None or (op_def.is_stateful and node.op not in _SAFE_STATEFUL and node.op not in also_safe
                              and not node.op.startswith(_SAFE_PREFIXES)):
            found.add(node.op)
    return sorted(found)


def run_on_shadows(fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
                   available: Callable[[], int], collectives: frozenset[str] = frozenset()) -> str:
    """Run the traced ``fn`` once on shadow copies of the variables it captures, so that its
    executor and kernels exist before the first real step (which then costs what any step costs:
    measured for the digits step, 30 ms at a promoted standby's first step, 1.5 ms after this).
    The program's own variables are not touched; its arguments are the ones given to ``warm_up``.

    Returns "" when it ran, else why not (nothing ran): a stateful op outside :data:`_SAFE_STATEFUL`
    (its kernel's state or effect would differ from a process that did not run it), a captured
    resource that is not a variable (an iterator, a table, a summary writer: no shadow is made of
    those), an argument that is a resource (an iterator would lose a batch) unless it is an
    iterator procsv made for the warm-up (:func:`disposable`: then reading from it is allowed too),
    shadows larger than :data:`MEMORY_SHARE` of ``available()`` bytes, or a TensorFlow without the
    hook used. ``collectives`` (a standby group's member): these collective ops are allowed, and a
    captured handle of a variable the step does not list (their ordering token) is shadowed too. A
    step that fails on the shadows is reported and not raised: the first real step
    runs it for real. It costs the standby one step (and the copies) before it is ready. A call
    that ran without passing through the hook (a TensorFlow that calls the function some other
    way: then it ran on the real variables) is an :class:`UnsupportedState` error, never silent.
    """
    import tensorflow as tf

    concrete = fn.get_concrete_function(*args, **kwargs)  # traced already: found in the cache
    # the components of the stand-in iterators procsv made (disposable): the only resources an argument may hold
    owned = {id(t) for a in tf.nest.flatten((args, kwargs)) if _is_disposable(a)
             for t in tf.nest.flatten(a, expand_composites=True)}
    unsafe = unsafe_ops(concrete.graph.as_graph_def(), (_ITERATOR_OPS if owned else frozenset()) | collectives)
    if unsafe:
        return f"it has op(s) with state or effects of their own: {', '.join(unsafe[:5])}"
    by_handle = {id(v.handle): v for v in concrete.variables}
    shadowed = [by_handle[id(t)] if id(t) in by_handle else _as_variable(t) if collectives else None
                for t in concrete.captured_inputs]
    if any(v is None and t.dtype == tf.resource for v, t in zip(shadowed, concrete.captured_inputs)):
        return "it captures a resource that is not a variable"
    size = sum(v.shape.num_elements() * v.dtype.size for v in shadowed if v is not None and v.shape.is_fully_defined())
    if any(v is not None and not v.shape.is_fully_defined() for v in shadowed):
        return "a variable it captures has no fixed shape"
    if size > MEMORY_SHARE * available():
        return f"its variables ({size >> 20} MiB) would not fit twice in the memory available"
    real_call = getattr(concrete, "_call_flat", None)
    if real_call is None:
        return "this TensorFlow has no ConcreteFunction._call_flat"
    shadows = []
    for v, t in zip(shadowed, concrete.captured_inputs):
        if v is None:
            shadows.append(t)  # a captured constant: read only
            continue
        with tf.device(v.device):
            shadows.append(tf.Variable(v.read_value(), shape=v.shape, trainable=False))

    entered: list[bool] = []

    def call_on_shadows(tensor_inputs: Any, captured_inputs: Any) -> Any:
        entered.append(True)
        if any(getattr(x, "dtype", None) in (tf.resource, tf.variant) and id(x) not in owned for x in tensor_inputs):
            raise _Refused("an argument is a resource or a dataset (an iterator would lose a batch)")
        if len(captured_inputs) != len(shadows):
            raise _Refused("its captures changed while it was called")
        return real_call(tensor_inputs, [s.handle if isinstance(s, tf.Variable) else s for s in shadows])

    concrete._call_flat = call_on_shadows  # this call only: the instance attribute hides the method
    try:
        concrete(*args, **kwargs)
    except _Refused as exc:
        return str(exc)
    except tf.errors.OpError as exc:
        return f"it failed on the shadow copies ({type(exc).__name__}: {str(exc).splitlines()[0]})"
    finally:
        del concrete._call_flat
    if not entered:  # the call went around _call_flat: it ran on the program's own variables
        raise UnsupportedState(
            f"this TensorFlow release ran {getattr(fn, '__name__', 'a function')!r} without going through "
            "ConcreteFunction._call_flat, so a hot standby's run on shadow copies changed the program's own variables "
            "before the restore. Run with --standby fork, or report this with `pip show tensorflow`")
    return ""


def _as_variable(handle: Any) -> Any:
    """A captured variable handle the traced step does not list among its variables, as a variable to
    shadow (a collective's ordering token), or None (not a variable's handle)."""
    import tensorflow as tf
    from tensorflow.python.ops import gen_resource_variable_ops, resource_variable_ops

    if handle.dtype != tf.resource:
        return None
    try:
        kinds = resource_variable_ops.get_eager_safe_handle_data(handle).shape_and_type
        if len(kinds) != 1:
            return None
        value = gen_resource_variable_ops.read_variable_op(handle, tf.dtypes.as_dtype(kinds[0].dtype))
    except (AttributeError, TypeError, ValueError, tf.errors.OpError):
        return None
    return _Held(handle, value)


class _Held:
    """A variable known only by its handle: what :func:`run_on_shadows` reads of a variable."""

    def __init__(self, handle: Any, value: Any) -> None:
        self.handle, self.value = handle, value
        self.shape, self.dtype, self.device = value.shape, value.dtype, handle.device

    def read_value(self) -> Any:
        return self.value


def _is_disposable(obj: Any) -> bool:
    try:
        return obj in _DISPOSABLE
    except TypeError:  # not weakly referable: not one procsv marked
        return False


def standby_run(fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
                collectives: frozenset[str] = frozenset(), shadow_memory: str = "") -> str:
    """A hot standby's :func:`run_on_shadows` of a warmed-up step, said in its log; returns its answer.
    ``shadow_memory``: a standby group's one figure of the memory available (bytes; empty: none, read now)."""
    import psutil

    name = getattr(fn, "__name__", "the step")
    read = shadow_memory  # a standby group's: one figure for every member (alike)
    available = (lambda: int(read)) if read.isdigit() else (lambda: int(psutil.virtual_memory().available))
    why = run_on_shadows(fn, args, kwargs, available, collectives)
    if why and collectives:
        print(f"procsv: standby group member did not run {name} on shadows ({why}): exiting with code "
              f"{EXIT_NO_SHADOW_RUN}, since its peers may wait in the step's collective for good; the watchdog "
              "replaces the standby group, and the run's next ones skip the shadow run", flush=True)
    elif why:
        print(f"procsv: standby did not run {name} before its promotion ({why}): its first step makes its kernels",
              flush=True)
    else:
        print(f"procsv: standby ran {name} once on shadow copies of its variables (its kernels are made; the "
              "program's variables are untouched)", flush=True)
    return why
