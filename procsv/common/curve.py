"""The CURVE keys of a job that spans hosts, and the sockets they secure.

Runs in the watchdogs of a ``procsv launch --nnodes M`` job: node 0's (the master) and every other
node's agent; its peer-link parts in node 0's checkpoint service and in the group members of hosts
1..M-1 (:func:`connect_member`). No secret key is ever written anywhere:

- The master makes a fresh server key pair at each launch (``zmq.curve_keypair``) and keeps its
  secret in memory; it writes the job's id and the server's *public* key to
  ``<logdir>/.procsv/curve/job.json`` (a folder of mode 0700, files 0600, atomic writes). Agents
  pin that public key, so only the process holding the secret -- node 0's watchdog -- can answer
  their handshake.
- Each agent makes its own key pair when it starts, keeps the secret in memory, and files its
  public key for the job it joins: ``.procsv/curve/agent.<job>.<key in hex>`` (0600). The
  master's ZAP handler (:class:`zmq.auth.thread.ThreadAuthenticator` with a credentials callback)
  admits a client key only if it is filed for this job, so joining takes write access to the
  logdir's ``.procsv/curve/``; reading it gives public keys only.
- Which node rank a key may speak for is decided by the master when the key first claims a rank
  (:func:`procsv.watchdog.rules.hosts.claim_node`; :class:`~procsv.watchdog.multihost.nodes.NodeLink`).
- The master clears the folder when a launch begins and removes it when the launch ends; an agent
  removes its own key file when it exits.
- A group's in-memory tier over hosts (issue 54; node 0's checkpoint service,
  :mod:`procsv.services.checkpoint.peers`, and the members of hosts 1..M-1,
  :func:`connect_member`, :mod:`procsv.trainer.checkpoint.peer_copy`): the service makes a server pair of its own (the
  secret in its memory) and writes ``peer.json`` (the job, its TCP endpoint, its public key); a
  member makes its own pair and files its public key as ``member.<job>.<key in hex>`` (with its rank
  and attempt; node 0's watchdog removes it once that attempt is over: :func:`unfile_members`). The
  service's ZAP check (:func:`serve` with ``prefix`` :data:`MEMBER_PREFIX`) admits member keys
  only, the master's agent keys only: a member's key claims no node rank. Node 1's holder of
  node 0's group copies (:mod:`procsv.watchdog.multihost.holder`) files its key the same way, with
  a node and no rank (:func:`file_holder_key`): it may hand over and take back replica copies only.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import uuid
from dataclasses import dataclass
from typing import Any, Optional

import zmq
from zmq.utils import z85

from procsv.common.layout import Layout, read_json, write_json

JOB_FILE = "job.json"
AGENT_PREFIX = "agent."
MEMBER_PREFIX = "member."
PEER_FILE = "peer.json"  # node 0's checkpoint service's CURVE endpoint for the members of other hosts


@dataclass(frozen=True)
class ServerKeys:
    """The master's keys for one launch (Z85 text); the secret exists only in node 0's memory."""

    job: str
    public: bytes
    secret: bytes


@dataclass(frozen=True)
class Job:
    """What an agent reads of the current launch: its id and the server's public key (Z85)."""

    job: str
    server_public: bytes


@dataclass(frozen=True)
class AgentKeys:
    """One agent's own key pair (Z85 text), made when it starts; the secret stays in its memory."""

    public: bytes
    secret: bytes

    @staticmethod
    def new() -> "AgentKeys":
        public, secret = zmq.curve_keypair()
        return AgentKeys(public, secret)


def keys_dir(layout: Layout) -> str:
    return os.path.join(layout.meta, "curve")


def fingerprint(public: bytes) -> str:
    """A short name of a public key for people (logs, lifecycle records): 12 hex digits of its hash."""
    return hashlib.sha256(public).hexdigest()[:12]


def agent_key_path(layout: Layout, job: str, public: bytes) -> str:
    """Where an agent files its public key for ``job``: the name is the key, so the master's check
    is one lookup (no listing, no parsing of what an agent wrote)."""
    return os.path.join(keys_dir(layout), f"{AGENT_PREFIX}{job}.{z85.decode(public).hex()}")


def create_job(layout: Layout) -> ServerKeys:
    """A new launch's server keys (the master): clears the folder of any earlier launch's files
    (an older procsv's secret keys too), then writes ``job.json`` with the public key only."""
    folder = keys_dir(layout)
    remove_job(layout)
    os.makedirs(folder, mode=0o700, exist_ok=True)
    os.chmod(folder, 0o700)
    public, secret = zmq.curve_keypair()
    keys = ServerKeys(uuid.uuid4().hex[:12], public, secret)
    write_json(os.path.join(folder, JOB_FILE), {"job": keys.job, "server_public": public.decode("ascii")}, mode=0o600)
    return keys


def remove_job(layout: Layout) -> None:
    """Remove the keys folder (the master, at the end of its launch and before a new one)."""
    shutil.rmtree(keys_dir(layout), ignore_errors=True)


def load_job(layout: Layout) -> Optional[Job]:
    """The current launch (an agent), or None if the master has not written it (or it is unreadable)."""
    try:
        record = read_json(os.path.join(keys_dir(layout), JOB_FILE))
    except OSError:  # EIO, EACCES, ESTALE: not readable now (the caller looks again)
        return None
    if not isinstance(record, dict):
        return None
    job, public = record.get("job"), record.get("server_public")
    if not isinstance(job, str) or not isinstance(public, str) or len(public) != 40:
        return None
    return Job(job, public.encode("ascii"))


def file_agent_key(layout: Layout, job: str, keys: AgentKeys, node: int, host: str) -> str:
    """File this agent's public key for ``job`` (0600; who filed it is in the body, for people)."""
    path = agent_key_path(layout, job, keys.public)
    write_json(path, {"node": node, "host": host, "pid": os.getpid(), "public": keys.public.decode("ascii")},
               mode=0o600)
    return path


def unfile_agent_key(path: Optional[str]) -> None:
    """Remove a key file this agent filed (gone already: the master removed the folder)."""
    if path is None:
        return
    try:
        os.unlink(path)
    except OSError:
        pass


@dataclass(frozen=True)
class Peer:
    """Node 0's checkpoint service as a member of another host reads it from ``peer.json``."""

    job: str
    endpoint: str
    server_public: bytes


def member_key_path(layout: Layout, job: str, public: bytes) -> str:
    """Where a group member of host 1..M-1 files its public key for ``job`` (as an agent's, by name)."""
    return os.path.join(keys_dir(layout), f"{MEMBER_PREFIX}{job}.{z85.decode(public).hex()}")


def write_peer(layout: Layout, peer: Peer) -> None:
    """Node 0's checkpoint service: say where the members of other hosts reach it (0600, atomic)."""
    write_json(os.path.join(keys_dir(layout), PEER_FILE), {"job": peer.job, "endpoint": peer.endpoint,
                                                             "server_public": peer.server_public.decode("ascii")},
               mode=0o600)


def load_peer(layout: Layout) -> Optional[Peer]:
    """Node 0's checkpoint service's endpoint for this launch, or None if not written (or unreadable)."""
    try:
        record = read_json(os.path.join(keys_dir(layout), PEER_FILE))
    except OSError:
        return None
    if not isinstance(record, dict):
        return None
    job, endpoint, public = record.get("job"), record.get("endpoint"), record.get("server_public")
    if not isinstance(job, str) or not isinstance(endpoint, str) or not isinstance(public, str) or len(public) != 40:
        return None
    return Peer(job, endpoint, public.encode("ascii"))


def file_member_key(layout: Layout, job: str, keys: AgentKeys, rank: int, attempt: int = 0) -> str:
    """File a group member's public key for ``job`` (0600; its rank and the group's attempt in the
    body: node 0's watchdog removes it once that attempt is over, :func:`unfile_members`; its pid,
    for people)."""
    path = member_key_path(layout, job, keys.public)
    write_json(path, {"rank": rank, "attempt": attempt, "pid": os.getpid(), "public": keys.public.decode("ascii")},
               mode=0o600)
    return path


def member_over(record: object, before: int, rank: Optional[int] = None, attempt: Optional[int] = None) -> bool:
    """Whether a member key file's body (``record``) is of a member whose attempt is over: an
    attempt below ``before`` (the group's current one), or exactly ``rank``'s of ``attempt``
    (one that ended). A body without a rank and an attempt is nobody's to judge: False."""
    if not isinstance(record, dict):
        return False
    r, a = record.get("rank"), record.get("attempt")
    if not isinstance(r, int) or not isinstance(a, int) or isinstance(r, bool) or isinstance(a, bool):
        return False
    return a < before or (r == rank and a == attempt)


def unfile_members(layout: Layout, job: str, before: int, rank: Optional[int] = None,
                   attempt: Optional[int] = None) -> int:
    """Node 0's watchdog: remove the key files of ``job``'s members whose attempt is over
    (:func:`member_over`): a member SIGKILLed never removes its own, and over a long run with many
    restarts they would pile up until the launch ends. How many were removed."""
    folder, prefix = keys_dir(layout), f"{MEMBER_PREFIX}{job}."
    try:
        names = [n for n in os.listdir(folder) if n.startswith(prefix)]
    except OSError:
        return 0
    removed = 0
    for name in names:
        path = os.path.join(folder, name)
        try:
            if member_over(read_json(path), before, rank, attempt):
                os.unlink(path)
                removed += 1
        except (OSError, ValueError):  # gone meanwhile, or half a body: left for the next look
            continue
    return removed


def member_rank(layout: Layout, job: str, public: str) -> Optional[int]:
    """The rank a group member filed its key ``public`` (Z85) with for ``job``, or None (not filed,
    unreadable): node 0's checkpoint service lets that key speak for that rank only."""
    try:
        record = read_json(member_key_path(layout, job, public.encode("ascii")))
    except (OSError, ValueError, UnicodeEncodeError):
        return None
    rank = record.get("rank") if isinstance(record, dict) else None
    return rank if isinstance(rank, int) and not isinstance(rank, bool) and rank >= 0 else None


def file_holder_key(layout: Layout, job: str, keys: AgentKeys, node: int) -> str:
    """File the public key of node ``node``'s holder of node 0's group copies (issue 54, point 2;
    :mod:`procsv.watchdog.multihost.holder`) for ``job``: admitted by node 0's checkpoint service's
    peer link as a member's is, but filed with no rank (it speaks for no member), only a node."""
    path = member_key_path(layout, job, keys.public)
    write_json(path, {"holder": node, "pid": os.getpid(), "public": keys.public.decode("ascii")}, mode=0o600)
    return path


def holder_node(layout: Layout, job: str, public: str) -> Optional[int]:
    """The node whose holder filed the key ``public`` (Z85) for ``job``, or None (a member's key,
    not filed, unreadable): only that key may hand node 0's checkpoint service replica copies."""
    try:
        record = read_json(member_key_path(layout, job, public.encode("ascii")))
    except (OSError, ValueError, UnicodeEncodeError):
        return None
    node = record.get("holder") if isinstance(record, dict) else None
    return node if isinstance(node, int) and not isinstance(node, bool) and node > 0 else None


class _FiledKeys:
    """The ZAP credentials check: admit a client key only if it is filed for this job (an agent's
    for the master; a group member's for node 0's checkpoint service: ``prefix``)."""

    def __init__(self, layout: Layout, job: str, prefix: str = AGENT_PREFIX) -> None:
        self._layout = layout
        self._job = job
        self._prefix = prefix

    def callback(self, domain: str, key: bytes) -> bool:
        try:  # Z85, as pyzmq's authenticator hands the client's key over
            path = os.path.join(keys_dir(self._layout), f"{self._prefix}{self._job}.{z85.decode(key).hex()}")
            return os.path.isfile(path)
        except (ValueError, KeyError, OSError):  # not a Z85 key; the logdir cannot be looked at
            return False


def serve(ctx: "zmq.Context[Any]", sock: "zmq.Socket[Any]", layout: Layout, keys: ServerKeys,
          prefix: str = AGENT_PREFIX) -> Any:
    """Make ``sock`` (not yet bound) a CURVE server that admits only keys filed for this job (an
    agent's; ``prefix`` :data:`MEMBER_PREFIX`: a group member's); returns the authenticator thread,
    which the caller stops (``.stop()``) when it closes the socket."""
    from zmq.auth.thread import ThreadAuthenticator

    auth = ThreadAuthenticator(ctx)
    auth.start()
    auth.configure_curve_callback(domain="*", credentials_provider=_FiledKeys(layout, keys.job, prefix))
    sock.curve_secretkey = keys.secret
    sock.curve_publickey = keys.public
    sock.curve_server = True
    return auth


def connect_as_agent(sock: "zmq.Socket[Any]", keys: AgentKeys, job: Job) -> None:
    """Make ``sock`` (not yet connected) a CURVE client of this job's master, with the agent's own keys."""
    sock.curve_secretkey = keys.secret
    sock.curve_publickey = keys.public
    sock.curve_serverkey = job.server_public


def connect_as_member(sock: "zmq.Socket[Any]", keys: AgentKeys, peer: Peer) -> None:
    """Make ``sock`` (not yet connected) a CURVE client of node 0's checkpoint service, with a
    member's own keys (filed with :func:`file_member_key`)."""
    sock.curve_secretkey = keys.secret
    sock.curve_publickey = keys.public
    sock.curve_serverkey = peer.server_public


@dataclass(frozen=True)
class MemberLink:
    """What a member's connection to node 0's checkpoint service takes from the disk, done before
    the socket is touched: the service ``peer.json`` named, the member's own key pair for it, and
    the path of its public key filed for the launch (the service's ZAP check looks it up at the
    handshake, so it is filed before the connect: :func:`attach_member`)."""

    peer: Peer
    keys: AgentKeys
    path: str


def file_member(layout: Layout, peer: Peer, rank: int, attempt: int) -> MemberLink:
    """A new key pair of this process's own for ``peer``, its public key filed for the launch
    (:func:`file_member_key`, with this member's ``rank`` and ``attempt``): the part of a member's
    connection that writes to the logdir (a shared filesystem: a member's step never waits on it
    once it trains, :mod:`procsv.trainer.remote.peer_follow`). OSError if the key cannot be filed."""
    keys = AgentKeys.new()
    path = file_member_key(layout, peer.job, keys, rank, attempt)
    return MemberLink(peer, keys, path)


def attach_member(sock: "zmq.Socket[Any]", link: MemberLink) -> None:
    """Connect ``sock`` (a DEALER, not yet connected) to ``link``'s service as a CURVE client with
    its keys (filed already: :func:`file_member`). Touches no file."""
    connect_as_member(sock, link.keys, link.peer)
    sock.connect(link.peer.endpoint)


def member_link(layout: Layout, rank: int, attempt: int) -> Optional[MemberLink]:
    """A member's first connection's disk part: the service ``peer.json`` names and a key filed for
    it (:func:`file_member`), or None (said in one line) when node 0's service names no endpoint
    (yet: the member's follow connects once it does, :mod:`procsv.trainer.remote.peer_follow`)."""
    peer = load_peer(layout)
    if peer is None:
        print("procsv: this member's in-memory snapshots have nowhere to go yet: node 0's checkpoint service "
              f"names no endpoint in {keys_dir(layout)} (they go to it once it does)", file=sys.stderr, flush=True)
        return None
    return file_member(layout, peer, rank, attempt)


def connect_member(sock: "zmq.Socket[Any]", layout: Layout, rank: int, attempt: int) -> Optional[str]:
    """Connect ``sock`` (a DEALER) to node 0's checkpoint service as a CURVE client with a key pair
    of this process's own, filed for the launch (removed by :func:`unfile_agent_key` at the end; the
    master removes the folder when the launch ends); the key file's path, or None (said in one line)
    when node 0's service names no endpoint (the member then hands over no copies)."""
    link = member_link(layout, rank, attempt)
    if link is None:
        return None
    attach_member(sock, link)
    return link.path
