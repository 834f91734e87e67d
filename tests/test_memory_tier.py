"""The in-memory snapshot tier: what a restart recovers from after a SIGKILL of the trainer.

The decisions are pure (``procsv.trainer.checkpoint.memory_tier``, ``procsv.services.checkpoint.memory``) and
tested as such; the rest with real launches of the digits example, real SIGKILLs, and the final
weights read back with plain TensorFlow and compared bit for bit with an uninterrupted run.
"""

from __future__ import annotations

import json
import math
import os
import re
import signal
from typing import Any, Optional, cast

import pytest

from conftest import (CLEAN_ARGS, committed_steps, final_weights, finish, launch, quiet_env, raw_status, wait_for,
                      wait_role_pid)
from procsv.common.layout import Layout
from procsv.common.snapshot_memory import SLOT_COMPLETE, SLOT_WRITING
from procsv.ipc.messages import Busy, Progress, SaveData, SaveReason, SaveResult, SnapshotHeld
from procsv.services.checkpoint.arena import ArenaView
from procsv.services.checkpoint.memory import persist_decision
from procsv.trainer.checkpoint import memory_tier
from procsv.trainer.channels import TrainerChannels
from procsv.trainer.checkpoint.agent import CheckpointAgent
from procsv.trainer.checkpoint.memory_tier import Slots
from procsv.trainer.checkpoint.snapshot import SnapshotArena, arena_bytes_needed

# the 600-step digits run of conftest's clean_weights; disk checkpoints only every 100,000 steps and
# at the end, so that what a restart finds on disk mid-run is nothing at all: anything it restores came from memory
ARGS = CLEAN_ARGS
NO_DISK = ("--save-checkpoint-steps", "100000")
TIER = quiet_env(PROCSV_MEMORY_SNAPSHOTS="0.01")  # its share of the loop's time (the default, said explicitly)


# ---------------------------------------------------------------------------------------- pure
def test_the_interval_keeps_the_copies_under_the_budget():
    assert memory_tier.interval(0.002, budget=0.01) == pytest.approx(0.2)
    assert memory_tier.interval(0.0, budget=0.01) == memory_tier.MIN_INTERVAL  # never more often than the floor


def test_the_interval_follows_the_median_cost_so_one_descheduled_snapshot_does_not_stretch_it():
    assert memory_tier.typical_cost([]) is None
    # 2 ms snapshots, one charged a 70 ms descheduling (seen at load 20): the interval stays the budget's 0.2 s
    costs = [0.002, 0.0021, 0.070, 0.0019, 0.002]
    assert memory_tier.typical_cost(costs) == pytest.approx(0.002)
    assert memory_tier.interval(memory_tier.typical_cost(costs) or 0.0, budget=0.01) == pytest.approx(0.2)
    # only the last COST_SAMPLES count: a lasting change (a bigger model) is followed within them
    later = costs + [0.004] * memory_tier.COST_SAMPLES
    assert memory_tier.typical_cost(later) == pytest.approx(0.004)


def test_a_trainers_first_snapshots_one_offs_never_set_its_interval():
    # its first two snapshots charged 7 and 35 ms (at load): the median, 21 ms, made the interval
    # 2.1 s, longer than the disk saves' 2 s, which restart it: no later snapshot came to correct it
    assert memory_tier.typical_cost([0.007, 0.035]) == pytest.approx(0.007)
    assert memory_tier.typical_cost([0.035]) == pytest.approx(0.035)
    assert memory_tier.typical_cost([0.007, 0.035, 0.002]) == pytest.approx(0.007)  # settled: the median


def test_a_trainer_that_ran_long_without_a_failure_snapshots_at_youngs_interval_not_the_budgets():
    # 3 ms snapshots: the budget allows one every 0.3 s; a trainer just started (or just restored) takes them so
    assert memory_tier.interval(0.003, budget=0.01, age_secs=0.0) == pytest.approx(0.3)
    assert memory_tier.interval(0.003, budget=0.01, age_secs=10.0) == pytest.approx(0.3)
    # and so does one that has run minutes: failures that close keep the budget's interval (issue 54:
    # with the whole age as Young's M, 30 s stretched 2 ms snapshots to 0.35 s, 150 of the benchmark's steps)
    assert memory_tier.interval(0.002, budget=0.01, age_secs=30.0) == pytest.approx(0.2)
    assert memory_tier.interval(0.002, budget=0.01, age_secs=memory_tier.CALM_AFTER) == pytest.approx(0.2)
    # after an hour without a failure: sqrt(2 * 0.003 * (3600 - 300)) = 4.45 s, 0.07 % of the loop instead of 1 %
    assert memory_tier.interval(0.003, budget=0.01, age_secs=3600.0) == pytest.approx(4.450, abs=1e-3)
    # after a day: no longer than MAX_INTERVAL (10 s), whatever Young's formula says (sqrt(518) = 22.8 s)
    assert memory_tier.interval(0.003, budget=0.01, age_secs=86400.0) == memory_tier.MAX_INTERVAL == 10.0
    # a copy so slow that the budget's interval is longer still: the budget holds
    assert memory_tier.interval(1.0, budget=0.01, age_secs=7 * 86400.0) == pytest.approx(100.0)
    assert memory_tier.young(0.0, 3600.0) == 0.0 and memory_tier.young(0.003, 0.0) == 0.0


def test_a_slot_holding_the_held_the_unacked_or_the_disk_snapshot_is_never_written():
    s = Slots(3)
    assert s.free(0.0) == 0
    s.written(0, 10), s.sent_memory(0, 10, now=0.0)
    assert s.free(0.1) == 1  # slot 0 awaits its acknowledgment
    s.acknowledged(10)
    s.written(1, 20), s.sent_disk(1)
    assert s.busy(0.2) == {0, 1} and s.free(0.2) == 2
    s.written(2, 30), s.sent_memory(2, 30, now=0.3)
    assert s.free(0.4) is None  # held (10), on its way to disk (20), unacknowledged (30): wait
    assert s.free(0.3 + memory_tier.UNACKED_GRACE) == 2  # an acknowledgment that never comes frees it in time
    s.acknowledged(30)
    assert s.free(0.5) == 0  # the service holds 30 now: 10 is released
    s.disk_done(), s.acknowledged(20)  # results come in order: 20 then ... (here 20 is the newest it says)
    assert s.busy(0.6) == {1}


def test_a_walk_of_the_object_graph_is_charged_at_its_own_rate():
    # a 50 ms walk redone every 10 s takes 0.5 % of the loop: the 1 ms copies get the other 0.5 %
    assert memory_tier.interval(0.001, budget=0.01, walk_secs=0.05, walk_every=10.0) == pytest.approx(0.2)
    # walks alone would take the whole budget: one snapshot per walk
    assert memory_tier.interval(0.001, budget=0.01, walk_secs=0.2, walk_every=10.0) == 10.0


def test_frequent_disk_saves_never_stretch_the_in_memory_interval():
    # the user's disk snapshots take none of the tier's budget, however often or slowly they come
    # (bench_recovery's save every 2 s took 3 % of the loop at load 8: the old rule then left the
    # tier one snapshot per 10 s, and a kill re-did as many steps as with no tier at all)
    assert memory_tier.interval(0.002, budget=0.01) == pytest.approx(0.2)
    assert memory_tier.interval(0.002, budget=0.01, walk_secs=0.02, walk_every=10.0) == pytest.approx(0.25)


class _Service:
    """The trainer's side of the checkpoint service for one agent: takes every snapshot, answers
    each read with what it holds; a read costs ``read_secs`` on the fake clock."""

    def __init__(self) -> None:
        self.t = 100.0
        self.read_secs = 0.0
        self.sent: list[SaveData] = []

    def clock(self) -> float:
        return self.t

    def send_snapshot(self, msg: SaveData, frames: list[object], until: Optional[float] = None) -> bool:
        self.sent.append(msg)
        return True

    def setup(self, msg: object) -> None:  # the agent's heartbeat
        pass

    def poll_checkpoint(self, timeout: float = 0.0) -> list[object]:
        self.t += self.read_secs
        return [SnapshotHeld(self.sent[-1].step)] if self.sent else []


def _agent(tmp_path: Any, ckpt: Any, step_var: Any, svc: _Service, save_checkpoint_steps: Optional[int],
           memory_budget: float) -> CheckpointAgent:
    """A checkpoint agent of ``ckpt`` in a new logdir, on ``svc``'s clock, saving on steps only."""
    layout = Layout(str(tmp_path / "run"))
    layout.create()
    return CheckpointAgent(ckpt, step_var, layout, basename="model.ckpt", save_model_secs=None,
                           save_checkpoint_steps=save_checkpoint_steps, max_to_keep=5,
                           keep_checkpoint_every_n_hours=None, clock=svc.clock, memory_budget=memory_budget)


def _tiered_agent(tmp_path: Any, svc: _Service) -> tuple[CheckpointAgent, TrainerChannels]:
    """An agent of a 64x64 variable with the in-memory tier on (1 %), its memory ready, on ``svc``."""
    import tensorflow as tf

    step_var = tf.Variable(0, dtype=tf.int64)
    ckpt = tf.train.Checkpoint(w=tf.Variable(tf.ones([64, 64])), step=step_var)
    agent = _agent(tmp_path, ckpt, step_var, svc, save_checkpoint_steps=None, memory_budget=0.01)
    agent.store.arena_for(arena_bytes_needed(ckpt))
    return agent, cast(TrainerChannels, svc)


def test_an_in_memory_snapshot_is_charged_its_boundary_its_next_steps_slowdown_and_its_ack_reads(tmp_path):
    svc = _Service()
    agent, ch = _tiered_agent(tmp_path, svc)

    assert agent.memory_snapshot(ch, 1)  # the first walks the object graph: charged as a walk
    agent.charge_memory(1, 100.0, 100.030)
    assert agent.next_work(1, 100.030)[0] == 2  # the step after it is measured: the next boundary is its
    agent.charge_memory(2, 100.031, 100.0312)  # no typical step known yet: the boundary alone
    assert (agent.memory.walk_cost, agent.memory.copy_cost) == (pytest.approx(0.030), None)
    agent.charge_memory(3, 100.0316, 100.0317)  # nothing taken, nothing pending: nothing charged
    assert agent.memory.walk_cost == pytest.approx(0.030)

    svc.read_secs, svc.t = 0.001, 100.0702
    agent.poll(ch, 101, svc.t)  # a read made only for the in-memory snapshot's acknowledgment: 1 ms
    assert agent.store.slots.held == 1 and svc.t == pytest.approx(100.0712)
    assert agent.memory_snapshot(ch, 102)
    agent.charge_memory(102, 100.0712, 100.0732)  # its boundary stopped the loop 2 ms; a step took 0.4 ms before
    assert agent.memory.copy_cost is None and agent.next_work(102, 100.0732)[0] == 103
    agent.charge_memory(103, 100.0746, 100.0747)  # the step after it took 1.4 ms: 1 ms more than typical
    assert agent.memory.copy_cost == pytest.approx(0.002 + 0.001 + 0.001)
    assert agent.memory.next_due() == pytest.approx(agent.memory.at + 0.004 / (0.01 - 0.030 / 10.0))
    assert [m.step for m in svc.sent] == [1, 102] and not any(m.persist for m in svc.sent)


def test_the_trainers_age_on_the_agents_clock_sets_youngs_interval_and_a_restore_resets_it(tmp_path):
    svc = _Service()
    agent, _ = _tiered_agent(tmp_path, svc)
    agent.restore_or_init(lambda: None)  # nothing committed: initialized at t = 100
    agent.memory.copy_cost = 0.003
    assert agent.memory.next_due() == pytest.approx(100.0 + 0.3)  # young: the budget's interval
    agent.memory.at = 100.0 + 3600.0  # a snapshot an hour later on the same clock
    calm = 3600.0 - memory_tier.CALM_AFTER
    assert agent.memory.next_due() == pytest.approx(3700.0 + math.sqrt(2 * 0.003 * calm))
    svc.t = 5000.0
    agent.restore_or_init(lambda: None)  # a new session restores: its age starts again
    assert agent.memory.next_due() == pytest.approx(5000.0 + 0.3)


def test_the_every_n_steps_trigger_does_not_fire_for_the_step_a_restart_restored(tmp_path):
    """A restart that restored step 50 (a multiple of save_checkpoint_steps=50) must not carry the
    trigger of that committed step over to step 51: the next checkpoint by steps is step 100."""
    import tensorflow as tf

    step_var = tf.Variable(50, dtype=tf.int64)
    ckpt = tf.train.Checkpoint(step=step_var)
    svc = _Service()
    agent = _agent(tmp_path, ckpt, step_var, svc, save_checkpoint_steps=50, memory_budget=0.0)
    agent.view.restored(50)  # what restore() sets after restoring step 50
    ch = cast(TrainerChannels, svc)
    assert not agent.poll(ch, 50, svc.t) and not agent.pending
    assert not agent.poll(ch, 51, svc.t) and not agent.pending
    assert agent.poll(ch, 100, svc.t) and agent.pending


class _Committing(_Service):
    """A service that has committed every disk snapshot sent to it by the time it is next read."""

    def __init__(self) -> None:
        super().__init__()
        self.answered: set[int] = set()

    def poll_checkpoint(self, timeout: float = 0.0) -> list[object]:
        done = [m for m in self.sent if m.persist and m.step not in self.answered]
        self.answered.update(m.step for m in done)
        return [SaveResult(m.step, m.reason, True, f"model.ckpt-{m.step}", None, 0.01) for m in done]

    def to_watchdog(self, msg: object) -> None:  # the busy notice around a disk snapshot
        pass


def test_a_step_trigger_during_a_snapshot_that_has_committed_saves_at_the_triggers_step(tmp_path):
    """Steps come faster than the agent's scheduled reads: at step 5's trigger, the snapshot of
    step 3 is still in flight for the agent, but its result is waiting. The agent reads it then
    and saves step 5, rather than a later step after its next read."""
    import tensorflow as tf

    step_var = tf.Variable(0, dtype=tf.int64)
    ckpt = tf.train.Checkpoint(step=step_var)
    svc = _Committing()
    agent = _agent(tmp_path, ckpt, step_var, svc, save_checkpoint_steps=5, memory_budget=0.0)
    ch = cast(TrainerChannels, svc)
    agent.request(SaveReason.PERIODIC)
    assert agent.poll(ch, 3, svc.t)
    assert agent.snapshot(ch, 3) and agent.in_flight == 3
    assert not agent.poll(ch, 4, svc.t)  # no read is due yet: the snapshot is in flight for the agent
    assert agent.in_flight == 3
    assert agent.poll(ch, 5, svc.t)  # the trigger reads: committed, so step 5 is saved now
    assert agent.in_flight is None and agent.last_committed == 3


class _Told(_Committing):
    """A service that commits every snapshot, with the trainer's Progress reports kept."""

    def __init__(self) -> None:
        super().__init__()
        self.told: list[Progress] = []

    def to_watchdog(self, msg: object) -> None:
        self.told.append(cast(Progress, msg))


def test_the_progress_around_a_snapshot_before_the_sessions_first_step_says_no_step_was_completed(tmp_path):
    """The start-up checkpoint a TF1 Supervisor takes as its session becomes ready comes before any
    step: its reports (busy, then not) say ``stepped`` False, which the watchdog does not take for the
    first step; once the step boundary's hook says the session stepped, a snapshot's reports say True."""
    import tensorflow as tf

    step_var = tf.Variable(0, dtype=tf.int64)
    ckpt = tf.train.Checkpoint(step=step_var)
    svc = _Told()
    agent = _agent(tmp_path, ckpt, step_var, svc, save_checkpoint_steps=None, memory_budget=0.0)
    ch = cast(TrainerChannels, svc)
    agent.request(SaveReason.PERIODIC)
    assert agent.poll(ch, 0, svc.t) and agent.snapshot(ch, 0)  # the checkpoint at session creation
    assert [(p.busy, p.stepped) for p in svc.told] == [(Busy.SNAPSHOT, False), (Busy.NONE, False)]
    agent.hooks.stepped = lambda: True  # (the step boundary's: its first step was reported)
    svc.t += 1.0
    agent.poll(ch, 1, svc.t)
    agent.request(SaveReason.PERIODIC)
    assert agent.poll(ch, 1, svc.t) and agent.snapshot(ch, 1)
    assert [(p.busy, p.stepped) for p in svc.told[2:]] == [(Busy.SNAPSHOT, True), (Busy.NONE, True)]


def test_a_snapshot_after_the_optimizer_built_its_variables_holds_them(tmp_path):
    """The object graph walked for the checkpoint at step 0, before a lazily built optimizer made
    its slot variables, must not be reused once they exist: a snapshot taken with it would lack
    them, and a restart from it would silently reset the optimizer's moments."""
    import keras
    import tensorflow as tf

    from procsv.trainer.checkpoint.snapshot import GRAPH_KEY, plan

    step_var = tf.Variable(0, dtype=tf.int64)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4)])
    opt = keras.optimizers.Adam(1e-3)
    ckpt = tf.train.Checkpoint(model=model, optimizer=opt, step=step_var)
    svc = _Committing()
    agent = _agent(tmp_path, ckpt, step_var, svc, save_checkpoint_steps=None, memory_budget=0.01)
    agent.store.arena_for(arena_bytes_needed(ckpt))
    ch = cast(TrainerChannels, svc)
    agent.request(SaveReason.PERIODIC)
    assert agent.poll(ch, 0, svc.t) and agent.snapshot(ch, 0)  # the checkpoint at session creation
    opt.build(model.trainable_variables)  # what the first apply_gradients does: m and v of each variable
    svc.t += 1.0
    agent.poll(ch, 1, svc.t)  # reads the result of step 0's checkpoint
    assert agent.in_flight is None and agent.last_committed == 0
    assert agent.memory_snapshot(ch, 1)
    agent.request(SaveReason.PERIODIC)
    assert agent.poll(ch, 2, svc.t) and agent.snapshot(ch, 2)
    want = {key for key, _ in plan(ckpt).readers} | {GRAPH_KEY}
    assert len(want) > len({t.key for t in svc.sent[0].tensors})  # the optimizer's variables are new
    for msg in svc.sent[1:]:
        assert {t.key for t in msg.tensors} == want, (msg.step, msg.persist)


class _HoldingMeta(_Service):
    """A service that says, with each acknowledgment, whether it holds the trainer's MetaGraphDef."""

    def __init__(self) -> None:
        super().__init__()
        self.frames: list[list[object]] = []
        self.holds_meta = True

    def send_snapshot(self, msg: SaveData, frames: list[object], until: Optional[float] = None) -> bool:
        self.frames.append(list(frames))
        return super().send_snapshot(msg, frames, until)

    def poll_checkpoint(self, timeout: float = 0.0) -> list[object]:
        return [SnapshotHeld(self.sent[-1].step, self.holds_meta)] if self.sent else []


def test_a_graph_trainer_sends_its_meta_graph_with_in_memory_snapshots_only_until_the_service_holds_it(tmp_path):
    """The first in-memory snapshot of a graph program carries its MetaGraphDef (the last frame);
    once the service says it holds it, the next ones do not; when a service says it holds none (a
    restarted one), the next carries it again, and then no more."""
    svc = _HoldingMeta()
    agent, ch = _tiered_agent(tmp_path, svc)
    agent.meta_graph = b"the MetaGraphDef"
    for step in (1, 2, 3, 4, 5):
        svc.holds_meta = step != 3
        assert agent.memory_snapshot(ch, step)
        svc.t += 1.0
        agent.poll(ch, step, svc.t)  # reads the acknowledgment
    assert [m.meta_graph for m in svc.sent] == [True, False, False, True, False]
    assert [f[-1] == b"the MetaGraphDef" for f in svc.frames] == [True, False, False, True, False]
    assert all(len(f) == len(svc.frames[1]) + m.meta_graph for f, m in zip(svc.frames, svc.sent))


def test_a_snapshot_cost_never_credits_a_step_faster_than_typical():
    charge = memory_tier.Charge(step=5, spent=0.002, ended=1.0, reused=True, typical=0.0004)
    assert memory_tier.snapshot_cost(charge, next_step_secs=0.0001, ack_reads=0.0) == pytest.approx(0.002)
    assert memory_tier.snapshot_cost(charge, next_step_secs=None, ack_reads=0.0005) == pytest.approx(0.0025)


def test_a_snapshot_waiting_for_its_summaries_keeps_its_slot_until_sent_or_dropped():
    s = Slots(3)
    s.written(0, 10), s.wait_to_send(0, 10)
    assert s.busy(0.0) == {0} and s.free(100.0) == 1  # no grace: it waits as long as the summaries take
    s.sent_memory(0, 10, now=1.0)
    assert s.waiting is None and s.unacked == (0, 10, 1.0)
    s.written(1, 20), s.wait_to_send(1, 20)
    s.drop_waiting()  # a disk snapshot of a later step superseded it
    assert 1 not in s.busy(2.0)


def test_a_slot_zeromq_may_still_read_is_never_written_whatever_the_acknowledgments_grace():
    # a member of another host sends its slot's bytes uncopied (peer_copy): a link to node 0 that
    # stalls past the grace must not free the slot under the send (node 0 would get a torn copy)
    s = Slots(3)
    s.written(0, 10), s.sent_memory(0, 10, now=0.0), s.send_started(0)
    assert s.busy(0.1) == {0}
    late = 1.0 + memory_tier.UNACKED_GRACE
    assert 0 in s.busy(late) and s.free(late) == 1  # the grace is over, the send is not: slot 0 stays
    s.acknowledged(10)  # the service holds it (and slot 0 as the held one)
    s.send_done(0)
    assert s.busy(late) == {0}  # held now, no longer sending
    s.written(1, 20), s.sent_memory(1, 20, now=late), s.send_started(1)
    s.acknowledged(20)  # acknowledged before ZeroMQ let go (the frames' trackers lag)
    assert s.busy(late) == {1} and s.free(late) == 2  # the empty slot first, then the oldest
    s.written(2, 30), s.sent_memory(2, 30, now=late), s.send_started(2), s.acknowledged(30)
    assert s.busy(late) == {1, 2}  # 1 is still read by ZeroMQ though the service holds 30
    s.send_done(1), s.send_done(2)
    assert s.busy(late) == {2}


def test_with_one_slot_only_the_disk_snapshot_blocks_it():
    s = Slots(1)
    s.written(0, 5), s.sent_disk(0)
    assert s.free(0.0) is None
    s.disk_done(), s.acknowledged(5)
    assert s.free(0.0) == 0  # with the tier off the held snapshot is on disk already


def test_a_torn_slot_is_seen_by_the_service():
    arena = SnapshotArena(4096, slots=3)
    try:
        view = ArenaView(arena.ref())
        assert "never written" in view.slot_problem(1, 7)
        arena.mark(1, SLOT_WRITING, 7)
        assert "cut short" in view.slot_problem(1, 7)  # a copy in progress, or killed mid-way
        arena.mark(1, SLOT_COMPLETE, 7)
        assert view.slot_problem(1, 7) == ""
        arena.mark(1, SLOT_WRITING, 9)
        arena.mark(1, SLOT_COMPLETE, 9)
        assert "overwritten" in view.slot_problem(1, 7)
        assert view.slot_problem(2, 7) and view.slot_problem(0, 7)  # the other slots are untouched
        view.close()
    finally:
        arena.close()


def test_only_a_whole_snapshot_newer_than_every_checkpoint_is_persisted():
    assert persist_decision(50, 40, True, "") == ""
    assert persist_decision(50, None, True, "") == ""
    assert "not newer" in persist_decision(40, 40, True, "")
    assert "settings" in persist_decision(50, 40, False, "")
    assert "torn" in persist_decision(50, 40, True, "its copy of step 50 was cut short (torn)")


# ---------------------------------------------------------------------------------------- real runs
def _manifest(logdir: str, step: int) -> dict:
    with open(os.path.join(logdir, ".procsv", "checkpoints", f"model.ckpt-{step}.json")) as fh:
        return json.load(fh)


def _restored_steps(out: str) -> list[int]:
    return [int(m) for m in re.findall(r"trainer attempt \d+ restored step (\d+)", out)]


def _same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys() and len(a) > 4
    for key in a:
        assert (a[key] == b[key]).all(), f"{key} differs from the uninterrupted run"


@pytest.mark.slow
def test_a_kill_mid_snapshot_copy_restores_the_one_before_and_a_later_sigkill_resumes_from_memory_exactly(
        logdir, clean_weights):
    """Two SIGKILLs of the trainer in one launch with no disk checkpoint but the final one.

    First, the 3rd copy into the snapshot memory hangs with its copy done but its slot not yet marked
    complete, and the trainer is killed there: the restart restores the snapshot before, never the torn one.
    (Not a later one: under load a copy costs 10-20 ms of wall time, the adaptive interval grows to match,
    and a 1200-step run at 3 ms, as long as CLEAN_ARGS' 600 at 6 ms, took as few as 5 in-memory snapshots.)
    Then the restarted trainer, 150 steps past that restore, is killed with nothing newer on disk than the
    snapshot the service persisted for the first restart: only memory can save its progress, and the second
    restart resumes from the restarted trainer's own in-memory snapshot, exactly (the final weights are an
    uninterrupted run's). The service outlives both trainers and holds their snapshots."""
    # (the fault point fires in the first trainer attempt only: the restarted one snapshots normally)
    proc = launch(logdir, *ARGS, *NO_DISK, env=quiet_env(PROCSV_FAULT="trainer:slot_complete:3",
                                                         PROCSV_MEMORY_SNAPSHOTS="0.01"))
    try:
        line = wait_for(lambda: _fault_line(logdir), 120, what="the trainer to hang mid-copy")
        torn = int(re.search(r"of step (\d+)", line).group(1))
        os.kill(wait_role_pid(logdir, "trainer"), signal.SIGKILL)
        wait_for(lambda: _restarted_past(logdir, 150), 120, what="the restarted trainer 150 steps past its restore")
        on_disk = committed_steps(logdir)
        assert len(on_disk) == 1 and on_disk[0] < torn, (on_disk, torn)  # the first restart's snapshot, persisted
        os.kill(wait_role_pid(logdir, "trainer"), signal.SIGKILL)
    finally:
        code, out, err = finish(proc)
    assert code == 0, err
    restored = _restored_steps(out)
    assert len(restored) == 2 and 0 < restored[0] < torn, (torn, out)  # the snapshot before, never the torn one
    assert restored[0] == on_disk[0], (restored, on_disk)
    assert restored[1] > on_disk[0], (restored, on_disk)  # newer than anything on disk: the snapshot held in memory
    for step in restored:
        assert _manifest(logdir, step)["reason"] == "memory"
    assert f"persisting its in-memory snapshot of step {restored[1]}" in out + err
    _same(final_weights(logdir), clean_weights)
    with open(os.path.join(logdir, ".procsv", "checkpoint_stats.json")) as fh:
        memory = json.load(fh)["memory"]  # the service outlived the trainers: it held the trainers' snapshots
    assert memory["held"] >= 2 and memory["first_step"] <= restored[1] < memory["last_step"] <= 600, memory


@pytest.mark.slow
def test_killing_the_checkpoint_service_with_the_trainer_falls_back_to_disk(logdir, clean_weights):
    # (every 100 steps, the kill past step 125: at CLEAN_ARGS' 6 ms, the seconds 200 and 250 took at 3 ms, before)
    proc = launch(logdir, *ARGS, "--save-checkpoint-steps", "100", env=TIER)
    try:
        wait_for(lambda: [s for s in committed_steps(logdir) if s >= 100], 120, what="a checkpoint on disk")
        wait_for(lambda: (raw_status(logdir) or {}).get("step", 0) >= 125, 120, what="step 125")
        on_disk = max(committed_steps(logdir))
        assert _manifest(logdir, on_disk)["reason"] == "steps"
        service, trainer = wait_role_pid(logdir, "checkpoint"), wait_role_pid(logdir, "trainer")
        os.kill(service, signal.SIGKILL)
        os.kill(trainer, signal.SIGKILL)
    finally:
        code, out, err = finish(proc)
    assert code == 0, err
    restored = _restored_steps(out)
    assert restored and restored[0] == on_disk, (on_disk, out)  # what memory held died with the service
    _same(final_weights(logdir), clean_weights)


def _restarted_past(logdir: str, steps: int) -> bool:
    """Whether the status shows the second trainer attempt ``steps`` steps past the step it restored."""
    status = raw_status(logdir) or {}
    trainer = [p for p in status.get("processes", []) if p.get("role") == "trainer"]
    restored = status.get("restored_step")
    return bool(trainer) and trainer[0].get("attempt") == 2 and restored is not None \
        and status.get("step", 0) >= restored + steps


def _fault_line(logdir: str) -> str:
    try:
        with open(os.path.join(logdir, "logs", "trainer.1.log"), errors="replace") as fh:
            return next((l for l in fh if "fault injected: stuck at slot_complete" in l), "")
    except FileNotFoundError:
        return ""


class _SlowCommitting(_Committing):
    """Each disk snapshot handed over stops the loop ``send_secs`` on the fake clock."""

    send_secs = 0.004

    def send_snapshot(self, msg: SaveData, frames: list[object], until: Optional[float] = None) -> bool:
        self.t += self.send_secs
        return super().send_snapshot(msg, frames, until)


def test_a_disk_snapshot_restarts_the_in_memory_interval_and_takes_none_of_its_budget(tmp_path):
    svc = _SlowCommitting()
    svc.send_secs = 0.024  # each disk snapshot stops the loop 24 ms, 0.8 s apart: 3 % of the loop
    agent, ch = _tiered_agent(tmp_path, svc)
    agent.memory.copy_cost, agent.memory.walk_cost = 0.002, 0.0
    for i, step in enumerate((100, 200, 300, 400)):
        svc.t = 100.0 + 0.8 * i
        agent.request(SaveReason.PERIODIC)
        assert agent.poll(ch, step, svc.t) and agent.snapshot(ch, step)
        # the service holds the disk snapshot as its newest: the next in-memory one is due an
        # interval (2 ms / 1 %) after it, not 10 s later for the user's saves having taken the budget
        assert agent.memory.at == pytest.approx(svc.t) and agent.memory.step == step
        assert agent.memory.next_due() == pytest.approx(svc.t + 0.2)
        svc.t += 0.1
        agent.poll(ch, step + 1, svc.t + 1.0)  # the commit is read: nothing in flight
        assert agent.in_flight is None
    assert agent.memory_due(401, agent.memory.at + 0.2) and not agent.memory_due(401, agent.memory.at + 0.19)


def test_disk_saves_more_frequent_than_a_costly_snapshots_interval_do_not_keep_it_from_being_corrected(tmp_path):
    # the trainer's first in-memory snapshot paid one-offs, 35 ms at load (its only sample, so the
    # cheapest), and set a 3.5 s interval; the user's disk saves every 2 s each restarted it, so no
    # in-memory snapshot ever came to be charged its usual 2 ms: one sample pinned the tier off
    svc = _SlowCommitting()
    agent, ch = _tiered_agent(tmp_path, svc)
    assert agent.memory_snapshot(ch, 1)
    agent.memory.copy_cost, agent.memory.walk_cost = 0.035, 0.0
    memory_at, step = svc.t, 1
    while svc.t < memory_at + 60.0 and not agent.memory_due(step, svc.t):
        step += 1
        svc.t += 0.1
        if step % 20 == 0:  # a disk save every 2 s
            agent.request(SaveReason.PERIODIC)
            assert agent.poll(ch, step, svc.t) and agent.snapshot(ch, step)
            agent.poll(ch, step, svc.t + 0.001)  # its commit is read
    # within the budget (one per 3.5 s at most), and within the longest interval the tier allows
    assert memory_at + 3.5 <= svc.t <= memory_at + memory_tier.MAX_INTERVAL + 0.1


class _Holding(_SlowCommitting):
    """Commits every disk snapshot and says it holds the newest snapshot sent, at every read."""

    def poll_checkpoint(self, timeout: float = 0.0) -> list[object]:
        held = [SnapshotHeld(self.sent[-1].step)] if self.sent and not self.sent[-1].persist else []
        return super().poll_checkpoint(timeout) + held


def test_one_walk_charged_a_descheduling_does_not_keep_the_tier_at_one_snapshot_per_10_s(tmp_path):
    # the first in-memory snapshot walks the object graph and is charged a descheduling, 120 ms at
    # load: the walks alone then take the budget, one in-memory snapshot per 10 s. The disk saves
    # every 2 s redo the walk (the shared plan is never 10 s old), so no in-memory snapshot walked
    # again to be charged a usual walk: the tier stayed at one per 10 s for the rest of the run
    svc = _Holding()
    svc.send_secs = 0.0
    agent, ch = _tiered_agent(tmp_path, svc)
    assert agent.memory_snapshot(ch, 1)
    agent.charge_memory(1, 100.0, 100.12)
    agent.charge_memory(2, 100.121, 100.1211)
    assert agent.memory.walk_cost == pytest.approx(0.12)
    step, svc.t = 2, 100.2
    while svc.t < 160.0:
        step += 1
        svc.t += 0.1
        agent.poll(ch, step, svc.t)
        if step % 20 == 0:  # a disk save every 2 s
            agent.request(SaveReason.PERIODIC)
            assert agent.poll(ch, step, svc.t) and agent.snapshot(ch, step)
        elif agent.memory_due(step, svc.t) and agent.memory_snapshot(ch, step):
            agent.charge_memory(step, svc.t, svc.t + 0.002)  # a copy (or a walk) of 2 ms
            svc.t += 0.1
            step += 1
            agent.charge_memory(step, svc.t, svc.t + 0.0001)
    # the walk was measured again: the interval is the budget's for 2 ms copies again
    assert agent.memory.walk_cost < 0.01 and agent.memory.next_due() - agent.memory.at < 1.0


class _Refusing(_Service):
    """Node 0's checkpoint service as a member of another host sees it: every copy refused, too large."""

    def poll_checkpoint(self, timeout: float = 0.0) -> list[object]:
        from procsv.ipc.messages import GroupCopyRefused

        out = [GroupCopyRefused(1, 1, m.step, 1 << 20, 4096) for m in self.sent[self.read:]]
        self.read = len(self.sent)
        return out

    read = 0


def test_a_member_whose_peer_copy_node_0_refused_takes_no_more_copies_it_would_refuse(tmp_path, capfd):
    # a member of another host whose copy node 0 refused (beyond its limit): every later copy of the
    # same state is as large, and node 0 refuses it too. Before, the member still copied its state
    # into a slot, sent it over CURVE (19 % of a step's CPU at 64 MiB) and node 0 received it whole,
    # every K steps, for nothing; now it takes no more of them (said once in its log)
    import tensorflow as tf

    svc = _Refusing()
    step_var = tf.Variable(0, dtype=tf.int64)
    ckpt = tf.train.Checkpoint(w=tf.Variable(tf.ones([64, 64])), step=step_var)
    layout = Layout(str(tmp_path / "run"))
    layout.create()
    agent = CheckpointAgent(ckpt, step_var, layout, basename="model.ckpt", save_model_secs=None,
                            save_checkpoint_steps=None, max_to_keep=5, keep_checkpoint_every_n_hours=None,
                            clock=svc.clock, memory_budget=0.01, saving=False, group=(1, 1, 50))
    agent.memory.remote = True  # (PROCSV_GROUP_REMOTE: a member of host 1)
    agent.store.arena_for(arena_bytes_needed(ckpt))
    ch = cast(TrainerChannels, svc)
    assert agent.memory_due(50, svc.t) and agent.memory_snapshot(ch, 50)
    svc.t += 1.0
    agent.poll(ch, 51, svc.t)  # reads the refusal
    assert agent.store.slots.unacked is None
    for step in (100, 150, 200):
        svc.t += 1.0
        agent.poll(ch, step, svc.t)
        assert not agent.memory_due(step, svc.t), f"a copy of step {step} is due again"
    assert [m.step for m in svc.sent] == [50]
    err = capfd.readouterr().err
    assert err.count("refused member 1's copy") == 1 and "takes no more in-memory snapshots" in err, err


class _AckDuringWait(_Committing):
    """A service whose acknowledgment of an in-memory snapshot comes while the trainer waits for the
    result of the disk snapshot in flight (at a stop): the wait hands it on as another message first."""

    def __init__(self) -> None:
        super().__init__()
        self.acked: set[int] = set()

    def poll_checkpoint(self, timeout: float = 0.0) -> list[object]:
        return []  # nothing is read at the steps: every answer comes during the wait

    def wait_save_result(self, step: int, deadline: float, other: Any = lambda msg: None) -> SaveResult:
        for m in self.sent:
            if not m.persist and m.step not in self.acked:
                self.acked.add(m.step)
                other(SnapshotHeld(m.step))
        return SaveResult(step, SaveReason.PERIODIC, True, f"model.ckpt-{step}", None, 0.01)


def test_an_acknowledgment_that_comes_while_a_stop_waits_for_the_snapshot_in_flight_is_folded_in(tmp_path):
    """Every reply of the service reaches the agent's state through one function, also while a stop
    waits for the disk snapshot in flight: the in-memory snapshot acknowledged meanwhile (newer than
    the one in flight, so that one's result does not stand for it) is the service's, and its slot no
    longer awaits an acknowledgment (dropped, it stayed spoken for until the grace ran out)."""
    svc = _AckDuringWait()
    agent, ch = _tiered_agent(tmp_path, svc)
    agent.request(SaveReason.PERIODIC)
    assert agent.poll(ch, 5, svc.t) and agent.snapshot(ch, 5)
    assert agent.in_flight == 5
    assert agent.memory_snapshot(ch, 7)
    assert agent.store.slots.unacked is not None and agent.store.slots.unacked[1] == 7
    assert agent.wait_in_flight(ch, 7, svc.t + 5.0)
    assert [(m.step, m.persist) for m in svc.sent] == [(5, True), (7, False)] and svc.acked == {7}
    assert agent.in_flight is None and agent.last_committed == 5
    assert agent.store.slots.unacked is None, agent.store.slots.unacked  # the acknowledgment of 7 was folded in
