"""A group member of another host follows node 0's restarted checkpoint service, off its step path.

Runs in the trainer of a member of host 1..M-1 (``PROCSV_GROUP_REMOTE``): :class:`PeerFollow` is
a daemon thread of that trainer, started by :class:`procsv.trainer.channels.TrainerChannels` once
the member is connected to the service ``peer.json`` names. Node 0's service SIGKILLed and
restarted by the watchdog listens on a new port with a new key and rewrites ``peer.json``; the
member must then connect to the new one (before, it kept sending to the dead one's port until the
group's next attempt: its copies lost, the frames queued there pinning its slots).

Everything this takes from the logdir is done here, never on the trainer's step path: the logdir
is a shared filesystem on a real cluster (NFS), where a read or a write may stall for seconds, and
the step must never wait on it. Before, the step path itself read ``peer.json`` (every 0.25 s) and
filed the new key. The thread:

- reads ``peer.json`` every :data:`PEER_LOOK_SECS` (a plain poll: inotify does not see a change
  made on another host of an NFS mount);
- when it names another service than the one last prepared for, makes a new key pair and files
  its public key (:func:`procsv.common.curve.file_member`) -- filed *before* any connect, as node
  0's ZAP check requires -- and only then publishes the result (:meth:`PeerFollow.take`);
- removes the key files the trainer retired (:meth:`PeerFollow.retire`): the previous connection's,
  once the trainer closed that socket, and a prepared one that a newer ``peer.json`` superseded
  before the trainer took it (never connected).

The trainer's step path only reads that slot (an attribute; a lock is taken only when it is set,
and no file is touched under it) and, when set, does the socket work itself on its main thread
(ZeroMQ sockets are not thread-safe): :meth:`TrainerChannels._follow_service`. A key that cannot be
filed (the logdir failing) is said in one line and tried again at the next look.
"""

from __future__ import annotations

import sys
import threading
from typing import Callable, Optional

from procsv.common import curve
from procsv.common.layout import Layout

PEER_LOOK_SECS = 0.25  # how often the thread reads peer.json


class PeerFollow:
    """The follow of node 0's checkpoint service for one member's connection: a daemon thread
    (:meth:`start`) that prepares a connection to each new service ``peer.json`` names, and the
    thread-safe slot the trainer takes it from (:meth:`take`). ``peer``: the service the member is
    connected to now (None: ``peer.json`` named none when the member started, a service restarting
    then; the first one it names is followed like a restarted one). :meth:`look` is one round of the
    thread (a test may drive it). ``file_member``: files this member's key for a service (its rank and
    attempt bound: :meth:`procsv.trainer.channels.RemoteMember.file_member`)."""

    def __init__(self, layout: Layout, peer: Optional[curve.Peer], every: float = PEER_LOOK_SECS, *,
                 file_member: Callable[[Layout, curve.Peer], curve.MemberLink]) -> None:
        self.layout, self.every, self._file_member = layout, every, file_member
        self._peer = peer  # the service last prepared for (the thread's own)
        self._lock = threading.Lock()  # guards the three below; never held over a file access
        self.ready: Optional[curve.MemberLink] = None  # a prepared connection the trainer has not taken
        self._retired: list[str] = []  # key files no socket uses any more: the thread removes them
        self._closed = False
        self._failing = False  # the last key filing failed (said once until it works again)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="procsv-peer-follow", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def take(self) -> Optional[curve.MemberLink]:
        """The trainer (its step path): a connection prepared for a new service, now the trainer's
        to connect (and its key file the trainer's to retire), or None. Touches no file."""
        if self.ready is None:  # the common case: an attribute read
            return None
        with self._lock:
            link, self.ready = self.ready, None
        return link

    def retire(self, path: Optional[str]) -> None:
        """The trainer: the key file ``path`` backs no socket any more (the trainer closed the
        socket that used it); the thread removes it at its next look. Touches no file."""
        if path is None:
            return
        with self._lock:
            self._retired.append(path)

    def look(self) -> None:
        """One round of the thread: remove the retired key files; read ``peer.json`` and, if it names
        another service, file a key for it and publish the connection (superseding one not taken)."""
        with self._lock:
            retired, self._retired = self._retired, []
        for path in retired:
            curve.unfile_agent_key(path)
        peer = curve.load_peer(self.layout)
        if peer is None or peer == self._peer:
            return
        try:
            link = self._file_member(self.layout, peer)
        except OSError as exc:
            if not self._failing:
                print(f"procsv: this member could not file its key for node 0's restarted checkpoint service "
                      f"(tried again every {self.every:g} s): {exc}", file=sys.stderr, flush=True)
            self._failing = True
            return
        self._failing = False
        self._peer = peer
        with self._lock:
            stale: Optional[curve.MemberLink] = link if self._closed else self.ready
            if not self._closed:
                self.ready = link
        if stale is not None:  # never connected: superseded by a newer service, or the channels closed
            curve.unfile_agent_key(stale.path)

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            self.look()

    def close(self, join_secs: float = 0.5) -> list[str]:
        """Stop the thread (waiting at most ``join_secs`` for it: it may be stalled on the logdir)
        and return the key files the caller is to remove now: the retired ones and a prepared one
        never taken. A key the thread files after this removes itself (:meth:`look`)."""
        self._stop.set()
        with self._lock:
            self._closed = True
            paths, self._retired = self._retired, []
            if self.ready is not None:
                paths.append(self.ready.path)
                self.ready = None
        if self._thread.is_alive():
            self._thread.join(join_secs)
        return paths
