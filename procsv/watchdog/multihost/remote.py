"""The members of a trainer group that run on other hosts (``--nnodes M``), seen from node 0.

Runs in the watchdog of node 0 (the master). :class:`RemoteMembers` asks each other host's agent
(over :class:`~procsv.watchdog.multihost.nodes.NodeLink`) to start its share of a group's attempt, and
turns the agents' answers into observations of the view: a member started (``spawned``, via
``node<R>``), or ended (``exited``, with the error file the member wrote in the shared logdir, read
by the logdir reader thread: the end is observed when the read is done, or without it once
:data:`~procsv.watchdog.endreads.READ_WAIT` has passed).
The executor signals and kills remote members through the same link, and asks their agents for their
stacks (:attr:`RemoteMembers.stacks`).

A member of another host files a CURVE key for node 0's checkpoint service (its peer copies,
:func:`procsv.common.curve.connect_member`) and removes it at an orderly exit, never when
SIGKILLed: node 0 removes the key files of the attempts that are over (when the next one starts)
and of each member that ended, on the logdir reader thread (:func:`procsv.common.curve.unfile_members`).
"""

from __future__ import annotations

import signal
from collections import deque
from typing import Callable, Optional

from procsv.common import curve
from procsv.common.bootstrap import Resume
from procsv.common.layout import Layout
from procsv.ipc.messages import PromoteMember
from procsv.watchdog import observe
from procsv.watchdog.children import read_child_error
from procsv.watchdog.diskjobs import DiskJobs, Job
from procsv.watchdog.endreads import READ_WAIT, UNREAD
from procsv.watchdog.lateblame import breaker_found
from procsv.watchdog.rules.failures import ChildError, Failure
from procsv.watchdog.rules.group import rank_of, worker_slot
from procsv.watchdog.rules.membership import ranks_of
from procsv.watchdog.multihost.nodes import NodeLink
from procsv.watchdog.multihost.stackasks import StackAsks
from procsv.watchdog.publish.events import Report
from procsv.watchdog.rules.standby import slot as standby_slot
from procsv.watchdog.rules.state import STANDBY, WORKER, RunView


def files_of(slot: str) -> str:
    """The name of a remote member's log and error file: its slot's, a standby group's member's its worker's."""
    return worker_slot(rank_of(slot)) if slot.startswith(STANDBY) else slot


class RemoteMembers:
    """Node 0's side of the other hosts' members; one per launch with ``--nnodes`` > 1."""

    def __init__(self, link: NodeLink, view: RunView, layout: Layout, nproc: int,
                 report: Callable[[list[Report]], None], clock: Callable[[], float], reader: DiskJobs) -> None:
        self.link = link
        self.stacks = StackAsks(link, clock)  # the asks of the agents for their members' stacks (issue 69)
        self.view = view
        self.layout = layout
        self.nproc = nproc
        self.report = report
        self.clock = clock
        self.pending: dict[str, tuple[int, int]] = {}  # slot -> (attempt, host): members asked of an agent, not started yet
        # (the view is forking meanwhile: Executor.perform)
        self.reader = reader
        # the starts asked of an agent: (node, attempt, slots) -> (ranks, cluster, env, sent: the last send went
        # out), sent again while one of their members is still pending, down the node's new route or after a
        # send that failed (resend)
        self.asked: dict[tuple[int, int, tuple[str, ...]], tuple[list[int], list[str], dict[str, str], bool]] = {}
        # ... and when each was first sent (watched clock): rule 12 bounds the wait for its answer (start_unanswered)
        self.asked_at: dict[tuple[int, int, tuple[str, ...]], float] = {}
        # the promotions sent to an agent: (node, standby slot, attempt) -> (the message, sent: the last send went
        # out), sent again while the agent's hellos still list the member unpromoted, down the node's new route or
        # after a send that failed (resend): the agent promotes a member once however often it is asked
        self.promoting: dict[tuple[int, str, int], tuple[PromoteMember, bool]] = {}
        # ends whose error file is being read: (slot, attempt, pid, code, wall, the read, due), in order
        self._stale_said: set[tuple[int, str, int]] = set()  # the stale members of a lost host said killed (stale)
        self._ends: "deque[tuple[str, int, int, int, float, bool, Job[Optional[ChildError]], float]]" = deque()

    def start(self, attempt: int, cluster: list[str], env: dict[str, str], nodes: tuple[int, ...],
              standby: bool = False) -> None:
        """Ask every other host of ``nodes`` (the group's hosts, node 0 first) for its tasks of the group's
        ``attempt``: the host at place P of ``nodes`` runs P*N .. P*N+N-1 (:func:`membership.ranks_of`).
        ``standby``: its members of a standby group prepared to become ``attempt`` (slots ``standby<R>``)."""
        job, layout = self.link.job, self.layout
        if not standby:  # (a standby group is prepared while the attempt before it runs)
            self.reader.submit(lambda: curve.unfile_members(layout, job, before=attempt))  # every earlier one is over
        slot_of = standby_slot if standby else worker_slot
        for node in nodes[1:]:
            ranks = ranks_of(nodes, node, self.nproc)
            for rank in ranks:
                self.pending[slot_of(rank)] = attempt, node
            self._ask(node, attempt, tuple(slot_of(r) for r in ranks), ranks, cluster, env, standby)
        self._forget_answered()

    def promote(self, node: int, slot: str, attempt: int, told: Resume) -> None:
        """Ask host ``node``'s agent to promote its standby group member ``slot`` to the ``attempt``'s worker
        (:mod:`procsv.watchdog.multihost.standbys`), with what a member spawned now would be ``told``."""
        self._promote(node, PromoteMember(slot, attempt, list(told.skip_steps), told.rollback_before,
                                          told.launch_start_step))

    def _promote(self, node: int, msg: PromoteMember) -> None:
        key = node, msg.slot, msg.attempt
        sent = self.link.promote(node, msg)
        if not sent and (key not in self.promoting or self.promoting[key][1]):  # (said once, not at each try)
            self.report([Report(say=f"procsv: could not send node {node}'s agent the promotion of {msg.slot} "
                                    f"(attempt {msg.attempt}): not connected; sending it again as it says hello")])
        self.promoting[key] = msg, sent

    def start_task(self, node: int, slot: str, attempt: int, rank: int, env: dict[str, str]) -> None:
        """Ask host ``node`` for one task restarted alone (``--ps``: a worker), ``env`` with its whole
        ``TF_CONFIG``."""
        self.pending[slot] = attempt, node
        self._ask(node, attempt, (slot,), [rank], [], env)
        self._forget_answered()

    def _ask(self, node: int, attempt: int, slots: tuple[str, ...], ranks: list[int], cluster: list[str],
             env: dict[str, str], standby: bool = False) -> None:
        key = node, attempt, slots
        self.asked_at.setdefault(key, self.clock())
        sent = self.link.start(node, attempt, ranks, cluster, env, standby)
        if not sent and (key not in self.asked or self.asked[key][3]):  # (said once, not at each try)
            self.report([Report(say=f"procsv: could not send node {node}'s agent its start of {', '.join(slots)} "
                                    f"(attempt {attempt}): not connected; asking again as it says hello")])
        self.asked[key] = ranks, cluster, env, sent

    def resend(self, nodes: set[int]) -> None:
        """The routes of ``nodes`` moved to another connection (:meth:`NodeLink.take_rerouted`): send their
        starts still waited for again. The first may have gone down a connection the agent had replaced
        (what its old socket queued during a partition reaches node 0 before any hello of the new one) and
        be lost; nothing else would end the wait while the host keeps saying hello (the view forking: no
        restart, no stop). A start whose send failed (not connected, or its queue full) is sent again at
        each call. The agent starts a member of an attempt once however often it is asked. So for a standby
        group's promotion (issue 70), while the node's hellos still list the member unpromoted (``standby<R>``):
        the agent promotes a member once (the second finds it re-keyed)."""
        self._forget_answered()
        for (node, attempt, slots), (ranks, cluster, env, sent) in list(self.asked.items()):
            if node in nodes:
                self.report([Report(say=f"procsv: node {node}'s agent is on another connection while its start of "
                                        f"{', '.join(slots)} (attempt {attempt}) is not answered; asking again")])
            if node in nodes or not sent:
                self._ask(node, attempt, slots, ranks, cluster, env, slots[0].startswith(STANDBY))
        for (node, slot, attempt), (msg, sent) in list(self.promoting.items()):
            known = self.view.nodes.get(node)
            if known is None or known.lost_at is not None or f"{slot}.{attempt}" not in known.live:
                del self.promoting[node, slot, attempt]  # promoted there (its hellos list its worker), or gone
            elif node in nodes or not sent:
                if node in nodes:
                    self.report([Report(say=f"procsv: node {node}'s agent is on another connection while it still "
                                            f"lists {slot} (attempt {attempt}) unpromoted; sending its promotion "
                                            f"again")])
                self._promote(node, msg)

    def _forget_answered(self) -> None:
        """Forget the starts none of whose members is still pending (started, ended, or its host lost), and observe
        each host's oldest start still waiting (:func:`~procsv.watchdog.observe.starts_waiting`)."""
        for key in [k for k in self.asked if not any(self.pending.get(s) == (k[1], k[0]) for s in k[2])]:
            del self.asked[key]
            self.asked_at.pop(key, None)
        for node in self.view.nodes:
            waiting = sorted((self.asked_at[k], k) for k in self.asked if k[0] == node)
            if not waiting:
                observe.starts_waiting(self.view, node, None, [])
                continue
            at, (_, attempt, slots) = waiting[0]
            observe.starts_waiting(self.view, node, at, [f"{s}.{attempt}" for s in slots
                                                         if self.pending.get(s) == (attempt, node)])

    def lost(self, node: int) -> None:
        """Host ``node`` was found lost (before :class:`~procsv.watchdog.rules.actions.NodeLost` is noted): the
        members asked of it and not started never will be. Each is added to the view as started (pid 0: none)
        on that host, so the host's loss ends it as it ends the started ones (dead, ``HostLost``) and breaks
        its group (rule 11). Before, the pending members kept the view ``forking`` and the group whole: its
        chief waited for them in its first collective, no restart or stop could come (the run hung)."""
        for slot, (attempt, on) in list(self.pending.items()):
            if on == node:
                del self.pending[slot]
                role = STANDBY if slot.startswith(STANDBY) else WORKER
                observe.spawned(self.view, slot, role, attempt, 0, self.clock(), f"node{node}")  # (not recorded)
                self.view.children[slot].node = node
        self._forget_answered()

    def dropped(self, node: int) -> None:
        """A stop came while host ``node``'s agent had not answered a start (before
        :class:`~procsv.watchdog.rules.actions.StartsDropped` is noted): its members asked are added to the view as
        started (pid 0: none), which the note ends as never started; the stop waits for none of them."""
        self.lost(node)

    def stale(self, node: int, members: list[tuple[str, int]]) -> None:
        """A hello of host ``node``, found lost, that lists ``members`` still running
        (:func:`~procsv.watchdog.rules.hosts.stale_members`): its agent is told to kill each (again at each hello
        while it lists it: a signal lost with a connection is sent again), said once."""
        for slot, attempt in members:
            self.link.signal(node, slot, attempt, signal.SIGKILL, kill=True)
            if (node, slot, attempt) not in self._stale_said:
                self._stale_said.add((node, slot, attempt))
                self.report([Report(say=f"procsv: node {node} is heard again, its agent still running {slot} attempt "
                                        f"{attempt} of a group broken by the host's loss (it did not find node 0 "
                                        "lost): killing it; the host is taken back once it is gone")])

    def started(self, node: int, slot: str, attempt: int, pid: int) -> None:
        """An agent started a member it was asked for (a stale one is killed at once; one heard of already,
        said again by an agent asked again down a new connection, is known)."""
        if self.pending.get(slot, (0, 0))[0] != attempt:
            known = self.view.children.get(slot)
            if known is not None and (known.attempt, known.pid, known.node) == (attempt, pid, node):
                return
            promoted = self.view.children.get(worker_slot(rank_of(slot))) if slot.startswith(STANDBY) else None
            if promoted is not None and (promoted.attempt, promoted.pid, promoted.node) == (attempt, pid, node):
                return  # a standby member node 0 promoted, said started again before its promotion reached it
            self.link.signal(node, slot, attempt, signal.SIGKILL, kill=True)
            return
        del self.pending[slot]
        self._forget_answered()
        role = STANDBY if slot.startswith(STANDBY) else WORKER  # (a standby group's member: standby<R>)
        self.report(observe.spawned(self.view, slot, role, attempt, pid, self.clock(), f"node{node}"))
        self.view.children[slot].node = node  # the view stays "forking" until the last one (Executor.poll_fork)

    def ended(self, slot: str, attempt: int, pid: int, code: int, wall: float, signalled: bool = True) -> None:
        """An agent reaped a member; its error file, if any, is in the shared logdir. ``signalled``: a
        signal of this watchdog reached it alive (False: its end was not the watchdog's doing)."""
        if self.pending.get(slot, (0, 0))[0] == attempt:
            del self.pending[slot]
            self._forget_answered()
        key_job, layout, rank = self.link.job, self.layout, rank_of(slot)
        self.reader.submit(lambda: curve.unfile_members(layout, key_job, before=0, rank=rank, attempt=attempt))
        child = self.view.children.get(slot)
        if slot.startswith(STANDBY) and (child is None or child.pid != pid):  # promoted meanwhile: its worker's end
            slot = worker_slot(rank)
            child = self.view.children.get(slot)
        if child is None or child.attempt != attempt or child.pid != pid:
            return
        observe.end_came(self.view, slot, attempt, self.clock())
        path = self.layout.error_file(files_of(slot), attempt)
        job = self.reader.submit(lambda: read_child_error((path,), pid))
        self._ends.append((slot, attempt, pid, code, wall, signalled, job, self.clock() + READ_WAIT))

    def settle(self) -> bool:
        """Observe the ends whose error file was read, or is overdue (decided without it), in order;
        True if one was."""
        settled = False
        while self._ends:
            slot, attempt, pid, code, wall, signalled, job, due = self._ends[0]
            if not job.done and self.clock() < due:
                break
            settled = True
            self._ends.popleft()
            unread = "" if job.done else UNREAD
            log = self.layout.attempt_log(files_of(slot), attempt)
            failure = Failure(slot, attempt, pid, code, wall, log, job.result,
                              unread=unread, signalled=signalled)
            self.report(observe.reaped(self.view, slot, attempt, failure, self.clock()) + breaker_found(self.view))
        return settled

    def live(self) -> bool:
        """A member on another host that has not ended yet; the members of a host found lost are not waited for
        (no agent is left to report their end), nor a start asked and not answered (:attr:`pending`: the
        ``NodeStop`` at the launch's end has its agent stop whatever it started, after the request; before, the
        launch's end waited for the answer, for ever when none came)."""
        lost = {node for node, n in self.view.nodes.items() if n.lost_at is not None}
        return any(c.node != 0 and not c.reaped and c.node not in lost for c in self.view.children.values())
