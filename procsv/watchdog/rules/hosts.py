"""Rule 12 of the decision function: the other hosts of a job that spans hosts (``--nnodes M``).

Runs in the watchdog of node 0 (the master, which decides for the whole job). Pure: reads the
observed :class:`~procsv.watchdog.rules.state.RunView` (each host's :class:`NodeView`, fed by its
agent's heartbeats), the time ``now`` passed in and the :class:`~procsv.watchdog.rules.limits.Limits`.

- A host is lost (:class:`NodeLost`) when it is silent: its agent's beats (every ``AGENT_BEAT_SECS``,
  0.1 s) are late past :func:`suspect_after` (an adaptive bound over the gaps node 0 read between its
  beats: their mean plus ``SUSPECT_SIGMAS`` deviations, phi-accrual's idea, kept within 0.2-0.3 s) AND
  its host's kernel answers none of node 0's probes (a TCP handshake to the agent's probe port,
  :func:`probes_due`, every ``PROBE_EVERY`` while the beats are late) for ``PROBE_WINDOW``, as node 0 saw at
  its last look (:func:`kernel_silent`: node 0's own slowness is no evidence of a silent host), its beats then
  ``BLIP_SECS`` (0.4 s) late at least: a host whose network is cut, or whose power or kernel is gone, is found
  within 0.5 s of its silence, and a link that drops every packet for up to 0.25 s (a bond's failover, a fast
  reroute; up to 0.35 s by its phase against the beats) and passes them again is ridden out (TCP retransmits what
  it dropped; before, a blip of 0.15-0.25 s was a loss and a group restart). A slow agent
  (stopped, starved of CPU, blocked) is not: its host's kernel still completes the handshake, so only
  the bound applies to it, ``node_timeout`` (``--node-timeout``) seconds without a beat, whatever the
  probes say, on node 0's watched clock (:mod:`procsv.common.clock.unwatched`: a time node 0 was stopped, SIGSTOP
  then SIGCONT, is left out; before, its first round after a SIGSTOP of 20 s decided before the beats queued meanwhile
  were read and found a host that beat all along lost "for 20 s", about one run in two), and counted from node 0's own
  resumption when its loop stalled without a stop since the host's last beat (blocked or descheduled
  ``OWN_STALL_SECS`` or more, ``NodeView.watched_from``: the beats that came meanwhile are read a moment after). The fast path needs a probe port that answered once (``probe_ok``: one behind a firewall
  never did, and an unanswered probe then means nothing). An answer of a reset to a probe sent since the last
  beat (the host is up, its agent's port closed: the agent died or exited, :func:`agent_gone`) finds the host
  lost as soon: no agent is there to be slow (before, it was left to the bound, 15 s by default, while the
  group waited for the dead agent's members). Its members count as dead, which breaks the group (rule 11); the next group
  waits until every host is connected again, or with ``--min-nodes`` starts at once on the hosts left
  (:func:`~procsv.watchdog.rules.membership.next_nodes`). Also
  while the run finishes: the launch waits for no member of a lost host.
- A one-way cut of node 0's frames to a host (its beats still coming until its TCP waits for node 0's
  acknowledgements, ~0.25 s): its agent's hellos say how long it has heard nothing from node 0 (``NodeHello.deaf``);
  one saying ``DEAF_SECS`` or more starts node 0's probes at once, and the host is lost once those sent since went
  unanswered ``ONE_WAY_WINDOW`` (:func:`one_way_cut`; found in 0.34 s, before 0.53-0.69 s, past the 0.5 s goal).
- A host whose agent beats on but answers none of a start node 0 asked of it (``StartMembers``: no ``MemberStarted``
  for a member of it) for :func:`start_bound` seconds (the agent's own bound on its pre-warmed trainer's fork,
  ``START_ANSWER_SECS``, plus ``node_timeout``) is lost too (:func:`start_unanswered`: the request lost with a
  connection node 0 did not see replaced, or an agent whose loop is wedged while something else beats), said with
  what to do; its hello takes it back, and the group's restart asks it again. Before, node 0 waited for the answer
  for ever (the view ``forking``: no restart, and a stop waited its grace, then for ever for the member asked).
  A stop waits for no such start (:class:`StartsDropped`: its members count as never started, which breaks a group
  waiting for them in its first collective; the launch's ``NodeStop`` has the agent stop whatever it started).
- A host that never joined, or was lost and did not come back within ``rejoin_timeout``
  seconds, stops the run in order, which then fails (:class:`StopFailing`). With ``--min-nodes K``
  (elastic, :mod:`procsv.watchdog.rules.membership`) only once fewer than K hosts are left: until
  then the group trains on without it (from its loss on), and takes it back when its agent comes back.
- Which agent may speak for a node rank (:func:`claim_node`): the first key that claims it in a
  launch holds it; another key's claim is refused while the holder is connected, and wins once
  the holder's host was found lost (its agent relaunched: a new agent makes a new key pair).
"""

from __future__ import annotations

import enum
import math
from typing import Mapping, Optional

from procsv.watchdog.rules.actions import Action, NodeLost, StartsDropped, StopFailing
from procsv.watchdog.rules.limits import Limits
from procsv.watchdog.rules.membership import out_of_group
from procsv.watchdog.rules.state import NodeView, RunView

AGENT_BEAT_SECS = 0.1  # an agent beats (NodeHello) this often; node 0 beats its agents every 0.5 s
GAPS_KEPT = 100  # the gaps between a host's beats that the detector looks at (the last 10 s or so)
SUSPECT_FLOOR = 0.2  # beats late this long at least (two beats missed) before a host is probed
SUSPECT_CAP = 0.3  # ... and at most (the 0.5 s bound: this, the window, a round of node 0's loop)
SUSPECT_SIGMAS = 4.0  # late past the mean gap plus this many deviations (phi about 4.5; more at the floor)
MIN_SIGMA = 0.02  # the deviation taken at least (a steady agent's gaps vary by a few ms: no hair trigger)
PROBE_EVERY = 0.05  # a suspected host is probed this often
PROBE_WINDOW = 0.1  # ... and lost once a probe went unanswered this long at a look of node 0's (PROBES_MIN at least)
# ... and no beat came for this long at that look: a link blip shorter than this (less a beat's and a probe's interval,
# 0.25 s at least, up to 0.35 s by its phase against the beats) is ridden out, not a loss. The 0.5 s goal caps it: a
# blip cannot be told from a cut until it ends, so a silent host is found about this long after its last beat
BLIP_SECS = 0.4
PROBE_RTT = 0.05  # a probe out this long at a look counts as unanswered (a LAN's round trip: under a millisecond)
PROBES_MIN = 2
PROVE_EVERY = 1.0  # a probe port not proven yet is probed this often (one answer proves it)
PROBE_TIMEOUT = 2.0  # node 0 gives up on one probe after this (it counts as unanswered from the start)
OWN_STALL_SECS = 2.0  # node 0's own round this late after the one before (watched time): blocked or descheduled, not watching
# an agent's hello saying it heard nothing from node 0 for this long (NodeHello.deaf: node 0 beats every 0.1 s, so
# one beat missed and half an interval) starts node 0's probes of its host (rule 12's second signal of a one-way
# cut, one_way_cut). Low: the probes decide, this only starts them; and a hello sent past ~0.25 s of a cut of node 0's
# frames no longer reaches node 0 (its agent's TCP then waits for node 0's acknowledgements)
DEAF_SECS = 0.15
# ... and the host is lost once the probes sent since went unanswered this long (PROBES_MIN at least): longer than
# PROBE_WINDOW, so that a blip whose two ways heal apart (node 1's frames passing a moment before node 0's: its held
# hellos, saying it heard nothing, come first) is ridden out as one that heals at once; a cut still found within 0.5 s
ONE_WAY_WINDOW = 0.15
# an agent answers a start (StartMembers) within this once its loop reads it: a fork asked of its pre-warmed trainer is
# given up after prewarm.FORK_REPLY_TIMEOUT (the same 10 s) and the member started fresh at once (a Popen)
START_ANSWER_SECS = 10.0


def host_actions(view: RunView, now: float, limits: Limits) -> list[Action]:
    """Rule 12: hosts lost, and hosts that stay away too long."""
    if limits.nnodes <= 1:
        return []
    out: list[Action] = []
    for node in range(1, limits.nnodes):
        n = view.nodes.get(node)
        if n is None or n.last_beat is None or n.lost_at is not None:
            continue
        # also while the run finishes: a host that dies during the orderly stop reports its
        # members' ends no more, and the launch waits for them until their host is found lost
        if now - max(n.last_beat, n.watched_from) > limits.node_timeout:  # (a silence node 0 watched)
            out.append(NodeLost(node, now - n.last_beat))
        elif (unanswered := kernel_silent(n, now)) is not None:
            out.append(NodeLost(node, now - n.last_beat, unanswered))
        elif agent_gone(n, now):
            out.append(NodeLost(node, now - n.last_beat, reset=True))
        elif (cut := one_way_cut(n)) is not None:
            out.append(NodeLost(node, now - n.last_beat, cut, deaf=n.waits.deaf))
        elif (waited := start_unanswered(n, now, limits)) is not None:
            out.append(NodeLost(node, now - n.last_beat, unstarted=tuple(n.waits.asked), start_secs=waited))
        elif n.waits.asked_at is not None and view.stop_signal is not None:  # (a stop waits for no start of another host)
            out.append(StartsDropped(node, tuple(n.waits.asked), now - n.waits.asked_at))
    if view.stop_signal is not None or view.finishing:
        return out
    gone = out_of_group(view, now, limits)
    if not gone or (limits.elastic and limits.nnodes - len(gone) >= limits.min_nodes):
        return out
    whys = []
    for node in gone:
        n = view.nodes.get(node)
        if n is None or n.last_beat is None:
            whys.append(f"node {node} did not join within --rejoin-timeout {limits.rejoin_timeout:g} s (is `procsv "
                        f"launch --node-rank {node}` running there, and can it reach --master-addr?)")
        else:
            whys.append(f"node {node} ({n.host}) was lost and did not come back within --rejoin-timeout "
                        f"{limits.rejoin_timeout:g} s")
    why = "; ".join(whys)
    if limits.elastic:
        why += f": {limits.nnodes - len(gone)} of {limits.nnodes} hosts left, fewer than --min-nodes {limits.min_nodes}"
    return [StopFailing("nodes", why, why)]


def suspect_after(gaps: list[float]) -> float:
    """How late a host's beats may be before it is suspected (probed): the mean of the gaps node 0 read
    between its beats plus ``SUSPECT_SIGMAS`` deviations (at least ``MIN_SIGMA``), within
    ``SUSPECT_FLOOR``-``SUSPECT_CAP``. A host whose beats come late often (a loaded one) is probed later;
    never past the cap, so that a silent host is still found within 0.5 s."""
    if len(gaps) < 2:
        return SUSPECT_FLOOR
    mean, sigma = _moments(gaps)
    return min(SUSPECT_CAP, max(SUSPECT_FLOOR, mean + SUSPECT_SIGMAS * sigma))


def _moments(gaps: list[float]) -> tuple[float, float]:
    """The mean of ``gaps`` and their deviation, at least ``MIN_SIGMA`` (plain floats: each round asks)."""
    mean = sum(gaps) / len(gaps)
    return mean, max(math.sqrt(sum((g - mean) ** 2 for g in gaps) / len(gaps)), MIN_SIGMA)


def phi(silent: float, gaps: list[float]) -> float:
    """Phi-accrual's suspicion of a host whose beats have been late ``silent`` seconds: -log10 of the
    chance that a gap as long comes from the gaps seen (a normal law over them). For the docs and tests:
    the rule suspects at :func:`suspect_after`, where phi is about 4.5 (more at its floor: a steady agent)."""
    if len(gaps) < 2:
        return 0.0
    mean, sigma = _moments(gaps)
    tail = 0.5 * math.erfc((silent - mean) / (sigma * math.sqrt(2)))
    return -math.log10(max(tail, 1e-300))


def suspected(n: NodeView, now: float) -> bool:
    """Whether a connected host's beats are late past :func:`suspect_after`."""
    return n.last_beat is not None and now - n.last_beat > suspect_after(n.gaps)


def kernel_silent(n: NodeView, now: float) -> Optional[float]:
    """How long a suspected host's kernel has answered none of node 0's probes, once that makes it lost;
    None: not lost this way (not suspected, its probe port never proven, or too little evidence).

    The evidence is what node 0 saw at its last look for the answers (``looked_at``), never its clock at the
    decision: ``PROBES_MIN`` probes at least out since ``PROBE_RTT`` then, the oldest since ``PROBE_WINDOW``,
    none answered (an answer to a later probe covers the earlier ones). A node 0 slow to look, or descheduled
    between its look and its decision, finds the host later, never lost by its own lateness: the probes it
    sent had all that time to be answered. And no beat for ``BLIP_SECS`` at that look: a blip is told from a cut
    only once it ends, so the host is found lost no sooner than that after its last beat (its probes, sent from
    :func:`suspect_after` on, answer as soon as the link passes again, and cover the ones the blip dropped). That
    silence counts from the last probe the host's kernel answered, if later than its last beat (``Waits.reached``: the
    link passed then): a flapping link whose beats wait out TCP's retransmission through two blips, each of 0.25 s at
    most, is ridden out (before, a loss 0.1-0.2 s into the second blip: measured on the agent's side)."""
    if not n.probe_ok or n.looked_at is None or not suspected(n, now) or n.last_beat is None \
            or n.looked_at - max(n.last_beat, n.waits.reached or n.last_beat) < BLIP_SECS:
        return None
    out = [sent for sent in n.unanswered if n.looked_at - sent >= PROBE_RTT]
    if len(out) < PROBES_MIN or n.looked_at - out[0] < PROBE_WINDOW:
        return None
    return n.looked_at - out[0]


def one_way_cut(n: NodeView) -> Optional[float]:
    """How long a host's kernel has answered none of node 0's probes sent since its agent first said, in a hello node
    0 read (``NodeView.deaf_from``), that it had heard nothing from node 0 for ``DEAF_SECS`` or more, once that makes it
    lost; None: not lost this way. Its hellos reach node 0 and node 0's frames (beats, probes' handshakes) do not
    reach it: a one-way cut of node 0's frames to it, found as a silent host's (``PROBES_MIN`` probes at least out
    since ``PROBE_RTT`` at node 0's last look, the oldest since ``ONE_WAY_WINDOW``, none answered) without waiting for
    its beats to be late: they kept coming until its TCP waited for node 0's acknowledgements (~0.25 s), and were
    then ``BLIP_SECS`` late at least (before, found 0.654 s after the cut, past the 0.5 s goal). A slow agent's host
    answers the probes (only the bound applies to it, as for a late beat); a link that dropped both ways (a blip)
    delivers the hellos it held only once it passes again, when the probes sent since are answered (the probes of
    the blip itself are not counted: ``observe.node_hello`` keeps only those sent since the first deaf hello). A probe
    the host's kernel answered ends the agent's word (node 0's frames reach it: ``observe.probes_looked``), and the
    agent's silence counts from the last such answer, if later (``Waits.reached``): on a flapping link, the held
    hellos of one blip, their agent still deaf while its connection waits out TCP's retransmission, are no evidence
    through the next blip (before, a loss 0.16 s into a second blip of 0.2 s, though no hello passed in it)."""
    if not n.probe_ok or n.waits.deaf_from is None or n.looked_at is None or n.lost_at is not None:
        return None
    out = [sent for sent in n.unanswered if sent >= n.waits.deaf_from and n.looked_at - sent >= PROBE_RTT]
    if len(out) < PROBES_MIN or n.looked_at - out[0] < ONE_WAY_WINDOW:
        return None
    return n.looked_at - out[0]


def agent_gone(n: NodeView, now: float) -> bool:
    """Whether a suspected host answered a probe sent since its agent's last beat with a reset: its host is up
    and no agent listens on its probe port (the agent died, or exited; a port proven once by a handshake, so
    not a firewall's reset), and its members died with it (their parent-death signal)."""
    return n.probe_ok and n.reset_at is not None and suspected(n, now)


def start_bound(limits: Limits) -> float:
    """How long node 0 waits for an agent's answer to a start it asked (:func:`start_unanswered`): the agent's own
    bound on its answer (``START_ANSWER_SECS``: a fork of its pre-warmed trainer given up, the member started fresh)
    plus ``node_timeout`` (an agent may be slow that long: stopped, starved of CPU, its beats late but coming)."""
    return START_ANSWER_SECS + limits.node_timeout


def start_unanswered(n: NodeView, now: float, limits: Limits) -> Optional[float]:
    """How long node 0 has waited for host ``n``'s answer to the oldest start it asked of it (``NodeView.asked_at``,
    the first send's time on the watched clock: a resend down a new connection does not restart it), once that is
    past :func:`start_bound`; None: no start waits, or not that long. The host beats on (a silent one is found by
    its silence first), so its agent reads node 0's messages or never got this one: either way the member asked
    will not start, and counting the host lost ends the wait as its silence would (the members asked count dead, the
    group restarts, its next hello takes the host back). A late answer finds its member stale (killed)."""
    if n.waits.asked_at is None or now - n.waits.asked_at <= start_bound(limits):
        return None
    return now - n.waits.asked_at


def stale_members(n: NodeView) -> list[tuple[str, int]]:
    """The members a host found lost still runs, as its agent's last hello listed them (``(slot, attempt)``): each of
    them counted dead at the loss (its group broke and restarts without it), so each is stale, and node 0 has its
    agent kill it. Until they are gone the host is not taken back (:func:`~procsv.watchdog.observe.node_hello`: an
    agent still running an old group's members stops them first). Its agent stops them itself once it finds node 0
    lost; one that did not (a link blip that node 0's rule called a loss and the agent's rode out, its own view of
    node 0 a turn later: measured, blips of 0.25-0.3 s) kept them running, and a member that does not end by itself
    (one that sleeps; a TensorFlow member ends once the chief it talks to is gone) kept the host out: node 0 waited
    for it until ``--rejoin-timeout``, and failed the run."""
    if n.lost_at is None:
        return []
    return [(slot, int(attempt)) for slot, _, attempt in (m.rpartition(".") for m in n.live) if attempt.isdigit()]


def probes_due(view: RunView, now: float) -> list[int]:
    """The hosts node 0 probes now (its link connects to their probe ports, :mod:`procsv.watchdog.multihost.probes`):
    each suspected one every ``PROBE_EVERY``, and one whose probe port is not proven yet every ``PROVE_EVERY``."""
    due = []
    for node, n in sorted(view.nodes.items()):
        if not n.probe or n.last_beat is None or n.lost_at is not None:
            continue
        # (suspected: its beats late; deaf: its agent says node 0's frames do not reach it, its own still pass)
        every = PROBE_EVERY if suspected(n, now) or (n.waits.deaf_from is not None and n.probe_ok) \
            else None if n.probe_ok else PROVE_EVERY
        if every is not None and (n.probed_at is None or now - n.probed_at >= every - 1e-9):
            due.append(node)
    return due


class Claim(str, enum.Enum):
    """The answer to an agent that says it is node R (:func:`claim_node`)."""

    HELD = "held"  # this key already holds the node
    BOUND = "bound"  # the node is free (never claimed, or its holder was found lost): this key holds it now
    REFUSED = "refused"  # another key holds it and its host is not lost; or no such node in this job


def claim_node(view: RunView, limits: Limits, node: int, holders: Mapping[int, str], key: str) -> tuple[Claim, str]:
    """Whether ``key`` (an agent's public key, as its CURVE handshake proved it) may speak for
    ``node``; ``holders``: which key holds which node in this launch. The reason says why not.
    Pure: the master's link keeps the holders and acts on the answer."""
    if not 1 <= node < limits.nnodes:
        return Claim.REFUSED, f"this job has no node {node} (--nnodes {limits.nnodes}: nodes 1 to " \
                              f"{limits.nnodes - 1} join node 0)"
    holder = holders.get(node)
    if holder == key:
        return Claim.HELD, ""
    other = next((n for n, k in holders.items() if k == key), None)
    if other is not None:
        return Claim.REFUSED, f"this agent already speaks for node {other} in this launch"
    if holder is None:
        return Claim.BOUND, f"node {node} had no agent in this launch"
    n = view.nodes.get(node)
    if n is None or n.lost_at is not None:
        return Claim.BOUND, f"node {node}'s earlier agent was lost"
    return Claim.REFUSED, f"node {node} is held by another agent in this launch" + \
        (f" (at {n.host}, pid {n.pid})" if n.host else "") + \
        f"; a second `procsv launch --node-rank {node}`? It is refused while that agent is connected"


# ---------------------------------------------------------------- the other way: an agent's view of its master
# (issue 70, "the master is a host too"). Run by each node agent's loop (procsv.watchdog.multihost.masterseen
# observes, procsv.watchdog.multihost.agent acts), with the same evidence and bounds as node 0's view of an agent:
# node 0 beats every AGENT_BEAT_SECS too (multihost.nodes.BEAT_SECS), the agent keeps the gaps between the beats
# it read in a NodeView of node 0 and probes node 0's own address (--master-addr: the master's listening socket,
# whose handshakes node 0's kernel completes whether its loop turns or not). One difference: a reset is no answer
# here (the agent observes it so): node 0's port is its launch's own socket, so a refusal means its launch is gone.

def master_lost(master: NodeView, now: float, node_timeout: float) -> Optional[str]:
    """Why a node agent's master is lost now (it stops its members: they are part of a stale group); None: not
    lost. Its beats late past :func:`suspect_after` and none of the agent's probes answered for
    ``PROBE_WINDOW`` (:func:`kernel_silent`: a host silent, or node 0's launch gone, found within 0.5 s); or no
    beat for ``node_timeout``, whatever the probes say (a master whose loop is slow is left to that bound)."""
    if master.last_beat is None or master.lost_at is not None:
        return None
    silent = now - master.last_beat
    if silent > node_timeout:
        return f"no heartbeat from node 0 for {silent:.1f} s (longer than its --node-timeout {node_timeout:g})"
    unanswered = kernel_silent(master, now)
    if unanswered is not None:
        return (f"no heartbeat from node 0 for {silent:.2f} s and no handshake from node 0's address for "
                f"{unanswered:.2f} s (its host silent, or its launch gone)")
    return None


def master_probe_due(master: NodeView, now: float) -> bool:
    """Whether a node agent probes its master now: as :func:`probes_due` for a host, every ``PROBE_EVERY`` while
    its beats are late past :func:`suspect_after`, every ``PROVE_EVERY`` until its address answered once; and
    every ``PROVE_EVERY`` once its kernel answered in this silence (a master stopped whole, its ZeroMQ thread too,
    accepts nothing: each probe waits in its listening socket's backlog, 100 by default, and a full backlog
    answers no more; at ``PROBE_EVERY`` 15 s of a stopped master would fill it, at ``PROVE_EVERY`` never). Also
    once it is found lost, at the same pace: its address answering again is when the agent redials
    (:func:`master_redial`)."""
    if not master.probe or master.last_beat is None:
        return False
    # (a handshake covers every probe sent up to it: masterseen.master_probes_looked; with none out, and one sent in
    # this silence, node 0's kernel answered in it: the next probe PROVE_EVERY later, the others PROBE_EVERY after it)
    answered = master.probe_ok and not master.unanswered and master.probed_at is not None \
        and master.probed_at > master.last_beat
    every = (PROVE_EVERY if answered else PROBE_EVERY) if suspected(master, now) \
        else None if master.probe_ok else PROVE_EVERY
    return every is not None and (master.probed_at is None or now - master.probed_at >= every - 1e-9)


def master_redial(master: NodeView, dialed_at: float) -> bool:
    """Whether a node agent replaces its connection to its master now (a new socket: ``NodeHello.link`` + 1): node
    0's address answered no probe for ``PROBE_WINDOW`` at least and was heard again since the agent made its
    connection (``dialed_at``): a handshake answered, or a beat that ended its loss (``healed``: a partition
    healed, the packets pass again). The connection it has waits out TCP's retransmission backoff on the agent's
    side (from 0.2 s, doubled at each unanswered try up to 120 s: after a partition of P seconds its next try
    comes up to about P later, and only then does its hello pass; node 0's side retries on its own backoff, so
    node 0's beats may come back first); a new one is up within a few round trips. Once per healing: a master
    whose kernel answered all along (a slow one, lost at ``node_timeout``) lost no packet and keeps its
    connection."""
    return master.healed is not None and master.healed.at > dialed_at
