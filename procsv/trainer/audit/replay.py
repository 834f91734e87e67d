"""An auditor's replay of one committed interval (issue 71).

Runs in an auditor: a trainer process of its own role, forked from the zygote, ``SCHED_IDLE`` from its first
line, told its interval S1-S2 in its configuration (``ChildConfig.audit``, read in bootstrap). It runs the
user's module; its Supervisor, instead of restoring the newest checkpoint, restores exactly checkpoint S1
(verified against its manifest) and reads checkpoint S2's tensors back from disk, both under the restore lock
(retention keeps both for the audit: the watchdog's :class:`~procsv.ipc.messages.AuditHold`); then the program trains with no side effect (no session with the
services: no snapshot, no checkpoint, no summary, no progress; its steps are not the run's) until the step
boundary at S2, where its state is compared with S2 tensor by tensor (a digest per tensor), one
:class:`~procsv.ipc.messages.AuditResult` goes to the watchdog and the process exits 0. A program that ends
before S2, or a checkpoint retired before the auditor read it, is an answer with an ``error``, not a verdict.

An eager program's state is its ``tf.train.Checkpoint``, written by TF into a temporary folder at S2 and read
back; a TF1 graph program's (the graph ``Supervisor``'s, ``MonitoredTrainingSession``'s: a
:class:`~procsv.trainer.checkpoint.name_based.NameBasedCheckpoint`) is restored and read in the replay's own
graph session, keyed as the graph's Saver writes it (``w``, ``w/Momentum``, ``global_step``), with one read at
S2. A program with no state to save answers with an error (:data:`UNSUPPORTED`).

The replay is a restart's: S1 counts as the checkpoint restored (the agent's ``restored_from``), so Keras ``fit``
(:mod:`procsv.trainer.keras.fit`) resumes at S1's epoch and batch with the earlier epochs' input put back, and at
S2 what a snapshot writes first runs (:attr:`AuditReplay.prepare`: the step, ``fit``'s position) before the state
is read. A group's replay (``--nproc N``; over hosts, all its members' count, every one on node 0) is N auditors, a
group of their own (their own localhost ``TF_CONFIG``):
each restores S1 as a restarted group's member restores the checkpoint its chief pinned, they replay the interval
together (each step's all-reduce), each reads its state at S2, and the chief alone answers (the trainer's checkpoint
is its chief's; every member's step reaches it through the all-reduce). A session that trains nothing (a Keras ``fit`` that completed before S1) leaves the answer to the
program's next session (:meth:`AuditReplay.stopped`), which replays from S1 again, as a restart's next fit does; a
restore target a front-end chose (a Keras fit's: only its position when S1 is a later fit's of another model) is
restored in place of the checkpoint object, as at a restart.
"""

from __future__ import annotations

import atexit
import hashlib
import os
import socket
import sys
import tempfile
import threading
from typing import Any, Callable, NoReturn, Optional

import zmq

from procsv.common import faults
from procsv.common.bootstrap import ChildContext
from procsv.common.errors import ProcsvError
from procsv.common.layout import Layout
from procsv.common.manifests import Manifest, list_committed, restoring
from procsv.ipc.messages import AuditResult
from procsv.trainer.checkpoint.name_based import NameBasedCheckpoint
from procsv.ipc.transport import make_socket, send
from procsv.trainer.checkpoint.restore_at_start import verify_and_restore
from procsv.trainer.managed import ManagedSession
from procsv.trainer.standby.wait import leave

NEVER = float("inf")
UNSUPPORTED = "not audited in this slice"  # an answer's error that switches the audit off (the verdict reads it)
SKIPPED_KEYS = ("_CHECKPOINTABLE_OBJECT_GRAPH", "save_counter/")  # bookkeeping of a save, not training state
FAILED_SESSIONS_MAX = 3  # an auditor's sessions that failed before S2: past this the program's retries are not waited for
_failed: list[str] = []  # why each of this auditor process's sessions failed before S2 (each has an AuditReplay of its own)


def digest(value: Any) -> str:
    """A tensor's digest: its dtype, shape and bytes (16 hex digits of BLAKE2b)."""
    import numpy as np

    arr = np.asarray(value)
    h = hashlib.blake2b(digest_size=8)
    h.update(f"{arr.dtype.str}{arr.shape}".encode())
    h.update(np.ascontiguousarray(arr).tobytes() if arr.dtype != object else repr(arr.tolist()).encode())
    return h.hexdigest()


def read_digests(path: str) -> dict[str, str]:
    """Every tensor of the checkpoint ``path`` (but :data:`SKIPPED_KEYS`), digested by key. A ``variant`` tensor (a
    ``tf.data`` iterator's state, which a program checkpoints for an exact resume) has no value a reader can give
    (``get_tensor`` raises): it is digested by its dtype alone (its key kept: both sides have it; not its shape, which
    holds the elements a ``prefetch`` had buffered when it was saved, as many as its thread had made by then). Its
    position is the step's, and a wrong input read shows in the weights it trains."""
    import tensorflow as tf

    reader = tf.train.load_checkpoint(path)
    dtypes = reader.get_variable_to_dtype_map()
    shapes = reader.get_variable_to_shape_map()
    return {k: digest(reader.get_tensor(k)) if dtypes[k] != tf.variant else opaque()
            for k in sorted(shapes) if not k.startswith(SKIPPED_KEYS)}


def opaque() -> str:
    """The digest of a tensor whose value cannot be read (a ``variant``): its dtype alone (pure)."""
    return hashlib.blake2b(b"variant", digest_size=8).hexdigest()


def state_digests(checkpoint: Any, scratch: str) -> dict[str, str]:
    """This process's state now, digested by key (but :data:`SKIPPED_KEYS`): a TF1 graph program's variables
    read in its session, keyed as its Saver writes them (what procsv's checkpoint of it holds); an eager one's
    ``tf.train.Checkpoint`` as TF writes it (into the folder ``scratch``, then read back)."""
    if isinstance(checkpoint, NameBasedCheckpoint):
        return {k: digest(v) for k, v in sorted(checkpoint.gather()) if not k.startswith(SKIPPED_KEYS)}
    checkpoint.write(os.path.join(scratch, "state"))
    return read_digests(os.path.join(scratch, "state"))


def differing(mine: dict[str, str], theirs: dict[str, str]) -> list[str]:
    """The keys whose digests differ, or that one side lacks, sorted (pure)."""
    return sorted(k for k in mine.keys() | theirs.keys() if mine.get(k) != theirs.get(k))


def whole(digests: dict[str, str]) -> str:
    """One digest of a whole state (pure)."""
    return hashlib.blake2b("".join(f"{k}={v};" for k, v in sorted(digests.items())).encode(),
                           digest_size=8).hexdigest()


def _manifest(layout: Layout, step: int) -> Optional[Manifest]:
    return next((m for m in list_committed(layout) if m.step == step), None)


class AuditReplay:
    """One auditor's replay of ``interval`` (S1, S2) of the run in ``ctx``: :meth:`begin` restores S1 and reads
    S2; the step boundary at S2 (:meth:`boundary`) or the session's end (:meth:`end`) compares and answers."""

    def __init__(self, ctx: ChildContext, interval: tuple[int, int], checkpoint: Any, global_step: Any) -> None:
        self.ctx, self.start, self.end_step = ctx, interval[0], interval[1]
        self.checkpoint, self.global_step = checkpoint, global_step
        self.theirs: dict[str, str] = {}
        self.restored = ""  # checkpoint S1's prefix, once restored
        self.counter: Any = None
        # what the trainer's snapshot runs first (the step into its variable, a Keras fit's position): set by the
        # Supervisor, run before the state at S2 is read, so that it holds what the trainer's checkpoint S2 holds
        self.prepare: Callable[[], None] = lambda: None

    def begin(self, target: Any = None, prepare: Optional[Callable[[], None]] = None) -> None:
        """Restore exactly checkpoint S1 and digest checkpoint S2, under the restore lock; a failure answers
        with its error and ends the process. (A graph program's session is open: its restore runs in it.)
        ``target``: what is restored instead of the checkpoint object, as at a restart (a front-end's choice: a
        Keras fit's whole state, or only its position when S1 is a later fit's of another model). ``prepare``:
        what the trainer's snapshot runs first (:attr:`prepare`)."""
        if prepare is not None:
            self.prepare = prepare
        if self.checkpoint is None:
            self._answer([], "", f"a program with no state to save: {UNSUPPORTED}")
        layout = self.ctx.layout
        with restoring(layout):  # (retention deletes nothing meanwhile; the watchdog's links hold them after)
            first, last = _manifest(layout, self.start), _manifest(layout, self.end_step)
            try:
                if first is None or last is None:  # (retention keeps both: the watchdog's AuditHold)
                    gone = self.start if first is None else self.end_step
                    self._answer([], "", f"checkpoint {gone} was retired before the auditor read it")
                verify_and_restore(self.checkpoint if target is None else target, self.global_step, layout, first)
                self.restored = first.path(layout.logdir)
                self.theirs = read_digests(last.path(layout.logdir))
            except (ProcsvError, OSError) as exc:
                self._answer([], "", f"{type(exc).__name__}: {exc}")
        print(f"procsv: auditor restored step {self.start}; replaying to step {self.end_step}", flush=True)
        if faults.fires("auditor", "hang"):  # tests only: a replay blocked for good, using no CPU (a deadlock)
            threading.Event().wait()

    def claim(self, state: Any) -> None:
        """Own the session's step boundary: nothing before step S2 (no snapshot, no summary, no progress)."""
        self.counter = state.counter  # (the step variable holds the step only once synced)
        state.claim(self.boundary, lambda: None, lambda: None)
        state.losses = None
        state.set_end(NEVER, NEVER)
        state.set_checkpoint(self.end_step, NEVER)

    def boundary(self, step: int) -> None:
        """The boundary before the step after ``step``: at S2 (or past it), compare and end."""
        if step >= self.end_step:
            self.end(step)

    def stopped(self, step: int, failed: bool = False) -> None:
        """The session ended at ``step`` (``failed``: with an error the program's block raised, or a thread's):
        :meth:`end`, unless it trained nothing (``step`` is S1's, not S2's) or failed before S2. A session that
        trains nothing (a Keras ``fit`` that completed before S1, or resumed past its last epoch) leaves the answer
        to the program's next session, which restores S1 again and replays, as a restarted trainer's next fit does.
        So does one that failed before S2 (TF's retry loop: an ``AbortedError`` caught, a new session opened, which
        the trainer's restore made exact): the next session replays from S1 again; a program that opens none
        answers at its exit that its session ended at ``step``, with no replay to S2. A program that opens none
        after a session that trained nothing ends without an answer (the watchdog's: no replay)."""
        if step == self.start:
            return
        if failed and step < self.end_step:
            why = f"the program's session ended with an error at step {step}, before step {self.end_step}"
            _failed.append(why)
            if len(_failed) >= FAILED_SESSIONS_MAX:  # (a program that retries for ever: no answer would come)
                self._answer([], "", f"{why}, {len(_failed)} times")
            print(f"procsv: auditor: {why}; if the program opens another session, it replays from step {self.start} "
                  "again", flush=True)
            if len(_failed) == 1:
                atexit.register(self._unanswered)
            return
        self.end(step)

    def _unanswered(self) -> None:
        """At the auditor's exit, no session having answered: the last failed session's reason."""
        self._answer([], "", f"{_failed[-1]}, and it opened no other")

    def end(self, step: int) -> None:
        """Compare this process's state at ``step`` with checkpoint S2, answer, and exit 0."""
        if step != self.end_step:
            self._answer([], "", f"the program ended at step {step}, before step {self.end_step}")
        if self.counter is not None:
            self.counter.sync()
        self.prepare()  # (as a snapshot: Keras fit's position written into its variables)
        with tempfile.TemporaryDirectory(dir=self.ctx.endpoints.runtime_dir, prefix="audit.") as tmp:
            mine = state_digests(self.checkpoint, tmp)  # this process's own state, as its checkpoint holds it
        self._answer(differing(mine, self.theirs), whole(mine), "")

    def _answer(self, differ: list[str], state: str, error: str) -> NoReturn:
        """Say the answer (a group's replay: its chief alone, the replay's answer; a worker, whose state the chief's
        checkpoint does not hold, only leaves, once its state was read as every member's is: a read of a variable
        synced on read is a collective) and leave."""
        if self.ctx.rank != 0:
            sys.stdout.flush()
            leave()
        msg = AuditResult(os.getpid(), self.ctx.attempt, self.start, self.end_step, differ, state,
                          socket.gethostname(), error)
        said = "bit-equal to the trainer's checkpoint" if not (differ or error) else \
            f"no replay: {error}" if error else f"{len(differ)} tensor(s) differ from the trainer's: {', '.join(differ[:5])}"
        print(f"procsv: auditor, steps {self.start}-{self.end_step}: {said}", flush=True)
        zctx = zmq.Context()
        sock = make_socket(zctx, zmq.PUSH, linger_ms=5000)
        sock.connect(self.ctx.endpoints.watchdog)
        send(sock, msg, block=True)
        sock.close()  # (lingers until the watchdog has it, at most 5 s)
        zctx.term()
        sys.stdout.flush()
        leave()  # nothing of the program's after this: no final checkpoint, no summaries, no teardown


class AuditSession(ManagedSession):
    """An auditor's session: a :class:`~procsv.trainer.managed.ManagedSession` whose end answers (the program's
    last interval ends with the program: no step boundary after S2)."""

    def __init__(self, state: Any, should_stop: Any, replay: AuditReplay) -> None:
        super().__init__(state, should_stop)
        self.replay = replay
