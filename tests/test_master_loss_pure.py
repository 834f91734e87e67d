"""An agent's view of its master (issue 70, "the master is a host too": ``master_lost`` and ``master_probe_due``
of ``procsv.watchdog.rules.hosts``), on made-up series: the beats an agent reads from node 0 and the answers node
0's kernel gives to the agent's probes of its address, through the observation functions the agent's loop calls
(``procsv.watchdog.multihost.masterseen``), turn after turn on a fake clock. Pure: no process, no socket.

The same detector as node 0's of a silent agent (tests/test_host_loss_pure.py): a silent master host (no beat, no
answer) or a launch gone (no beat, its port refusing: a reset counts as no answer here) is found within 0.5 s of
its silence; a master whose loop is slow never is (stopped 200 ms every 3 s, starved of CPU, a 10 s stall): its
kernel completes the handshakes, and only ``--node-timeout`` applies. Before, an agent stopped its members only
once node 0 was silent for ``--node-timeout`` (15 s): its members stayed that long in a stale group.

A master found lost is probed on, and its address answering again after a silence (a partition healed) makes the
agent redial at once (``master_redial``), once per healing; a slow master, whose kernel answered all along, never.
"""

from __future__ import annotations

import dataclasses
import random
from typing import Callable, Optional

from procsv.watchdog.multihost.masterseen import (UNANSWERED_KEPT, master_beat, master_heard, master_probe_sent,
                                                  master_probes_looked)
from procsv.watchdog.rules.hosts import (AGENT_BEAT_SECS, PROBE_EVERY, SUSPECT_CAP, master_lost, master_probe_due,
                                         master_redial)
from procsv.watchdog.rules.state import Healed, NodeView
from test_host_loss_pure import alive, steady, two_blips

MASTER = "10.0.0.1:29400"
TURN = 0.05  # the agent's loop turns this often (multihost.agent.TICK)


def agent(beats: list[float], kernel: Callable[[float], Optional[bool]], until: float, tick: float = TURN,
          node_timeout: float = 15.0, rtt: float = 0.001, probe: str = MASTER,
          first_loss: bool = False) -> tuple[list[tuple[float, str]], list[float], NodeView]:
    """The agent's turns every ``tick`` s until ``until``: the master's beats read at the times in ``beats`` (at
    the first turn after each, as its loop reads them); a probe sent at ``t`` is answered ``rtt`` later if
    ``kernel(t)`` is not None (True: a handshake, False: a reset), observed at the next turn; a redial whenever
    :func:`master_redial` says so (its time becomes the connection's); the master marked lost when found so (as
    ``MasterSeen.lost`` does), or, ``first_loss``, the turns end there. The ``(time, reason)`` it was found lost,
    the times it redialed, and the view at the end."""
    master = NodeView(0, probe=probe)
    answers: list[tuple[float, float, bool]] = []  # (when it arrives, the probe's send, a handshake)
    lost: list[tuple[float, str]] = []
    dialed: list[float] = []
    b = 0
    for i in range(int(until / tick) + 1):
        now = round(i * tick, 6)
        while b < len(beats) and beats[b] <= now:
            master = master_beat(master, now)
            b += 1
        got = [a for a in answers if a[0] <= now]
        answers = [a for a in answers if a[0] > now]
        master = master_probes_looked(master, now, [(sent, handshake) for _, sent, handshake in got])
        if master_redial(master, dialed[-1] if dialed else 0.0):
            dialed.append(now)
        if master_probe_due(master, now):
            master = master_probe_sent(master, now)
            said = kernel(now)
            if said is not None:
                answers.append((now + rtt, now, said))
        why = master_lost(master, now, node_timeout)
        if why is not None:
            lost.append((now, why))
            if first_loss:
                break
            master = dataclasses.replace(master, lost_at=now)
    return lost, dialed, master


def run(beats: list[float], kernel: Callable[[float], Optional[bool]], until: float, tick: float = TURN,
        node_timeout: float = 15.0, rtt: float = 0.001, probe: str = MASTER) -> Optional[tuple[float, str]]:
    """The first ``(time, reason)`` the master is found lost in :func:`agent`'s turns, or None."""
    lost, _, _ = agent(beats, kernel, until, tick, node_timeout, rtt, probe, first_loss=True)
    return lost[0] if lost else None


def test_a_master_host_whose_packets_are_dropped_is_found_lost_within_half_a_second() -> None:
    for phase in (0.0, 0.03, 0.07, 0.099):
        silent_at = 10.0 + phase
        found = run(steady(0.0, silent_at), lambda t: True if t < silent_at else None, until=20)
        assert found is not None, phase
        assert found[0] - silent_at <= 0.5 and "no handshake" in found[1], (phase, found)


def test_a_master_launch_gone_whose_port_refuses_is_found_lost_within_half_a_second() -> None:
    """Node 0's launch SIGKILLed, its host up: the handshakes are refused (a reset). For node 0's view of an agent
    a reset is an answer (its agent's port alone closed); for the agent's view of node 0 it is none."""
    found = run(steady(0.0, 10.0), lambda t: True if t < 10.0 else False, until=20)
    assert found is not None and found[0] - 10.0 <= 0.5, found


def test_a_master_whose_loop_is_slow_is_never_lost() -> None:
    """Stopped 200 ms every 3 s; starved (beats late by up to 0.4 s now and then); stalled 10 s: its kernel
    answers the probes (up to 30 ms late), so it is never lost under --node-timeout 15."""
    stopped = []
    for t in steady(0.0, 120.0):
        k = int(t // 3.0)
        stop = (k * 3.0 + 1.0, k * 3.0 + 1.2)
        stopped.append(stop[1] + 0.002 if stop[0] <= t < stop[1] else t)
    stopped = sorted(set(stopped))
    assert max(b - a for a, b in zip(stopped, stopped[1:])) > SUSPECT_CAP
    rng = random.Random(7)
    starved, t = [], 0.0
    while t < 120.0:
        t += AGENT_BEAT_SECS + (rng.uniform(0.1, 0.4) if rng.random() < 0.02 else rng.expovariate(1 / 0.01))
        starved.append(round(t, 6))
    stalled = steady(0.0, 30.0) + steady(40.0, 70.0)
    for beats in (stopped, starved, stalled):
        assert run(beats, alive, until=beats[-1], rtt=0.03) is None


def test_a_frozen_master_or_one_never_proven_is_lost_at_the_node_timeout_only() -> None:
    found = run(steady(0.0, 30.0), alive, until=60)
    assert found is not None and 44.9 < found[0] < 45.3 and "--node-timeout 15" in found[1], found
    for probe in (MASTER, ""):  # (a firewall dropping the probes: an unanswered one means nothing; no address)
        found = run(steady(0.0, 5.0), lambda t: None, until=30, node_timeout=4.0, probe=probe)
        assert found is not None and found[0] > 8.9 and "--node-timeout 4" in found[1], found


def test_a_master_found_lost_is_not_found_lost_again_and_its_beats_back_clear_it() -> None:
    master = NodeView(0, probe=MASTER)
    for t in steady(0.0, 5.0):
        master = master_beat(master, t)
    assert master_lost(master, 25.0, 15.0) is not None
    master = dataclasses.replace(master, lost_at=25.0)
    # (probed on, no longer left alone: its address answering again is the healing the agent redials on)
    assert master_lost(master, 26.0, 15.0) is None and master_probe_due(master, 26.0)
    gaps = list(master.gaps)
    master = master_beat(master, 30.0)
    assert master.lost_at is None and master.gaps == gaps  # (the gap across the loss is not learnt)


def test_a_master_stopped_whole_for_14_s_is_probed_too_seldom_to_fill_its_sockets_backlog_and_a_silence_after_is_found() -> None:
    """Node 0's launch SIGSTOPped 14 s (its ZeroMQ thread too: the probes' connections wait in its listening
    socket's backlog, 100 by default, unaccepted; a full backlog answers no more): once its kernel answered in
    this silence it is probed every second, about 20 probes in all (before: every 50 ms, ~280), so it is not lost
    under --node-timeout 15. Its host going silent while it is suspected is still found within 1.5 s."""
    beats = steady(0.0, 10.0) + steady(24.0, 40.0)
    sent = []

    def kernel(t: float) -> bool:
        sent.append(t)
        return True

    assert run(beats, kernel, until=40) is None
    assert len([t for t in sent if 10.0 <= t < 24.5]) <= 30, len(sent)
    found = run(steady(0.0, 10.0), lambda t: True if t < 12.0 else None, until=30)
    assert found is not None and found[0] - 12.0 <= 1.5, found


def redials(beats: list[float], kernel: Callable[[float], Optional[bool]], until: float, node_timeout: float = 15.0,
            rtt: float = 0.001) -> tuple[list[float], list[float], NodeView]:
    """:func:`agent`'s turns to the end: the times it was found lost, the times it redialed, the view at the end."""
    lost, dialed, master = agent(beats, kernel, until, node_timeout=node_timeout, rtt=rtt)
    return [t for t, _ in lost], dialed, master


def test_a_partition_that_heals_makes_the_agent_redial_within_a_turn_or_two_whatever_its_length() -> None:
    """The master's host silent from t = 10 (no beat, no answer: a partition) until t = 10 + P. Found lost within
    0.5 s, probed every PROBE_EVERY all the while, and redialed once, within two turns of the heal, for a partition
    of 2 s or of 10 minutes: whether its address answers a probe first (its beats come back only over the new
    connection), or node 0's beats come back first over the old one (node 0's side retried first: the agent's
    side of that connection may still wait out its backoff). The probes it keeps stay bounded."""
    for length in (2.0, 600.0):
        heal = 10.0 + length

        def kernel(t: float) -> Optional[bool]:
            return True if t < 10.0 or t >= heal else None

        for beats_back in ([], steady(heal + 0.001, heal + 5)):
            lost, dialed, master = redials(steady(0.0, 10.0) + beats_back, kernel, until=heal + 5)
            assert len(lost) == 1 and lost[0] - 10.0 <= 0.5, lost
            assert len(dialed) == 1 and heal <= dialed[0] <= heal + 2 * TURN, (length, beats_back[:1], dialed)
            assert master.healed is not None and master.healed.after >= length - 0.5, master.healed
            assert len(master.unanswered) <= UNANSWERED_KEPT + 1


def test_a_slow_master_lost_at_the_node_timeout_is_never_redialed_nor_one_still_silent() -> None:
    """Node 0 stopped 30 s (its kernel answers every probe): lost at --node-timeout, never redialed (its connection
    lost no packet), its beats back or not. A master host still silent: probed on, never redialed. A healing is
    redialed once: not again by a connection made after it."""
    for back in (steady(35.0, 40.0), []):
        _, dialed, _ = redials(steady(0.0, 5.0) + back, alive, until=40)
        assert dialed == []
    lost, dialed, master = redials(steady(0.0, 5.0), lambda t: True if t < 5.0 else None, until=60)
    assert len(lost) == 1 and dialed == [] and master.probed_at is not None and master.probed_at > 59.0
    master = master_beat(NodeView(0, probe=MASTER, lost_at=10.0, unanswered=[9.9, 9.95, 10.0], looked_at=19.98), 20.0)
    assert master.healed is not None and master.healed.at == 20.0 and master_redial(master, 5.0) and not master_redial(master, 20.05)
    # a probe just out; one sent before the agent was descheduled 2 s, not looked at since: no silence seen
    for unanswered, looked in (([29.98], 29.99), ([27.9], 27.91)):
        answered = master_beat(NodeView(0, probe=MASTER, lost_at=25.0, unanswered=unanswered, looked_at=looked), 30.0)
        assert answered.healed is None and not master_redial(answered, 5.0)


def test_a_word_from_a_master_found_lost_ends_its_loss_so_the_members_it_starts_are_not_stopped() -> None:
    """After a partition heals, the agent's new connection may carry node 0's StartMembers before its first beat
    (measured, the second host's frames to node 0 dropped 10 s: 3 runs of 3). The agent stops its members while its
    view has node 0 lost: it killed the new group's member at once, saying 'the master is silent for -0.0 s', and
    the group restarted again. Any word from node 0 on the connection the agent has ends the loss as a beat does;
    the gap across it is not learnt, the healing the redial read is kept, and it is not found lost again at once."""
    master = NodeView(0, probe=MASTER)
    for t in steady(0.0, 5.0):
        master = master_beat(master, t)
    master = dataclasses.replace(master, lost_at=5.3, unanswered=[5.2, 5.25], healed=Healed(15.0, 9.8))
    gaps = list(master.gaps)
    heard = master_heard(master, 15.1)
    assert heard.lost_at is None and heard.last_beat == 15.1 and heard.unanswered == [] and heard.gaps == gaps
    assert heard.healed == Healed(15.0, 9.8) and not master_redial(heard, 15.05)
    assert master_lost(heard, 15.15, 15.0) is None and master_lost(heard, 15.15, 4.0) is None
    live = master_beat(heard, 15.2)  # (a connected master: a word changes nothing)
    assert master_heard(live, 15.25) == live


def test_late_answers_to_probes_sent_in_the_partition_are_one_healing_not_two() -> None:
    """A probe sent shortly before a heal has its SYN retransmitted by the agent's kernel a second later, after the
    heal, and its answer may be looked at before a newer probe's (measured: 'heard again after 8.5 s', then 'after
    0.9 s' 50 ms later, two redials for one heal). An answer to a probe sent before the last healing starts no
    silence of its own: one healing, one redial."""
    sent = [round(10.0 + 0.05 * i, 6) for i in range(201)]  # probes every 0.05 s of a partition from 10 to 20
    master = NodeView(0, probe=MASTER, probe_ok=True, last_beat=9.9, lost_at=10.3)
    for s in sent:
        master = master_probe_sent(master, s)
    master = master_probes_looked(master, 20.1, [(19.1, True)])  # (its SYN sent again at 20.1: answered first)
    assert master.healed is not None and master.healed.at == 20.1 and master.healed.after >= 9.0 and master_redial(master, 5.0)
    master = master_probes_looked(master, 20.15, [(20.05, True), (19.15, True)])
    assert master.healed is not None and master.healed.at == 20.1 and not master_redial(master, 20.1)
    both = master_probes_looked(dataclasses.replace(master, healed=None, unanswered=sent), 20.1,
                                [(19.1, True), (20.05, True)])  # (the two at one look)
    assert both.healed is not None and both.healed.at == 20.1 and both.healed.after >= 9.0
    master = master_beat(master, 20.2)  # (its first beat over the new connection: no healing either)
    assert master.healed is not None and master.healed.at == 20.1 and not master_redial(master, 20.1)


def test_an_agent_says_its_live_members_started_again_once_on_each_new_connection() -> None:
    """A MemberStarted sent on a connection the agent then replaced (a redial) is lost with it: a member of an attempt
    node 0 had given up, started by a StartMembers read late on the old connection, ran on unknown to node 0, which
    kills a stale start at once but never heard of this one (measured: a flapping link beside two CPU burners; its
    hellos listed it live, so node 0 did not take the host back while it ran). Each new connection's first hello
    that passes is followed by a MemberStarted per live member, once; node 0 takes a repeat of a known start as known."""
    from procsv.ipc.messages import MemberStarted
    from procsv.watchdog.multihost.agent import started_again

    live = [("worker1", 3, 4242), ("worker2", 3, 4243)]
    assert started_again(live, 4, 3) == [MemberStarted("worker1", 3, 4242), MemberStarted("worker2", 3, 4243)]
    assert started_again(live, 4, 4) == [] and started_again([], 5, 4) == []


def test_a_link_blip_up_to_the_blip_bound_costs_the_agent_neither_its_members_nor_its_connection() -> None:
    """The agent's view of node 0 rides out a blip as node 0's of an agent does (tests/test_host_loss_pure.py): up to
    0.24 s at any phase, node 0 is not found lost (its members are not stopped as a stale group's) and the agent keeps
    its connection (TCP retransmits what the blip dropped; before, a blip of 0.35 s was a loss at the phases late in
    the beat's interval, and any the agent's probes saw unanswered for 0.1 s a redial); one of 0.6 s is a loss, found
    within 0.5 s of its start."""
    from test_host_loss_pure import blip

    for phase in (0.0, 0.03, 0.07, 0.099):
        for length in (0.1, 0.2, 0.24, 0.35):  # (0.35 s: ridden out here at each phase, its turns every 50 ms)
            beats, kernel = blip(10.0 + phase, length)
            lost, dialed, _ = agent(beats, kernel, until=30)
            assert lost == [] and dialed == [], (phase, length, lost, dialed)
        beats, kernel = blip(10.0 + phase, 0.6)
        found = run(beats, kernel, until=30)
        assert found is not None and found[0] - (10.0 + phase) <= 0.5 and "no handshake" in found[1], (phase, found)


def test_the_agent_says_node_0_is_lost_whether_its_trainers_run_or_not() -> None:
    """Once the agent finds node 0 lost it says so in every case: stopping its live trainers, or that none was running.
    Before, only with a live trainer: under a one-way cut of node 1's packets to node 0 (node 0's still passing),
    TensorFlow ended worker1 ("Socket closed": node 0's chief, killed once node 0 found node 1 lost) before the
    agent's finding, and node 1's output never said node 0 was lost."""
    from procsv.watchdog.multihost.agent import lost_line

    why = "no heartbeat from node 0 for 0.45 s and no handshake from node 0's address for 0.20 s"
    assert lost_line(why, True) == f"node 0 is lost ({why}): stopping this host's trainers (a stale group)"
    assert lost_line(why, False) == \
        f"node 0 is lost ({why}): no trainer of this host is running (a trainer's end is in its log)"


def test_a_flapping_link_whose_beats_wait_out_tcps_backoff_through_both_blips_costs_the_agent_no_members() -> None:
    """The agent's view of node 0 rides out a flapping link as node 0's of an agent does
    (tests/test_host_loss_pure.py): two blips of up to 0.25 s a moment apart, node 0's beats held through both (its
    TCP's retransmission backed off in the first, dropped in the second), the agent's probes answered between them:
    node 0 is not found lost, its members not stopped (its probes, once answered in the silence, every
    ``PROVE_EVERY``: none falls in the second blip; its view counts the silence from the last answered, as node 0's)."""
    for gap in (0.05, 0.1, 0.15):
        for second in (0.2, 0.25):
            for phase in (0.0, 0.03, 0.07, 0.099):
                blips, beats = two_blips(phase, gap, second)
                lost, _, _ = agent(beats, lambda t: None if any(s <= t < e for s, e in blips) else True, until=20)
                assert lost == [], (gap, second, phase, lost)
