"""``sv.saver`` and ``sv.summary_writer``: TF1's ``Saver`` and ``FileWriter`` methods over procsv's services.

Runs in the trainer process, in an eager program and in a graph program (whose ``sv.saver``'s other
attributes are its ``tf.compat.v1.train.Saver``'s, and whose restore is that Saver's, by name). TF1 programs
call ``sv.saver.save(sess, sv.save_path, global_step=...)``, ``sv.saver.restore(sess, path)`` and
``sv.summary_writer.add_summary(...)`` themselves; here those calls keep TF's meaning while the
writing stays with the checkpoint and summary services:

* :class:`SaverShim`: ``save`` commits a checkpoint of the session's current step through the
  checkpoint service (atomic, manifest, retention) and returns its prefix as TF did
  (``<logdir>/<basename>-<step>``); to a path of the program's own, TF's Saver writes it there too;
  ``restore`` verifies and restores a committed checkpoint (or
  restores a plain TF one); ``last_checkpoints`` lists the committed ones, oldest first. Any other
  attribute is the ``tf.train.Checkpoint``'s (what is saved). What procsv cannot do as TF did is a
  :class:`UsageError` of one line, never a quiet difference.
* :class:`SummaryWriterShim`: ``add_summary``, ``add_session_log``, ``add_event`` go to the summary
  service (through the Supervisor's buffer, handed off at step boundaries); ``flush`` hands off and
  waits until the service has written them; ``close`` flushes and drops later ``add_*`` calls
  until ``reopen``, as TF's writer; ``get_logdir`` is the logdir; in graph mode ``add_graph`` and
  ``add_meta_graph`` send the graph to the summary service for the event file.

Saving, restoring, flushing and session logs use the trainer's sockets, which belong to the thread
that prepared the session: from any other thread they are a :class:`UsageError`.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from typing import Any, Callable, Optional

from procsv.common.errors import CheckpointError, UsageError
from procsv.common.layout import Layout
from procsv.common.manifests import list_committed
from procsv.ipc.messages import GraphEvent, SaveReason, SessionLogEvent, SessionStatus
from procsv.trainer.boundary import StepBoundary
from procsv.trainer.checkpoint.keeper import CheckpointKeeper
from procsv.trainer.once import warn_once
from procsv.trainer.settings import Settings
from procsv.trainer.step_boundary import StepCounter, StepState
from procsv.trainer.summaries.log import SummaryLog

_STATUS = {1: SessionStatus.START, 2: SessionStatus.STOP, 3: SessionStatus.CHECKPOINT}  # SessionLog.SessionStatus


@dataclasses.dataclass(frozen=True)
class Tf1Parts:
    """What ``sv.saver`` and ``sv.summary_writer`` translate to: the Supervisor's collaborators and settings."""

    checkpoint: Any  # the saved state (a tf.train.Checkpoint, or graph mode's name-based one); None: nothing
    graph: Any  # graph mode: the GraphSetup (procsv.trainer.graph.defaults); None: eager
    layout: Optional[Layout]  # None: no logdir (plain python)
    settings: Settings  # the Supervisor's, read live (checkpoint_basename, stop_grace_secs)
    chief: bool
    state: StepState
    counter: StepCounter
    global_step: Any
    keeper: Optional[CheckpointKeeper]  # None: nothing is saved
    boundary: StepBoundary
    summaries: SummaryLog
    session_thread: Callable[[], Optional[int]]  # the thread that prepared the open session (None: no session)
    connected: Callable[[], bool]  # a session holds the trainer's sockets now
    started: Callable[[], bool]  # a session was prepared (and not stopped since... or stopped: see Supervisor)

    @property
    def save_path(self) -> Optional[str]:
        return os.path.join(self.layout.logdir, self.settings.checkpoint_basename) if self.layout is not None else None


def _on_session_thread(parts: Tf1Parts, what: str) -> None:
    """Raise :class:`UsageError` unless a session is open and this is the thread that prepared it."""
    owner = parts.session_thread()
    if owner is None or not parts.connected():
        raise UsageError(f"{what} needs an open session: call it inside `with sv.managed_session() as sess:`")
    if threading.get_ident() != owner:
        raise UsageError(f"{what} from thread {threading.current_thread().name!r}: it runs only on the thread that "
                         "entered managed_session() (the trainer's sockets are that thread's)")


def _int_step(global_step: Any) -> Optional[int]:
    if global_step is None:
        return None
    numpy = getattr(global_step, "numpy", None)
    return int(numpy() if callable(numpy) else global_step)


class SaverShim:
    """``sv.saver``: TF1's ``Saver`` methods over the checkpoint service (see the module docstring)."""

    def __init__(self, parts: Tf1Parts) -> None:
        self._parts = parts

    @property
    def checkpoint(self) -> Any:
        """The ``tf.train.Checkpoint`` that is saved (TF2's saver)."""
        return self._parts.checkpoint

    def __getattr__(self, name: str) -> Any:  # the checkpoint's own attributes (``sv.saver.model``...)
        if name.startswith("_"):  # never its own (a copy before __init__ has no _parts: no recursion)
            raise AttributeError(name)
        graph = self._parts.graph  # graph mode: the tf.compat.v1.train.Saver's (``saver_def``...)
        return getattr(graph.saver if graph is not None else self._parts.checkpoint, name)

    def save(self, sess: Any, save_path: str, global_step: Any = None, latest_filename: Optional[str] = None,
             meta_graph_suffix: str = "meta", write_meta_graph: bool = True, write_state: bool = True,
             strip_default_attrs: bool = False, save_debug_info: bool = False) -> str:
        """``save_path`` is ``sv.save_path``: commit a checkpoint of the session's current step through the
        checkpoint service and return its prefix, ``<logdir>/<checkpoint_basename>-<step>`` (TF's return
        value; the step is always in the name, as with ``global_step=``), or ``<logdir>/<checkpoint_basename>``
        for a graph without a global step (as TF names it). A ``global_step`` other than the session's step is
        a :class:`UsageError` there (a committed checkpoint is named by the step it holds). ``latest_filename``
        and ``write_state=False`` are warned about: the service keeps the logdir's ``checkpoint`` file.

        Any other path (TensorFlow's PTB tutorial saves to its own ``FLAGS.save_path``): what TF's Saver
        does, ``<save_path>-<global_step>`` written now by TF's own Saver (graph mode; eager: the
        ``tf.train.Checkpoint``) with the state file of its folder, and its prefix returned; the run's
        checkpoint of the step is committed through the service first, so that the run keeps it too. The
        state file of the logdir stays the service's: a path in the logdir gets no state file (said once).

        Either way a worker (only the chief saves) or a call outside the session's thread is a
        :class:`UsageError`; :class:`CheckpointError` if the service's commit of the own path failed.
        The meta graph options mean nothing in eager mode (TF ignores them there too)."""
        sv = self._parts
        _on_session_thread(sv, "sv.saver.save(sess, save_path)")
        if not sv.chief:
            raise UsageError("sv.saver.save() in a worker (is_chief=False): only the chief saves")
        own = sv.save_path is not None and os.path.abspath(save_path) == os.path.abspath(sv.save_path)
        step = sv.state.step
        graph = sv.graph
        if graph is not None and hasattr(global_step, "graph"):  # graph mode: the global step tensor's value
            global_step = graph.session.raw.run(global_step)
        asked = _int_step(global_step)
        if own and asked is not None and asked != step:
            raise UsageError(f"sv.saver.save(global_step={asked}) at step {step}: a checkpoint is named by the step "
                             "it holds; pass global_step=sv.global_step (or leave it out)")
        if own and (latest_filename is not None or not write_state):
            warn_once("saver.save.state", "sv.saver.save(latest_filename=..., write_state=False) is ignored: the "
                                          "checkpoint service keeps the logdir's `checkpoint` state file")
        prefix = self._commit(step, raise_on_failure=own)
        if own:
            return prefix
        return self._program_copy(save_path, asked, latest_filename, meta_graph_suffix, write_meta_graph, write_state,
                                  strip_default_attrs, save_debug_info)

    def _commit(self, step: int, raise_on_failure: bool) -> str:
        """Commit ``step``'s checkpoint through the service unless it is committed as it is; its prefix."""
        sv = self._parts
        assert sv.keeper is not None and sv.save_path is not None  # (a logdir and something to save: else no sv.saver)
        ckpt = sv.keeper.agent
        # a graph without a global step: ``<basename>``, rewritten at each save (TF's name with global_step=None)
        prefix = f"{sv.save_path}-{step}" if getattr(ckpt.global_step, "numbered", True) else sv.save_path
        if step <= ckpt.last_committed and not ckpt.behind(step):
            return prefix  # already committed, as it is: TF would have written the same state again
        result = sv.boundary.save_now(SaveReason.STEPS)
        if ckpt.last_committed < step and raise_on_failure:
            why = result.error if result is not None and result.error else "it did not commit in time"
            raise CheckpointError(f"sv.saver.save() at step {step}: {why}")
        return prefix

    def _program_copy(self, save_path: str, asked: Optional[int], latest_filename: Optional[str],
                      meta_graph_suffix: str, write_meta_graph: bool, write_state: bool, strip_default_attrs: bool,
                      save_debug_info: bool) -> str:
        """TF's ``Saver.save`` to the program's own ``save_path``: written now, in this thread, by TF."""
        import tensorflow as tf

        sv = self._parts
        folder = os.path.dirname(os.path.abspath(save_path))
        if write_state and sv.layout is not None and folder == os.path.abspath(sv.layout.logdir):
            warn_once("saver.save.own_state", f"sv.saver.save(sess, {save_path!r}) writes no `checkpoint` state file: "
                                              "the logdir's is the checkpoint service's (it names the run's checkpoints)")
            write_state = False
        graph = sv.graph
        if graph is not None:  # the program's graph: its own tf.compat.v1.train.Saver, as under TensorFlow
            return str(graph.saver.save(graph.session.raw, save_path, global_step=asked, latest_filename=latest_filename,
                                        meta_graph_suffix=meta_graph_suffix, write_meta_graph=write_meta_graph,
                                        write_state=write_state, strip_default_attrs=strip_default_attrs,
                                        save_debug_info=save_debug_info))
        prefix = save_path if asked is None else f"{save_path}-{asked}"
        written = str(sv.checkpoint.write(prefix))
        if write_state:  # its folder as the program named it, as TF's Saver: a relative prefix is named relative to it
            tf.compat.v1.train.update_checkpoint_state(os.path.dirname(save_path), written,
                                                       latest_filename=latest_filename)
        return written

    def restore(self, sess: Any, save_path: str) -> None:
        """Restore ``save_path``: a committed checkpoint of the logdir is verified against its
        manifest first (:class:`CorruptCheckpoint` if it does not match); any other (a plain
        ``tf.train.Checkpoint``'s) restores what it holds of the saved state, its ``global_step`` too
        if it has one, as TF1's restore did. The session's step becomes the restored global step.
        Works in ``init_fn`` (before the first step: a warm start) and between steps; restoring a
        step older than the newest committed one during a session is a :class:`UsageError` (the run's
        history would fork: its next checkpoints would be named like committed ones)."""
        from procsv.trainer.checkpoint import restore_at_start

        sv = self._parts
        if sv.checkpoint is None:
            raise UsageError("sv.saver.restore(): this Supervisor saves nothing (checkpoint=None)")
        owner = sv.session_thread()
        if owner is not None and threading.get_ident() != owner:
            raise UsageError("sv.saver.restore() from another thread than the one that entered managed_session()")
        sv.counter.sync()
        path = os.path.abspath(save_path)
        layout = sv.layout
        manifest = next((m for m in list_committed(layout) if m.path(layout.logdir) == path), None) \
            if layout is not None else None
        ckpt = sv.keeper.agent if sv.keeper is not None else None
        step = manifest.step if manifest is not None else None
        if ckpt is not None and step is not None and sv.started() and step < ckpt.last_committed:
            raise UsageError(f"sv.saver.restore(sess, {save_path!r}) during a session whose newest checkpoint is "
                             f"step {ckpt.last_committed}: restore it at the start (init_fn), or use a new logdir")
        if manifest is not None and layout is not None:
            restore_at_start.verify_and_restore(sv.checkpoint, sv.global_step, layout, manifest)
        elif sv.graph is not None:  # graph mode: every variable of the saver, by name, as TF's Saver
            sv.checkpoint.restore(path)
            sv.global_step.forget()  # (the step is read again from the variable)
        else:  # TF1's restore: what the file holds of the saved state (a warm start); its global_step if it has one
            sv.checkpoint.restore(path).assert_nontrivial_match().expect_partial()
        sv.state.step = int(sv.global_step.numpy())

    @property
    def last_checkpoints(self) -> list[str]:
        """The committed checkpoints that retention keeps, oldest first (TF's list of the ones not deleted)."""
        layout = self._parts.layout
        return [m.path(layout.logdir) for m in list_committed(layout)] if layout is not None else []

    def recover_last_checkpoints(self, checkpoint_paths: Any) -> None:
        """TF rebuilt its retention list from ``checkpoint_paths``; procsv's checkpoint service keeps
        retention over the logdir's committed checkpoints itself (``max_to_keep``,
        ``keep_checkpoint_every_n_hours``), so ``last_checkpoints`` already lists them: nothing to do."""

    def set_last_checkpoints_with_time(self, last_checkpoints_with_time: Any) -> None:
        """As :meth:`recover_last_checkpoints`: retention is the checkpoint service's."""

    def export_meta_graph(self, *args: Any, **kwargs: Any) -> Any:
        graph = self._parts.graph
        if graph is not None:  # graph mode: the Saver's own (it writes only the file asked for)
            return graph.saver.export_meta_graph(*args, **kwargs)
        raise UsageError("sv.saver.export_meta_graph(): an eager program has no graph to export; save a model "
                         "with tf.saved_model.save")


class SummaryWriterShim:
    """``sv.summary_writer``: TF's ``FileWriter`` methods over the summary service (see the module docstring)."""

    def __init__(self, parts: Tf1Parts) -> None:
        self._parts = parts
        self._closed = False

    def get_logdir(self) -> Optional[str]:
        """The directory the summary service writes the event files into: the run's logdir."""
        return self._parts.layout.logdir if self._parts.layout is not None else None

    def add_summary(self, summary: Any, global_step: Any = None) -> None:
        """A ``Summary`` proto (or its serialized bytes, or ``{tag: scalar}``) at ``global_step``
        (default: the current step); dropped after :meth:`close`, as TF."""
        if not self._closed:
            self._parts.summaries.summary_computed(None, summary, _int_step(global_step))

    def add_session_log(self, session_log: Any, global_step: Any = None) -> None:
        """A ``SessionLog`` (START, STOP or CHECKPOINT with its path) at ``global_step``, written after
        what was logged before it. TensorBoard reads a START at step S as a restart there, hiding the
        points at steps >= S written before it. On the session's thread only."""
        if self._closed:
            return
        sv = self._parts
        _on_session_thread(sv, "sv.summary_writer.add_session_log()")
        status = _STATUS.get(int(getattr(session_log, "status", 0)))
        if status is None:
            raise UsageError(f"add_session_log(): status {getattr(session_log, 'status', None)!r} is none of "
                             "SessionLog.START, STOP, CHECKPOINT")
        step = sv.state.step if global_step is None else _int_step(global_step)
        sv.summaries.flush(force=False, urgent=True)
        sv.summaries.send(SessionLogEvent(status, int(step or 0), str(getattr(session_log, "checkpoint_path", ""))))

    def add_event(self, event: Any) -> None:
        """An ``Event`` proto holding a ``summary`` or a ``session_log`` (at ``event.step``); any other
        kind (a graph, run metadata, a log message) is a :class:`UsageError`: the summary service
        writes summaries and session logs."""
        kind = event.WhichOneof("what")
        if kind == "summary":
            self.add_summary(event.summary, event.step)
        elif kind == "session_log":
            self.add_session_log(event.session_log, event.step)
        else:
            raise UsageError(f"add_event(): an event holding {kind!r} cannot be written by procsv's summary service "
                             "(it writes summaries and session logs)")

    def add_graph(self, graph: Any = None, global_step: Any = None, graph_def: Any = None) -> None:
        """Graph mode: ``graph``'s GraphDef (or ``graph_def``) into the event file at ``global_step``
        (default 0, as TF), through the summary service; on the session's thread only. An eager
        program has no graph: :class:`UsageError`."""
        if graph_def is None and graph is not None and hasattr(graph, "as_graph_def"):
            graph_def = graph.as_graph_def(add_shapes=True)
        self._graph_event("add_graph", graph_def, global_step, meta=False)

    def add_meta_graph(self, meta_graph_def: Any, global_step: Any = None) -> None:
        """Graph mode: a ``MetaGraphDef`` into the event file (TensorBoard's ``meta_graph``), as
        :meth:`add_graph`."""
        self._graph_event("add_meta_graph", meta_graph_def, global_step, meta=True)

    def _graph_event(self, what: str, proto: Any, global_step: Any, meta: bool) -> None:
        sv = self._parts
        if sv.graph is None:
            raise UsageError(f"sv.summary_writer.{what}(): an eager program has no graph; use "
                             "tf.summary.trace_on/trace_export with a writer of your own")
        if proto is None:
            raise UsageError(f"sv.summary_writer.{what}(): pass a graph or graph_def")
        if self._closed:
            return
        _on_session_thread(sv, f"sv.summary_writer.{what}()")
        data = proto if isinstance(proto, bytes) else proto.SerializeToString()
        sv.summaries.send(GraphEvent(int(_int_step(global_step) or 0), time.time(), meta=meta), [data])

    def flush(self) -> None:
        """Hand off what was logged and wait (up to 10 s) until the summary service has written it.
        From another thread than the session's it is handed off at the next step boundary instead."""
        sv = self._parts
        owner = sv.session_thread()
        if not sv.connected() or owner is None or threading.get_ident() != owner:
            return
        sv.summaries.flush(force=True)

    def close(self) -> None:
        """Flush, then drop further ``add_*`` calls until :meth:`reopen` (TF's writer after close)."""
        self.flush()
        self._closed = True

    def reopen(self) -> None:
        """Accept ``add_*`` calls again after :meth:`close`."""
        self._closed = False

