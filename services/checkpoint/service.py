"""The checkpoint service's event loop: timer, snapshot intake, commit, notifications.

Runs in the checkpoint service process (``python -m procsv.services.checkpoint``). It binds the ROUTER
``checkpoint.sock``; the trainer's DEALER sends :class:`CheckpointSetup` (policy + heartbeat) and :class:`SaveData`
snapshots, and receives :class:`SaveRequest` (the timer lives here, as ``save_model_secs``), :class:`SaveResult`,
and :class:`CommitLoading` while a commit waits for a load (:mod:`.preload`). Results also go to the watchdog
and, as a ``SessionLog CHECKPOINT``, to the summary service (over a DEALER; it expects no answer there).
SIGTERM from the watchdog (or from anyone once the watchdog is gone: a SIGTERM to every process of the job is
left to the watchdog, which stops the trainer first, so that its emergency checkpoint commits here) ends the
loop after the commit in progress, if any. Every timer runs on the injected monotonic ``clock``. A trainer
group's members' snapshots (other hosts' too) are :mod:`.group`'s.

The service runs at ``nice`` +10 (``PROCSV_CHECKPOINT_NICE`` overrides): its work should come out of the loop's
idle time. It maps (and pre-faults) the trainer's shared snapshot memory as soon as a heartbeat names it,
reads the numeric tensors from there and writes them with ``O_DIRECT``.

Saves are synchronous in this loop, one at a time: the trainer sends a snapshot only when the previous
one has its :class:`SaveResult`. A committed step is written again only as a newer revision of it
(:attr:`SaveData.revision`), in place (:mod:`.inplace`); a heartbeat naming a snapshot this process
never received gets ``SaveResult`` ``lost``: taken again.

Retention deletes checkpoints, so a save applies only the settings the trainer itself sent (:mod:`.settings`),
never defaults, and keeps past them the steps an audit still needs (the watchdog's :class:`AuditHold`, from a
DEALER of its own; ``--audit``): each setup's settings are persisted in the logdir, a restarted service reads them at start,
and a snapshot from a trainer whose settings it does not have is held, uncommitted, until its next heartbeat.
The checkpoints of a timeline an audit rolled back are quarantined as the watchdog's :class:`AuditQuarantine`
says (:meth:`~procsv.services.checkpoint.store.CheckpointStore.quarantine_wrong`).

A message that is malformed, of another schema version or of a kind not in :data:`ACCEPT` is refused by the
codec, counted (:class:`~procsv.ipc.rejections.Rejections`) and never stops the loop;
``<logdir>/.procsv/checkpoint_stats.json`` (:mod:`.stats`) has the counts, which ``procsv status`` shows, and
the in-memory snapshots this process held.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any, Callable, Optional, Sequence

import zmq

from procsv.ipc.codec import ProtocolError
from procsv.ipc.messages import (AuditHold, AuditQuarantine, CheckpointSetup, DeleteCheckpoints, GroupFetch, GroupQuery, Hello, Message, RecoverQuery,
                                 RecoverReply, Role, SaveData, SaveReason, SaveRequest, SaveResult, SessionLogEvent,
                                 SessionStatus, SnapshotHeld)
from procsv.ipc.rejections import Rejections
from procsv.ipc.transport import CHECKPOINT_FRAME_MAX, Received, bind_private, drain, make_socket, send
from procsv.common import faults
from procsv.common.bootstrap import ChildContext
from procsv.common.stopfrom import Authority
from procsv.common.stopwake import StopWake
from procsv.common.errors import CheckpointError
from procsv.common.manifests import Manifest, committed_step, list_committed
from procsv.services.checkpoint.arena import ArenaCache
from procsv.services.checkpoint.group import GroupIntake
from procsv.services.checkpoint.peers import open_link
from procsv.services.checkpoint.memory import (HeldSnapshot, KeptMetaGraph, TrainerLife, kept_meta_graph,
                                               persist_decision, with_kept_meta_graph)
from procsv.services.checkpoint.policy import save_due
from procsv.services.checkpoint.stats import ServiceStats
from procsv.services.checkpoint.settings import CheckpointSettings, load as load_settings, store as store_settings
from procsv.services.checkpoint.deletions import Deletions
from procsv.services.checkpoint.store import CheckpointStore
from procsv.services.checkpoint.preload import Loader
from procsv.services.checkpoint.writer import needs_tensorflow, save_errors, write_snapshot

POLL_MS = 100
NICE = 10
EXIT_WAIT = 5.0  # seconds a dead trainer may still be exiting when its successor asks for its snapshot
ACCEPT = frozenset({CheckpointSetup, SaveData, RecoverQuery, DeleteCheckpoints, GroupQuery, GroupFetch,  # all a trainer sends
                    AuditHold, AuditQuarantine})  # (and the watchdog, --audit)


class CheckpointService:
    """The checkpoint service: its sockets, the trainer's settings, the snapshot in flight or held, the store."""

    def __init__(self, ctx: ChildContext, clock: Callable[[], float] = time.monotonic) -> None:
        self.ctx = ctx
        self.clock = clock
        self.store = CheckpointStore(ctx.layout)
        self.zctx: zmq.Context[Any] = zmq.Context.instance()
        self.router = make_socket(self.zctx, zmq.ROUTER, sndhwm=100, max_frame=CHECKPOINT_FRAME_MAX)
        self.router.setsockopt(zmq.ROUTER_MANDATORY, 1)
        # a peer reconnecting under an identity the ROUTER holds takes it over (else it is dropped unseen for good)
        self.router.setsockopt(zmq.ROUTER_HANDOVER, 1)
        bind_private(self.router, ctx.endpoints.checkpoint)
        self.to_watchdog: Optional[zmq.Socket[Any]] = None
        if ctx.supervised:
            self.to_watchdog = make_socket(self.zctx, zmq.PUSH, linger_ms=1000)
            self.to_watchdog.connect(ctx.endpoints.watchdog)
        self.to_summary = make_socket(self.zctx, zmq.DEALER, linger_ms=1000)
        self.to_summary.connect(ctx.endpoints.summary)
        self.trainer: Optional[bytes] = None
        self.setup: Optional[CheckpointSetup] = None
        self.last_request = clock()
        self.stopping = False
        self.arenas = ArenaCache()
        self.last_received: Optional[int] = None  # the step of the last snapshot this process received
        # the trainer's own settings, as persisted by the last service that received them
        self.settings: Optional[CheckpointSettings] = load_settings(ctx.layout)
        # a snapshot that came before its trainer's settings: (message, frames, trainer identity)
        self.held: Optional[tuple[SaveData, list[Any], bytes]] = None
        # the in-memory tier (procsv.services.checkpoint.memory): the newest in-memory snapshot, the
        # life of the trainer that sent it, and what became of the last one persisted for a dead trainer
        self.memory: Optional[HeldSnapshot] = None
        self.life: Optional[TrainerLife] = None
        self.recovered: Optional[RecoverReply] = None
        self.meta_graph: Optional[KeptMetaGraph] = None  # graph mode: the MetaGraphDef a trainer sent last
        self.rejections = Rejections("procsv checkpoint", os.path.relpath(ctx.layout.checkpoint_stats, ctx.layout.logdir), _say)
        self.group = GroupIntake(self._answer, _say, open_link(self.zctx, ctx.layout, _say,  # (other hosts' too)
                                                               ctx.config.group.peer_bind),
                                 lambda m: self.to_watchdog is None or send(self.to_watchdog, m),  # progress
                                 peer_setting=ctx.config.group.peer_max_bytes)
        self.stats = ServiceStats(ctx.layout, self.rejections, lambda: (self.group.stats(), self.group.copies.held),
                                  clock, _say)
        self.deletions = Deletions(self.store, _say)  # what waits for a restore to end before it is deleted
        # TensorFlow, when needed: the watchdog and the trainer whose snapshot waits are told meanwhile
        self.loader = Loader(ctx.layout, self.to_watchdog, (self.router, ACCEPT), ctx.attempt, _say, clock)

    def run(self) -> int:
        self.loader.at_start()  # before the lower priority and the Hello: what this run's commits need
        try:
            nice = self.ctx.config.launch.checkpoint_nice
            os.nice(int(nice) if nice is not None else NICE)
        except (OSError, ValueError):
            pass
        for note in self.store.recover():
            print(f"procsv checkpoint: {note}", flush=True)
        self.stats.write(durable=False)
        if self.to_watchdog is not None:  # ready to commit: the watchdog's stall rule counts from here
            send(self.to_watchdog, Hello(Role.CHECKPOINT, os.getpid(), self.ctx.attempt))

        wake = StopWake(self.router, self._on_term, self._stop_authority(), "procsv checkpoint")  # woken at once
        wake.also(*self.group.sockets())  # --nnodes: the members of other hosts
        while not self.stopping:
            early, self.loader.early = self.loader.early, []  # what came while it loaded (before its Hello, at a commit)
            if early or wake.wait(POLL_MS):
                self.group.deliver(self.rejections.count)
                for got in early or drain(self.router, limit=1, routed=True, accept=ACCEPT):
                    if isinstance(got, ProtocolError):
                        self.rejections.count(got)
                    else:
                        self._handle(got)
            self._tick()
            self.stats.maybe_write()
        wake.close()
        self.stats.write(durable=True)
        self.router.close(0)
        self.arenas.pin(None)
        self.arenas.drop()
        self.group.close()
        return 0

    def _on_term(self, signum: int) -> None:
        self.stopping = True

    def _stop_authority(self) -> Authority:
        """Whose SIGTERM/SIGINT stops this service: the process that started it (the watchdog, or the
        trainer of a plain ``python train.py``), or anyone's once that one is gone."""
        return Authority.parent("the watchdog" if self.ctx.supervised else "the trainer that started it",
                                self.ctx.config.parent_pid)

    def _tick(self) -> None:
        if self.deletions.retired:
            self.deletions.retire([])
        if self.deletions.delete_for is not None:
            self._delete_all(self.deletions.delete_for)
        if self.memory is not None and self.life is not None and self.life.pid == self.memory.pid and self.life.dead():
            self._persist_memory(f"its trainer (pid {self.life.pid}) died")
        if self.trainer is None or self.setup is None:
            return
        now = self.clock()
        if save_due(now, self.last_request, self.setup.save_model_secs):
            self.last_request = now
            self._reply(SaveRequest(SaveReason.PERIODIC))

    def _reply(self, msg: Message) -> None:
        if self.trainer is None:
            return
        try:
            send(self.router, msg, prefix=[self.trainer])
        except zmq.ZMQError:  # the trainer is gone (unroutable); it will say hello again
            self.trainer = None

    def _handle(self, got: Received) -> None:
        msg, payload, identity = got.msg, got.payload, got.identity
        if identity is None:  # not from the ROUTER (which always names the peer): nobody to answer
            return
        if isinstance(msg, RecoverQuery):
            self._recover(msg, identity)
            return
        if isinstance(msg, (GroupQuery, GroupFetch)) or (isinstance(msg, SaveData) and not msg.persist and msg.member >= 0):
            self.group.handle(msg, payload, identity)  # a group's in-memory tier: held apart, never persisted
            return
        if isinstance(msg, DeleteCheckpoints):
            self._delete_all(identity)
            return
        if isinstance(msg, AuditHold):  # the watchdog's: no reply
            self.deletions.hold(msg.steps)
            return
        if isinstance(msg, AuditQuarantine):  # the watchdog's, at an audit's rollback: no reply
            for note in self.store.quarantine_wrong(msg.after, msg.attempt, msg.steps, msg.reason):
                _say(f"procsv checkpoint: {note}")
            return
        if isinstance(msg, CheckpointSetup):
            if self.life is None or self.life.pid != msg.pid:
                if self.life is not None:
                    self.life.close()
                self.life = TrainerLife(msg.pid)
            if self.memory is not None and self.memory.pid is None and self.memory.identity == identity:
                self.memory.pid = msg.pid
            if self.trainer != identity:
                if self.memory is not None and self.memory.identity != identity:
                    # a new trainer restored without asking for it (or after giving up waiting): too late
                    self._release_memory(f"its trainer (pid {msg.pid}) started a new session" if self.memory.pid == msg.pid
                                         else f"a new trainer (pid {msg.pid}) has restored without it")
                self.recovered = None
                self.trainer = identity
                self.last_request = self.clock()  # a (re)started trainer just restored: no save at once
                try:
                    for note in self.store.quarantine_corrupt_after(msg.step):
                        _say(f"procsv checkpoint: {note}")
                except OSError as exc:  # a full disk (mkdir, the state file): nothing is deleted; next trainer tries again
                    _say(f"procsv checkpoint: could not quarantine checkpoints newer than step {msg.step}: {exc}")
            self.setup = msg
            self._remember(CheckpointSettings.from_setup(identity, msg))
            if msg.arena is not None:
                try:
                    self.arenas.get(msg.arena).populate()
                except CheckpointError as exc:
                    _say(f"procsv checkpoint: {exc}")
            if msg.in_flight is not None and msg.in_flight != self.last_received:
                self._reply(SaveResult(msg.in_flight, SaveReason.LOST, False, None,
                                       "the checkpoint service restarted before this snapshot reached it", 0.0))
            if self.held is not None:
                held, frames, sender = self.held
                self.held = None
                if sender == identity and msg.in_flight == held.step and self.settings is not None:
                    self._save(held, frames, self.settings)
                else:  # its trainer is gone or no longer waits for it (and may reuse the memory)
                    _say(f"procsv checkpoint: dropped the held snapshot of step {held.step}: its trainer no longer waits")
        elif isinstance(msg, SaveData) and not msg.persist:
            self._hold(msg, payload, identity)
        elif isinstance(msg, SaveData):
            self.meta_graph = kept_meta_graph(msg, payload, identity, self.meta_graph)
            self.trainer = identity
            self.last_received = msg.step
            if self.memory is not None and self.memory.msg.step <= msg.step:
                self._release_memory("")  # a disk snapshot as new or newer supersedes it
            if self.settings is not None and self.settings.of(identity):
                self._save(msg, payload, self.settings)
            else:
                self.held = (msg, payload, identity)
                _say(f"procsv checkpoint: holding the snapshot of step {msg.step} until its trainer's checkpoint "
                     "settings arrive (never applying default retention)")

    def _remember(self, settings: CheckpointSettings) -> None:
        """Use ``settings`` from now on; persist them (atomically) when they changed."""
        if settings == self.settings:
            return
        self.settings = settings
        try:
            store_settings(self.ctx.layout, settings)
        except OSError as exc:  # they still apply in this process; a restart would hold snapshots
            _say(f"procsv checkpoint: could not persist the checkpoint settings: {exc}")

    # ------------------------------------------------------------------ the in-memory tier
    def _hold(self, msg: SaveData, payload: list[Any], identity: bytes) -> None:
        """Keep ``msg`` (an in-memory snapshot) as the newest, releasing the one held before; with
        its trainer's ``MetaGraphDef`` (graph mode), whether it came with it or before."""
        self.meta_graph = kept_meta_graph(msg, payload, identity, self.meta_graph)
        msg, payload = with_kept_meta_graph(msg, payload, identity, self.meta_graph)
        try:
            view = self.arenas.get(msg.arena) if msg.arena is not None else None
        except CheckpointError as exc:
            _say(f"procsv checkpoint: not holding the in-memory snapshot of step {msg.step}: {exc}")
            return
        pid = self.life.pid if self.life is not None and identity == self.trainer else None
        self.memory = HeldSnapshot(msg, payload, view, identity, pid)
        self.arenas.pin(view)
        self.trainer = identity
        self.stats.held(msg.step)
        self._reply(SnapshotHeld(msg.step, msg.meta_graph))

    def _release_memory(self, why: str) -> None:
        if self.memory is not None and why:
            _say(f"procsv checkpoint: dropped the in-memory snapshot of step {self.memory.msg.step}: {why}")
        self.memory = None
        self.arenas.pin(None)

    def _persist_memory(self, why: str) -> None:
        """Commit the held in-memory snapshot (``why``: its trainer died) if it is newer than every
        checkpoint and whole; remember the outcome for the restarted trainer's :class:`RecoverQuery`."""
        held = self.memory
        if held is None:
            return
        committed = list_committed(self.ctx.layout)
        newest = committed[-1].step if committed else None
        settings = self.settings if self.settings is not None and self.settings.of(held.identity) else None
        problem = held.view.slot_problem(held.msg.slot, held.msg.step) if held.view is not None else ""
        refused = persist_decision(held.msg.step, newest, settings is not None, problem)
        reply = RecoverReply(-1, None, refused)
        if refused:
            self._release_memory(f"not persisted: {refused}")
        elif settings is not None:
            _say(f"procsv checkpoint: {why}; persisting its in-memory snapshot of step {held.msg.step} "
                 f"({held.msg.step - (newest if newest is not None else 0)} steps past the last checkpoint)")
            result = self._save(held.msg, held.payload, settings, reply_to=None)
            reply = RecoverReply(held.msg.step if result.ok else -1, result.path, result.error or "")
            self._release_memory("")
        self.recovered = reply

    def _recover(self, query: RecoverQuery, identity: bytes) -> None:
        """A restarted trainer asks before restoring: persist what a dead trainer left, then answer."""
        if self.memory is not None and self.memory.identity != identity:
            life = self.life if self.life is not None and self.life.pid == self.memory.pid else None
            if life is not None and not life.wait_dead(EXIT_WAIT):
                self._release_memory(f"its trainer (pid {life.pid}) is still alive while pid {query.pid} restores")
            else:
                self._persist_memory(f"a restarted trainer (pid {query.pid}) asks for it")
        reply, self.recovered = self.recovered, None
        if reply is None:
            reply = RecoverReply(-1, None, "no in-memory snapshot is held")
        self._answer(identity, reply)

    # ------------------------------------------------------------------ disk
    def _save(self, msg: SaveData, payload: list[Any], settings: CheckpointSettings,
              reply_to: Optional[bytes] = b"") -> SaveResult:
        """Commit ``msg``; tell the trainer (``reply_to``; by default the current one, None: nobody),
        the watchdog and the summary service; return the result."""
        again = committed_step(self.ctx.layout, msg.basename, msg.step, msg.numbered)
        if again is not None and msg.revision <= again.revision:  # on disk already, as new: not written, nor announced
            _say(f"procsv checkpoint: step {msg.step} is committed already ({again.prefix}); not written again")
            return self._tell(SaveResult(msg.step, msg.reason, True, again.path(self.ctx.layout.logdir), None, 0.0,
                                         again=True, revision=again.revision, attempt=msg.attempt), reply_to, msg.numbered, [])
        faults.stall("checkpoint", "commit_stall")  # tests: a commit that takes as long as the test says (a busy disk)
        started = self.clock()
        retired: list[Manifest] = []
        try:
            view = self.arenas.get(msg.arena) if msg.arena is not None else None
            if self.loader.before_commit(needs_tensorflow(msg), msg.step, self.trainer if reply_to == b"" else None):
                started = self.clock()  # loaded, no stall (told); the persist time the trainer's deadlines use
            manifest, retired = self.store.commit(
                step=msg.step,
                reason=msg.reason,
                basename=msg.basename,
                write=lambda tmp_prefix: write_snapshot(tmp_prefix, msg, payload, view),
                max_to_keep=settings.max_to_keep,
                keep_every_n_hours=settings.keep_checkpoint_every_n_hours,
                numbered=msg.numbered,
                revision=msg.revision,  # above the committed copy's: that step's checkpoint rewritten in place
                held=self.deletions.held,
                attempt=msg.attempt,
            )
            result = SaveResult(msg.step, msg.reason, True, manifest.path(self.ctx.layout.logdir), None,
                                self.clock() - started, revision=manifest.revision, attempt=msg.attempt)
        except Exception as exc:
            if not isinstance(exc, save_errors()):
                raise
            detail = f"{type(exc).__name__}: {exc}".splitlines()[0]
            _say(f"procsv checkpoint: save at step {msg.step} failed, previous checkpoint kept: {detail}")
            result = SaveResult(msg.step, msg.reason, False, None, detail, self.clock() - started, attempt=msg.attempt)
        return self._tell(result, reply_to, msg.numbered, retired)

    def _tell(self, result: SaveResult, reply_to: Optional[bytes], numbered: bool,
              retired: list[Manifest]) -> SaveResult:
        """``result`` to the watchdog, the trainer (``reply_to``: as :meth:`_save`), a new commit's to summaries."""
        self.last_request = self.clock()
        if self.to_watchdog is not None and not faults.fires("checkpoint", "untold"):
            send(self.to_watchdog, result)  # first: a trainer that waits for this result may exit on it
        if reply_to == b"":
            self._reply(result)
        if result.ok and result.path and numbered and not result.again:  # (TF logs none without a global step)
            send(self.to_summary, SessionLogEvent(SessionStatus.CHECKPOINT, result.step, result.path))
        self.deletions.retire(retired)  # after the trainer heard: deleting old files is not on its path
        return result

    def _delete_all(self, identity: bytes) -> None:
        """A trainer's :class:`DeleteCheckpoints` (:meth:`Deletions.delete_all`); answered once done."""
        answer = self.deletions.delete_all(identity)
        if answer is None:
            return
        if answer.error is None:
            self._release_memory("")
        self._answer(identity, answer)

    def _answer(self, identity: bytes, msg: Message, frames: Sequence[Any] = ()) -> None:
        try:
            send(self.router, msg, frames, prefix=[identity])
        except zmq.ZMQError:  # the trainer is gone
            pass


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)
