"""Node 0's checkpoint service's link to the group members of other hosts (issue 54, point 2).

Runs in node 0's checkpoint service of a ``procsv launch --nnodes M`` job (the watchdog sets
``PROCSV_GROUP_PEER_BIND`` to the host of ``--master-addr``). A member of host 1..M-1 cannot map a
memfd across hosts nor reach the service's IPC socket, so it sends its in-memory snapshots here
over TCP: a ROUTER bound on a free port of that host, a CURVE server with a key pair this process
makes (the secret stays in its memory), admitting only keys a member filed for this launch
(:func:`procsv.common.curve.serve`, ``prefix`` ``member.``), each for the rank it was filed with
only (a key filed as rank 1 cannot replace the chief's copy, nor make this process hold copies of
ranks no member has: :meth:`PeerLink.rank_of`). Where it listens, and its public key, are
in ``.procsv/curve/peer.json`` (:func:`~procsv.common.curve.write_peer`).

A member's message here is one of the group tier's (its :class:`SaveData`, every tensor a frame of
its own; a :class:`GroupFetch` on restore) and goes to the same
:class:`~procsv.services.checkpoint.group.GroupIntake` as the local members' under the identity
``peer:<its identity>``, so that the answers come back through this socket: the copies held here
are that member's *peer copy*, apart from its own host.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import zmq

from procsv.common.layout import Layout
from procsv.ipc.messages import GroupFetch, Message, ReplicaCopy, ReplicaHello, SaveData
from procsv.ipc.codec import ProtocolError
from procsv.ipc.transport import CHECKPOINT_FRAME_MAX, drain, make_socket, send
from procsv.common import curve

PEER_TAG = b"peer:"  # the identity of a member of another host, as the group's intake sees it
ACCEPT = frozenset({SaveData, GroupFetch})  # what a member of another host may send (no query: the chief is on node 0)
REPLICA = frozenset({ReplicaHello, ReplicaCopy})  # what node 1's holder of node 0's copies sends (.replica)
KEYS_REMEMBERED = 64  # the keys whose filed rank (or node) is kept read; each restart of a member files a new key


def remember(cache: "dict[str, Any]", key: str, value: Any, most: int = KEYS_REMEMBERED) -> None:
    """Keep ``value`` for ``key`` in ``cache``, forgetting the key read longest ago beyond ``most``: a
    month-long run restarts its members thousands of times, each with a new key, and a forgotten
    key is only read from its file again (gone once its member's attempt is over: then refused)."""
    cache.pop(key, None)
    while len(cache) >= most:
        cache.pop(next(iter(cache)))
    cache[key] = value


class PeerLink:
    """The CURVE ROUTER the members of hosts 1..M-1 hand their snapshots to."""

    def __init__(self, zctx: "zmq.Context[Any]", layout: Layout, host: str) -> None:
        job = curve.load_job(layout)
        if job is None:
            raise OSError(f"no job is filed in {curve.keys_dir(layout)} (node 0 writes it before its services start)")
        public, secret = zmq.curve_keypair()
        keys = curve.ServerKeys(job.job, public, secret)
        self.sock = make_socket(zctx, zmq.ROUTER, sndhwm=100, max_frame=CHECKPOINT_FRAME_MAX)
        self.sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self.sock.setsockopt(zmq.ROUTER_HANDOVER, 1)  # a member's reconnection takes its identity over
        self.auth = curve.serve(zctx, self.sock, layout, keys, prefix=curve.MEMBER_PREFIX)
        self._layout, self._job = layout, job.job
        self._ranks: dict[str, int] = {}  # a member's key (Z85) -> the rank it was filed with
        self._holders: dict[str, Optional[int]] = {}  # a key (Z85) -> the node whose holder filed it
        port = self.sock.bind_to_random_port(f"tcp://{host}")
        self.endpoint = f"tcp://{host}:{port}"
        curve.write_peer(layout, curve.Peer(job.job, self.endpoint, public))

    def deliver(self, handle: Callable[[Message, list[Any], bytes], None],
                refused: Callable[[ProtocolError], None],
                replica: Optional[Callable[[Message, list[Any], bytes, int], None]] = None) -> None:
        """Hand the members' messages waiting now to the group's intake (``handle``), each under its
        tagged identity, and a holder's (a key filed as node N's holder) to ``replica``; anything else
        (a snapshot to persist, one of no member) is ``refused``."""
        for got in drain(self.sock, limit=64, routed=True, accept=ACCEPT | REPLICA, user=True):
            if isinstance(got, ProtocolError):
                refused(got)
            elif got.identity is None:
                continue
            elif type(got.msg) in REPLICA:
                user = got.user or ""
                if user not in self._holders:  # (read once while remembered)
                    remember(self._holders, user, curve.holder_node(self._layout, self._job, user) if user else None)
                node = self._holders[user]
                if node is None or replica is None:
                    refused(ProtocolError("a replica message from a key not filed as a holder's"))
                else:
                    replica(got.msg, got.payload, PEER_TAG + got.identity, node)
            elif self.rank_of(got.user) != (got.msg.member if isinstance(got.msg, SaveData) else getattr(got.msg, "rank", None)):
                refused(ProtocolError(f"a member of another host spoke for another rank than its key was filed with "
                                      f"({self.rank_of(got.user)})"))
            elif isinstance(got.msg, SaveData) and (got.msg.persist or got.msg.member < 0 or got.msg.arena is not None):
                refused(ProtocolError("a member of another host sent a snapshot that is not a group member's copy"))
            else:
                handle(got.msg, got.payload, PEER_TAG + got.identity)

    def rank_of(self, user: Optional[str]) -> Optional[int]:
        """The rank the member whose key is ``user`` (Z85) filed it with (read once while
        remembered: :func:`remember`), or None."""
        if user is None:
            return None
        rank = self._ranks.get(user)
        if rank is None:
            rank = curve.member_rank(self._layout, self._job, user)
            if rank is not None:
                remember(self._ranks, user, rank)
        return rank

    def answer(self, identity: bytes, msg: Message, frames: Any = ()) -> bool:
        """Send ``msg`` to the member of another host ``identity`` names; False if it is not one's."""
        if not identity.startswith(PEER_TAG):
            return False
        try:
            send(self.sock, msg, frames, prefix=[identity[len(PEER_TAG):]])
        except zmq.ZMQError:  # that member is gone
            pass
        return True

    def close(self) -> None:
        self.sock.close(0)
        self.auth.stop()


def open_link(zctx: "zmq.Context[Any]", layout: Layout, say: Any, host: str) -> Optional[PeerLink]:
    """The link, if this service is node 0's of a job over several hosts (``host``: the service's
    ``ChildConfig.group_peer_bind``, the host it binds; empty: not node 0's, None); a link that
    cannot be opened is said in one line (the members of other hosts then hold no copies here)."""
    if not host:
        return None
    try:
        return PeerLink(zctx, layout, host)
    except (OSError, zmq.ZMQError) as exc:
        say(f"procsv checkpoint: the members of other hosts cannot hand over their in-memory snapshots: {exc}")
        return None
