"""The watched clock (procsv/common/clock/unwatched.py, procsv/common/clock/watched.py): the watchdog's and
the agents' timers leave out the time their process was stopped (SIGSTOP, then SIGCONT: Slurm's
``scontrol suspend``/``resume``), and only that.

The arithmetic on made-up series of the loop's readings and SIGCONTs (pure), and the clock in a real
process stopped and continued by real signals (no TensorFlow, but seconds long: slow). The whole launch
suspended and resumed is tests/test_suspend.py.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import quick_guard_env, wait_for
from procsv.common.layout import Layout
from procsv.watchdog.config import LaunchConfig
from procsv.watchdog.multihost.agent import NodeAgent
from procsv.ipc.messages import SaveOverdue
from procsv.watchdog.observe import attempt_began_wall, heard
from procsv.watchdog.rules.state import TRAINER, ChildView, RunView
from procsv.common.clock.unwatched import MIN_STOP_SECS, Stop, Unwatched, stopped_within
from procsv.common.clock.watched import TICK_SECS, WatchedClock


def readings(u: Unwatched, series: list[tuple[str, float]]) -> list[float]:
    """Drive ``u`` with ``("read", raw)`` and ``("cont", raw)`` events (a SIGCONT handled at raw, taken by the
    next read): the watched times the reads returned."""
    out, pending = [], []
    for kind, raw in series:
        if kind == "cont":
            pending.append(raw)
        else:
            out.append(u.read(raw, pending))
            pending = []
    return out


def test_a_stop_ended_by_a_sigcont_is_left_out_of_every_later_reading():
    u = Unwatched()
    # the loop reads every 0.1 s, is stopped after 10.0 and continued at 30.0, then reads on
    got = readings(u, [("read", 10.0), ("read", 10.1), ("cont", 30.1), ("read", 30.15), ("read", 30.25)])
    assert got == pytest.approx([10.0, 10.1, 10.15, 10.25])
    assert u.subtracted == pytest.approx(20.0)
    assert u.stops == [Stop(at=pytest.approx(10.1), secs=pytest.approx(20.0))]
    # a silence that began at the last reading before the stop counts only what was watched since the continue
    assert got[-1] - got[1] == pytest.approx(0.15)


def test_a_long_loop_gap_without_a_sigcont_is_counted():
    """A loop blocked or descheduled 20 s while its children ran on: what they did meanwhile is real."""
    u = Unwatched()
    got = readings(u, [("read", 10.0), ("read", 30.0), ("read", 30.1)])
    assert got == [10.0, 30.0, 30.1]
    assert u.subtracted == 0.0 and u.stops == []


def test_a_sigcont_to_a_process_that_was_not_stopped_subtracts_nothing():
    """kill -CONT of a running launch (or a stop shorter than MIN_STOP_SECS): the loop read the clock a moment
    before, the gap is no stop; many of them subtract nothing either."""
    u = Unwatched()
    series: list[tuple[str, float]] = []
    for i in range(100):  # a SIGCONT between every two readings, 0.1 s apart, for 10 s
        series += [("read", i * 0.1), ("cont", i * 0.1 + 0.05)]
    got = readings(u, series + [("read", 10.0)])
    assert got[-1] == 10.0 and u.subtracted == 0.0
    short = Unwatched()
    assert readings(short, [("read", 5.0), ("cont", 5.0 + MIN_STOP_SECS * 0.9), ("read", 6.0)]) == [5.0, 6.0]


def test_the_clock_never_runs_backwards_for_the_loop():
    """A reading taken just before the stop, whose SIGCONT the same read takes (the handler ran between the
    raw reading and the take), reads as the continue: never below the reading before."""
    u = Unwatched()
    assert u.read(10.0) == 10.0
    assert u.read(10.05, [30.0]) == pytest.approx(10.0)  # (stopped after its raw reading, continued at 30.0)
    assert u.read(30.01) == pytest.approx(10.01)
    # readings in order stay in order over any series of stops
    v = Unwatched()
    series = [("read", 0.0), ("read", 0.5), ("cont", 3.0), ("read", 2.9), ("read", 3.2), ("cont", 9.0),
              ("cont", 9.5), ("read", 9.6), ("read", 20.0), ("cont", 40.0), ("read", 40.0)]
    got = readings(v, series)
    assert got == sorted(got)
    # two SIGCONTs of one stop: the second, 0.5 s after the first, subtracts nothing more
    assert [s.secs for s in v.stops] == pytest.approx([2.5, 5.8, 20.0])


def test_another_thread_sees_the_stops_the_loop_has_not_taken_yet():
    u = Unwatched()
    u.read(10.0)
    assert u.peek(30.5, [30.0]) == pytest.approx(10.5)  # as the loop will count it
    assert u.peek(30.5, [10.5]) == pytest.approx(30.5)  # (no stop: a SIGCONT 0.5 s after the loop's reading)
    assert u.subtracted == 0.0 and u.last_read == 10.0  # a peek changes nothing
    assert u.read(30.5, [30.0]) == pytest.approx(10.5)


def test_unwatched_since_gives_back_the_real_time_since_a_watched_moment():
    u = Unwatched()
    readings(u, [("read", 0.0), ("read", 5.0), ("cont", 25.0), ("read", 25.0), ("read", 40.0), ("cont", 50.0),
                 ("read", 50.0)])
    assert u.unwatched_since(0.0) == pytest.approx(30.0)  # both stops
    assert u.unwatched_since(6.0) == pytest.approx(10.0)  # the second only (it began at watched 20.0)
    assert u.unwatched_since(21.0) == 0.0
    # an attempt that began at watched 6.0 (raw 26.0) began 24 s before raw 50.0, 14 s of them watched: a commit
    # of its own 20 s before raw 50.0 is not taken for an earlier attempt's
    child = ChildView(slot="trainer", role="trainer", attempt=2, pid=1234, started=6.0)
    wall_now, clock_now = 1_000_050.0, u.read(50.0)
    assert attempt_began_wall(child, 0.0, wall_now, clock_now, u.unwatched_since(6.0)) == pytest.approx(1_000_026.0)


CHILD = """
import sys, time
from procsv.common.clock.watched import WatchedClock
clock = WatchedClock()
clock.watch()
print("ready", flush=True)
while sys.stdin.readline().strip() == "read":
    t0 = time.monotonic()
    watched = clock()
    t1 = time.monotonic()
    print(f"{watched!r} {t0!r} {t1!r} {clock.subtracted!r} {len(clock.new_stops())}", flush=True)
"""


@pytest.fixture
def clocked():
    """A Python process whose loop watches a WatchedClock: write "read", it answers a reading of it, its raw monotonic
    clock just before and just after that reading, the seconds subtracted and the stops new since the last answer."""
    proc = subprocess.Popen([sys.executable, "-c", CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            env=quick_guard_env())
    assert proc.stdout is not None and proc.stdin is not None
    assert proc.stdout.readline().strip() == "ready"

    def ask() -> tuple[float, float, float, float, int]:
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write("read\n")
        proc.stdin.flush()
        watched, t0, t1, subtracted, new = proc.stdout.readline().split()
        return float(watched), float(t0), float(t1), float(subtracted), int(new)
    yield proc, ask
    proc.kill()
    proc.wait()


def _stopped(pid: int) -> bool:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] == "T"


@pytest.mark.slow  # (no TensorFlow, but the stop takes seconds)
def test_a_real_sigstop_and_sigcont_are_left_out_and_a_bare_sigcont_is_not(clocked):
    proc, ask = clocked
    _, _, _, subtracted, new = ask()
    assert subtracted == 0.0 and new == 0
    os.kill(proc.pid, signal.SIGCONT)  # a running process continued: no stop
    time.sleep(0.2)  # (its handler ran: the kernel delivers the signal at once, the process waits in readline)
    before, b0, b1, subtracted, new = ask()
    assert subtracted == 0.0 and new == 0
    os.kill(proc.pid, signal.SIGSTOP)
    wait_for(lambda: _stopped(proc.pid), 10, what="the process stopped")
    time.sleep(2.5)  # (the stop: its last reading was before it, its SIGCONT after)
    os.kill(proc.pid, signal.SIGCONT)
    after, a0, a1, subtracted, new = ask()
    assert new == 1 and subtracted >= 2.5
    # the watched time between the two readings is the raw time between them (each taken between its t0 and t1)
    # without the stop, and never negative
    assert a0 - b1 - subtracted <= after - before <= a1 - b0 - subtracted
    assert after >= before


TICKED = """
import sys, time
from procsv.common.clock.watched import process_clock
clock = process_clock()  # (a trainer's: the Supervisor's default clock, its loop a thread of its own)
print("ready", flush=True)
while sys.stdin.readline().strip() == "read":
    t0 = time.monotonic()
    watched = clock()
    t1 = time.monotonic()
    print(f"{watched!r} {t0!r} {t1!r}", flush=True)
"""


@pytest.mark.slow  # (no TensorFlow, but the stop takes seconds)
def test_a_ticked_clock_measures_a_stop_from_its_own_ticks_not_from_the_main_threads_last_reading():
    """The trainer's clock (process_clock): its main thread may read it seldom (a long step, a wait), so its loop is a
    thread that reads it every TICK_SECS and stamps each SIGCONT as delivered (the wakeup fd). A SIGCONT 1.5 s after
    the main thread's last reading leaves nothing out (a clock whose loop is the main thread took those 1.5 s for a
    stop), and a real stop (1.5 s) is left out with at most a tick (and the delivery) more, at the main thread's first
    reading after the SIGCONT (the loop may not have taken it yet: the reading counts it as the loop will)."""
    proc = subprocess.Popen([sys.executable, "-c", TICKED], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            env=quick_guard_env())
    assert proc.stdout is not None and proc.stdin is not None
    try:
        assert proc.stdout.readline().strip() == "ready"

        def left_out() -> tuple[float, float, float]:
            """The seconds the clock left out so far: at least ``lo``, at most ``hi`` (the raw clock read just before
            and just after the reading); and the reading."""
            assert proc.stdin is not None and proc.stdout is not None
            proc.stdin.write("read\n")
            proc.stdin.flush()
            watched, t0, t1 = map(float, proc.stdout.readline().split())
            return t0 - watched, t1 - watched, watched
        lo, hi, first = left_out()
        assert lo <= 0.0 <= hi
        time.sleep(1.5)  # (the main thread reads nothing meanwhile: it waits in readline)
        os.kill(proc.pid, signal.SIGCONT)  # a running process continued: no stop
        time.sleep(0.2)
        lo, hi, before = left_out()
        assert lo <= 0.0 <= hi
        time.sleep(0.3)
        os.kill(proc.pid, signal.SIGSTOP)
        wait_for(lambda: _stopped(proc.pid), 10, what="the process stopped")
        t0 = time.monotonic()
        time.sleep(1.5)
        os.kill(proc.pid, signal.SIGCONT)
        stopped = time.monotonic() - t0
        lo, hi, after = left_out()
        assert stopped <= hi and lo <= stopped + TICK_SECS + 0.5, (stopped, lo, hi)
        assert first <= before <= after
    finally:
        proc.kill()
        proc.wait()


def test_an_agent_suspended_with_its_job_finds_node_0_not_lost_and_one_that_watched_node_0_silent_does(short_tmp):
    """Node 1's agent, its clock on a made-up raw time: node 0 beat every 0.5 s until 10.0, then (a) the agent's own
    process was stopped until 30.0 with the whole job and continued (a real SIGCONT to this process, handled by the
    agent's clock), or (b) the agent ran on while node 0 said nothing. With --node-timeout 15: (a) node 0 is not lost
    and the master's silence is 0.1 s (before: "no heartbeat from node 0 for 20.1 s", its members stopped as a stale
    group); (b) it is lost."""
    layout = Layout(os.path.join(short_tmp, "run"))
    layout.create()
    verdicts = []
    for suspended in (True, False):
        raw = [0.0]
        agent = NodeAgent(LaunchConfig("procsv.examples.digits", [], layout.logdir, nnodes=2, node_rank=1,
                                       master_addr="127.0.0.1:1", prewarm=False, node_timeout=15.0),
                          clock=WatchedClock(lambda: raw[0]))
        agent.clock.watch()  # (as its loop does)
        try:
            for i in range(21):  # node 0's beats, read by the agent's loop as they come
                raw[0] = i * 0.5
                agent.seen.beat(agent.clock())
                agent.seen.heard_at = agent.clock()
            raw[0] = 30.0
            if suspended:
                os.kill(os.getpid(), signal.SIGCONT)  # (its handler runs in this, the main, thread at once)
            raw[0] = 30.1
            now = agent.clock()
            verdicts.append((round(now - agent.seen.heard_at, 3), agent.seen.lost(now, agent.seen.node_timeout)))
        finally:
            agent.clock.unwatch()
            agent.seen.close()
            agent.stacks.close()
            agent.disk.close()
    assert verdicts[0] == (0.1, None)
    assert verdicts[1][0] == 20.1 and "no heartbeat from node 0 for 20.1 s" in (verdicts[1][1] or "")


def test_a_wait_timed_on_a_raw_clock_leaves_out_the_stops_within_it():
    # two stops: 12 s beginning at watched 100, 3 s at watched 110; the watched time now is 115
    stops = [Stop(100.0, 12.0), Stop(110.0, 3.0)]
    assert stopped_within(stops, 115.0, 4.0) == 0.0  # begun after the last stop
    assert stopped_within(stops, 115.0, 7.0) == 2.0  # begun during the last stop: its part after
    assert stopped_within(stops, 115.0, 16.0) == 3.0  # 5 s watched, the 3 s stop, 8 of the 10 s watched before it
    assert stopped_within(stops, 115.0, 20.0) == 5.0  # 5 watched, 3 stopped, 10 watched, the last 2 s of the first stop
    assert stopped_within(stops, 115.0, 30.0) == 15.0  # begun as the first stop did
    assert stopped_within(stops, 115.0, 40.0) == 15.0  # begun before both
    assert stopped_within([], 115.0, 30.0) == 0.0


def test_a_snapshot_overdue_only_for_the_suspension_is_no_stall():
    """The watchdog believes a trainer's SaveOverdue unless its own stops within the wait explain it (the trainer
    times the wait on its raw clock: a job suspended mid-commit came back with its service SIGKILLed as stalled)."""
    view = RunView(launch_start=0.0)
    trainer = ChildView(TRAINER, TRAINER, 1, 4242, 0.0)
    view.children[TRAINER] = trainer
    msg = SaveOverdue(4242, 139, 13.5, 6.0)
    said = heard(view, msg, 200.0, stops=[Stop(198.5, 12.0)])  # 12 of the 13.5 s stopped: 1.5 s waited
    assert not trainer.save_overdue and view.failed_saves == 0
    assert "12.0 s of it while this launch was stopped: not overdue" in said[0].say
    heard(view, msg, 200.0, stops=[Stop(198.5, 2.0)])  # 11.5 s waited: overdue
    assert trainer.save_overdue and view.failed_saves == 1


def test_a_wait_whose_stop_the_trainers_clock_left_out_is_not_forgiven_twice():
    """The trainer's clock leaves its own stops out of a wait (the watched clock, a Supervisor's default) and says how
    many seconds (``stopped_secs``): the watchdog leaves out only what of its own stops that does not cover. A commit
    waited 3.5 s, the job was stopped 12 s, then 3 s more: 6.5 s watched, past the 6 s deadline, is overdue (read as a
    raw wait, 3.5 s of its last 6.5 fell in the stop: 'not overdue')."""
    view = RunView(launch_start=0.0)
    trainer = ChildView(TRAINER, TRAINER, 1, 4242, 0.0)
    view.children[TRAINER] = trainer
    stops = [Stop(197.0, 12.0)]
    said = heard(view, SaveOverdue(4242, 139, 6.5, 6.0, stopped_secs=12.0), 200.0, stops=stops)
    assert trainer.save_overdue and view.failed_saves == 1 and not said
    trainer.save_overdue = None
    said = heard(view, SaveOverdue(4242, 139, 6.5, 6.0), 200.0, stops=stops)  # a clock that left nothing out
    assert not trainer.save_overdue and "3.5 s of it while this launch was stopped: not overdue" in said[0].say
    # the trainer's clock left out 10 s of a 12 s stop (continued earlier than the watchdog): the other 2 s are left out
    said = heard(view, SaveOverdue(4242, 139, 7.5, 6.0, stopped_secs=10.0), 200.0, stops=stops)
    assert not trainer.save_overdue and "2.0 s of it while this launch was stopped: not overdue" in said[0].say
