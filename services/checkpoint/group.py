"""The checkpoint service's copies of a trainer group's in-memory snapshots (issue 54).

Runs in the checkpoint service. In a ``procsv launch --nproc N`` group on one host every member
(the chief and each worker) copies its state into its own snapshot memory every K steps (the same
steps on every member: ``PROCSV_GROUP_SNAPSHOT_STEPS``) and hands it here as a :class:`SaveData`
with ``member`` set and ``persist=False``. The service copies the tensors out of the member's slot
at once (the member may reuse the slot once it is acknowledged), takes the CRC-32C of the copy,
and keeps the last :data:`KEEP` copies of each member (:class:`GroupCopies`), in this process's
memory: a member's death loses none of them. They are never written to disk: a dead attempt's
snapshot committed behind the next attempt's restore could make the next-but-one restore a state
the group never pinned (commit ``c0cf535``'s invariant).

A restarted group's chief asks for the newest step held for every member of one attempt
(:meth:`GroupCopies.whole`, the :class:`~procsv.ipc.messages.GroupQuery`), each copy verified
against its checksum, and pins it; each member then fetches its own copy (its input position is its
own) and restores it (:mod:`procsv.trainer.checkpoint.group_restore`).

With ``--nnodes M`` the members of hosts 1..M-1 hand theirs over TCP (:mod:`.peers`, every tensor a
frame): held here, on node 0, they are those members' *peer copies*, which a whole host lost and
rejoined restores from (``GroupHeld.peer``; a damaged one is named as such and the group restores
from disk). A peer copy is bounded as a local one is: a local member's copy comes out of its own
snapshot memory, so it is never larger than that; a peer copy larger than the largest snapshot
memory of node 0's own members (the same variables: data-parallel replicas), or than
``PROCSV_GROUP_PEER_MAX_BYTES`` if set (:func:`peer_limit`), is refused: not held, said in one line
here, told to the member (:class:`GroupCopyRefused`, which it says in one line of its log) and to
the watchdog (the lifecycle record ``group_copy_refused``); the group then restores that member from
disk, as for a missing copy. (Before, a member sending 512 MiB made this process hold 3 of them.)
Every copy held here is also sent to node 1's holder (:mod:`.replica`), which hands them back to
this service restarted after a SIGKILL: ``MemberCopy.node``.
Until a member of node 0 has handed over a copy (at a group's start, after this service's restart)
the limit is not known and a peer copy is held whatever its size; once a member's memory is mapped
the ones held beyond the limit are dropped, said and told as refused (before, they stayed held for
the service's life: every later copy of that member, as large, was refused and never replaced them).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence


import numpy as np

from procsv.common import crc32c, faults
from procsv.common.snapshot_memory import itemsize
from procsv.common.errors import CheckpointError
from procsv.ipc.codec import ProtocolError
from procsv.ipc.messages import (ArenaRef, GroupCopy, GroupCopyHeld, GroupCopyRefused, GroupFetch, GroupHeld, GroupQuery, Message,
                                 SaveData, SnapshotHeld, TensorSpec)
from procsv.services.checkpoint.arena import ArenaView
from procsv.ipc.replica_messages import ReplicaCopy
from procsv.services.checkpoint.peers import PEER_TAG, PeerLink
from procsv.services.checkpoint.replica import HOLDER_NODE, Replica

KEEP = 3  # copies kept per member: the newest step whole for the group may be behind a member's newest


def peer_limit(own_memory: Sequence[int], setting: str = "") -> Optional[int]:
    """The most bytes one peer copy may have: ``setting`` (``PROCSV_GROUP_PEER_MAX_BYTES``) if it
    is a positive integer, else the largest snapshot memory of node 0's own members
    (``own_memory``: their sizes; a copy of the same variables is never larger), else None (none
    mapped yet: not known, not bounded)."""
    try:
        limit = int(setting)
    except ValueError:
        limit = 0
    if limit > 0:
        return limit
    return max(own_memory) if own_memory else None


def copy_size(payload: Sequence[Any]) -> int:
    """The bytes of a message's frames."""
    return sum(len(memoryview(f.buffer if hasattr(f, "buffer") else f)) for f in payload)


def checksum(frames: tuple[bytes, ...]) -> int:
    """The CRC-32C of ``frames`` in order."""
    crc = 0
    for frame in frames:
        crc = crc32c.extend(crc, frame)
    return crc


@dataclass(frozen=True)
class MemberCopy:
    """One member's in-memory snapshot, copied out of its slot: every tensor as one frame."""

    rank: int
    attempt: int
    step: int
    specs: tuple[TensorSpec, ...]  # offset None: the i-th spec is the i-th frame
    frames: tuple[bytes, ...]
    crc: int  # of the frames as copied
    peer: bool = False  # held here for a member of another host (its peer copy, over CURVE: peers.py)
    node: Optional[int] = None  # handed back by that node's holder to this (restarted) service: .replica

    def name(self) -> str:
        where = f" held on node {self.node}" if self.node is not None else ""
        return f"member {self.rank}'s {'peer' if self.peer and self.node is None else 'in-memory'} copy of step {self.step}{where}"

    def problem(self) -> str:
        """Why this copy must not be restored (its bytes no longer match its checksum); empty if it may."""
        now = checksum(self.frames)
        return "" if now == self.crc else f"its checksum is {now:08x}, not {self.crc:08x} as copied"

    def size(self) -> int:
        return sum(len(f) for f in self.frames)


def copy_out(msg: SaveData, payload: list[Any], view: Optional[ArenaView], peer: bool = False) -> MemberCopy:
    """Copy the snapshot ``msg`` names (its slot of ``view``, its frames) into service memory
    (``peer``: a member of another host's, every tensor a frame).

    Raises :class:`CheckpointError` for a slot that does not hold it whole, before or after the copy
    (a member that reused it meanwhile), and for a tensor outside its slot."""
    def whole() -> None:
        if view is not None and any(s.offset is not None for s in msg.tensors):
            torn = view.slot_problem(msg.slot, msg.step)
            if torn:
                raise CheckpointError(f"its slot is not whole: {torn}")

    whole()
    framed = iter(payload)
    specs, frames = [], []
    for spec in msg.tensors:
        if spec.offset is None:
            frames.append(bytes(next(framed)))
        else:
            if view is None:
                raise CheckpointError("its snapshot memory is not mapped")
            n = int(np.prod(spec.shape, dtype=np.int64)) * itemsize(spec.dtype)
            if spec.offset < 0 or spec.offset + n > view.ref.size:
                raise CheckpointError(f"{spec.key} lies outside the snapshot memory")
            frames.append(view.array[spec.offset:spec.offset + n].tobytes())
        specs.append(TensorSpec(spec.key, spec.dtype, spec.shape, spec.lengths, None))
    whole()
    copied = tuple(frames)
    crc = checksum(copied)
    # tests: a copy (a peer copy) damaged after its checksum
    if faults.fires("checkpoint", "group_peer_corrupt" if peer else "group_copy_corrupt") and copied:
        first = copied[0]
        copied = (bytes([first[0] ^ 0xFF]) + first[1:], *copied[1:]) if first else copied
    return MemberCopy(msg.member, msg.attempt, msg.step, tuple(specs), copied, crc, peer)


def handed_back(msg: ReplicaCopy, payload: list[Any]) -> MemberCopy:
    """A copy node 1's holder handed back to this restarted service (:mod:`.replica`): its frames
    as they came, its checksum the one taken when node 0's service first copied it."""
    frames = tuple(bytes(f) for f in payload)
    return MemberCopy(msg.rank, msg.attempt, msg.step, tuple(msg.tensors), frames, msg.crc, True, HOLDER_NODE)


class GroupCopies:
    """The in-memory snapshots of a group's members: the last :data:`KEEP` of each, by rank."""

    def __init__(self) -> None:
        self.by_rank: dict[int, list[MemberCopy]] = {}
        self.held = 0  # copies held by this process
        self.last_step: Optional[int] = None

    def hold(self, copy: MemberCopy) -> None:
        kept = [c for c in self.by_rank.get(copy.rank, []) if (c.attempt, c.step) != (copy.attempt, copy.step)]
        self.by_rank[copy.rank] = (kept + [copy])[-KEEP:]
        self.held += 1
        self.last_step = copy.step

    def take_back(self, copy: MemberCopy) -> None:
        """Hold a copy node 1's holder handed back (:mod:`.replica`): placed before the copies held
        here that are newer (attempt, then step), so that it never pushes one of them out."""
        kept = [c for c in self.by_rank.get(copy.rank, []) if (c.attempt, c.step) != (copy.attempt, copy.step)]
        at = sum(1 for c in kept if (c.attempt, c.step) < (copy.attempt, copy.step))
        self.by_rank[copy.rank] = (kept[:at] + [copy] + kept[at:])[-KEEP:]
        self.held += 1

    def find(self, rank: int, step: int, attempt: int) -> Optional[MemberCopy]:
        return next((c for c in self.by_rank.get(rank, []) if c.step == step and c.attempt == attempt), None)

    def whole(self, nproc: int, after: int, before: Optional[int] = None) -> tuple[int, int, str]:
        """The newest ``(step, attempt)`` held for every rank below ``nproc``, newer than ``after`` and
        older than ``before`` (a rollback of that step; None: any), each copy verifying against its
        checksum; ``(-1, 0, why not)`` if there is none (a member's copy missing, or the newest whole one
        damaged: the group restores from disk then)."""
        steps = sorted({(c.step, c.attempt) for c in self.by_rank.get(0, [])
                        if c.step > after and (before is None or c.step < before)}, reverse=True)
        for step, attempt in steps:
            copies = [c for c in (self.find(rank, step, attempt) for rank in range(nproc)) if c is not None]
            if len(copies) < nproc:
                continue
            for c in copies:
                bad = c.problem()
                if bad:
                    return -1, 0, f"{c.name()} is damaged ({bad})"
            return step, attempt, ""
        if not self.by_rank:
            return -1, 0, "no in-memory snapshot of the group is held"
        newest = max((c.step for copies in self.by_rank.values() for c in copies), default=-1)
        if newest <= after:
            return -1, 0, f"none is newer than the committed checkpoint of step {after}"
        if before is not None and not any(after < c.step < before for copies in self.by_rank.values() for c in copies):
            return -1, 0, f"none between the committed checkpoint of step {after} and step {before}, which it rolls back"
        return -1, 0, f"no step newer than {after}{'' if before is None else f' and before {before}'} is held for all " \
            f"{nproc} members"

    def drop_peers_beyond(self, limit: int) -> list[MemberCopy]:
        """Forget the peer copies of more than ``limit`` bytes (held before the limit was known); them."""
        dropped: list[MemberCopy] = []
        for rank, copies in list(self.by_rank.items()):
            beyond = [c.peer and c.size() > limit for c in copies]
            dropped += [c for c, out in zip(copies, beyond) if out]
            self.by_rank[rank] = [c for c, out in zip(copies, beyond) if not out]
        return dropped

    def peer_in(self, nproc: int, step: int, attempt: int) -> bool:
        """Whether a member's copy of ``step`` held here is a peer copy (of a member of another host)."""
        return any(c is not None and c.peer for c in (self.find(rank, step, attempt) for rank in range(nproc)))


class GroupIntake:
    """The service's side of a group's in-memory tier: each member's snapshot memory mapped (one
    :class:`ArenaView` per rank, replaced when a restarted member names a new one), the copies, and
    the answers to :class:`GroupQuery` and :class:`GroupFetch`. ``answer(identity, msg, frames)``
    sends to one member; ``say`` prints a line to the service's log; ``tell`` sends to the watchdog
    (a :class:`GroupCopyHeld` for each copy held: the group's progress, for its restart policy)."""

    def __init__(self, answer: Callable[[bytes, Message, Sequence[Any]], None], say: Callable[[str], None],
                 peers: Optional[PeerLink] = None, tell: Callable[[Message], object] = lambda msg: None,
                 peer_setting: str = "") -> None:
        self._answer, self.say, self.tell = answer, say, tell
        self.copies = GroupCopies()
        self.views: dict[int, ArenaView] = {}
        self.peers = peers  # node 0 of --nnodes M: the members of other hosts hand their copies here
        self._peer_setting = peer_setting  # peer_limit's setting: ChildConfig.group_peer_max_bytes
        # ... and every copy held here is also held by node 1's holder, which hands them back to a restarted service
        self.replica = Replica(peers, self.copies, handed_back, say, KEEP) if peers is not None else None

    def sockets(self) -> list[Any]:
        """The sockets of the members of other hosts (none unless node 0 of a job over several hosts)."""
        return [self.peers.sock] if self.peers is not None else []

    def deliver(self, refused: Callable[[ProtocolError], None]) -> None:
        """Handle what the members of other hosts sent (a message that is not theirs to send: ``refused``)."""
        if self.peers is not None:
            self.peers.deliver(self.handle, refused, self.replica.handle if self.replica is not None else None)

    def answer(self, identity: bytes, msg: Message, frames: Sequence[Any]) -> None:
        if self.peers is None or not self.peers.answer(identity, msg, frames):
            self._answer(identity, msg, frames)

    def handle(self, msg: Message, payload: list[Any], identity: bytes) -> None:
        if isinstance(msg, SaveData):
            self._hold(msg, payload, identity)
        elif isinstance(msg, GroupQuery):
            step, attempt, note = self.copies.whole(msg.nproc, msg.after, msg.before)
            if step < 0 and self.copies.held:
                self.say(f"procsv checkpoint: the group's chief (pid {msg.pid}) restores from disk: {note}")
            self.answer(identity, GroupHeld(step, attempt, note, self.copies.peer_in(msg.nproc, step, attempt)), ())
        elif isinstance(msg, GroupFetch):
            copy = self.copies.find(msg.rank, msg.step, msg.attempt)
            if copy is None:
                self.answer(identity, GroupCopy(-1, [], 0, f"member {msg.rank}'s copy of step {msg.step} is not held"), ())
            else:
                self.answer(identity, GroupCopy(copy.step, list(copy.specs), copy.crc, ""), copy.frames)

    def _hold(self, msg: SaveData, payload: list[Any], identity: bytes) -> None:
        if msg.member == 1 and faults.fires("checkpoint", "group_copy_missing"):  # tests: worker1's copies lost
            return
        peer = identity.startswith(PEER_TAG)
        if peer and self._too_large(msg, payload, identity):
            return
        try:
            view = self._view(msg.member, msg.arena) if msg.arena is not None else None
            copy = copy_out(msg, payload, view, peer=peer)
        except CheckpointError as exc:
            self.say(f"procsv checkpoint: not holding member {msg.member}'s in-memory snapshot of step {msg.step}: {exc}")
            return
        self.copies.hold(copy)
        self.answer(identity, SnapshotHeld(msg.step, False), ())
        self.tell(GroupCopyHeld(msg.member, msg.attempt, msg.step))
        if self.replica is not None:  # after the member's acknowledgement: off its step path
            self.replica.forward(copy)

    def _too_large(self, msg: SaveData, payload: list[Any], identity: bytes) -> bool:
        """Refuse a peer copy beyond :func:`peer_limit` (True): said here, to the member, to the watchdog."""
        limit = peer_limit([v.ref.size for v in self.views.values()], self._peer_setting)
        size = copy_size(payload)
        if limit is None or size <= limit:
            return False
        self.say(f"procsv checkpoint: not holding member {msg.member}'s peer copy of step {msg.step}: "
                 f"{size} bytes, beyond the {limit} held for one member")
        refused = GroupCopyRefused(msg.member, msg.attempt, msg.step, size, limit)
        self.answer(identity, refused, ())
        self.tell(refused)
        return True

    def _view(self, rank: int, ref: ArenaRef) -> ArenaView:
        view = self.views.get(rank)
        if view is None or view.ref != ref:
            if view is not None:
                view.close()
            view = self.views[rank] = ArenaView(ref)
            self._drop_too_large()
        return view

    def _drop_too_large(self) -> None:
        """A member's memory was mapped (the limit is known now, or changed): the peer copies held
        beyond it (before it was known: at a group's start, after this service's restart) are
        dropped, each said and told to the watchdog as refused; every later copy of that member is
        as large, refused, and would never have replaced them."""
        limit = peer_limit([v.ref.size for v in self.views.values()], self._peer_setting)
        if limit is None:
            return
        for c in self.copies.drop_peers_beyond(limit):
            self.say(f"procsv checkpoint: not holding {c.name()} any more: {c.size()} bytes, "
                     f"beyond the {limit} held for one member")
            self.tell(GroupCopyRefused(c.rank, c.attempt, c.step, c.size(), limit))

    def stats(self) -> dict[str, Any]:
        """What ``checkpoint_stats.json`` says of the group's copies (``group``)."""
        out: dict[str, Any] = {"held": self.copies.held, "last_step": self.copies.last_step}
        if self.replica is not None:
            out["replica"] = self.replica.stats()
        return out

    def close(self) -> None:
        for view in self.views.values():
            view.close()
        self.views.clear()
        if self.peers is not None:
            self.peers.close()
            self.peers = None
