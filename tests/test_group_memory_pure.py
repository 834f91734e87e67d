"""The checkpoint service's copies of a trainer group's in-memory snapshots, without processes.

``procsv.services.checkpoint.group``: which step is whole for the group (held for every member of
one attempt, each copy matching its checksum, newer than the newest commit), and why not.
"""

from __future__ import annotations

import dataclasses

from procsv.ipc.messages import SaveData, SaveReason, TensorSpec
from procsv.services.checkpoint.group import KEEP, GroupCopies, MemberCopy, checksum, copy_out
from procsv.trainer.checkpoint.memory_tier import Slots


def copy(rank: int, step: int, attempt: int = 1, data: bytes = b"\x01\x02\x03\x04") -> MemberCopy:
    frames = (data, b"graph")
    specs = (TensorSpec("w", "float32", [1]), TensorSpec("_CHECKPOINTABLE_OBJECT_GRAPH", "string", [], [5]))
    return MemberCopy(rank, attempt, step, specs, frames, checksum(frames))


def test_the_newest_step_held_for_every_member_is_whole_not_the_newest_of_one_member():
    held = GroupCopies()
    for rank, step in ((0, 50), (1, 50), (0, 100), (1, 100), (0, 150)):  # worker1 died before handing 150 over
        held.hold(copy(rank, step))
    assert held.whole(2, after=-1) == (100, 1, "")
    assert held.whole(2, after=100) == (-1, 0, "no step newer than 100 is held for all 2 members")
    assert held.whole(2, after=150)[0] == -1 and "none is newer than the committed checkpoint of step 150" in \
        held.whole(2, after=150)[2]


def test_a_rollbacks_query_is_answered_the_newest_whole_step_before_the_rolled_back_one():
    # a group started to roll back step 110 while a bound of 70 still holds (a checkpoint holding step 70's
    # update on disk): before, the newest whole step (100) was answered, the chief found it "not before step
    # 70" and passed over every copy, the whole copy of 50 too, restoring from disk (from step 0 if nothing)
    held = GroupCopies()
    for rank, step, attempt in ((0, 50, 1), (1, 50, 1), (0, 100, 2), (1, 100, 2)):
        held.hold(copy(rank, step, attempt))
    assert held.whole(2, after=-1, before=70) == (50, 1, "")
    assert held.whole(2, after=-1, before=110) == (100, 2, "")
    assert held.whole(2, after=-1, before=100) == (50, 1, "")  # (a copy of the rolled-back step holds its update)
    assert held.whole(2, after=50, before=70) == \
        (-1, 0, "none between the committed checkpoint of step 50 and step 70, which it rolls back")
    assert held.whole(2, after=-1) == (100, 2, "")  # no rollback: the newest


def test_a_step_is_whole_only_within_one_attempt_and_only_the_last_copies_of_a_member_are_kept():
    held = GroupCopies()
    held.hold(copy(0, 100, attempt=2))
    held.hold(copy(1, 100, attempt=1))  # the same step of another attempt: never mixed
    assert held.whole(2, after=-1)[0] == -1
    for step in range(1, KEEP + 2):
        held.hold(copy(0, step * 1000))
    assert [c.step for c in held.by_rank[0]] == [(i + 2) * 1000 for i in range(KEEP)]


def test_a_damaged_copy_makes_the_group_restore_from_disk_and_says_which_member():
    held = GroupCopies()
    held.hold(copy(0, 50))
    good = copy(1, 50)
    held.hold(dataclasses.replace(good, frames=(b"\x01\x02\x03\x05", b"graph")))  # a bit flipped after its checksum
    step, _, note = held.whole(2, after=-1)
    assert step == -1 and note.startswith("member 1's in-memory copy of step 50 is damaged")
    assert GroupCopies().whole(2, after=-1) == (-1, 0, "no in-memory snapshot of the group is held")


def test_a_copy_out_of_a_members_message_takes_its_frames_and_its_checksum():
    msg = SaveData(50, SaveReason.MEMORY, "model.ckpt", [TensorSpec("s", "string", [1], [3])], persist=False,
                   member=1, attempt=2)
    got = copy_out(msg, [b"abc"], None)
    assert (got.rank, got.attempt, got.step, got.frames, got.problem()) == (1, 2, 50, (b"abc",), "")


def test_a_walk_of_mirrored_variables_is_reused_and_reads_their_live_values():
    # under a tf.distribute strategy a Keras 3 variable's SaveSpec holds the MirroredVariable itself: a
    # walk of the object graph was never reused (5-20 ms of every group member's in-memory snapshot)
    import numpy as np
    import tensorflow as tf

    from procsv.examples.digits import build_model
    from procsv.trainer.checkpoint.snapshot import plan

    with tf.distribute.MirroredStrategy(["/cpu:0"]).scope():
        model, optimizer, _ = build_model()
    ckpt = tf.train.Checkpoint(model=model, optimizer=optimizer, global_step=tf.Variable(0, dtype=tf.int64))
    walked = plan(ckpt)
    assert walked.reusable
    kernel = model.trainable_variables[0]
    kernel.assign(tf.ones_like(kernel))  # after the walk: a reused walk reads what the variable holds now
    read = {key: np.asarray(reader()) for key, reader in walked.readers}
    assert any(v.shape == tuple(kernel.shape) and np.array_equal(v, np.ones(kernel.shape)) for v in read.values())


def test_a_damaged_peer_copy_is_named_a_peer_copy_and_the_answer_says_when_a_peer_copy_is_in_the_step():
    # --nnodes: node 0's service holds host 1's member's copies as its peer copies (issue 54 point 2)
    held = GroupCopies()
    held.hold(copy(0, 50))
    held.hold(dataclasses.replace(copy(1, 50), peer=True))
    assert held.whole(2, after=-1) == (50, 1, "") and held.peer_in(2, 50, 1)
    assert not held.peer_in(1, 50, 1)  # the chief's own copy is its host's
    held.hold(copy(0, 100))
    held.hold(dataclasses.replace(copy(1, 100), peer=True, frames=(b"\x01\x02\x03\x05", b"graph")))
    step, _, note = held.whole(2, after=-1)
    assert step == -1 and note.startswith("member 1's peer copy of step 100 is damaged"), note


def test_a_peer_copy_goes_uncopied_every_tensor_a_frame_of_its_own_in_order():
    import numpy as np
    import zmq

    from procsv.trainer.checkpoint.peer_copy import frames as peer_frames

    memory = np.arange(64, dtype=np.uint8)
    specs = [TensorSpec("w", "float32", [2], None, 8), TensorSpec("s", "string", [1], [3]),
             TensorSpec("b", "int64", [1], None, 40)]
    got_specs, frames = peer_frames(specs, [b"abc", b"meta"], memory)
    assert [s.offset for s in got_specs] == [None] * 3 and [s.key for s in got_specs] == ["w", "s", "b"]
    assert [bytes(f) for f in frames] == [memory[8:16].tobytes(), b"abc", memory[40:48].tobytes(), b"meta"]
    # the tensors' frames are the snapshot memory itself, not copies of it
    assert isinstance(frames[0], zmq.Frame)
    assert np.frombuffer(frames[0].buffer, np.uint8).ctypes.data == memory.ctypes.data + 8
    msg = SaveData(50, SaveReason.MEMORY, "model.ckpt", got_specs, persist=False, member=1, attempt=1)
    assert copy_out(msg, frames, None, peer=True).frames == (memory[8:16].tobytes(), b"abc", memory[40:48].tobytes())


def test_a_slot_sent_uncopied_is_reported_free_of_its_send_only_once_zeromq_let_go_of_its_frames():
    import time

    import numpy as np
    import zmq

    from procsv.trainer.checkpoint.peer_copy import Sends, frames as peer_frames

    ctx = zmq.Context()
    a, b = ctx.socket(zmq.PAIR), ctx.socket(zmq.PAIR)
    try:
        b.bind("inproc://peer-copy-test")
        a.connect("inproc://peer-copy-test")
        memory = np.arange(1 << 20, dtype=np.uint8)
        _, frames = peer_frames([TensorSpec("w", "uint8", [1 << 19], None, 4096)], [], memory)
        sends = Sends()
        a.send_multipart([b"head", *frames], copy=False)
        sends.started(2, frames)
        del frames
        assert sends.done() == []  # queued to the peer, not read: ZeroMQ holds the slot's bytes
        got = b.recv_multipart(copy=False)
        assert np.frombuffer(got[1].buffer, np.uint8)[0] == memory[4096]
        del got
        deadline = time.monotonic() + 5.0
        done: list[int] = []
        while not done and time.monotonic() < deadline:  # the trackers are told by ZeroMQ's own thread
            done = sends.done()
            time.sleep(0.01)
        assert done == [2] and sends.done() == []
    finally:
        a.close(0)
        b.close(0)
        ctx.term()


def test_node_0_holds_no_more_of_one_peer_copy_than_its_own_members_snapshot_memory_or_the_setting():
    from procsv.services.checkpoint.group import copy_size, peer_limit

    assert peer_limit([3 << 20, 5 << 20]) == 5 << 20  # a replica's copy of the same variables is never larger
    assert peer_limit([5 << 20], "4096") == 4096  # PROCSV_GROUP_PEER_MAX_BYTES, when set
    assert peer_limit([5 << 20], "none") == peer_limit([5 << 20], "0") == 5 << 20  # not a size: the default
    assert peer_limit([]) is None  # none of node 0's members' memory mapped yet: not known
    assert copy_size([b"abcd", memoryview(b"ef")]) == 6
    s = Slots(3)
    s.written(0, 50), s.sent_memory(0, 50, now=0.0), s.send_started(0)
    s.refused(50)  # node 0 will never hold it: no acknowledgment awaited, the slot kept while ZeroMQ reads it
    assert s.unacked is None and s.busy(0.1) == {0}
    s.send_done(0)
    assert s.free(0.1) == 1 and s.busy(0.1) == set()


def test_a_peer_copy_held_before_node_0_knew_its_limit_is_dropped_once_its_own_members_memory_is_mapped():
    # peer_limit is None until a member of node 0 hands over its first copy (its snapshot memory
    # mapped): at a group's start, or after node 0's service restarted, a peer copy that comes first
    # is held whatever its size. Before, it stayed held for the service's life: every later copy of
    # that member is as large and refused, so none ever replaced it (a 512 MiB state: up to KEEP of
    # them held on node 0). Now mapping a member's memory drops the peer copies beyond the limit,
    # said in one line each and told to the watchdog as a refusal
    from procsv.ipc.messages import GroupCopyRefused, SnapshotHeld
    from procsv.services.checkpoint.group import GroupIntake
    from procsv.services.checkpoint.peers import PEER_TAG
    from procsv.trainer.checkpoint.snapshot import SnapshotArena

    answers: list[tuple[bytes, object]] = []
    said: list[str] = []
    told: list[object] = []
    intake = GroupIntake(lambda who, msg, frames: answers.append((who, msg)), said.append, tell=told.append)
    big = [b"\x00" * (1 << 20)]
    spec = [TensorSpec("w", "uint8", [1 << 20])]
    intake.handle(SaveData(50, SaveReason.MEMORY, "model.ckpt", spec, persist=False, member=1, attempt=1),
                  big, PEER_TAG + b"m1")
    assert intake.copies.find(1, 50, 1) is not None  # no limit known yet: held (and acknowledged)
    assert isinstance(answers[-1][1], SnapshotHeld)
    arena = SnapshotArena(4096, slots=3)
    try:
        intake.handle(SaveData(50, SaveReason.MEMORY, "model.ckpt", [], arena.ref(), 0, persist=False,
                               member=0, attempt=1), [], b"chief")
        limit = arena.ref().size
        assert intake.copies.find(0, 50, 1) is not None and limit < 1 << 20
        assert intake.copies.find(1, 50, 1) is None, "the oversized peer copy is still held"
        assert [line for line in said if "member 1's peer copy of step 50" in line] == [
            f"procsv checkpoint: not holding member 1's peer copy of step 50 any more: {1 << 20} bytes, "
            f"beyond the {limit} held for one member"], said
        assert [m for m in told if isinstance(m, GroupCopyRefused)] == [GroupCopyRefused(1, 1, 50, 1 << 20, limit)]
        intake.handle(SaveData(100, SaveReason.MEMORY, "model.ckpt", spec, persist=False, member=1, attempt=1),
                      big, PEER_TAG + b"m1")
        assert intake.copies.find(1, 100, 1) is None and isinstance(answers[-1][1], GroupCopyRefused)
    finally:
        intake.close()
        arena.close()
