"""Node 0's checkpoint service's CURVE link to the group members of other hosts, with real sockets.

``procsv.services.checkpoint.peers`` and ``procsv.common.curve.connect_member``: a member that
filed its key for the launch hands over a copy and fetches it back through the link; a client
whose key is not filed is never admitted (its copy never arrives); a snapshot to persist is
refused, not committed; ``peer.json`` holds no secret key.
"""

from __future__ import annotations

import os
import time
from typing import Any

import pytest
import zmq

from procsv.common.layout import Layout
from procsv.ipc.messages import GroupCopy, GroupFetch, SaveData, SaveReason, SnapshotHeld, TensorSpec
from procsv.ipc.transport import make_socket, recv_message, send
from procsv.services.checkpoint.group import GroupIntake
from procsv.services.checkpoint.peers import PeerLink
from procsv.common import curve


@pytest.fixture
def link(tmp_path: Any) -> Any:
    layout = Layout(str(tmp_path))
    os.makedirs(layout.meta, exist_ok=True)
    curve.create_job(layout)
    zctx: zmq.Context[Any] = zmq.Context()
    said: list[str] = []
    intake = GroupIntake(lambda identity, msg, frames: None, said.append, PeerLink(zctx, layout, "127.0.0.1"))
    refused: list[Any] = []
    yield layout, zctx, intake, refused
    intake.close()
    zctx.term()


def serve_until(intake: GroupIntake, refused: list[Any], done: Any, secs: float = 10.0) -> None:
    deadline = time.monotonic() + secs
    while not done() and time.monotonic() < deadline:
        if intake.peers is not None and intake.peers.sock.poll(50):
            intake.deliver(refused.append)


def snapshot(**kw: Any) -> SaveData:
    fields: dict[str, Any] = dict(persist=False, member=1, attempt=1)
    fields.update(kw)
    return SaveData(50, SaveReason.MEMORY, "model.ckpt", [TensorSpec("w", "float32", [1])], **fields)


def test_a_member_whose_key_is_filed_hands_over_its_copy_and_fetches_it_back(link: Any) -> None:
    layout, zctx, intake, refused = link
    sock = make_socket(zctx, zmq.DEALER, linger_ms=0)
    key = curve.connect_member(sock, layout, 1, 1)  # member 1's first attempt
    assert key is not None and os.path.basename(key).startswith(curve.MEMBER_PREFIX)
    send(sock, snapshot(), [b"\x01\x02\x03\x04"])
    serve_until(intake, refused, lambda: sock.poll(0))
    held = recv_message(sock, 1000).msg
    assert isinstance(held, SnapshotHeld) and held.step == 50
    assert intake.copies.find(1, 50, 1) is not None and intake.copies.find(1, 50, 1).peer  # type: ignore[union-attr]
    send(sock, GroupFetch(os.getpid(), 1, 50, 1))
    serve_until(intake, refused, lambda: sock.poll(0))
    got = recv_message(sock, 1000)
    assert isinstance(got.msg, GroupCopy) and got.msg.step == 50 and [bytes(f) for f in got.payload] == [b"\x01\x02\x03\x04"]
    send(sock, snapshot(persist=True), [b"\x01\x02\x03\x04"])  # a member of another host never commits
    serve_until(intake, refused, lambda: refused)
    assert len(refused) == 1 and "not a group member's copy" in str(refused[0])
    curve.unfile_agent_key(key)
    assert not os.path.exists(key)
    with open(os.path.join(curve.keys_dir(layout), curve.PEER_FILE)) as fh:
        record = fh.read()
    assert "secret" not in record and curve.load_peer(layout) is not None
    sock.close()


@pytest.mark.slow
def test_a_client_whose_key_is_not_filed_is_never_admitted(link: Any) -> None:
    layout, zctx, intake, refused = link
    peer = curve.load_peer(layout)
    assert peer is not None
    sock = make_socket(zctx, zmq.DEALER, linger_ms=0)
    curve.connect_as_member(sock, curve.AgentKeys.new(), peer)  # a key pair of its own, filed nowhere
    sock.connect(peer.endpoint)
    send(sock, snapshot(), [b"\x01\x02\x03\x04"])
    serve_until(intake, refused, lambda: False, secs=1.5)
    assert intake.copies.held == 0 and not sock.poll(0)
    sock.close()


def test_a_member_key_speaks_only_for_the_rank_it_was_filed_with(link: Any) -> None:
    # a member of host 1 (rank 1, its key filed so) that sends a copy for rank 0 (the chief's, held
    # on node 0) or for a rank of no member would replace the chief's copy of that step, or make the
    # service hold KEEP copies for every rank it names (its memory unbounded): each is refused and
    # counted, and the rank filed with the key still hands over its own copy
    layout, zctx, intake, refused = link
    sock = make_socket(zctx, zmq.DEALER, linger_ms=0)
    try:
        assert curve.connect_member(sock, layout, 1, 1) is not None  # filed as rank 1
        send(sock, snapshot(member=0), [b"\x05\x06\x07\x08"])
        send(sock, snapshot(member=7), [b"\x05\x06\x07\x08"])
        send(sock, GroupFetch(os.getpid(), 0, 50, 1))
        serve_until(intake, refused, lambda: len(refused) >= 3)
        assert intake.copies.held == 0 and intake.copies.by_rank == {}, intake.copies.by_rank
        assert len(refused) == 3 and all("filed" in str(r) for r in refused), refused
        send(sock, snapshot(member=1), [b"\x01\x02\x03\x04"])
        serve_until(intake, refused, lambda: sock.poll(0))
        held = recv_message(sock, 1000).msg
        assert isinstance(held, SnapshotHeld) and intake.copies.find(1, 50, 1) is not None
    finally:
        sock.close()


def test_node_0_removes_the_key_files_of_members_whose_attempt_is_over(tmp_path: Any) -> None:
    # a member SIGKILLed never removes its own key file; node 0 removes those of the attempts before
    # the group's current one, and the one of a member that ended, and nobody else's
    layout = Layout(str(tmp_path))
    os.makedirs(layout.meta, exist_ok=True)
    job = curve.create_job(layout).job
    files = {(rank, attempt): curve.file_member_key(layout, job, curve.AgentKeys.new(), rank, attempt)
             for rank, attempt in ((1, 1), (2, 1), (1, 2), (2, 2), (1, 3), (2, 3))}
    other = curve.file_member_key(layout, "another-job", curve.AgentKeys.new(), 1, 1)  # not this launch's to judge

    assert curve.unfile_members(layout, job, before=3) == 4  # attempt 3 started: 1 and 2 are over
    assert sorted(k for k, path in files.items() if os.path.exists(path)) == [(1, 3), (2, 3)]
    assert curve.unfile_members(layout, job, before=0, rank=2, attempt=3) == 1  # member 2 of attempt 3 ended
    assert [k for k, path in files.items() if os.path.exists(path)] == [(1, 3)] and os.path.exists(other)
    assert not curve.member_over({"rank": 1, "attempt": 4}, before=4)
    assert not curve.member_over({"rank": 1}, before=4)  # no attempt in the body: never removed


def test_the_link_forgets_the_keys_of_members_restarted_long_ago_and_reads_a_live_ones_again(link: Any) -> None:
    # every restart of a member of another host files a new key; a month-long run restarts them
    # thousands of times, and the link used to remember every key's rank for the rest of the launch
    from procsv.services.checkpoint.peers import KEYS_REMEMBERED

    layout, zctx, intake, refused = link
    job = curve.load_job(layout)
    assert job is not None
    keys = [curve.AgentKeys.new() for _ in range(3 * KEYS_REMEMBERED)]
    paths = [curve.file_member_key(layout, job.job, k, rank=1 + i % 2, attempt=1 + i) for i, k in enumerate(keys)]
    for i, k in enumerate(keys):
        assert intake.peers.rank_of(k.public.decode("ascii")) == 1 + i % 2  # type: ignore[union-attr]
    assert len(intake.peers._ranks) <= KEYS_REMEMBERED  # type: ignore[union-attr]
    os.unlink(paths[0])  # the first member's attempt is over: its key, forgotten, is read again and refused
    assert intake.peers.rank_of(keys[0].public.decode("ascii")) is None  # type: ignore[union-attr]
    assert intake.peers.rank_of(keys[1].public.decode("ascii")) == 2  # type: ignore[union-attr]
