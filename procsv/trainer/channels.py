"""The trainer's three ZeroMQ connections, all owned by the trainer's main thread.

Runs in the trainer. Nothing here ever blocks the training loop: sends are non-blocking (a full
queue returns False and the caller counts a drop; only an explicit save's snapshot waits for
room, with a deadline), and the checkpoint and summary sockets are
read with zero-timeout receives (:func:`procsv.ipc.transport.drain`) at step boundaries. The
exceptions are the end of training: :meth:`TrainerChannels.wait_save_result` waits with a
deadline for the final checkpoint to commit (and raises :class:`~procsv.ipc.transport.NoReply`
at the deadline), and the summary sender waits a little for its last acks; and the start of a
restarted trainer: :meth:`TrainerChannels.recover` waits with a deadline for the service to
persist a held in-memory snapshot (``NoReply`` likewise); and Keras's ``delete_checkpoint=True``:
:meth:`TrainerChannels.delete_checkpoints` waits with a deadline for the service to delete them.

Connections: a DEALER to the checkpoint service's ROUTER (``CheckpointSetup``/``SaveData`` up,
``SaveRequest``/``SaveResult`` down; a group member of another host: node 0's service's peer link
over CURVE, followed to a restarted service: :mod:`procsv.trainer.remote.peer_follow`'s thread reads
``peer.json`` and files the new key, the step path only connects the socket); a DEALER to the
summary service's ROUTER (``SummaryBatch`` and ``SessionLogEvent`` up, ``SummaryAck`` down); a PUSH
to the watchdog when supervised. The step path touches no file.
"""

from __future__ import annotations

import os
import secrets
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence, TypeVar, cast

import zmq

from procsv.ipc.codec import ProtocolError
from procsv.ipc.messages import (CheckpointSetup, CheckpointsDeleted, DeleteCheckpoints, GroupCopy, GroupHeld, Message,
                                 RecoverQuery, RecoverReply, SaveData, SaveResult, SummaryAck)
from procsv.common import curve
from procsv.ipc.transport import Endpoints, NoReply, ReceiveTimeout, Received, drain, make_socket, recv_message, send
from procsv.common.bootstrap import ChildConfig
from procsv.common.layout import Layout
from procsv.trainer.remote.peer_follow import PeerFollow

_Answer = TypeVar("_Answer", RecoverReply, CheckpointsDeleted)
WAIT_SLICE_MS = 200  # a long wait is cut into slices this long (the deadline is checked between)


def read_summary_acks(sock: zmq.Socket[Any], timeout: float = 0.0) -> list[SummaryAck]:
    """The :class:`SummaryAck` messages waiting on a DEALER connected to the summary service, after
    waiting up to ``timeout`` seconds for the first; anything else (or malformed) is dropped."""
    return [r.msg for r in drain(sock, first_timeout_ms=max(0, int(timeout * 1000)))
            if not isinstance(r, ProtocolError) and isinstance(r.msg, SummaryAck)]


@dataclass(frozen=True)
class RemoteMember:
    """A group member of host 1..M-1 (``ChildConfig.group_remote``, set by node 0's ``StartMembers``): its
    in-memory copies go to node 0's checkpoint service over CURVE, under a key filed in ``layout`` for
    its ``rank`` and ``attempt`` (:func:`procsv.common.curve.file_member`)."""

    layout: Layout
    rank: int
    attempt: int

    @staticmethod
    def of(config: ChildConfig) -> Optional["RemoteMember"]:
        """The remote member ``config`` names, or None (not one)."""
        if not config.group.remote:
            return None
        return RemoteMember(Layout(config.logdir or "."), config.place.rank, config.attempt)

    def file_member(self, layout: Layout, peer: curve.Peer) -> curve.MemberLink:
        """:func:`curve.file_member` for this member (what :class:`PeerFollow` files with)."""
        return curve.file_member(layout, peer, self.rank, self.attempt)


class TrainerChannels:
    """The trainer's sockets: PUSH to the watchdog, DEALERs to the checkpoint and summary services."""

    def __init__(self, endpoints: Endpoints, supervised: bool, clock: Callable[[], float] = time.monotonic,
                 services: bool = True, checkpoint: bool = False, remote: Optional[RemoteMember] = None) -> None:
        """``services=False`` (a worker replica): no connection to the checkpoint and summary
        services, which only the chief uses; sends to them are dropped; ``checkpoint``: a worker of a
        group with the in-memory tier, connected to the checkpoint service only (its snapshots);
        ``remote``: such a worker on host 1..M-1, connected to node 0's service over CURVE."""
        self.clock = clock
        self.zctx: zmq.Context[Any] = zmq.Context()
        # unique per connection, not per process: a session prepared again in the same process (TF's
        # retry loop) is a new trainer to the service, and a pid the kernel reuses names nobody else
        ident = f"trainer-{os.getpid()}-{secrets.token_hex(4)}".encode()
        self.ckpt: Optional[zmq.Socket[Any]] = None
        self.summary: Optional[zmq.Socket[Any]] = None
        self._member_key: Optional[str] = None  # a member of host 1..M-1: the key file it connected with (curve.file_member)
        self._follow: Optional[PeerFollow] = None  # ... and the thread that prepares a restarted service's connection
        self.followed = 0  # how many times it connected to a restarted service (what the dead one never answers)
        self._ident = ident
        if services or checkpoint:
            self.ckpt = make_socket(self.zctx, zmq.DEALER, sndhwm=4, identity=ident, linger_ms=0)
            if checkpoint and not services and remote is not None:  # node 0's service, over CURVE
                layout = remote.layout
                link = curve.member_link(layout, remote.rank, remote.attempt)  # (at the start: before the first step)
                if link is None:  # no service named yet (one restarting): the thread waits for it
                    self.ckpt.close()
                    self.ckpt = None
                else:
                    curve.attach_member(self.ckpt, link)
                    self._member_key = link.path
                self._follow = PeerFollow(layout, link.peer if link is not None else None,
                                          file_member=remote.file_member)
                self._follow.start()
            else:
                self.ckpt.connect(endpoints.checkpoint)
        if services:
            self.summary = make_socket(self.zctx, zmq.DEALER, sndhwm=256, linger_ms=3000)
            self.summary.connect(endpoints.summary)
        self.watchdog: Optional[zmq.Socket[Any]] = None
        if supervised:
            self.watchdog = make_socket(self.zctx, zmq.PUSH, sndhwm=1000, linger_ms=1000)
            self.watchdog.connect(endpoints.watchdog)

    def to_watchdog(self, msg: Message) -> bool:
        return self.watchdog is not None and send(self.watchdog, msg)

    def to_summary(self, msg: Message, payload: Sequence[Any] = ()) -> bool:
        return self.summary is not None and send(self.summary, msg, payload)

    def summary_acks(self, timeout: float = 0.0) -> list[SummaryAck]:
        """The summary service's acks received so far (waiting up to ``timeout`` s for the first)."""
        return read_summary_acks(self.summary, timeout) if self.summary is not None else []

    def setup(self, msg: CheckpointSetup) -> None:
        if self.ckpt is not None:
            send(self.ckpt, msg)

    def send_snapshot(self, msg: SaveData, frames: Sequence[Any], until: Optional[float] = None) -> bool:
        """Hand a snapshot to the checkpoint service; False if its queue is full. With ``until`` (on
        :attr:`clock`: an explicit save) a full queue is waited on until then instead."""
        self._follow_service()
        if self.ckpt is None:
            return False
        while not send(self.ckpt, msg, frames):
            left_ms = 0 if until is None else int((until - self.clock()) * 1000)
            if left_ms <= 0:
                return False
            self.ckpt.poll(min(left_ms, WAIT_SLICE_MS), zmq.POLLOUT)
        return True

    def _follow_service(self) -> None:
        """A member of another host: connect to node 0's restarted checkpoint service once
        :class:`PeerFollow`'s thread has filed a key for it (an attribute read when it has not). Socket
        work only, no file: the old key file is left to that thread to remove."""
        link = self._follow.take() if self._follow is not None else None
        if link is None or self._follow is None:
            return
        restarted = self.ckpt is not None  # (else none was named when this member started)
        if self.ckpt is not None:
            self.ckpt.close(0)
        self.ckpt = make_socket(self.zctx, zmq.DEALER, sndhwm=4, identity=self._ident, linger_ms=0)
        curve.attach_member(self.ckpt, link)  # its key filed already (by the thread, before publishing it)
        self._follow.retire(self._member_key)  # its socket closed: the thread may remove the file now
        self._member_key = link.path
        self.followed += 1
        print(f"procsv: node 0's checkpoint service {'was restarted' if restarted else 'named its endpoint'}; "
              f"this member's in-memory snapshots go to it at {link.peer.endpoint}", file=sys.stderr, flush=True)

    def poll_checkpoint(self, timeout: float = 0.0) -> list[Message]:
        """Every message the checkpoint service has sent, waiting up to ``timeout`` s for the first
        (0: none); malformed ones are dropped. A member of another host follows a restarted service
        here too: a member whose frames are queued for the dead one may have no free slot to take
        (and send) its next snapshot from until ZeroMQ lets go of them."""
        self._follow_service()
        if self.ckpt is None:
            return []
        return [r.msg for r in drain(self.ckpt, first_timeout_ms=max(0, int(timeout * 1000)))
                if not isinstance(r, ProtocolError)]

    def wait_save_result(self, step: int, deadline: float,
                         other: Callable[[Message], None] = lambda msg: None) -> SaveResult:
        """Wait until ``deadline`` (on :attr:`clock`) for the result of the save at ``step``; raise
        :class:`NoReply` if it has not come by then. Other messages meanwhile go to ``other``."""
        if self.ckpt is None:
            raise NoReply("this process is connected to no checkpoint service (a worker replica)")
        while True:
            left_ms = int((deadline - self.clock()) * 1000)
            if left_ms <= 0:
                raise NoReply(f"no result for the checkpoint of step {step} by the deadline")
            try:
                msg = recv_message(self.ckpt, min(left_ms, WAIT_SLICE_MS)).msg
            except (ReceiveTimeout, ProtocolError):
                continue
            if isinstance(msg, SaveResult) and msg.step == step:
                return msg
            other(msg)

    def recover(self, query: RecoverQuery, deadline: float) -> RecoverReply:
        """Ask the checkpoint service to persist a held in-memory snapshot and return its answer;
        raise :class:`NoReply` if none came by ``deadline`` (on :attr:`clock`) or the query could not
        be sent. Other messages meanwhile are dropped (none is expected: this runs before the first
        heartbeat)."""
        return self._ask(query, RecoverReply, deadline, "the recover query",
                         "no answer about a held in-memory snapshot by the deadline")

    def delete_checkpoints(self, query: DeleteCheckpoints, deadline: float) -> CheckpointsDeleted:
        """Ask the checkpoint service (the one writer of checkpoints) to delete every committed
        checkpoint and return its answer; :class:`NoReply` as :meth:`recover`."""
        return self._ask(query, CheckpointsDeleted, deadline, "the request to delete the checkpoints",
                         "no answer from the checkpoint service about deleting the checkpoints by the deadline")

    def ask_group(self, query: Message, deadline: float) -> tuple[Message, list[Any]]:
        """A group member's question about its in-memory snapshots (:class:`GroupQuery`,
        :class:`GroupFetch`): the answer (:class:`GroupHeld`, :class:`GroupCopy`) and its frames;
        :class:`NoReply` as :meth:`recover`. Other messages meanwhile are dropped (this runs before
        the first snapshot)."""
        got = self._ask_for(query, (GroupHeld, GroupCopy), deadline, "the question about the group's snapshots",
                            "no answer about the group's in-memory snapshots by the deadline")
        return got.msg, got.payload

    def _ask(self, query: Message, answer: type[_Answer], deadline: float, what: str, late: str) -> _Answer:
        return cast(_Answer, self._ask_for(query, (answer,), deadline, what, late).msg)  # (the type waited for)

    def _ask_for(self, query: Message, answers: tuple[type[Message], ...], deadline: float, what: str,
                 late: str) -> Received:
        if self.ckpt is None:
            raise NoReply("this process is connected to no checkpoint service (a worker replica)")
        if not send(self.ckpt, query):
            raise NoReply(f"{what} could not be handed to the checkpoint service (queue full)")
        while True:
            left_ms = int((deadline - self.clock()) * 1000)
            if left_ms <= 0:
                raise NoReply(late)
            try:
                got = recv_message(self.ckpt, min(left_ms, WAIT_SLICE_MS))
            except (ReceiveTimeout, ProtocolError):
                continue
            if isinstance(got.msg, answers):
                return got

    def close(self) -> None:
        for sock in (self.ckpt, self.summary, self.watchdog):
            if sock is not None:
                sock.close()
        self.zctx.term()
        for path in self._follow.close() if self._follow is not None else []:
            curve.unfile_agent_key(path)
        self._follow = None
        curve.unfile_agent_key(self._member_key)
        self._member_key = None
