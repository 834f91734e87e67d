"""The TF1 arguments of ``procsv.Supervisor`` and what they mean in TF2.

Runs in the trainer process, when a Supervisor is built. ``Supervisor.USE_DEFAULT`` builds the
default piece; ``None`` turns that service off, as in TensorFlow: ``saver=None`` saves (and
restores) nothing, ``summary_op=None`` computes no automatic summaries, ``summary_writer=None``
writes none. In an eager program the graph-era arguments (``graph``, ``init_op``, ``ready_op``...)
have no TF2 meaning: they are accepted, ignored, and warned about once, naming what to use
instead; in a graph program they keep their TF1 meaning (:mod:`procsv.trainer.graph.defaults`).
Also here: the refusal of a Supervisor given nothing to save (:func:`state_given`), the check of a
passed ``summary_writer`` (:func:`check_passed_writer`) and TensorFlow's CamelCase aliases. (The TF1
properties and methods are :mod:`procsv.trainer.tf1_surface`'s.)
"""

from __future__ import annotations

import dataclasses
import os
import sys
from typing import Any, Callable, Mapping, Optional

from procsv.common.errors import UsageError
from procsv.trainer.once import warn_once


class _UseDefault:
    """TF's ``Supervisor.USE_DEFAULT``: "build the default piece" (``None`` turns it off)."""

    def __repr__(self) -> str:
        return "Supervisor.USE_DEFAULT"


USE_DEFAULT: Any = _UseDefault()


class _NotPassed:
    """The default of ``checkpoint=`` (the Supervisor's, ``Scaffold``'s, ``MonitoredTrainingSession``'s):
    the program named no state to save. ``None`` is the opt-out (checkpoints off)."""

    def __repr__(self) -> str:
        return "<checkpoint not passed>"


NOT_PASSED: Any = _NotPassed()

# TF1's default Saver collected every variable of the graph; an eager program has no graph to
# collect them from, so a Supervisor given nothing to save refuses to start instead of saving nothing
NOTHING_TO_SAVE = ("nothing to save was passed: pass checkpoint=tf.train.Checkpoint(model=..., optimizer=...) (the "
                   "state a restarted trainer resumes from; an eager program has no graph whose variables a default "
                   "saver would collect), or checkpoint=None to run without checkpoints (a restart then starts from "
                   "step 0)")

# graph-era arguments: accepted, ignored, warned once with the TF2 way to do it
IGNORED = {
    "graph": "nothing: TF2 runs eagerly; the state to save is checkpoint=tf.train.Checkpoint(...)",
    "ready_op": "a check at the start of the managed_session block (TF2 variables exist once created)",
    "ready_for_local_init_op": "a check at the start of the managed_session block",
    "init_op": "init_fn(session) (TF2 variables are initialized when created)",
    "init_feed_dict": "init_fn(session)",
    "local_init_op": "code at the start of the managed_session block (it runs at every (re)start)",
    "local_init_run_options": "nothing (TF2 has no RunOptions)",
    "session_manager": "nothing: the Supervisor restores the newest committed checkpoint itself",
}
CAMEL_CASE = {"PrepareSession": "prepare_or_wait_for_session", "StartQueueRunners": "start_queue_runners",
              "StartStandardServices": "start_standard_services", "Stop": "stop", "RequestStop": "request_stop",
              "Loop": "loop", "ShouldStop": "should_stop", "StopOnException": "stop_on_exception",
              "WaitForStop": "wait_for_stop", "SummaryComputed": "summary_computed"}  # TF's own setattr list


@dataclasses.dataclass
class Tf1Choices:
    """What the TF1 arguments decided (the Supervisor reads these)."""

    checkpoint: Any  # the state to save, after ``saver``
    summary_fn: Optional[Callable[[], Mapping[str, Any]]]  # None: no automatic summaries
    writer: bool  # False: ``summary_writer=None``, summaries are refused (TF: "requires a summary writer")
    given: dict[str, Any]  # the TF1 values as passed (the properties return them)
    graph: Any = None  # graph mode: the GraphSetup (procsv.trainer.graph.defaults); None: eager


def _is_default(value: Any) -> bool:
    return value is USE_DEFAULT


def state_given(checkpoint: Any, saver: Any, logdir: Optional[str]) -> Any:
    """``checkpoint`` as passed, ``None`` when the program opted out (``checkpoint=None``,
    ``saver=None``) or saves nowhere (``logdir=None`` in plain python: TF's Supervisor without a
    logdir saved and restored nothing; a ``checkpoint`` given then is warned about once). Raises
    :class:`UsageError` (:data:`NOTHING_TO_SAVE`) in an eager program that passed neither
    ``checkpoint`` nor ``saver`` (or a ``saver`` that is no ``tf.train.Checkpoint``), so that no run
    goes on saving nothing. A graph program (eager execution off) is not judged here."""
    import tensorflow as tf

    if logdir is None:
        if checkpoint is not NOT_PASSED and checkpoint is not None:
            warn_once("Supervisor.no_logdir", "Supervisor(logdir=None) outside procsv launch: no checkpoint is "
                                              "saved or restored and no summary written (as TF's Supervisor "
                                              "without a logdir); pass logdir=... to save the checkpoint= given")
        return None
    if checkpoint is None and saver is not None:  # the opt-out (saver=None warns of its own)
        print("procsv: warning: Supervisor(checkpoint=None): nothing will be saved, and a restarted trainer "
              "starts again from step 0 (TF's Supervisor saved every variable of its graph; TF2 has no graph "
              "to collect them from); pass checkpoint=tf.train.Checkpoint(model=..., optimizer=...)",
              file=sys.stderr, flush=True)
    if checkpoint is not NOT_PASSED or not tf.executing_eagerly():
        return None if checkpoint is NOT_PASSED else checkpoint
    if _is_default(saver):
        raise UsageError(NOTHING_TO_SAVE)
    if saver is not None and not isinstance(saver, (tf.train.Checkpoint, Mapping)):
        raise UsageError(f"Supervisor(saver={type(saver).__name__}) cannot save an eager program's state, so "
                         f"{NOTHING_TO_SAVE}")
    return None


def resolve(checkpoint: Any, summary_fn: Optional[Callable[[], Mapping[str, Any]]], saver: Any, summary_op: Any,
            summary_writer: Any, logdir: Optional[str], ignored: Mapping[str, Any]) -> Tf1Choices:
    """Apply TF's ``USE_DEFAULT``/``None`` rules to ``saver``, ``summary_op``, ``summary_writer``
    (:func:`state_given` to ``checkpoint``: refused when nothing was passed to save; ``logdir``
    None: nothing saved and no summary writer, as TF) and warn once about every graph-era argument
    given a value."""
    import tensorflow as tf

    for name, value in ignored.items():
        if value is not None and not _is_default(value):
            warn_once(f"Supervisor.{name}", f"Supervisor({name}=...) has no meaning in TF2 and is ignored; "
                                            f"use {IGNORED[name]}")
    checkpoint = state_given(checkpoint, saver, logdir)
    if summary_writer is not None and not _is_default(summary_writer):
        check_passed_writer(summary_writer, logdir)  # its directory must be the logdir: then it is used
    if logdir is None:
        saver, summary_writer = (saver if saver is None else USE_DEFAULT), None
    if saver is None:
        if checkpoint is not None:
            raise UsageError("Supervisor(saver=None, checkpoint=...): saver=None turns checkpoints off; "
                             "pass one of them")
        warn_once("Supervisor.saver=None", "Supervisor(saver=None): no checkpoint is saved or restored (as TF); "
                                           "a restarted trainer starts from step 0")
    elif not _is_default(saver):
        if isinstance(saver, (tf.train.Checkpoint, Mapping)) and checkpoint is None:
            checkpoint = saver  # the TF2 saver: what to save
        else:
            warn_once("Supervisor.saver", "Supervisor(saver=...) is ignored: procsv's checkpoint service saves "
                                          "checkpoint=tf.train.Checkpoint(model=..., optimizer=...)")
    if summary_op is None:
        summary_fn = None
    elif not _is_default(summary_op):
        if callable(summary_op) and summary_fn is None:
            summary_fn = summary_op  # the TF2 summary_op: a callable returning {tag: value}
        else:
            warn_once("Supervisor.summary_op", "Supervisor(summary_op=...) must be a callable returning "
                                               "{tag: value} in TF2 (or use summary_fn=); this one is ignored")
    writer = summary_writer is not None
    if not writer:
        summary_fn = None
    given = dict(ignored, saver=saver, summary_op=summary_op, summary_writer=summary_writer)
    return Tf1Choices(checkpoint, summary_fn, writer, given)


def add_camel_case_aliases(cls: type) -> None:
    """TensorFlow's Supervisor has these CamelCase names for its methods (supervisor.py, the end)."""
    for camel, snake in CAMEL_CASE.items():
        owner = next(c for c in cls.__mro__ if snake in c.__dict__)  # (the Supervisor or its names' base)
        setattr(cls, camel, owner.__dict__[snake])  # (the function, or the descriptor that forwards the name)


def check_passed_writer(summary_writer: Any, logdir: Optional[str]) -> None:
    """``Supervisor(summary_writer=W)``: W's directory is used when it is the run's logdir (the
    summary service writes the run's event files there: ``procsv.common.layout``, top level); any
    other directory, no logdir, or a writer whose directory cannot be known (TF2's
    ``tf.summary.create_file_writer``: TensorFlow 2 does not tell it) is a :class:`UsageError`."""
    import tensorflow as tf

    get_logdir = getattr(summary_writer, "get_logdir", None)
    where = get_logdir() if callable(get_logdir) else None
    rule = ("procsv's summary service writes a run's event files into its logdir only, beside its checkpoints "
            "(one run, one directory)")
    if where is None:
        kind = ("a tf.summary.SummaryWriter, whose directory TensorFlow 2 does not tell"
                if isinstance(summary_writer, tf.summary.SummaryWriter) else f"a {type(summary_writer).__name__}")
        raise UsageError(f"Supervisor(summary_writer=...) got {kind}: {rule}; leave summary_writer out "
                         "(sv.summary_writer then writes into the logdir), or pass logdir= the directory you meant")
    if logdir is None:
        raise UsageError(f"Supervisor(summary_writer=<a writer of {where!r}>) without a logdir: {rule}; pass "
                         f"logdir={where!r}")
    if os.path.abspath(str(where)) != os.path.abspath(logdir):
        raise UsageError(f"Supervisor(summary_writer=<a writer of {where!r}>): {rule}, and {where!r} is not the "
                         f"logdir {logdir!r}; pass logdir={where!r} (under procsv launch: --logdir), or leave "
                         "summary_writer out")
