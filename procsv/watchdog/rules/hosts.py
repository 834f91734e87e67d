"""Rule 12 of the decision function: the other hosts of a job that spans hosts (``--nnodes M``).

Runs in the watchdog of node 0 (the master, which decides for the whole job). Pure: reads the
observed :class:`~procsv.watchdog.rules.state.RunView` (each host's :class:`NodeView`, fed by its
agent's heartbeats), the time ``now`` passed in and the :class:`~procsv.watchdog.rules.limits.Limits`.

- A host whose agent has been silent for ``node_timeout`` seconds is lost (:class:`NodeLost`):
  its members count as dead, which breaks the group (rule 11); the next group waits until
  every host is connected again (:func:`~procsv.watchdog.rules.membership.next_nodes`). Also while the run finishes: the launch
  waits for no member of a lost host.
- A host that never joined, or was lost and did not come back within ``rejoin_timeout``
  seconds, stops the run in order, which then fails (:class:`StopFailing`). With ``--min-nodes K``
  (elastic, :mod:`procsv.watchdog.rules.membership`) only once fewer than K hosts are left: until
  then the group trains on without it, and takes it back when its agent comes back.
- Which agent may speak for a node rank (:func:`claim_node`): the first key that claims it in a
  launch holds it; another key's claim is refused while the holder is connected, and wins once
  the holder's host was found lost (its agent relaunched: a new agent makes a new key pair).
"""

from __future__ import annotations

import enum
from typing import Mapping

from procsv.watchdog.rules.actions import Action, NodeLost, StopFailing
from procsv.watchdog.rules.limits import Limits
from procsv.watchdog.rules.membership import out_of_group
from procsv.watchdog.rules.state import RunView


def host_actions(view: RunView, now: float, limits: Limits) -> list[Action]:
    """Rule 12: hosts lost, and hosts that stay away too long."""
    if limits.nnodes <= 1:
        return []
    out: list[Action] = []
    for node in range(1, limits.nnodes):
        n = view.nodes.get(node)
        if n is not None and n.last_beat is not None and n.lost_at is None and now - n.last_beat > limits.node_timeout:
            # also while the run finishes: a host that dies during the orderly stop reports its
            # members' ends no more, and the launch waits for them until their host is found lost
            out.append(NodeLost(node, now - n.last_beat))
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
