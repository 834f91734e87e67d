"""A member of another host follows node 0's restarted checkpoint service off its step path.

``procsv.trainer.remote.peer_follow`` and ``procsv.trainer.channels``, with real files, a real
thread and real CURVE sockets: ``peer.json`` replaced by a named pipe with no writer (its ``open()`` blocks, as
a read of a stalled NFS logdir does) never stops the member's step path (its hand-overs and reads
of the service); once the logdir answers again the member follows the restarted service, its new
key filed before it connects, the old one removed. The thread's bookkeeping of key files: a
connection superseded before the trainer took it, one prepared after the channels closed, a key that
could not be filed (tried again).
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from typing import Any

import pytest
import zmq

from procsv.common import curve
from procsv.common.layout import Layout
from procsv.ipc.transport import Endpoints
from procsv.services.checkpoint.group import GroupIntake
from procsv.services.checkpoint.peers import PeerLink
from procsv.trainer.channels import RemoteMember, TrainerChannels
from procsv.trainer.remote.peer_follow import PeerFollow
from test_group_peers import link, serve_until, snapshot

__all__ = ["link"]  # a fixture, used by name

FRAMES = [b"\x01\x02\x03\x04"]


def member_keys(layout: Layout) -> set[str]:
    folder = curve.keys_dir(layout)
    return {os.path.join(folder, n) for n in os.listdir(folder) if n.startswith(curve.MEMBER_PREFIX)}


def unblock(fifo: str) -> None:
    """Let an ``open()`` blocked on the named pipe ``fifo`` return (it then reads nothing)."""
    try:
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    except OSError:  # ENXIO: nobody is blocked on it
        pass


@pytest.mark.slow
def test_peer_json_blocking_never_stops_the_step_path_and_the_member_follows_once_it_answers(
        link: Any, tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    layout, zctx, intake, refused = link
    remote = RemoteMember(layout, 1, 1)  # a member of host 1: rank 1's first attempt (node 0's StartMembers)
    ch = TrainerChannels(Endpoints(str(tmp_path)), supervised=False, services=False, checkpoint=True, remote=remote)
    first_keys = member_keys(layout)
    assert len(first_keys) == 1
    assert ch.send_snapshot(snapshot(), FRAMES)
    serve_until(intake, refused, lambda: intake.copies.find(1, 50, 1) is not None)
    assert intake.copies.find(1, 50, 1) is not None
    intake.close()  # node 0's service SIGKILLed

    peer_json = os.path.join(curve.keys_dir(layout), curve.PEER_FILE)
    fifo = str(tmp_path / "stalled-peer.json")  # the same pipe by another name: unblocked through it
    os.unlink(peer_json)
    os.mkfifo(peer_json, 0o600)
    os.link(peer_json, fifo)

    steps, stop = [0], threading.Event()

    def train() -> None:  # the trainer's step boundaries: read the service, hand over a snapshot
        while not stop.is_set():
            ch.poll_checkpoint()
            ch.send_snapshot(dataclasses.replace(snapshot(), step=100 + steps[0]), FRAMES)
            steps[0] += 1
            time.sleep(0.005)

    trainer = threading.Thread(target=train, daemon=True)
    other: zmq.Context[Any] = zmq.Context()  # the new service is a new process: a context of its own
    again = None
    try:
        trainer.start()
        time.sleep(1.0)  # open() of the pipe blocks: whoever reads peer.json now is stuck on it
        before = steps[0]
        time.sleep(1.5)
        stalled = steps[0] - before
        assert stalled >= 20, f"the step path advanced {stalled} steps in 1.5 s while peer.json's read blocked"
        assert ch.followed == 0

        again = GroupIntake(lambda identity, msg, frames: None, lambda line: None, PeerLink(other, layout, "127.0.0.1"))
        unblock(fifo)  # the logdir answers again; peer.json names the restarted service
        serve_until(again, refused, lambda: again is not None and bool(again.copies.by_rank.get(1)), secs=10.0)
        assert again.copies.by_rank.get(1), "the member's copies never reached the restarted service"
        assert ch.followed == 1
        deadline = time.monotonic() + 5  # the thread removes the old key file once the old socket is closed
        while member_keys(layout) & first_keys and time.monotonic() < deadline:
            time.sleep(0.05)
        keys = member_keys(layout)
        assert not keys & first_keys, "the key filed for the dead service is still filed"
        assert len(keys) == 1, keys
        assert not refused, refused
    finally:
        stop.set()
        unblock(fifo)
        trainer.join(10)
        ch.close()
        if again is not None:
            again.close()
        other.term()
    assert not trainer.is_alive()
    assert not member_keys(layout), "a key file outlived the member's channels"


PUBLIC = [zmq.curve_keypair()[0] for _ in range(6)]


def peer_at(n: int) -> curve.Peer:
    """The ``n``-th service of a launch (a new port and a new key at each restart)."""
    return curve.Peer("job1", f"tcp://127.0.0.1:{5000 + n}", PUBLIC[n])


def test_the_threads_key_files_a_superseded_connection_a_late_one_and_a_failing_logdir(tmp_path: Any) -> None:
    layout = Layout(str(tmp_path))
    os.makedirs(curve.keys_dir(layout), mode=0o700)
    failures = [OSError(28, "No space left on device")]

    def file_once_failing(layout: Layout, peer: curve.Peer) -> curve.MemberLink:
        if failures:
            raise failures.pop()
        return curve.file_member(layout, peer, 0, 1)  # member 0, attempt 1

    follow = PeerFollow(layout, peer_at(1), file_member=file_once_failing)  # driven by hand: not started
    follow.look()
    assert follow.take() is None  # peer.json names no other service (none at all)
    curve.write_peer(layout, peer_at(2))
    follow.look()  # the logdir failing: nothing prepared, tried again at the next look
    assert follow.ready is None and not member_keys(layout)
    follow.look()
    b = follow.ready
    assert b is not None and b.peer == peer_at(2) and member_keys(layout) == {b.path}
    follow.look()
    assert follow.ready is b  # the same service: nothing new
    curve.write_peer(layout, peer_at(3))
    follow.look()  # restarted again before the trainer took b: b's key (never connected) removed
    c = follow.take()
    assert c is not None and c.peer == peer_at(3) and member_keys(layout) == {c.path}
    assert follow.take() is None
    follow.retire(c.path)  # the trainer closed c's socket: removed at the next look
    follow.look()
    assert not member_keys(layout)
    curve.write_peer(layout, peer_at(4))
    follow.look()
    d = follow.ready
    assert d is not None
    assert follow.close() == [d.path]  # never taken: the closing channels remove it
    curve.unfile_agent_key(d.path)
    curve.write_peer(layout, peer_at(5))
    follow.look()  # a key the thread files after the close removes itself
    assert follow.ready is None and not member_keys(layout)


def test_the_copy_the_dead_service_never_acknowledged_is_handed_to_the_restarted_one(
        link: Any, tmp_path: Any, monkeypatch: pytest.MonkeyPatch, capfd: Any) -> None:
    """A member's copy of step 50 reached node 0's service, which was SIGKILLed before it answered:
    once the member follows the restarted service, that copy (still whole in its slot) is handed to
    the new one. Before, it was counted as lost, and a member killed before its next copy restored
    an interval further back (or from disk)."""
    import tensorflow as tf

    from procsv.trainer.checkpoint.agent import CheckpointAgent
    from procsv.trainer.checkpoint.snapshot import arena_bytes_needed

    layout, zctx, intake, refused = link
    remote = RemoteMember(layout, 1, 1)  # a member of host 1: rank 1's first attempt (node 0's StartMembers)
    step_var = tf.Variable(0, dtype=tf.int64)
    w = tf.Variable(tf.reshape(tf.range(64 * 64, dtype=tf.float32), [64, 64]))
    ckpt = tf.train.Checkpoint(w=w, step=step_var)
    agent = CheckpointAgent(ckpt, step_var, layout, basename="model.ckpt", save_model_secs=None,
                            save_checkpoint_steps=None, max_to_keep=5, keep_checkpoint_every_n_hours=None,
                            clock=time.monotonic, memory_budget=0.01, saving=False, group=(1, 1, 50), remote=True)
    agent.store.arena_for(arena_bytes_needed(ckpt))
    assert agent.memory.remote
    ch = TrainerChannels(Endpoints(str(tmp_path)), supervised=False, services=False, checkpoint=True, remote=remote)
    other: zmq.Context[Any] = zmq.Context()  # the new service is a new process: a context of its own
    again = None
    try:
        step_var.assign(50)
        assert agent.memory_due(50, time.monotonic()) and agent.memory_snapshot(ch, 50)
        assert agent.store.slots.unacked is not None and agent.store.slots.unacked[1] == 50
        w.assign(tf.zeros([64, 64]))  # the model trains on: the copy is of its slot, not of the variables
        intake.close()  # node 0's service SIGKILLed before it answered
        again = GroupIntake(lambda identity, msg, frames: None, lambda line: None, PeerLink(other, layout, "127.0.0.1"))
        deadline, step = time.monotonic() + 10, 51
        while again.copies.find(1, 50, 1) is None and time.monotonic() < deadline:  # the member's step boundaries
            agent.poll(ch, step, time.monotonic())
            serve_until(again, refused, lambda: False, secs=0.02)
            step += 1
        assert ch.followed == 1
        copy = again.copies.find(1, 50, 1)
        assert copy is not None, "the copy the dead service never acknowledged did not reach the restarted one"
        assert not copy.problem(), copy.problem()
        got = {t.key: i for i, t in enumerate(copy.specs)}
        weights = [k for k in got if k.startswith("w/")]
        assert len(weights) == 1, got
        assert bytes(copy.frames[got[weights[0]]]) == tf.reshape(tf.range(64 * 64, dtype=tf.float32), [64, 64]).numpy().tobytes()
        while agent.store.slots.held != 50 and time.monotonic() < deadline:  # the new service's acknowledgment
            agent.poll(ch, step, time.monotonic())
            serve_until(again, refused, lambda: False, secs=0.02)
            step += 1
        assert agent.store.slots.held == 50 and agent.store.slots.unacked is None
        assert not refused, refused
        err = capfd.readouterr().err
        assert err.count("member 1's copy of step 50 went to node 0's checkpoint service before it was restarted") == 1, err
    finally:
        ch.close()
        if again is not None:
            again.close()
        other.term()


def test_a_slot_rewritten_by_a_refused_copy_is_never_handed_to_the_restarted_service(
        link: Any, tmp_path: Any, monkeypatch: pytest.MonkeyPatch, capfd: Any) -> None:
    """``--on-nonfinite continue``: the member's copy of step 50 reached node 0's service, which was
    SIGKILLed before it answered; past the acknowledgment's grace its slot was free, and the next
    copy (step 70, non-finite: refused after it was copied) was written over it. Once the member
    follows the restarted service, that slot no longer holds step 50: nothing is handed over as
    step 50. Before, the slot's bytes (step 70's non-finite state) went to the new service as the
    copy of step 50, and a group restarted restored them."""
    import numpy as np
    import tensorflow as tf

    from procsv.common.errors import NonFiniteState
    from procsv.trainer.checkpoint.agent import CheckpointAgent
    from procsv.trainer.checkpoint.memory_tier import UNACKED_GRACE
    from procsv.trainer.checkpoint.snapshot import arena_bytes_needed
    from procsv.trainer.nonfinite.watch import NonfiniteWatch

    layout, zctx, intake, refused = link
    remote = RemoteMember(layout, 1, 1)  # a member of host 1: rank 1's first attempt (node 0's StartMembers)
    skew = [0.0]  # the trainer's clock: moved past the acknowledgment's grace

    def clock() -> float:
        return time.monotonic() + skew[0]

    step_var = tf.Variable(0, dtype=tf.int64)
    w = tf.Variable(tf.reshape(tf.range(64 * 64, dtype=tf.float32), [64, 64]))
    ckpt = tf.train.Checkpoint(w=w, step=step_var)
    agent = CheckpointAgent(ckpt, step_var, layout, basename="model.ckpt", save_model_secs=None,
                            save_checkpoint_steps=None, max_to_keep=5, keep_checkpoint_every_n_hours=None,
                            clock=clock, memory_budget=0.01, saving=False, group=(1, 1, 50), remote=True)
    agent.store.arena_for(arena_bytes_needed(ckpt))
    agent.store.watch = NonfiniteWatch("continue", (), ())
    ch = TrainerChannels(Endpoints(str(tmp_path)), supervised=False, services=False, checkpoint=True, clock=clock,
                         remote=remote)
    other: zmq.Context[Any] = zmq.Context()  # the new service is a new process: a context of its own
    again = None
    slots = agent.store.slots
    try:
        step_var.assign(40)
        assert agent.memory_snapshot(ch, 40)  # held by the service: its slot is kept
        serve_until(intake, refused, lambda: intake.copies.find(1, 40, 1) is not None)
        deadline = time.monotonic() + 10
        while slots.held != 40 and time.monotonic() < deadline:
            agent.poll(ch, 41, clock())
            time.sleep(0.02)
        assert slots.held == 40
        step_var.assign(50)
        assert agent.memory_snapshot(ch, 50)
        slot50 = slots.unacked[0] if slots.unacked is not None else -1
        while slots.sending and time.monotonic() < deadline:  # written to the service's socket: let go
            agent.memory.reap_sends()
            time.sleep(0.02)
        assert not slots.sending
        intake.close()  # node 0's service SIGKILLed before it answered
        skew[0] += UNACKED_GRACE + 1  # step 50's slot is free again
        step_var.assign(60)
        assert not agent.memory_snapshot(ch, 60, unwritten_from=60)  # copied, waits for its summaries
        assert slots.waiting is not None and slots.waiting[0] != slot50
        step_var.assign(70)
        w.assign(tf.fill([64, 64], float("nan")))
        with pytest.raises(NonFiniteState):  # copied over step 50's slot, then refused
            agent.memory_snapshot(ch, 70)
        assert slots.unacked is not None and slots.unacked[:2] == (slot50, 50)

        again = GroupIntake(lambda identity, msg, frames: None, lambda line: None, PeerLink(other, layout, "127.0.0.1"))
        step = 71
        while ch.followed == 0 and time.monotonic() < deadline:  # the member's step boundaries
            agent.poll(ch, step, clock())
            serve_until(again, refused, lambda: False, secs=0.02)
            step += 1
        assert ch.followed == 1
        for _ in range(10):
            agent.poll(ch, step, clock())
            serve_until(again, refused, lambda: False, secs=0.02)
            step += 1
        copy = again.copies.find(1, 50, 1)
        if copy is not None:
            got = {t.key: i for i, t in enumerate(copy.specs)}
            weights = np.frombuffer(bytes(copy.frames[got[next(k for k in got if k.startswith("w/"))]]), np.float32)
            assert np.isfinite(weights).all(), "step 70's refused, non-finite copy reached the restarted service as step 50's"
        assert "handed to the restarted one" not in capfd.readouterr().err
        assert slots.unacked is None  # the dead service's acknowledgment is no longer awaited
    finally:
        ch.close()
        if again is not None:
            again.close()
        other.term()


def test_a_member_started_while_no_service_is_named_hands_its_copies_over_once_one_is(
        link: Any, tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    # node 0's service restarting when the member starts: peer.json names none yet. Before, that member
    # handed over no copy for its whole attempt (its follow thread was never started)
    layout, zctx, intake, refused = link
    remote = RemoteMember(layout, 1, 1)  # a member of host 1: rank 1's first attempt (node 0's StartMembers)
    peer_json = os.path.join(curve.keys_dir(layout), curve.PEER_FILE)
    with open(peer_json, "rb") as fh:
        named = fh.read()
    os.unlink(peer_json)
    ch = TrainerChannels(Endpoints(str(tmp_path)), supervised=False, services=False, checkpoint=True, remote=remote)
    try:
        assert not ch.send_snapshot(snapshot(), FRAMES) and not member_keys(layout)
        with open(peer_json + ".tmp", "wb") as fh:  # the service names itself (atomically, as it does)
            fh.write(named)
        os.rename(peer_json + ".tmp", peer_json)
        deadline = time.monotonic() + 10
        step = 50
        while intake.copies.find(1, step, 1) is None and time.monotonic() < deadline:
            step += 1
            ch.send_snapshot(dataclasses.replace(snapshot(), step=step), FRAMES)
            serve_until(intake, refused, lambda: intake.copies.find(1, step, 1) is not None, secs=0.3)
        assert intake.copies.find(1, step, 1) is not None, "the member never handed a copy to the service named late"
        assert ch.followed == 1 and len(member_keys(layout)) == 1 and not refused
    finally:
        ch.close()
    assert not member_keys(layout)
