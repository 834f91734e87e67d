"""The standby group over hosts (``--nnodes 2 --standby hot``, issue 70), with a fake clock (no process runs).

The standby group's simulator of ``test_standby_group_pure`` over two hosts: the group is the chief on node 0
and ``worker1`` on node 1; a ``Spawn`` of the standby prepares ``standby`` on node 0 and ``standby1`` on node 1
(the latter asked of node 1's agent: :meth:`RemoteMembers.start` with ``standby``), both for the next attempt.
Node 1 beats at every round unless it is lost. The real two-host run: ``test_hosts_group_tier.py``.
"""

from __future__ import annotations

from procsv.ipc.messages import NodeHello, StandbyReady, TrainerReady
from procsv.watchdog import observe
from procsv.watchdog.rules import standby
from procsv.watchdog.actionlines import standby_gone_reports
from procsv.watchdog.rules.actions import Action, Cause, Kill, Promote, Restart, Signal, Spawn, StandbyGone
from procsv.watchdog.rules.bookkeeping import note
from procsv.watchdog.rules.decide import Limits
from procsv.watchdog.rules.hang import HangLimits
from procsv.watchdog.rules.hosts import host_actions
from procsv.watchdog.rules.lifecycle import ProcState
from procsv.watchdog.rules.state import STANDBY, TRAINER, WORKER, ZygoteState

from test_group_decide import W1
from test_standby_group_pure import S1, StandbyGroupSim
from test_watchdog_decide import KILLED, Sim, of

HOSTS = (0, 1)


class TwoHostSim(StandbyGroupSim):
    """A group of one member on each of two hosts, with a standby group over both (``--standby hot``)."""

    def __init__(self, min_nodes: int = 0) -> None:
        Sim.__init__(self, Limits(hang=HangLimits(None, None), nproc=1, nnodes=2, min_nodes=min_nodes,
                                  node_timeout=5.0, rejoin_timeout=30.0), zygote=ZygoteState.READY)
        self.view.standby_ok = True
        self.one_by_one = False
        self.rest: list[int] = []
        self.beating = True  # node 1's agent says hello at every round
        self.beat()

    def beat(self) -> None:
        observe.node_hello(self.view, NodeHello(1, 1, "10.0.0.2", 77, ["10.0.0.2:4000"], [], 0, True, 1), self.now)

    def tick(self, dt: float = 0.0, draw: float = 0.5) -> list[Action]:
        if self.beating:
            self.now += dt
            self.beat()
            dt = 0.0
        return super().tick(dt, draw)

    def spawn(self, slot: str, role: str) -> None:
        """A group start: the chief here, worker1 by node 1's agent; a standby group: one member on each."""
        attempt = self.view.children[TRAINER].attempt + 1 if TRAINER in self.view.children else 1
        if role == TRAINER:
            Sim.spawn(self, slot, role)
            observe.spawned(self.view, W1, WORKER, attempt, next(self._pids), self.now, "node1")
            self.view.children[W1].node = 1
        elif role == STANDBY:
            observe.spawned(self.view, STANDBY, STANDBY, attempt, next(self._pids), self.now, "zygote")
            observe.spawned(self.view, S1, STANDBY, attempt, next(self._pids), self.now, "node1")
            self.view.children[S1].node = 1
        else:
            Sim.spawn(self, slot, role)

    def group_ready(self, step: int = 0) -> None:
        for slot in (TRAINER, W1):
            c = self.member(slot)
            observe.heard(self.view, TrainerReady(c.pid, c.attempt, step, None, 0.1, [],
                                                  1.0 if slot == TRAINER else None, None), self.now,
                          slot=None if slot == TRAINER else slot)

    def standby_ready(self, *slots: str) -> None:
        for slot in slots or (STANDBY, S1):  # node 1's relayed by its agent: named by its slot
            sb = self.view.children[slot]
            observe.heard(self.view, StandbyReady(sb.pid, sb.attempt, 0.5), self.now, slot=None if slot == STANDBY else slot)

    def group_progress(self, step: int, slots: tuple[str, ...] = ()) -> None:
        super().group_progress(step, slots or (TRAINER, W1))

    def started(self) -> "TwoHostSim":
        assert self.tick() == [Spawn(TRAINER, TRAINER, HOSTS)]
        self.group_ready()
        self.group_progress(1)
        return self


def test_a_member_killed_on_either_host_promotes_the_standby_group_over_both_hosts_whole_and_forks_nothing():
    for dead in (W1, TRAINER):  # node 1's member, then node 0's
        sim = TwoHostSim().started()
        assert sim.tick() == [Spawn(STANDBY, STANDBY)]  # one group over both hosts, for attempt 2
        assert [(c.slot, c.node, c.attempt, c.state) for c in standby.members(sim.view)] == \
            [(STANDBY, 0, 2, ProcState.STANDBY), (S1, 1, 2, ProcState.STANDBY)]
        sim.standby_ready()  # (node 1's: relayed by its agent, under its slot)
        pids = {s: sim.view.children[s].pid for s in (STANDBY, S1)}
        sim.notices(dead)
        acts = sim.tick(0.01)
        other = TRAINER if dead == W1 else W1
        assert [(a.slot, a.cause) for a in of(acts, Kill)] == [(other, Cause.GROUP_NOW)], acts  # at once, either host
        assert not of(acts, Signal)
        sim.reaps(dead, KILLED)
        sim.reaps(other, KILLED)
        acts += sim.tick(0.01) + sim.tick()
        assert of(acts, Restart) and of(acts, Promote) == [Promote(STANDBY, 2), Promote(S1, 2)], acts
        assert not of(acts, Spawn)
        chief, worker = sim.view.children[TRAINER], sim.view.children[W1]
        assert (chief.pid, chief.node, chief.attempt) == (pids[STANDBY], 0, 2)
        assert (worker.pid, worker.node, worker.attempt, worker.role) == (pids[S1], 1, 2, WORKER)
        sim.group_ready(100)
        sim.group_progress(101)
        assert sim.tick() == [Spawn(STANDBY, STANDBY)]  # the next one, over both hosts again, for attempt 3
        assert [(c.node, c.attempt) for c in standby.members(sim.view)] == [(0, 3), (1, 3)]


def test_a_standby_group_over_two_hosts_is_promotable_only_whole_and_with_each_member_on_its_tasks_host():
    sim = TwoHostSim().started()
    sim.tick()
    sim.standby_ready(STANDBY)
    assert standby.promotable(sim.view, 2, ready=False, nodes=HOSTS) and not standby.promotable(sim.view, 2, nodes=HOSTS)
    sim.standby_ready(S1)
    assert standby.promotable(sim.view, 2, nodes=HOSTS)
    sim.view.children[S1].node = 0  # task 1's member on node 0: not the next group's place for it
    assert not standby.promotable(sim.view, 2, nodes=HOSTS)
    assert not standby.promotable(sim.view, 1, nodes=(0,))  # a next group over node 0 alone: not this one


def test_a_host_lost_with_the_standby_group_prepared_takes_the_group_along_and_the_restart_forks_over_the_hosts_left():
    # the decision (docs/replicas.md): node 1's loss ends its standby member with its host (dead, as its worker);
    # the group's members there can never take a step, so the rest of it is killed (rule 10's broken) and the
    # restart forks the group over the hosts left (--min-nodes 1: node 0 alone), no standby promoted
    sim = TwoHostSim(min_nodes=1).started()
    sim.tick()
    sim.standby_ready()
    sim.beating = False
    sim.now += 10.0  # node 1 silent past its --node-timeout
    acts = host_actions(sim.view, sim.now, sim.limits)
    for action in acts:
        note(sim.view, action, sim.now, sim.limits)
    assert sim.view.nodes[1].lost_at == sim.now
    acts = sim.tick(0.01)
    assert Kill(STANDBY, 2, Cause.STANDBY_LOST) in acts, acts
    assert not of(acts, Promote)
    [gone] = [a for a in acts if isinstance(a, StandbyGone) and a.slot == S1]
    assert gone.failed  # (the loss counts as one end of a standby: the next group after the backoff)
    [line] = standby_gone_reports(sim.view, gone, sim.now)
    assert line.say.startswith(f"procsv: the standby group's member {S1} attempt 2 (pid ") and "HostLost: node 1" in \
        line.say, line.say
    sim.reaps(STANDBY, KILLED)
    sim.reaps(TRAINER, KILLED)
    acts = [a for _ in range(4) for a in sim.tick(0.5)]
    assert not of(acts, Promote), acts
    assert Spawn(TRAINER, TRAINER, (0,)) in acts, acts


def test_after_a_host_lost_with_the_standby_group_prepared_the_smaller_groups_standby_is_promoted_not_forked():
    # the elastic group's next standby (--min-nodes 1): node 1 lost with a standby group prepared over both hosts,
    # the group restarted over node 0 alone, and its standby (one member, node 0's) prepared once it stepped. Before,
    # node 1's standby1 of the group the loss ended stayed among the standby's members (settled, dead): the new
    # standby was never whole (two members for a group of one), so the next death killed it as unready and forked
    # (measured, three hosts down to two: every restart after the loss forked, its standby group wasted)
    sim = TwoHostSim(min_nodes=1).started()
    sim.tick()
    sim.standby_ready()
    sim.beating = False
    sim.now += 10.0  # node 1 silent past its --node-timeout
    for action in host_actions(sim.view, sim.now, sim.limits):
        note(sim.view, action, sim.now, sim.limits)
    sim.tick(0.01)
    sim.reaps(STANDBY, KILLED)
    sim.reaps(TRAINER, KILLED)
    sim.spawn = lambda slot, role: (Sim.spawn(sim, slot, role) if role != STANDBY  # type: ignore[method-assign]
                                    else StandbyGroupSim.spawn(sim, slot, role))  # node 0 alone: one member each
    acts = [a for _ in range(4) for a in sim.tick(0.5)]
    assert Spawn(TRAINER, TRAINER, (0,)) in acts, acts
    chief = sim.view.children[TRAINER]
    observe.heard(sim.view, TrainerReady(chief.pid, chief.attempt, 0, None, 0.1, [], 1.0, None), sim.now)
    sim.group_progress(2, (TRAINER,))
    sim.now += 30.0  # past the standby's backoff
    assert sim.tick() == [Spawn(STANDBY, STANDBY)]
    sim.standby_ready(STANDBY)
    assert [(c.slot, c.attempt, c.node) for c in standby.members(sim.view)] == [(STANDBY, chief.attempt + 1, 0)]
    sim.notices(TRAINER)
    sim.reaps(TRAINER, KILLED)
    acts = [a for _ in range(4) for a in sim.tick(0.5)]  # (the restart after its backoff: 1 s)
    assert of(acts, Promote) == [Promote(STANDBY, chief.attempt + 1)], acts
    assert not of(acts, Spawn) and not of(acts, Kill), acts
