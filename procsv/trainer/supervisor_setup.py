"""What a :class:`procsv.Supervisor` decides from its constructor's arguments, before any session.

Runs in the trainer process, inside ``Supervisor.__init__``: which logdir (the launch's, or the
one given; they must agree) and the refusal of arguments that cannot work (:func:`layout_for`);
the state to save, as a ``tf.train.Checkpoint`` holding the ``global_step`` variable
(:func:`trackable_state`), or in graph mode the graph's, with TF1's defaults (:func:`state_to_save`); and how each session's :class:`CheckpointAgent` is made, with the
settings ``procsv launch`` passes (read once by the Supervisor: :class:`bootstrap.ChildConfig`;
:func:`agent_factory`); and its
collaborators, each given what it needs (:func:`collaborators`). Free functions of their arguments:
the Supervisor keeps what they return.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from typing import Any, Callable, Mapping, Optional, Sequence

from procsv.common import bootstrap, env
from procsv.common.errors import UsageError
from procsv.common.layout import Layout
from procsv.trainer.boundary import StepBoundary
from procsv.trainer.checkpoint.agent import CheckpointAgent
from procsv.trainer.checkpoint.commits import SAVE_DEADLINE_FLOOR
from procsv.trainer.checkpoint.keeper import CheckpointKeeper
from procsv.trainer.checkpoint.restore import ReadRetry
from procsv.trainer.coordinator import Coordinator
from procsv.trainer.graph import replayable
from procsv.trainer.graph.state import CountedStep
from procsv.trainer.graph.supervised import GraphSupervision
from procsv.trainer.nonfinite.rollback import NonfiniteRollback
from procsv.trainer.nonfinite.spike import SpikeThresholds
from procsv.trainer.settings import Settings
from procsv.trainer.step_boundary import StepState
from procsv.trainer.summaries.log import SummaryLog
from procsv.trainer.summaries.sender import SUMMARY_DEADLINE
from procsv.trainer.tf1_args import USE_DEFAULT, Tf1Choices, resolve
from procsv.trainer.tf1_objects import Tf1Parts
from procsv.trainer.tf1_surface import Tf1Surface


def resolve_is_chief(is_chief: Optional[bool], ctx: Optional[bootstrap.ChildContext]) -> bool:
    """``Supervisor(is_chief=...)``: by default the group's task 0 (under ``procsv launch --nproc N``),
    else True. Raises :class:`UsageError` for a value that contradicts this trainer's task in a group
    (two chiefs would both save; a group without one would save nothing)."""
    group = ctx is not None and ctx.supervised and ctx.in_group
    if is_chief is None:
        return ctx.rank == 0 if group and ctx is not None else True
    if group and ctx is not None and bool(is_chief) != (ctx.rank == 0):
        raise UsageError(f"is_chief={is_chief} in trainer {ctx.rank} of a group of {ctx.nproc} (procsv launch --nproc): "
                         "task 0 is the chief; leave is_chief out, or pass is_chief=procsv.cluster.is_chief()")
    return bool(is_chief)


def refuse_eager_under_ps(graph_mode: bool, ctx: Optional[bootstrap.ChildContext]) -> None:
    """Raise :class:`UsageError` for an eager program under ``procsv launch --ps N --workers M``: the
    parameter servers hold a TF1 graph's variables (``replica_device_setter``); an eager program's
    workers would each train variables of their own and save nothing in common."""
    if not graph_mode and ctx is not None and ctx.supervised and ctx.config.place.ps > 0:
        raise UsageError("procsv launch --ps/--workers runs TF1 between-graph replication: build the model in a "
                         "graph (tf.compat.v1.disable_eager_execution(), variables under "
                         "tf.compat.v1.train.replica_device_setter); an eager program uses --nproc N")


def check_placement(tf1: Tf1Choices, ctx: Optional[bootstrap.ChildContext], is_chief: bool) -> None:
    """Where the program's state lives, checked before anything runs: an eager program is refused
    under ``--ps`` (:func:`refuse_eager_under_ps`); in a graph program, a replica that is not the chief
    needs every variable placed, as TF's ``Supervisor._verify_setup`` (its ``ValueError``: a worker's
    unplaced variables would be its own, not the parameter servers' it shares with the chief)."""
    refuse_eager_under_ps(tf1.graph is not None, ctx)
    if tf1.graph is None or is_chief:
        return
    for op in tf1.graph.graph.get_operations():
        if op.type in ("Variable", "VariableV2") and not op.device:
            raise ValueError(f"When using replicas, all Variables must have their device set: {op}")


def layout_for(logdir: Optional[str], ctx: Optional[bootstrap.ChildContext], *, is_chief: bool,
               checkpoint_basename: str, read_retry_secs: float) -> Optional[Layout]:
    """The run's :class:`Layout`: ``logdir``, else (None, or TF's ``''``) the launch's (``ctx``); None for no logdir in plain
    python (TF's meaning: nothing saved, no summaries). Raises :class:`UsageError` for a logdir
    other than the launch's, for ``is_chief=False`` under ``procsv launch``, a ``checkpoint_basename`` that is no plain file name and a negative
    ``read_retry_secs``."""
    launched = ctx.layout.logdir if ctx else None
    if not logdir:  # None, or TF's "no logdir" ''
        logdir = launched
    if "/" in checkpoint_basename or not checkpoint_basename:
        raise UsageError(f"checkpoint_basename {checkpoint_basename!r} must be a plain file name")
    if read_retry_secs < 0:
        raise UsageError(f"read_retry_secs must be >= 0, not {read_retry_secs!r}")
    if logdir is None:  # plain python without a logdir: TF's meaning, no checkpoints and no summaries
        return None
    if launched and os.path.abspath(logdir) != os.path.abspath(launched):
        raise UsageError(f"Supervisor(logdir={logdir!r}) differs from the launch's --logdir {launched!r}")
    if not is_chief and ctx is not None and ctx.supervised and not ctx.in_group:
        raise UsageError("is_chief=False under procsv launch without --nproc: the launch runs one trainer, the "
                         "chief, and a worker saves nothing, so nothing would be saved; drop is_chief=False, or "
                         "launch a group with --nproc N")
    return Layout(os.path.abspath(logdir))


def trackable_state(checkpoint: Any, global_step: Any) -> tuple[Any, Any, bool]:
    """The state to save (a ``tf.train.Checkpoint``, built from a mapping of names to trackables;
    None: nothing is saved), the ``global_step`` (the variable given; for ``USE_DEFAULT`` the
    checkpoint's ``global_step``, else a new int64 one, which the checkpoint holds as ``global_step``;
    for None, TF's "no global step", a :class:`CountedStep`: procsv counts the session's runs, as for
    a graph without one, and the checkpoint holds no step) and whether procsv created that variable
    (then the program holds it only once it asks the Supervisor)."""
    import tensorflow as tf

    if checkpoint is not None and not isinstance(checkpoint, tf.train.Checkpoint):
        if not isinstance(checkpoint, Mapping):
            raise UsageError("checkpoint must be a tf.train.Checkpoint or a mapping of names to trackables")
        checkpoint = tf.train.Checkpoint(**checkpoint)
    if global_step is None:  # TF's None: no global step (sv.global_step is None); its checkpoints are <basename>
        return checkpoint, CountedStep(), False
    global_step = None if global_step is USE_DEFAULT else global_step
    created = False
    if global_step is None:
        existing = getattr(checkpoint, "global_step", None) if checkpoint is not None else None
        created = not isinstance(existing, tf.Variable)
        global_step = existing if not created else tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step")
    if checkpoint is not None and getattr(checkpoint, "global_step", None) is None:
        checkpoint.global_step = global_step
    return checkpoint, global_step, created


def state_to_save(checkpoint: Any, summary_fn: Any, saver: Any, summary_op: Any, summary_writer: Any,
                  global_step: Any, logdir: Optional[str], args: Mapping[str, Any], **graph_settings: Any
                  ) -> tuple[Tf1Choices, Any, Any, bool]:
    """The TF1 arguments' meaning, the state to save, the global step and whether procsv created it:
    in graph mode (:func:`procsv.trainer.graph.defaults.is_graph_mode`) TF1's own meaning, with
    TF's defaults built in the program's graph (``graph_settings``: max_to_keep...); else their
    TF2 meaning (:func:`procsv.trainer.tf1_args.resolve`, :func:`trackable_state`)."""
    from procsv.trainer.graph.defaults import is_graph_mode, resolve_graph

    if is_graph_mode(args["graph"]):
        tf1 = resolve_graph(checkpoint, summary_fn, saver, summary_op, summary_writer, global_step, logdir, args,
                            **graph_settings)
        return tf1, tf1.checkpoint, tf1.graph.step, False
    tf1 = resolve(checkpoint, summary_fn, saver, summary_op, summary_writer, logdir, args)
    state, step, created = trackable_state(tf1.checkpoint, global_step)
    return tf1, state, step, created


def retention(tf1: Tf1Choices, max_to_keep: int, keep_hours: Optional[float]) -> tuple[int, Optional[float]]:
    """The retention the checkpoint service applies: in graph mode the saved ``tf.compat.v1.train.Saver``'s
    own ``max_to_keep`` and ``keep_checkpoint_every_n_hours`` (a Saver passed as ``saver=``, a
    Scaffold's, or the default one built from these arguments), as TF's Saver would apply them (its
    ``max_to_keep`` None or 0 keeps every checkpoint); else the Supervisor's arguments."""
    saver = getattr(tf1.graph, "saver", None)
    if saver is None or not hasattr(saver, "_max_to_keep"):
        return max_to_keep, keep_hours
    return int(saver._max_to_keep or 0), saver._keep_checkpoint_every_n_hours


def agent_factory(checkpoint: Any, global_step: Any, layout: Optional[Layout], *, basename: str,
                  save_model_secs: Optional[float], save_checkpoint_steps: Optional[int], max_to_keep: int,
                  keep_checkpoint_every_n_hours: Optional[float], allow_reinit: bool, read_retry_secs: float,
                  failure_limit: int, saving: bool, config: bootstrap.ChildConfig) -> Callable[[], CheckpointAgent]:
    """Makes the :class:`CheckpointAgent` of each session (a new one for a session prepared again
    after a stop). ``failure_limit`` and ``allow_reinit`` are resolved already (the program's, else the
    launch's: :func:`bootstrap.resolve`); the deadline floor is the launch's ``PROCSV_SAVE_DEADLINE``
    (``config.launch.save_deadline``), else the default. In a trainer group (``config.place.nproc`` > 1) every
    member, workers too, takes an in-memory snapshot every K steps (``config.group.snapshot_steps``,
    the watchdog's; 0: none), which the checkpoint service holds apart and never persists
    (:mod:`procsv.services.checkpoint.group`). ``save_model_secs=0`` without ``save_checkpoint_steps`` (the
    program asked for no checkpoint, as TF's Supervisor and MonitoredTrainingSession mean it) turns a single
    trainer's in-memory tier off too: a restarted trainer starts afresh, as the program chose."""
    in_group = config.place.nproc > 1
    every = env.group_snapshot_steps(config.group.snapshot_steps) if in_group else 0
    attempt = config.attempt
    group = (config.place.rank, attempt, every) if every else None
    memory_budget = env.memory_budget(config.launch.memory_snapshots) if not in_group or group is not None else 0.0
    if save_model_secs == 0 and not save_checkpoint_steps and group is None:
        memory_budget = 0.0  # the program asked for no checkpoint at all: none kept in memory for a restart either
    deadline_floor = bootstrap.resolve(None, config.launch.save_deadline, SAVE_DEADLINE_FLOOR)  # (no argument)

    def agent() -> CheckpointAgent:
        if layout is None:
            raise UsageError("no logdir: nothing is saved or restored")  # never asked: no state to save then
        return CheckpointAgent(
            checkpoint, global_step, layout, basename=basename,
            save_model_secs=save_model_secs or None, save_checkpoint_steps=save_checkpoint_steps,
            max_to_keep=max_to_keep, keep_checkpoint_every_n_hours=keep_checkpoint_every_n_hours,
            allow_reinit=allow_reinit, read_retry=ReadRetry(total_secs=read_retry_secs),
            failure_limit=failure_limit, save_deadline_floor=deadline_floor, saving=saving,
            memory_budget=memory_budget, group=group, attempt=attempt, remote=config.group.remote)
    return agent


@dataclasses.dataclass(frozen=True)
class Collaborators:
    """A Supervisor's collaborators (``docs/architecture.md``, "The trainer's collaborators")."""

    keeper: Optional[CheckpointKeeper]  # None: nothing is saved (checkpoint=None, or no logdir)
    summaries: SummaryLog
    rollback: NonfiniteRollback
    boundary: StepBoundary
    graph: Optional[GraphSupervision]  # graph mode only
    surface: Tf1Surface


def collaborators(state: StepState, coord: Coordinator, tf1: Tf1Choices, checkpoint: Any, global_step: Any,
                  layout: Optional[Layout], clock: Callable[[], float], settings: Settings,
                  make_agent: Optional[Callable[[], CheckpointAgent]], *, chief: bool, config: bootstrap.ChildConfig,
                  nonfinite: tuple[Optional[str], Sequence[str], Sequence[str]],
                  spike: tuple[Optional[str], Optional[SpikeThresholds]] = (None, None),
                  session_thread: Callable[[], Optional[int]], connected: Callable[[], bool],
                  started: Callable[[], bool]) -> Collaborators:
    """Build a Supervisor's collaborators around its step ``state``, ``coord`` and ``settings`` (shared:
    read live), each given what it needs (``make_agent``: None when nothing is saved; ``config``: the
    launch's settings and this trainer's place, :class:`bootstrap.ChildConfig`); the last three
    are the Supervisor's session as the TF1 shims see it (:class:`~procsv.trainer.tf1_objects.Tf1Parts`)."""
    keeper = CheckpointKeeper(make_agent) if make_agent is not None else None
    if keeper is not None:
        counter = state.counter
        keeper.configure(lambda agent: agent.hooks.prepare.append(counter.sync))  # the step is in each snapshot
    summaries = SummaryLog(state, clock, settings, chief=chief, writes=chief and layout is not None, writer=tf1.writer,
                           deadline=bootstrap.resolve(None, config.launch.summary_deadline, SUMMARY_DEADLINE))
    rollback = NonfiniteRollback(state, state.counter, keeper, checkpoint, lambda: summaries.flush(force=True), clock,
                                 settings, *nonfinite, config=config, on_spike=spike[0], spike_thresholds=spike[1],
                                 graph_input=None if tf1.graph is None else functools.partial(replayable.input_inside,
                                                                                            tf1.graph.graph))
    boundary = StepBoundary(state, clock, coord, keeper, summaries, rollback, settings, chief=chief)
    graph = None
    if tf1.graph is not None:
        graph = GraphSupervision(tf1.graph, state, coord, keeper, summaries.summary_computed, clock, settings,
                                 boundary.commit_checkpoint, chief=chief, layout=layout, config=config)
        summaries.graph_summary = graph.summary  # summary_op, every save_summaries_secs
    surface = Tf1Surface(tf1, coord, Tf1Parts(
        checkpoint, tf1.graph, layout, settings, chief, state, state.counter, global_step, keeper, boundary,
        summaries, session_thread=session_thread, connected=connected, started=started))
    return Collaborators(keeper, summaries, rollback, boundary, graph, surface)
