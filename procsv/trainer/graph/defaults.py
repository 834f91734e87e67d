"""The graph-mode Supervisor's TF1 arguments with their TF1 meaning, and TF's defaults for them.

Runs in the trainer process, inside ``Supervisor.__init__`` when the program is a TF1 graph
program (:func:`is_graph_mode`: ``graph=`` is a ``tf.Graph``, or eager execution is disabled).
:func:`resolve_graph` builds, in the program's graph and as TF's ``Supervisor`` did, every piece
the program left at ``USE_DEFAULT``: ``global_step`` (the graph's; none if it has none: procsv adds nothing to it),
``saver`` (a ``tf.compat.v1.train.Saver`` over every saveable global variable, with
``max_to_keep`` and ``keep_checkpoint_every_n_hours``), ``init_op``
(``global_variables_initializer``), ``ready_op`` (``report_uninitialized_variables``),
``ready_for_local_init_op`` and ``local_init_op`` (the collections', else local variables and
tables), ``summary_op`` (``merge_all``) and the ``SessionManager``; ``None`` turns a piece off,
as in TF. It also builds what procsv needs of the graph (the reads of the global step after its
writers: :mod:`procsv.trainer.graph.steps`; the state adapters of
:mod:`procsv.trainer.graph.state`), then finalizes the graph, as TF's Supervisor did: nothing
grows it from then on.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Optional, Union

from procsv.common.errors import UsageError
from procsv.trainer.graph.session_manager import SessionManager
from procsv.trainer.graph.state import CountedStep, GraphCheckpoint, GraphGlobalStep
from procsv.trainer.graph.built import once_per_graph
from procsv.trainer.graph.steps import StepProbe, global_step_of
from procsv.trainer.once import warn_once
from procsv.trainer.tf1_args import NOT_PASSED, USE_DEFAULT, Tf1Choices, check_passed_writer


def is_graph_mode(graph: Any) -> bool:
    """A graph program: ``graph`` is a ``tf.Graph``, or TF runs graphs (``disable_eager_execution``)."""
    import tensorflow as tf

    return isinstance(graph, tf.Graph) or not tf.compat.v1.executing_eagerly_outside_functions()


@dataclasses.dataclass
class GraphSetup:
    """Everything the graph-mode Supervisor resolved: TF1's pieces and procsv's adapters."""

    graph: Any
    global_step: Any  # the graph's variable (None: it has none; procsv counts the runs in Python)
    probe: StepProbe
    saver: Any  # the tf.compat.v1.train.Saver whose variables are saved (None: checkpoints off)
    init_op: Any
    init_feed_dict: Any
    ready_op: Any
    ready_for_local_init_op: Any
    local_init_op: Any
    summary_op: Any
    summary_default: bool  # summary_op is TF's default (merge_all): turned off, said once, if it cannot run
    session_manager: SessionManager
    step: Any  # the global step as the rest of procsv reads it (numpy(), assign())
    checkpoint: Any = None  # what the checkpoint agent snapshots and restores (None: checkpoints off)
    session: Any = None  # the current GraphSession
    summary_off: Optional[str] = None  # why the default summary_op was turned off
    prepared: bool = False  # the session being prepared was initialized and found ready
    summary_written: bool = True  # False without a writer: summary_op stays sv.summary_op (TF) but never runs

    def raw_session(self) -> Any:
        """The live ``tf.compat.v1.Session`` (the state adapters read and assign through it)."""
        if self.session is None:
            raise RuntimeError("no session of the graph is open")
        return self.session.raw


def _first(graph: Any, key: str) -> Any:
    items = graph.get_collection(key)
    return items[0] if items else None


def resolve_graph(checkpoint: Any, summary_fn: Any, saver: Any, summary_op: Any, summary_writer: Any,
                  global_step: Any, logdir: Optional[str], args: Mapping[str, Any], *, max_to_keep: int,
                  keep_checkpoint_every_n_hours: Optional[float], recovery_wait_secs: float,
                  increment_global_step: Optional[bool]) -> Tf1Choices:
    """TF's defaults for the TF1 arguments (``args``: graph, ready_op, ... as passed), built in the
    graph, which is then finalized. ``logdir`` None: nothing is saved or restored and no summary
    written, as TF. Raises :class:`UsageError` for ``checkpoint=`` (eager state)."""
    import tensorflow as tf

    if checkpoint is not NOT_PASSED and checkpoint is not None:
        raise UsageError("Supervisor(checkpoint=...) is the state of an eager program; a graph program saves its "
                         "graph's variables: leave checkpoint out (or pass saver=tf.compat.v1.train.Saver(var_list))")
    graph = args["graph"] if isinstance(args["graph"], tf.Graph) else tf.compat.v1.get_default_graph()
    keys = tf.compat.v1.GraphKeys
    if graph.finalized:  # the program finalized it (a Scaffold's finalize): procsv's own reads are built, then
        graph._unsafe_unfinalize()  # it is finalized again below; the program's part is left as it was
    with graph.as_default():
        # TF's rule: USE_DEFAULT is the graph's global step (if it has one), None is none
        variable = None if global_step is None else global_step_of(
            graph, None if global_step is USE_DEFAULT else global_step)
        if variable is not None and increment_global_step:
            warn_once("Supervisor.graph_global_step", "increment_global_step=True: procsv advances the graph's "
                      "global step at every sess.run of the session, each run is a step")
        counts = bool(variable is None or increment_global_step)  # (a second Supervisor on this graph reuses the probe)
        probe = once_per_graph(graph, ("probe", "" if variable is None else variable.name, counts),
                               lambda: StepProbe(graph, variable, counts)) if variable is not None \
            else StepProbe(graph, None, True)
        if saver is USE_DEFAULT:
            saver = _first(graph, keys.SAVERS)
            if saver is None and tf.compat.v1.global_variables():
                saver = tf.compat.v1.train.Saver(max_to_keep=max_to_keep,
                                                 keep_checkpoint_every_n_hours=keep_checkpoint_every_n_hours or 10000.0)
                graph.add_to_collection(keys.SAVERS, saver)
        elif saver is not None and not isinstance(saver, tf.compat.v1.train.Saver):
            raise UsageError(f"Supervisor(saver=...) in a graph program takes a tf.compat.v1.train.Saver, "
                             f"not {type(saver).__name__}")
        init_op, ready_op, rl_op, local_op = (args["init_op"], args["ready_op"], args["ready_for_local_init_op"],
                                              args["local_init_op"])
        if ready_op is USE_DEFAULT:
            ready_op = _first(graph, keys.READY_OP)
            if ready_op is None:
                ready_op = tf.compat.v1.report_uninitialized_variables()
                graph.add_to_collection(keys.READY_OP, ready_op)
        if rl_op is USE_DEFAULT:
            rl_op = _first(graph, keys.READY_FOR_LOCAL_INIT_OP)
        if init_op is USE_DEFAULT:
            init_op = _first(graph, keys.INIT_OP)
            if init_op is None:
                init_op = tf.compat.v1.global_variables_initializer()
                graph.add_to_collection(keys.INIT_OP, init_op)
        if local_op is USE_DEFAULT:
            local_op = _first(graph, keys.LOCAL_INIT_OP)
            if local_op is None:
                local_op = tf.group(tf.compat.v1.local_variables_initializer(), tf.compat.v1.tables_initializer())
                graph.add_to_collection(keys.LOCAL_INIT_OP, local_op)
        default_summary = summary_op is USE_DEFAULT
        if default_summary:
            summary_op = _first(graph, keys.SUMMARY_OP)
            if summary_op is None:
                summary_op = tf.compat.v1.summary.merge_all()
                if summary_op is not None:
                    graph.add_to_collection(keys.SUMMARY_OP, summary_op)
        manager = args["session_manager"]
        if manager is None:
            manager = SessionManager(local_init_op=local_op, ready_op=ready_op, ready_for_local_init_op=rl_op,
                                     graph=graph, recovery_wait_secs=recovery_wait_secs,
                                     local_init_run_options=args["local_init_run_options"])
        setup = GraphSetup(graph, variable, probe, saver, init_op, args["init_feed_dict"], ready_op, rl_op, local_op,
                           summary_op, default_summary, manager, step=None)
        setup.step, setup.checkpoint = _adapters(setup, saving=logdir is not None)
    graph.finalize()
    if logdir is None:  # TF: no logdir, no checkpoints and no summaries
        setup.checkpoint, summary_writer = None, None
    writer = summary_writer is not None
    if writer and summary_writer is not USE_DEFAULT:
        check_passed_writer(summary_writer, logdir)  # its directory must be the logdir: then it is used
    if not writer:  # TF keeps sv.summary_op (merge_all) without a writer; it only never runs
        setup.summary_written = False
    given = dict(args, saver=saver, summary_op=setup.summary_op, summary_writer=summary_writer, init_op=init_op,
                 ready_op=ready_op, ready_for_local_init_op=rl_op, local_init_op=local_op, session_manager=manager,
                 graph=graph)
    return Tf1Choices(None if setup.checkpoint is None else setup.checkpoint,
                      summary_fn if writer else None, writer, given, graph=setup)


def _adapters(setup: GraphSetup, saving: bool) -> tuple[Union[GraphGlobalStep, CountedStep], Optional[GraphCheckpoint]]:
    """The global step and the checkpoint as the checkpoint agent reads them
    (:mod:`procsv.trainer.graph.state`, built before the graph is finalized; a graph without a
    global step gets a :class:`CountedStep`, nothing in the graph); the checkpoint is None with
    ``saver=None``, without a logdir (not ``saving``: nothing built for it) and when the saver has
    no variable to save (nothing to checkpoint, as TF's Saver then saves nothing of the graph)."""
    import tensorflow as tf

    step = CountedStep() if setup.global_step is None else GraphGlobalStep(setup.global_step, setup.raw_session)
    if setup.saver is None or not saving:
        return step, None
    var_list = setup.saver._var_list
    if var_list is None:  # a Saver of a SaverDef (import_meta_graph's): it saves the graph's variables
        var_list = setup.graph.get_collection(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES)
    if not var_list:
        return step, None
    checkpoint = GraphCheckpoint(var_list, setup.raw_session)
    checkpoint.step_key = checkpoint.key_of(setup.global_step) if setup.global_step is not None else None
    return step, checkpoint
