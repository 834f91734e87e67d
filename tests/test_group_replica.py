"""Node 1's replica of node 0's group copies, with real sockets and the real holder thread.

``procsv.services.checkpoint.replica`` and ``procsv.watchdog.multihost.holder``: a copy a member
hands node 0's checkpoint service reaches node 1's holder; a new service (a new ``peer.json``, as
the watchdog's restart of a SIGKILLed one writes) gets it back from the holder, checksum intact,
marked as held on node 1; a member's key cannot pose as the holder, nor the holder's as a member;
a copy handed back never pushes out a newer one held already.
"""

from __future__ import annotations

import dataclasses
import gc
import os
import time
import tracemalloc
from typing import Any

import zmq

import pytest

from procsv.common import curve
from procsv.common.layout import Layout
from procsv.ipc.codec import ProtocolError
from procsv.ipc.messages import ReplicaCopy, ReplicaHello, SnapshotHeld, TensorSpec
from procsv.ipc.transport import CHECKPOINT_FRAME_MAX, drain, make_socket, recv_message, send
from procsv.services.checkpoint.group import KEEP, GroupCopies, GroupIntake, MemberCopy, checksum
from procsv.ipc.transport import Endpoints
from procsv.services.checkpoint.peers import PeerLink
from procsv.trainer.channels import RemoteMember, TrainerChannels
from procsv.watchdog.multihost.holder import Holder
from test_group_peers import link, serve_until, snapshot

__all__ = ["link"]  # a fixture, used by name

FRAMES = [b"\x01\x02\x03\x04"]


def test_a_copy_reaches_node_1s_holder_and_comes_back_to_a_restarted_service(link: Any) -> None:
    layout, zctx, intake, refused = link
    holder = Holder(layout, 1)
    holder.start()
    sock = make_socket(zctx, zmq.DEALER, linger_ms=0)
    again = None
    other: zmq.Context[Any] = zmq.Context()  # the new service is a new process: a context of its own
    try:
        serve_until(intake, refused, lambda: intake.replica is not None and intake.replica.holder is not None)
        assert intake.replica is not None and intake.replica.holder is not None, "the holder never said hello"
        key = curve.connect_member(sock, layout, 1, 1)
        send(sock, snapshot(), FRAMES)
        serve_until(intake, refused, lambda: bool(holder.held()))
        curve.unfile_agent_key(key)
        [held] = holder.held()
        assert (held.msg.rank, held.msg.attempt, held.msg.step, held.frames) == (1, 1, 50, tuple(FRAMES))
        assert held.msg.crc == checksum(tuple(FRAMES))  # node 0's checksum, carried along
        intake.close()  # the service dies; the watchdog's new one writes a new peer.json
        said: list[str] = []
        again = GroupIntake(lambda identity, msg, frames: None, said.append, PeerLink(other, layout, "127.0.0.1"))
        serve_until(again, refused, lambda: again is not None and again.copies.find(1, 50, 1) is not None)
        back = again.copies.find(1, 50, 1)
        assert back is not None and back.node == 1 and back.peer and back.problem() == "", back
        assert back.frames == tuple(FRAMES) and back.crc == held.msg.crc
        assert any("node 1's holder handed back 1 group copies" in line for line in said), said
        assert not refused, refused
    finally:
        sock.close(0)
        if again is not None:
            again.close()
        other.term()
        holder.stop()


def connect_as_the_holder(layout: Layout, sock: Any) -> str:
    """Connect ``sock`` to node 0's checkpoint service (its ``peer.json`` in ``layout``) with new
    keys filed as node 1's holder's; the key file's path (to unfile)."""
    peer = curve.load_peer(layout)
    assert peer is not None
    keys = curve.AgentKeys.new()
    path = curve.file_holder_key(layout, peer.job, keys, 1)
    curve.connect_as_member(sock, keys, peer)
    sock.connect(peer.endpoint)
    return path


def test_a_members_key_cannot_pose_as_the_holder_nor_the_holders_as_a_member(link: Any) -> None:
    layout, zctx, intake, refused = link
    member = make_socket(zctx, zmq.DEALER, linger_ms=0)
    posing = make_socket(zctx, zmq.DEALER, linger_ms=0)
    try:
        key = curve.connect_member(member, layout, 1, 1)
        send(member, ReplicaHello(1, os.getpid(), 0))
        spec = [TensorSpec("w", "float32", [1])]
        send(member, ReplicaCopy(0, 1, 50, spec, checksum(tuple(FRAMES))), FRAMES)
        serve_until(intake, refused, lambda: len(refused) >= 2)
        assert len(refused) == 2 and intake.replica is not None and intake.replica.holder is None, refused
        assert intake.copies.find(0, 50, 1) is None
        curve.unfile_agent_key(key)
        path = connect_as_the_holder(layout, posing)
        send(posing, snapshot(member=1), FRAMES)  # the holder's key speaks for no member
        serve_until(intake, refused, lambda: len(refused) >= 3)
        assert len(refused) == 3 and intake.copies.find(1, 50, 1) is None, refused
        curve.unfile_agent_key(path)
    finally:
        member.close(0)
        posing.close(0)


def copy(step: int, attempt: int = 1, node: Any = None) -> MemberCopy:
    frames = (step.to_bytes(4, "little"),)
    return MemberCopy(0, attempt, step, (TensorSpec("w", "float32", [1]),), frames, checksum(frames), node is not None, node)


def test_a_copy_handed_back_never_pushes_out_a_newer_one() -> None:
    held = GroupCopies()
    for step in (400, 450, 500):
        held.hold(copy(step, attempt=2))
    held.take_back(copy(350, attempt=1, node=1))  # older than all KEEP held: not kept
    assert [c.step for c in held.by_rank[0]] == [400, 450, 500]
    held = GroupCopies()
    held.hold(copy(400))
    for step in (250, 300, 350):
        held.take_back(copy(step, node=1))
    assert [c.step for c in held.by_rank[0]] == [300, 350, 400] and len(held.by_rank[0]) == KEEP
    assert held.by_rank[0][0].name() == "member 0's in-memory copy of step 300 held on node 1"


@pytest.mark.slow
def test_a_holder_that_does_not_read_pins_no_more_copies_than_the_service_holds(link: Any) -> None:
    """Node 1's agent SIGSTOPped (or its link lost): node 0's service keeps acknowledging its
    members and holds its KEEP copies, but queues no more copies for the holder than it holds;
    once the holder reads again, the next copy reaches it."""
    layout, zctx, intake, refused = link
    member = make_socket(zctx, zmq.DEALER, linger_ms=0)
    stalled = make_socket(zctx, zmq.DEALER, linger_ms=0, max_frame=CHECKPOINT_FRAME_MAX)
    stalled.setsockopt(zmq.RCVHWM, 1)
    stalled.setsockopt(zmq.RCVBUF, 4096)
    big = 1 << 20
    try:
        path = connect_as_the_holder(layout, stalled)
        send(stalled, ReplicaHello(1, os.getpid(), 0))
        serve_until(intake, refused, lambda: intake.replica is not None and intake.replica.holder is not None)
        replica = intake.replica
        assert replica is not None and replica.holder is not None
        key = curve.connect_member(member, layout, 1, 1)
        gc.collect()
        tracemalloc.start()
        try:
            base = tracemalloc.get_traced_memory()[0]
            for i in range(40):
                send(member, dataclasses.replace(snapshot(), step=100 + i), [bytes([i]) * big])
                serve_until(intake, refused, lambda: member.poll(0))
                assert member.poll(0) and isinstance(recv_message(member, 0).msg, SnapshotHeld), f"copy {i} unacknowledged"
            gc.collect()
            pinned = tracemalloc.get_traced_memory()[0] - base
        finally:
            tracemalloc.stop()
        # KEEP copies held, and as many at most queued for the holder (plus slack for the codec)
        assert pinned < (2 * KEEP + 2) * big, f"{pinned / big:.1f} MiB pinned for a holder that does not read"
        assert replica.sent + replica.skipped == 40 and replica.skipped > 0, replica.stats()
        got: list[int] = []
        sent_before = replica.sent

        def reads() -> bool:
            got.extend(r.msg.step for r in drain(stalled, limit=64) if not isinstance(r, ProtocolError)
                       and isinstance(r.msg, ReplicaCopy))
            return bool(got) and got[-1] == 200 and replica.sent > sent_before

        deadline = time.monotonic() + 20
        while not reads() and time.monotonic() < deadline:  # the holder reads again; new copies reach it
            send(member, dataclasses.replace(snapshot(), step=200), [b"\x07" * 16])
            serve_until(intake, refused, lambda: member.poll(0), secs=0.2)
            drain_all(member)
        assert got and got[-1] == 200, got
        curve.unfile_agent_key(key)
        curve.unfile_agent_key(path)
    finally:
        member.close(0)
        stalled.close(0)


def drain_all(sock: Any) -> None:
    for _ in drain(sock, limit=64):
        pass


def test_a_member_of_another_host_follows_node_0s_restarted_service(link: Any, tmp_path: Any,
                                                                     monkeypatch: Any) -> None:
    """Node 0's service SIGKILLed and restarted (a new peer.json): a running member of host 1
    lets go of the frames queued for the dead service (its slots) as soon as it reads the service's
    answers, and hands its next copies to the new service, not to the dead one's port until its
    next attempt."""
    layout, zctx, intake, refused = link
    remote = RemoteMember(layout, 1, 1)  # a member of host 1: rank 1's first attempt (node 0's StartMembers)
    now = [0.0]
    ch = TrainerChannels(Endpoints(str(tmp_path)), supervised=False, clock=lambda: now[0], services=False,
                         checkpoint=True, remote=remote)
    other: zmq.Context[Any] = zmq.Context()  # the new service is a new process: a context of its own
    again = None
    try:
        assert ch.send_snapshot(snapshot(), FRAMES)
        serve_until(intake, refused, lambda: intake.copies.find(1, 50, 1) is not None)
        assert intake.copies.find(1, 50, 1) is not None
        assert ch.ckpt is not None
        watch = ch.ckpt.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        intake.close()
        # until ZeroMQ has seen the service's end, a send may still be written to its socket (the frames
        # then let go at once): wait for it, as a member does in fact (a SIGKILL is seen at once)
        assert watch.poll(5000), "the member's socket never saw the service's end"
        ch.ckpt.disable_monitor()
        watch.close(0)
        queued = []  # the trackers of uncopied frames the dead service never takes (those its queue took)
        for i in range(8):
            frame = zmq.Frame(b"\x05" * 16, copy=False, track=True)
            if ch.send_snapshot(dataclasses.replace(snapshot(), step=60 + i), [frame]):
                queued.append(frame.tracker)
            del frame
        assert queued and not all(t.done for t in queued)
        again = GroupIntake(lambda identity, msg, frames: None, lambda line: None, PeerLink(other, layout, "127.0.0.1"))
        now[0] += 1.0
        deadline = time.monotonic() + 5  # no snapshot sent: the member only reads the service's answers
        while not all(t.done for t in queued) and time.monotonic() < deadline:
            ch.poll_checkpoint(timeout=0.05)
        assert all(t.done for t in queued), "ZeroMQ still holds frames for the dead service"
        for i in range(5):  # the member's next snapshots, a second apart
            now[0] += 1.0
            ch.send_snapshot(dataclasses.replace(snapshot(), step=100 + i), FRAMES)
            serve_until(again, refused, lambda: again is not None and again.copies.find(1, 100 + i, 1) is not None,
                        secs=2.0)
            ch.poll_checkpoint()
        held = sorted(c.step for c in again.copies.by_rank.get(1, []))
        assert held and held[-1] == 104, f"the restarted service holds {held} of the member's copies"
        assert not refused, refused
    finally:
        ch.close()
        if again is not None:
            again.close()
        other.term()


@pytest.mark.slow
def test_the_holder_retries_after_its_key_could_not_be_filed_and_keeps_replicating(link: Any,
                                                                                   monkeypatch: Any) -> None:
    """The logdir failing once (the holder's key not filed: the disk full) costs node 1's replica a
    retry, not the rest of the launch."""
    layout, zctx, intake, refused = link
    filed = curve.file_holder_key
    failures = [OSError(28, "No space left on device")]

    def file_once_failing(*args: Any) -> str:
        if failures:
            raise failures.pop()
        return filed(*args)

    monkeypatch.setattr(curve, "file_holder_key", file_once_failing)
    holder = Holder(layout, 1)
    holder.start()
    try:
        serve_until(intake, refused, lambda: intake.replica is not None and intake.replica.holder is not None,
                    secs=15.0)
        assert not failures, "the holder never tried"
        assert intake.replica is not None and intake.replica.holder is not None, "the holder never said hello again"
    finally:
        holder.stop()
