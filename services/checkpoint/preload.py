"""What the checkpoint service loads before it commits: TensorFlow, when this run's snapshots need it.

Runs in the checkpoint service. Most checkpoints are written without TensorFlow
(:mod:`procsv.services.checkpoint.writer`); a snapshot with a variant tensor (a ``tf.data``
iterator's state, what an exact resume needs) or a dtype the native writer does not know takes
TensorFlow's path, and importing TensorFlow takes seconds of CPU (8.5 s on a loaded machine, more
at the service's lower priority). A service that began that import at a commit looked stuck to the
watchdog's stall rule, which killed it, and its successor began the same import.

So the service says so: :class:`Loader` tells the watchdog with a
:class:`~procsv.ipc.messages.ServiceLoading` before the import and once it is done (the stall rule
never kills a service while it loads and counts its window from then), and remembers in the logdir
(``.procsv/checkpoint_needs.json``, atomically) that this run's checkpoints need TensorFlow, so that
every later service (a replacement, the next launch's) imports it before it says it is ready: at
its start, at normal priority, in parallel with the pre-warmed trainer. An import at a commit runs
at normal priority too: in a thread made before the service lowered its own (``nice`` is per
thread on Linux), which the commit waits for; at the service's +10 on a busy machine the same
import took minutes. Meanwhile the service tells the trainer whose commit waits, on the checkpoint
socket, with a :class:`~procsv.ipc.messages.CommitLoading` when the load begins and then each second
in which the import moved (a module more, or CPU time of its thread: :func:`progressing`; a
deadlocked or stopped import sends nothing, and the trainer's SaveOverdue gets the service
replaced): the trainer, at a snapshot's deadline, takes the commit for slow, not dead (no failed
checkpoint counted, no ``SaveOverdue``). The loader sends it on the service's ROUTER from the
service's main thread, which waits for the load (the import runs in its own thread). A load at start,
before the Hello or at a commit, keeps what trainers send meanwhile (:attr:`Loader.early`, for the
service's loop) and tells the newest one whose snapshot waits (:func:`awaited`): a trainer restarted
while its predecessor's commit loads is told too.
"""

from __future__ import annotations

import gc
import os
import sys
import threading
import time
from typing import AbstractSet, Any, Callable, Optional

import zmq

from procsv.common import faults
from procsv.common.layout import Layout, read_json, write_json
from procsv.ipc.codec import ProtocolError
from procsv.ipc.messages import CheckpointSetup, CommitLoading, Message, Role, SaveData, ServiceLoading
from procsv.ipc.transport import Received, drain, send

WHAT = "TensorFlow"
MIN_CPU_SECS = 0.02  # CPU of the loader thread in a second that shows an import at work (a deadlock: none)


def needs_path(layout: Layout) -> str:
    return os.path.join(layout.meta, "checkpoint_needs.json")


def needed(layout: Layout) -> str:
    """Why this run's checkpoints need TensorFlow ("" if no service found they do)."""
    got = read_json(needs_path(layout))
    why = got.get("tensorflow") if isinstance(got, dict) else None
    return why if isinstance(why, str) else ""


_LOADED = threading.Event()  # set once this process's loader imported TensorFlow


def loaded() -> bool:
    """Whether this service loaded TensorFlow (its loader's import is done): not whether it is in
    ``sys.modules``, where a service grown from a warm launch's fork (:mod:`procsv.services.seed`) has
    it from its start; that one goes through its load as a fresh service does (told to the watchdog
    and the trainer, remembered in the logdir), its import a look-up."""
    return _LOADED.is_set()


class Loader:
    """Loads TensorFlow for one checkpoint service, telling the watchdog (``to_watchdog``, None
    outside a launch) and the trainer whose snapshot waits (on the service's ROUTER of ``trainers``,
    which takes those message classes), and remembering the need in ``layout``; ``say`` prints a line."""

    def __init__(self, layout: Layout, to_watchdog: Optional[zmq.Socket[Any]],
                 trainers: tuple[zmq.Socket[Any], AbstractSet[type[Message]]], attempt: int,
                 say: Callable[[str], None], clock: Callable[[], float] = time.monotonic) -> None:
        self.layout = layout
        self.router, self.accept = trainers
        self.early: list[Received | ProtocolError] = []  # what trainers sent during a load (for the service's loop)
        self._waits: Optional[tuple[bytes, int]] = None  # the trainer and step whose commit waits for a load
        self.to_watchdog = to_watchdog
        self.attempt = attempt
        self.say = say
        self.clock = clock
        self._asked = threading.Event()
        self._done = threading.Event()
        self._error: Optional[BaseException] = None
        # made now, before the service lowers its priority: the import at a commit runs at this one
        self._thread = threading.Thread(target=self._import_when_asked, name="procsv-loader", daemon=True)
        self._thread.start()

    def _import_when_asked(self) -> None:
        self._asked.wait()
        try:
            faults.stall("checkpoint", "loading")  # tests: a load that takes as long as the test says
            gc.disable()  # (the import's objects outlive it: a fifth of its CPU was the collector visiting them,
            try:  # as in the zygote's, procsv.zygote.__main__; process-wide, only while the import runs)
                import tensorflow  # noqa: F401
            finally:
                gc.enable()
        except BaseException as exc:  # re-raised in the commit that waits for it
            self._error = exc
        else:
            _LOADED.set()
        self._done.set()

    def at_start(self) -> None:
        """Before the service's Hello: load what an earlier service of this run found it needs."""
        why = needed(self.layout)
        if why and not loaded():
            secs = self._load()
            self.say(f"procsv checkpoint: loaded {WHAT} in {secs:.1f} s before saying ready (this run's "
                     f"checkpoints need it: {why})")

    def before_commit(self, why: str, step: int, trainer: Optional[bytes]) -> bool:
        """Before the commit of ``step``: ``why`` its snapshot needs TensorFlow ("": it does not);
        ``trainer``: the identity of the trainer that waits for it (None: none does). Loads it if it is
        needed and not loaded yet (True then), and keeps ``checkpoint_needs.json`` saying what the
        commits need."""
        self._record(why)
        if not why or loaded():
            return False
        self._waits = (trainer, step) if trainer is not None else None
        self.say(f"procsv checkpoint: loading {WHAT} for this commit ({why}); the watchdog is told, and "
                 "the next checkpoint service of this run loads it before it says it is ready")
        secs = self._load()
        self.say(f"procsv checkpoint: loaded {WHAT} in {secs:.1f} s")
        return True

    def _record(self, why: str) -> None:
        """Make ``checkpoint_needs.json`` say what this commit needs: ``why``, or (``""``) nothing, by
        removing it, so that a run whose checkpoints stopped needing TensorFlow (its program changed)
        no longer loads it at each service's start. Compared with what the file says now (one small
        read a commit), so a file deleted under a live service is written again at its next commit
        that needs it. A full disk: the next commit tries again."""
        if why == needed(self.layout):
            return
        path = needs_path(self.layout)
        try:
            if why:
                write_json(path, {"tensorflow": why})
            else:
                os.unlink(path)
                self.say(f"procsv checkpoint: this run's checkpoints no longer need {WHAT}: removed {path}")
        except FileNotFoundError:
            pass
        except OSError as exc:
            self.say(f"procsv checkpoint: could not write {path}: {exc}")

    def _load(self) -> float:
        t0 = self.clock()
        self._tell(False, 0.0)
        self._asked.set()
        self._moved()  # the load began: its first deadline extends (a trainer may look before a second passed)
        last = self._sign()
        while not self._done.wait(1.0):  # (an import cannot be cut short; the watchdog bounds a load that never ends)
            now = self._sign()
            if progressing(last, now):  # only a load that moves looks alive to the trainer
                self._moved()
            last = now
        if self._error is not None:
            raise self._error
        secs = self.clock() - t0
        self._tell(True, secs)
        return secs

    def _moved(self) -> None:
        """The load began or moved: tell the trainer whose snapshot waits for it: the newest word of a
        trainer on one, read from the ROUTER now (kept in :attr:`early`), else the one whose commit began
        the load. So at start (before the Hello) the trainer whose snapshot is in flight is told, and at
        a commit so is a trainer restarted meanwhile (its predecessor killed), whose first snapshot waits
        behind the load: it would otherwise take the loading service for stuck at its deadline."""
        got = list(drain(self.router, routed=True, accept=self.accept))
        self.early.extend(got)
        self._waits = awaited(got) or self._waits
        if self._waits is not None:
            try:
                send(self.router, CommitLoading(self._waits[1], WHAT), prefix=[self._waits[0]])
            except zmq.ZMQError:  # the trainer is gone (unroutable)
                self._waits = None

    def _sign(self) -> tuple[int, float]:
        """What the import has done so far: the modules loaded, and the loader thread's CPU time."""
        return len(sys.modules), _cpu_secs(self._thread.ident)

    def _tell(self, done: bool, secs: float) -> None:
        if self.to_watchdog is not None:
            send(self.to_watchdog, ServiceLoading(Role.CHECKPOINT, os.getpid(), self.attempt, WHAT, done, secs))


def progressing(before: tuple[int, float], after: tuple[int, float]) -> bool:
    """Whether an import moved between two looks a second apart (:meth:`Loader._sign`): a module more,
    or :data:`MIN_CPU_SECS` of the loader thread's CPU. A deadlocked import (an import lock, a
    stalled filesystem) does neither, so the trainer's deadline finds it overdue and the watchdog
    replaces the service, instead of a sign of life sent as long as the service's main thread lives."""
    return after[0] != before[0] or after[1] - before[1] >= MIN_CPU_SECS


def _cpu_secs(ident: Optional[int]) -> float:
    """The CPU time of the thread ``ident`` (0.0 where it cannot be read: then only modules count)."""
    try:
        return time.clock_gettime(time.pthread_getcpuclockid(ident)) if ident is not None else 0.0
    except (OSError, AttributeError):
        return 0.0


def awaited(early: list[Received | ProtocolError]) -> Optional[tuple[bytes, int]]:
    """The trainer (its identity) and the step of the snapshot it waits for, from what a service
    received while it loaded before its Hello: the newest word of a trainer on it (a heartbeat's
    snapshot in flight, lost with the service before, or a snapshot sent since); None if none waits."""
    for got in reversed(early):
        if isinstance(got, Received) and got.identity is not None and (
                isinstance(got.msg, CheckpointSetup) or isinstance(got.msg, SaveData) and got.msg.persist):
            step = got.msg.in_flight if isinstance(got.msg, CheckpointSetup) else got.msg.step
            return None if step is None else (got.identity, step)
    return None
