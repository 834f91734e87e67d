"""Rule 15 of the decision function: an elastic group's membership (``--nnodes M --min-nodes K``).

Runs in the watchdog of node 0 (the master). Pure: reads the observed
:class:`~procsv.watchdog.rules.state.RunView` (each host's :class:`~procsv.watchdog.rules.state.NodeView`),
the time ``now`` passed in and the :class:`~procsv.watchdog.rules.limits.Limits`; returns values and actions.

A ``tf.distribute`` group cannot change its members in place: every change is a restart of the whole
group on a new ``TF_CONFIG`` (rule 11 starts it, rule 3 when it is due). This module decides which hosts
that group is made of:

- :func:`next_nodes`: the hosts the next group starts on. Node 0 and every other host whose agent is
  connected (and, after losses in a row, has stayed connected for its :func:`hold_down`). Without
  ``--min-nodes`` every host is waited for. With ``--min-nodes K`` (elastic) a host found lost is not
  waited for: rule 12 finds a silent host within 0.5 s and a slow one is not found lost (false losses are
  rare), so a lost host is taken to be gone and the group restarts at once on the K or more hosts it
  still has (issue 70: before, it waited out ``rejoin_timeout`` first); a host that never joined is
  waited for until ``rejoin_timeout`` has passed since the launch's start; fewer than K hosts connected
  wait for one to come back (rule 12 stops the run once fewer than K are left past ``rejoin_timeout``).
- :func:`out_of_group`: the hosts given up for now (past ``rejoin_timeout``, not connected). Fewer than
  ``K`` hosts left stops the run (:mod:`procsv.watchdog.rules.hosts`, rule 12).
- :func:`take_back`: a host connected (its agent joined or came back) while the group runs without it
  is taken back at the group's next checkpoint boundary: once its agent says its members would start
  at once (its pre-warmed trainer is ready; ``NodeHello.ready``), it has stayed connected for its
  :func:`hold_down`, and a checkpoint commits after that (and
  after the running group's first step; not the trainer's final one: it trained to its end), every member
  is SIGKILLed (cause ``regroup``); the
  group restarts at once on every connected host, from that checkpoint (the joiner has no state of
  its own: it restores the group's). A regroup is not a failure: rule 1 restarts without counting it.
- :func:`hold_down`: a host that flaps (lost, back, lost again...) would restart the group twice a flap
  (each loss a failure that progress forgives, each take-back a regroup), without bound. A host lost
  more than once within ``FLAP_WINDOW`` must stay connected before it is in a group again: the restart
  policy's backoff (``backoff_base`` x ``backoff_factor`` per loss past the first, at most
  ``backoff_cap``: 1, 2, 4 ... 30 s by default), so a host lost every few seconds is soon left out
  until it stays. Its first loss holds nothing: a host back from one loss is in the next group at once.

A host's members get their ranks in the order of the group's hosts: node 0's ``0 .. N-1``, the next host's
``N .. 2N-1`` and so on, so ranks stay dense whichever hosts are out (:func:`ranks_of`).
"""

from __future__ import annotations

from typing import Optional

from procsv.watchdog.rules.actions import Action, Cause, Kill
from procsv.watchdog.rules.group import members
from procsv.watchdog.rules.limits import Limits
from procsv.watchdog.rules.state import TRAINER, RunView


def connected(view: RunView, node: int) -> bool:
    """Whether host ``node``'s agent is connected now (node 0 always is: it is this watchdog)."""
    if node == 0:
        return True
    n = view.nodes.get(node)
    return n is not None and n.last_beat is not None and n.lost_at is None


def waited_for(view: RunView, node: int, now: float, limits: Limits) -> bool:
    """Whether host ``node``, not connected, is still waited for: within ``rejoin_timeout`` of the
    launch's start (it never joined) or of its loss."""
    n = view.nodes.get(node)
    since = view.launch_start if n is None or n.last_beat is None else n.lost_at
    return since is None or now - since <= limits.rejoin_timeout


def out_of_group(view: RunView, now: float, limits: Limits) -> list[int]:
    """The hosts given up for now: not connected, and past their ``rejoin_timeout``."""
    return [node for node in range(1, limits.nnodes)
            if not connected(view, node) and not waited_for(view, node, now, limits)]


FLAP_WINDOW = 600.0  # a host's losses this recent count for its hold-down (bookkeeping.note keeps them in NodeView)


def hold_down(view: RunView, node: int, now: float, limits: Limits) -> float:
    """How long host ``node`` must stay connected, once back, before a group starts on it: 0 unless it was
    lost more than once within ``FLAP_WINDOW``; then the restart policy's backoff, grown per loss past the
    first (``backoff_base * backoff_factor ** (losses - 2)``, at most ``backoff_cap``; no jitter)."""
    n = view.nodes.get(node)
    losses = 0 if n is None else sum(1 for t in n.lost_times if now - t <= FLAP_WINDOW)
    if losses < 2:
        return 0.0
    p = limits.restart
    return float(min(p.backoff_cap, p.backoff_base * p.backoff_factor ** (losses - 2)))


def settled_at(view: RunView, node: int, now: float, limits: Limits) -> Optional[float]:
    """When connected host ``node`` is in a group's hosts again: when it joined (or came back) plus its
    :func:`hold_down`; None: not connected."""
    if node == 0:
        return view.launch_start
    n = view.nodes.get(node)
    if not connected(view, node) or n is None:
        return None
    since = n.joined_at if n.joined_at is not None else n.last_beat
    return (since or 0.0) + hold_down(view, node, now, limits)


def settled(view: RunView, node: int, now: float, limits: Limits) -> bool:
    """Whether host ``node`` is connected and past its :func:`hold_down`."""
    at = settled_at(view, node, now, limits)
    return at is not None and now >= at


def next_nodes(view: RunView, now: float, limits: Limits) -> Optional[tuple[int, ...]]:
    """The hosts the next group starts on, in rank order (node 0 first); None: wait. Without ``--min-nodes``
    every host is waited for (connected and past its hold-down). With it, a host found lost is not (the group
    restarts at once on the hosts it has), one that never joined is within ``rejoin_timeout`` of the launch's
    start, and fewer than ``min_nodes`` hosts wait for one to come back."""
    nodes = [0]
    for node in range(1, limits.nnodes):
        if settled(view, node, now, limits):
            nodes.append(node)
        elif not limits.elastic:
            return None
        elif not ever_joined(view, node) and waited_for(view, node, now, limits):
            return None
    if limits.elastic and len(nodes) < limits.min_nodes:
        return None
    return tuple(nodes)


def ever_joined(view: RunView, node: int) -> bool:
    """Whether host ``node``'s agent joined once in this launch (it may be lost since)."""
    n = view.nodes.get(node)
    return n is not None and n.last_beat is not None


def ranks_of(nodes: tuple[int, ...], node: int, nproc: int) -> list[int]:
    """The ranks host ``node`` runs in a group of ``nodes`` (``nproc`` members a host)."""
    at = nodes.index(node)
    return list(range(at * nproc, at * nproc + nproc))


def take_back(view: RunView, now: float, limits: Limits) -> list[Action]:
    """Regroup at the checkpoint boundary: every joiner is ready (its pre-warmed trainer, so that its members
    start at once: ``NodeView.ready_at``; or ``zygote_wait`` passed since it joined), and a checkpoint committed
    after that and after the running group's first step: SIGKILL every live member (cause ``regroup``)."""
    if not limits.elastic or view.stop_signal is not None or view.finishing or view.restart_at is not None:
        return []
    chief = view.children.get(TRAINER)
    if chief is None or not chief.live or chief.first_step_at is None or chief.regroup:
        return []
    back = [node for node in view.nodes if view.group_nodes and node not in view.group_nodes
            and connected(view, node)]  # connected now, and the running group was started without them
    ready: list[float] = []
    for node in back:
        n = view.nodes[node]
        held = settled_at(view, node, now, limits)
        if held is None or now < held:
            return []  # it flapped: not back before its hold-down
        if n.ready_at is not None:
            ready.append(max(n.ready_at, held))
        elif n.joined_at is not None and now - n.joined_at > limits.zygote_wait:
            ready.append(max(n.joined_at + limits.zygote_wait, held))  # its pre-warmed trainer is late: not waited for longer
        else:
            return []
    if not ready or view.last_commit_at is None or view.last_commit_final:
        return []  # (the trainer's final commit: it trained to its end and exits; nothing to take a host back to)
    if view.last_commit_at < max(max(ready), chief.first_step_at):
        return []
    return [Kill(m.slot, m.attempt, Cause.REGROUP, f"node(s) {', '.join(map(str, back))} back: the group "
                 f"restarts with them from the checkpoint of step {view.last_commit_step}")
            for m in members(view, chief) if m.live and not m.killed]
