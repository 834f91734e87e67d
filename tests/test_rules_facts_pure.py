"""The facts the decision rules keep once (issue 51): a child's exit code is its failure's, the run's
``finishing`` is its state moved out of ``running``, the coordinator flag is the limits'. Each case the
rules met before is played here with a fake clock and hand-built views, as the decision tests do: an
exit 0, a kill by a signal, a loss with its host, a --ps task's exit 42, a stop, a give-up after
--max-restarts, a service that kept failing, a trainer that died while the run was stopping."""

from __future__ import annotations

import signal

from procsv.watchdog import observe
from procsv.watchdog.rules import stall
from procsv.watchdog.rules.actions import (Finish, GiveUp, GiveUpService, NodeLost, Restart, RestartTask, Settle,
                                           Signal, Spawn)
from procsv.watchdog.rules.bookkeeping import note, request_stop
from procsv.watchdog.rules.decide import Limits
from procsv.watchdog.rules.hang import HangLimits
from procsv.watchdog.rules.lifecycle import ProcState, RunState
from procsv.watchdog.rules.policy import RestartPolicy
from procsv.watchdog.rules.state import CHECKPOINT, PS, STANDBY, TRAINER, NodeView

from test_group_decide import W1, group
from test_ps_tasks_pure import ps_launch
from test_watchdog_decide import KILLED, Sim, of


def _started(limits: Limits | None = None) -> Sim:
    sim = Sim(limits)
    sim.start_trainer()
    return sim


def test_a_child_has_no_exit_code_until_reaped_and_then_its_failures():
    sim = _started()
    t = sim.trainer
    assert t.exit_code is None and not t.reaped and t.failure is None
    sim.notice()  # a death notice is no exit status
    assert t.exit_code is None and not t.reaped
    sim.dies(TRAINER, -signal.SIGSEGV)
    assert t.reaped and t.exit_code == -signal.SIGSEGV == t.failure.code
    assert t.cause == "was killed by SIGSEGV" and t.failure.fields() == {"signal": "SIGSEGV"}


def test_an_exit_0_finishes_the_run_succeeded_and_only_then_is_it_finishing():
    sim = _started()
    assert not sim.view.finishing
    sim.dies(TRAINER, 0)
    assert not sim.view.finishing  # reaped, not judged yet
    (f,) = of(sim.tick(1.0), Finish)
    assert f.run == RunState.SUCCEEDED and f.exit_code == 0
    assert sim.view.run == RunState.SUCCEEDED and sim.view.finishing and sim.view.exit_code == 0
    assert sim.trainer.state == ProcState.EXITED and sim.trainer.settled and sim.trainer.failure.fields() == {"code": 0}


def test_a_stop_request_is_not_finishing_until_the_trainers_end_is_judged():
    sim = _started()
    request_stop(sim.view, signal.SIGTERM, sim.now, sim.limits.stop_grace_secs)
    assert of(sim.tick(0.1), Signal) and not sim.view.finishing and sim.view.run == RunState.RUNNING
    sim.notice()  # died while the run was stopping: only its exit status is acted on
    assert sim.tick(0.1) == [] and not sim.view.finishing
    sim.dies(TRAINER, 0)
    (f,) = of(sim.tick(0.1), Finish)
    assert (f.run, f.exit_code) == (RunState.STOPPED, 128 + signal.SIGTERM)
    assert sim.view.finishing and sim.view.run == RunState.STOPPED and sim.view.exit_code == 143
    assert sim.trainer.state == ProcState.EXITED


def test_a_trainer_killed_during_a_stop_before_its_save_stops_the_run_with_1():
    sim = _started()
    request_stop(sim.view, signal.SIGTERM, sim.now, sim.limits.stop_grace_secs)
    sim.tick(0.1)
    sim.dies(TRAINER, KILLED)
    (f,) = of(sim.tick(0.1), Finish)
    assert f.unsaved and sim.view.run == RunState.STOPPED and sim.view.exit_code == 1
    assert sim.trainer.state == ProcState.FAILED


def test_a_give_up_after_max_restarts_fails_the_run_with_the_blamed_headline():
    sim = _started(Limits(restart=RestartPolicy(max_restarts=1), hang=HangLimits(None, None)))
    sim.dies(TRAINER, KILLED)
    (r,) = of(sim.tick(1.0), Restart)
    assert sim.view.children[TRAINER].state == ProcState.RESTARTING and sim.trainer.settled
    sim.tick(r.delay + 1.0)
    sim.ready()
    sim.progress(2)
    sim.dies(TRAINER, KILLED)
    (g,) = of(sim.tick(1.0), GiveUp)
    assert "--max-restarts 1" in g.reason
    assert sim.view.run == RunState.FAILED and sim.view.finishing and sim.view.exit_code == 1
    assert sim.view.last_error == f"trainer attempt 2 (pid {sim.trainer.pid}) was killed by SIGKILL"
    assert sim.trainer.state == ProcState.FAILED and sim.view.restart_at is None


def test_a_services_crash_loop_ends_the_run_failed_though_the_trainer_then_finishes_its_stop():
    sim = _started()
    for _ in range(sim.limits.service_restart_limit + 1):
        sim.dies(CHECKPOINT, 1)
        sim.tick(0.1)
    assert of(sim.log, GiveUpService) and sim.view.failed and not sim.view.finishing
    sim.dies(TRAINER, 0)  # the orderly stop that followed: a Finish, yet the run failed
    (f,) = of(sim.tick(0.1), Finish)
    assert f.run == RunState.STOPPED
    assert sim.view.run == RunState.FAILED and sim.view.finishing and sim.view.exit_code == 1


def test_members_lost_with_their_host_are_reaped_killed_and_their_late_end_changes_nothing():
    sim = group(2)
    w1 = sim.member(W1)
    w1.node = 1
    sim.view.nodes[1] = NodeView(1, "10.0.0.11", last_beat=sim.now)
    note(sim.view, NodeLost(1, 4.2), sim.now, sim.limits)
    assert w1.reaped and w1.exit_code == KILLED == w1.failure.code and w1.cause == "was killed by SIGKILL"
    assert not sim.member(TRAINER).reaped  # node 0's chief is not lost with it
    sim.reaps(W1, 0)  # its agent's report, after the loss: already reaped
    assert w1.exit_code == KILLED
    acts = sim.tick(0.01)
    assert Settle(W1, 1) in acts and [a.slot for a in of(acts, Signal)] == [TRAINER]


def test_a_parameter_servers_42_is_no_preemption_and_its_0_is_a_loss():
    for code in (42, 0):
        sim = ps_launch()
        ps0 = sim.view.children["ps0"]
        assert ps0.role == PS
        sim.reaps("ps0", code)
        (r,) = of(sim.tick(1.0), RestartTask)
        assert r.slot == "ps0" and r.history.restarts == 1  # counted: neither a preemption nor a finish
        assert ps0.state == ProcState.RESTARTING and sim.view.last_error.startswith("ps0 attempt 1")
        assert not sim.view.finishing


def test_a_workers_exit_0_in_a_ps_launch_settles_and_its_sigkill_restarts_it_uncounted_only_if_procsv_killed_it():
    sim = ps_launch()
    sim.reaps("worker1", 0)
    assert of(sim.tick(1.0), Settle) == [Settle("worker1", 1)] and sim.view.children["worker1"].state == ProcState.EXITED
    sim = ps_launch()
    sim.reaps("worker1", KILLED)
    (r,) = of(sim.tick(1.0), RestartTask)
    assert r.delay == 0.0 and r.history.restarts == 1  # killed from outside: restarted at once, counted
    assert of(sim.tick(0.01), Spawn) == [Spawn("worker1", "worker")]


def test_a_live_standby_overdue_to_save_is_not_the_trainer_the_stall_rule_reads():
    sim = _started()
    observe.spawned(sim.view, STANDBY, STANDBY, sim.trainer.attempt + 1, 999, sim.now, "fresh")
    sim.view.children[STANDBY].save_overdue = "not the trainer's"
    assert stall.checkpoint_stall(sim.view, sim.now, sim.limits) is None
    sim.trainer.save_overdue = "the trainer's"
    assert stall.checkpoint_stall(sim.view, sim.now, sim.limits) == "the trainer's"
    sim.dies(TRAINER, KILLED)  # no longer live: its overdue save is no stall
    assert stall.checkpoint_stall(sim.view, sim.now, sim.limits) is None
