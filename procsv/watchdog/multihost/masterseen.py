"""When a node agent gives up on a silent master; with an elastic job's, not while the master is live.

Runs in the node agent (:mod:`procsv.watchdog.multihost.agent`): :class:`MasterSeen` in its loop, the reads of
:func:`status_stamp` in its logdir thread. An agent gives up (exits 1) once the master is silent past
``--rejoin-timeout``. With ``--min-nodes K`` (rule 15) node 0 trains on without a host it lost and takes
the host back when its agent is heard again, however long that takes: an agent cut off by a network
partition must not give up on a master that is still live, or its host is out of the group for good.
So an elastic job's agent, silent past ``--rejoin-timeout``, reads node 0's ``status.json`` in the shared
logdir every ``node_timeout``: node 0's watchdog rewrites it (its ``updated_at``) while it runs; the agent
gives up once a read has not found it changed for ``rejoin_timeout`` + 2 x ``node_timeout`` (a master that is
gone: SIGKILLed, its host lost, or a logdir this host cannot read).

Before giving up, an agent stops its members once its master is lost (rule 12 the other way:
:func:`~procsv.watchdog.rules.hosts.master_lost`, within 0.5 s of a silent host or a launch gone). It keeps a
:class:`~procsv.watchdog.rules.state.NodeView` of node 0 for that, observed here as node 0's watchdog observes an
agent's (:func:`master_beat`, :func:`master_probe_sent`, :func:`master_probes_looked`). A master found lost is
probed on: its address answering again after a silence (a partition healed) is when the agent replaces its
connection (:func:`~procsv.watchdog.rules.hosts.master_redial`, :meth:`MasterSeen.redial`), not its old one's
retransmission backoff.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable, Optional

from procsv.common.layout import Layout, read_json
from procsv.watchdog.diskjobs import DiskJobs, Job
from procsv.watchdog.multihost.probes import Prober
from procsv.watchdog.rules.hosts import BLIP_SECS, GAPS_KEPT, PROBE_WINDOW, master_lost, master_probe_due, master_redial
from procsv.watchdog.rules.state import Healed, NodeView

# the probes of a silent master kept in its view: the silence's first and the newest (a partition of hours is probed
# every 0.05 s; what master_lost and master_redial read is the first and the last few)
UNANSWERED_KEPT = 20


def master_beat(master: NodeView, now: float) -> NodeView:
    """After a :class:`~procsv.ipc.messages.MasterBeat` read at ``now``: the gap since the last one learnt (not one
    across a loss: the detector learns a connected master's gaps only), its probes since forgotten, not lost. A
    beat that ends a loss during which node 0's address answered no probe for ``PROBE_WINDOW`` at least is a
    healing too (``healed``): node 0's side of the connection retried first, the agent's side may still wait."""
    gaps = [*master.gaps[1 - GAPS_KEPT:], now - master.last_beat] \
        if master.last_beat is not None and master.lost_at is None else master.gaps
    # (the silence as the agent's last look saw it: a probe it sent and was descheduled before looking at is none)
    healed = Healed(now, now - master.unanswered[0]) if master.lost_at is not None and master.unanswered \
        and master.looked_at is not None and master.looked_at - master.unanswered[0] >= PROBE_WINDOW \
        and _since_healed(master.healed, master.unanswered[0]) else master.healed
    return dataclasses.replace(master, gaps=gaps, last_beat=now, lost_at=None, unanswered=[], reset_at=None,
                               healed=healed)


def master_heard(master: NodeView, now: float) -> NodeView:
    """After a word from node 0 other than a beat (:class:`~procsv.ipc.messages.StartMembers`, ...) read at ``now`` on
    the connection the agent has: node 0 is there, so a loss ends as at a beat (no gap learnt; the healing kept). A
    new connection may carry node 0's StartMembers before its first beat: the agent, its view still lost, killed
    the members it had just started as a stale group's. A connected master's view is left as it is."""
    if master.lost_at is None:
        return master
    return dataclasses.replace(master, last_beat=now, lost_at=None, unanswered=[], reset_at=None)


def master_probe_sent(master: NodeView, sent: float) -> NodeView:
    """After the agent probed node 0's address at ``sent`` (:func:`~procsv.watchdog.rules.hosts.master_probe_due`;
    the prober's clock once the handshake's first packet was out)."""
    kept = master.unanswered if len(master.unanswered) <= UNANSWERED_KEPT else \
        [master.unanswered[0], *master.unanswered[1 - UNANSWERED_KEPT:]]  # (the silence's first, and the last ones)
    return dataclasses.replace(master, probed_at=sent, unanswered=[*kept, sent])


def master_probes_looked(master: NodeView, looked_at: float, answers: list[tuple[float, bool]]) -> NodeView:
    """After the agent looked for the answers to its probes of node 0's address at ``looked_at`` (its clock before
    it looked): ``answers``, ``(sent, handshake)``. A handshake covers every probe sent up to its own (node 0's
    host was up then); a reset does not (node 0's port is its launch's own socket: a refusal means the launch is
    gone). :func:`~procsv.watchdog.rules.hosts.kernel_silent` counts what was still out at this look, as node 0's
    rule 12 does for an agent (never the agent's own lateness in deciding)."""
    unanswered, ok, healed, waits = master.unanswered, master.probe_ok, master.healed, master.waits
    for sent, handshake in answers:
        if handshake:  # (node 0's address reached then: kernel_silent's silence counts from the last such probe)
            waits = dataclasses.replace(waits, reached=max(sent, waits.reached if waits.reached is not None else sent))
            # none answered since (the address was silent), in a silence begun after the last healing (a late answer
            # to a probe of the same silence, its SYN sent again by the kernel after the heal: no second healing), and
            # no beat for BLIP_SECS at least (a blip rule 12 rode out on both sides: TCP retransmits what it dropped
            # on the connection the agent has, ~0.6 s after its start at most; a new one would drop what it queued)
            if unanswered and sent - unanswered[0] >= PROBE_WINDOW and _since_healed(healed, unanswered[0]) \
                    and (master.last_beat is None or sent - master.last_beat >= BLIP_SECS):
                healed = Healed(looked_at, sent - unanswered[0])
            unanswered, ok = [s for s in unanswered if s > sent], True
    return dataclasses.replace(master, unanswered=unanswered, probe_ok=ok, looked_at=looked_at, healed=healed,
                               waits=waits)


def _since_healed(healed: Optional[Healed], silent_from: float) -> bool:
    """Whether a silence whose first unanswered probe was sent at ``silent_from`` began after the last healing
    (``healed``; None: none yet)."""
    return healed is None or silent_from > healed.at


def status_stamp(layout: Layout) -> Any:
    """The ``updated_at`` of node 0's ``status.json`` (None: unreadable or not written)."""
    try:
        status = read_json(layout.status)
    except OSError:  # (a network filesystem's EIO, ESTALE: as unread)
        return None
    return status.get("updated_at") if isinstance(status, dict) else None


class MasterSeen:
    """Whether the master is gone for this agent (:meth:`gone`)."""

    def __init__(self, layout: Layout, disk: DiskJobs, rejoin_timeout: float, elastic: bool, address: str = "",
                 clock: Callable[[], float] = time.monotonic, node_timeout: float = 15.0) -> None:
        self.layout, self.disk, self.rejoin_timeout = layout, disk, rejoin_timeout
        self.heard_at = clock()  # the master's last word to this agent (the agent's start counts as one)
        self.node_timeout = node_timeout  # the master silent this long is lost (node 0's --node-timeout, once it says)
        self.address = address  # node 0's (--master-addr): probed as node 0 probes an agent's probe port
        self.view = NodeView(0, probe=address)  # node 0 as this agent sees it (rules.hosts.master_lost)
        self.prober = Prober(clock)
        self.elastic = elastic  # --min-nodes K < --nnodes M: node 0 takes this host back (rule 15)
        self._stamp: Any = None  # the status file's ``updated_at`` as last read
        self.changed_at = float("-inf")  # when a read found it changed (the first read counts)
        self._read: Optional[Job[Any]] = None  # a read in the logdir thread
        self._read_at = float("-inf")

    def gone(self, now: float, heard_at: float, node_timeout: float) -> bool:
        """The master last heard at ``heard_at``: silent past ``rejoin_timeout`` and, in an elastic job, its
        status file not found changed for ``rejoin_timeout`` + 2 x ``node_timeout`` (reads every ``node_timeout``)."""
        if now - heard_at <= self.rejoin_timeout:
            return False
        if not self.elastic:
            return True
        if self._read is not None and self._read.done:
            if self._read.result is not None and self._read.result != self._stamp:
                self._stamp, self.changed_at = self._read.result, now
            self._read = None
        if self._read is None and now - self._read_at >= node_timeout:
            self._read, self._read_at = self.disk.submit(lambda: status_stamp(self.layout)), now
        return now - max(heard_at, self.changed_at) > self.rejoin_timeout + 2 * node_timeout

    # ------------------------------------------------------------------ rule 12 the other way (master_lost)
    def beat(self, now: float) -> None:
        """A :class:`~procsv.ipc.messages.MasterBeat` read now."""
        self.view = master_beat(self.view, now)

    def heard(self, now: float) -> None:
        """A word from node 0 other than a beat read now (:func:`master_heard`)."""
        self.view = master_heard(self.view, now)

    def probe(self, now: float) -> None:
        """Observe the answers to this agent's probes of node 0's address, then send one if due; before :meth:`lost`."""
        looked_at, answers = self.prober.answers()
        self.view = master_probes_looked(self.view, looked_at, [(sent, handshake) for _, sent, handshake in answers])
        if master_probe_due(self.view, now):
            self.view = master_probe_sent(self.view, self.prober.send(0, self.address))

    def lost(self, now: float, node_timeout: float) -> Optional[str]:
        """Why node 0 is found lost now (once: until a beat comes again), or None (:func:`master_lost`)."""
        why = master_lost(self.view, now, node_timeout)
        if why is not None:
            self.view = dataclasses.replace(self.view, lost_at=now)
            self.prober.forget(0)
        return why

    def redial(self, dialed_at: float) -> Optional[float]:
        """How long node 0's address answered no probe before it answered again, if the agent replaces its
        connection now (:func:`master_redial`: made at ``dialed_at``); None: it keeps it."""
        return self.view.healed.after if self.view.healed is not None and master_redial(self.view, dialed_at) else None

    @property
    def is_lost(self) -> bool:
        return self.view.lost_at is not None

    def new_master(self) -> None:
        """A relaunched master (a new launch): its gaps learnt and its address proven anew."""
        self.prober.forget(0)
        self.view = NodeView(0, probe=self.address)

    def close(self) -> None:
        self.prober.close()
