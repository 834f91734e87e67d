"""The auditor's duty cycle (issue 71): how much of the time it may run, so that the audit costs the trainer
at most :data:`BUDGET` of its throughput.

Runs in the watchdog. Pure: no clock (``now`` is the watchdog's, passed in), no process, no file; the executor
(:mod:`procsv.watchdog.audit.auditors`) feeds it the trainer's :class:`~procsv.ipc.messages.Progress` and performs
what :func:`tick` says (SIGSTOP or SIGCONT to the auditor).

Why: an auditor at ``SCHED_IDLE`` takes only CPU no other process wants, yet it is not free. Measured on a
2-core machine whose trainer used 1.05 cores: a trainer beside a running auditor made 3-9 % fewer steps a
second (a plain busy loop at ``SCHED_IDLE`` cost it 7-15 %): its threads woke on a core the auditor held,
which it gives up only at the next wake-up's preemption, with that core's caches the auditor's. How much it
costs depends on the program and the machine, so it is measured, not assumed. (With the kernel's autogroups on,
part of it is that an auditor's session of its own is a scheduling group that weighs as much as the trainer's:
``SCHED_IDLE`` is idle only inside its group; see docs/guarantees.md.)

How: the auditor runs in windows of :data:`RUN_SECS` and is stopped between them (a pause of at least
:data:`PAUSE_MIN_SECS`). The trainer's steps per second in each run window, divided by its rate in the pauses
on either side of it, is one sample of what a running auditor leaves the trainer; the slowdown is one minus the
median of the last :data:`SAMPLES` of them (what status shows), and what the cycle goes by is its upper bound ``x``:
one minus a low order statistic of them (:attr:`DutyCycle.bound`: of nine, the third lowest, which lies below the
samples' true median in all but 9 % of draws, whatever the noise's shape). The duty (the share of the time the auditor
runs) is then the largest that costs at most :data:`TARGET` (``duty * x``), between :data:`MIN_DUTY` and 1: a
machine with cores to spare and steady steps (``x`` about 0) audits at full speed (a short pause every
:data:`FREE_RUN_SECS` keeps measuring); a loaded one audits slowly and says so (the fraction of steps audited,
``procsv status``). The duty falls to what the bound says at once and rises at most :data:`UP` times a sample: noise
then keeps the duty low rather than swinging it to 1 and back (the budget is kept, coverage given up). A
window's rate leaves out the time the trainer reported work between steps (a snapshot); a window in which it
restarted, or the auditor was not running throughout, is no sample, nor is a pause in which an auditor started: forked
from the zygote, it runs until the executor sees it live and stops it, and its start (an auditor's first 0.19 s, in a
run window's tail, left the trainer 4 % of its steps in one measured launch) made that pause a baseline the next
window read faster than, a sample of "no slowdown"; those seconds are charged as run. While the trainer is not training (restarting, finished and waiting for
its last verdicts) or the run is finishing, the auditor runs free.

The duty alone bounds the cost of the cycle from its estimate on, not the run's: before :data:`SAMPLES_MIN` samples
the auditor ran half the time whatever it cost (4-5 s of the first 20 s: 1.3 % of a 20-s CPU-bound trainer's steps
at a slowdown of 5 %, 2 % at 10 %; the benchmark's audit-free/audited ratio of 0.976 where each run's ``cost``
said 0.004), and :data:`MIN_DUTY` costs more than the budget past a slowdown of 20 %. So the cycle also keeps an
account over the whole launch's training time (:meth:`DutyCycle.allows`): the seconds the trainer trained, the
seconds an auditor ran in them, and what each of those cost at the slowdown known then (:attr:`DutyCycle.charge`:
the bound; before :data:`SAMPLES_MIN` samples :data:`PRIOR`, or the worst sample if that says more; a slowdown that
grows later, a trainer crowded by other work, does not make the seconds run before it dearer). A run window begins
only if, by its end, what the audit cost stays within :data:`TARGET` of the time trained plus :data:`CREDIT` (a first
window's, which has nothing to go by); otherwise the pause goes on. A trainer on a spare core (no slowdown) is not
held back past its first three windows (each paid at :data:`PRIOR`, about 50 s; charged again at the first bound,
:meth:`DutyCycle._reprice`); one that a running auditor slows pays for them by longer pauses after.

Why the bound, not the median: the account charged the median (floored at 0), and on a loaded machine (samples
varying by 20-60 %: ``scripts/bench_audit_within.py``) the median of a few samples read a slowdown of 0 or less as
often as not while the real one was several per cent; a charge of 0 then set the duty to 1 and the account let the
auditor run for nothing, so the seconds charged least were the ones run most (42-75 % of the time in 6 of 15
launches, each launch's account saying 0.2-0.3 %). An order statistic reads 0 only if most samples say the auditor
costs nothing (seven of nine), which noise around a real slowdown seldom does; it needs no model of the noise
(the machine's is neither normal nor steady), and one outlier (a window that met an auditor's start) moves it one
rank, not to the outlier, from seven samples on. The duty is set by the same bound: a duty from the median would
plan windows the account then refuses (pauses stretched to pay for windows of :data:`FREE_RUN_SECS` charged at the
bound). The price is coverage where the samples are noisy: the duty is about :data:`TARGET` over half a standard
deviation of the samples, so a free trainer whose samples vary by 1 % audits about 60 % of the time, by 2.5 % about
20 %, by 15 % (a loaded 2-core machine) 1-3 % (``tests/test_audit_duty.py``).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from functools import lru_cache
from math import comb
from typing import Optional

BUDGET = 0.005  # the share of the trainer's throughput the audit may cost (issue 71: within 0.5 %)
TARGET = 0.8 * BUDGET  # what the duty aims at: the estimate is a median of noisy windows
RUN_SECS = 1.0  # one run window while the duty is below FREE_DUTY
FREE_RUN_SECS = 4.0  # one run window at a duty of 1 (the pauses then only keep measuring)
FREE_DUTY = 0.8  # from this duty up, run windows are FREE_RUN_SECS
PAUSE_MIN_SECS = 0.6
WINDOW_STEPS = 10  # a window is at least this many of the trainer's steps long (a slow trainer's are longer)
START_DUTY = 0.5  # before SAMPLES_MIN samples: a run window, then as long a pause
MIN_DUTY = 0.02
SAMPLES = 9  # the samples the slowdown is the median of, and its bound an order statistic of
MISS = 0.1  # the chance at most that the bound reads below the samples' true median slowdown (:func:`rank`)
UP = 2.0  # the duty rises at most this many times a sample (it falls to what the estimate says at once): a noisy
# estimate swings between "costs nothing" and "costs 8 %" (helper-100: the duty flipped 0.049 <-> 1.0 a sample)
SAMPLES_MIN = 3  # the duty stays START_DUTY until this many
PRIOR = 0.1  # the slowdown the account assumes before any sample (measured: 3-9 % for an auditor, 7-15 % a busy loop)
CREDIT = RUN_SECS * PRIOR  # the trainer's seconds the account lends up front: a first run window at PRIOR (a
# trainer on a spare core is audited from its first interval on); by the estimate, runs of 100 s and more cost at most
# BUDGET (TARGET, plus CREDIT spread over them), shorter ones CREDIT more
SETTLE_SECS = 0.15  # the trainer's reports this soon after a switch belong to neither window
MIN_SPAN = 0.5  # a window's reports must span this share of it to give a rate


@dataclass
class DutyCycle:
    """What the duty cycle knows: the duty, the window now (running or paused, since when, the trainer's
    ``(time, step)`` reports heard in it after it settled, in stretches between the trainer's work between
    steps, whether it is spoiled), the last pause's rate,
    the last run window's rate waiting for the pause after it, and the samples (run rate / pause rate)."""

    duty: float = START_DUTY
    running: bool = True
    since: Optional[float] = None
    window: list[list[tuple[float, int]]] = field(default_factory=lambda: [[]])  # its stretches between works
    spoiled: bool = False
    pause_rate: Optional[float] = None
    run_rate: Optional[float] = None
    samples: list[float] = field(default_factory=list)
    step_secs: float = 0.0  # the trainer's seconds a step, as its reports show them (between its last two steps)
    last_step: Optional[tuple[float, int]] = None  # the trainer's newest (time, step) whose step was new
    trained: float = 0.0  # the account: the seconds the trainer trained (ticks not free), this launch
    ran: float = 0.0  # the account: the seconds of those an auditor was let run (a live one)
    cost_secs: float = 0.0  # the account: the trainer's seconds those cost it, each at the charge of its time
    lent: tuple[float, float] = (0.0, 0.0)  # the account: the seconds an auditor ran before the first bound, and what
    # they were charged (at the first bound, charged again at it: they are the windows it was measured on)
    last_tick: Optional[float] = None  # when the last tick was (the account adds the time since, as it was)
    measured: bool = False  # the pause now gave its rate (it goes on past its end while the account says so)
    live: bool = False  # whether an auditor was live at the last tick (one live now and not then has just started)

    @property
    def slowdown(self) -> Optional[float]:
        """What a running auditor takes of the trainer's steps per second (median of the samples), or None
        before :data:`SAMPLES_MIN` samples."""
        if len(self.samples) < SAMPLES_MIN:
            return None
        return 1.0 - statistics.median(self.samples[-SAMPLES:])

    @property
    def bound(self) -> Optional[float]:
        """An upper bound of the slowdown, at least 0: one minus the :func:`rank`-th lowest of the last
        :data:`SAMPLES` samples (the third lowest of nine), or None before :data:`SAMPLES_MIN` samples. What the
        duty is set by and the account charges."""
        if len(self.samples) < SAMPLES_MIN:
            return None
        kept = sorted(self.samples[-SAMPLES:])
        return max(0.0, 1.0 - kept[rank(len(kept)) - 1])

    @property
    def cost(self) -> Optional[float]:
        """The share of the trainer's throughput the audit costs at this duty, at most (estimated: :attr:`bound`
        times the duty)."""
        x = self.bound
        return None if x is None else x * self.duty

    @property
    def charge(self) -> float:
        """The slowdown the account charges a second of the auditor's running: the :attr:`bound`; before
        :data:`SAMPLES_MIN` samples :data:`PRIOR`, or more if a sample so far says more."""
        if self.bound is not None:
            return self.bound
        return max([PRIOR] + [1.0 - s for s in self.samples])

    @property
    def spent(self) -> Optional[float]:
        """The share of the trainer's time the audit has cost it so far this launch (estimated: each second an auditor
        ran while it trained at the :attr:`charge` of that second), or None before any training or sample."""
        if self.trained <= 0.0 or not self.samples:
            return None
        return self.cost_secs / self.trained

    def allows(self, secs: float) -> bool:
        """Whether a run window of ``secs`` keeps the account within the budget by its end: what the audit will have
        cost the trainer (that window at today's :attr:`charge`) at most :data:`TARGET` of the time trained then, plus
        :data:`CREDIT`."""
        return self.cost_secs + secs * self.charge <= TARGET * (self.trained + secs) + CREDIT

    def heard(self, now: float, wall: float, step: int, working: bool) -> None:
        """The trainer reported ``step`` at its ``wall`` time (heard at ``now``); ``working``: between steps (a
        snapshot, a final checkpoint) or not yet stepping: the stretch of the window ends there (the rate leaves
        the work out), the next report begins another."""
        if self.last_step is not None and step > self.last_step[1] and wall > self.last_step[0]:
            self.step_secs = (wall - self.last_step[0]) / (step - self.last_step[1])
        if self.last_step is None or step != self.last_step[1]:
            self.last_step = (wall, step)
        if working:
            if self.window[-1]:
                self.window.append([])
            return
        if self.since is None or now - self.since < SETTLE_SECS:
            return
        last = next((seg[-1] for seg in reversed(self.window) if seg), None)
        if last is not None and (step < last[1] or wall <= last[0]):
            self.spoiled = True  # a restart, a rollback: not the same run of steps
            return
        self.window[-1].append((wall, step))

    def _rate(self, length: float) -> Optional[float]:
        """The trainer's steps a second in the window that ends (``length`` s long), if it is a sample."""
        stretches = [seg for seg in self.window if len(seg) >= 2]
        steps = sum(seg[-1][1] - seg[0][1] for seg in stretches)
        secs = sum(seg[-1][0] - seg[0][0] for seg in stretches)
        if self.spoiled or steps <= 0 or secs < MIN_SPAN * (length - SETTLE_SECS):
            return None
        return steps / secs

    def _reprice(self) -> None:
        """At the first bound: the seconds charged before it (at :data:`PRIOR` or the worst sample then) charged again
        at the bound, lower or higher: they are the windows it was measured on (a first window an auditor started in
        cost the trainer 34-72 % of its steps in 6 of 21 launches measured, lent at :data:`PRIOR`); a higher one holds
        the next windows back until it is paid."""
        x = self.bound
        if x is not None and self.lent[0] > 0.0:
            self.cost_secs += self.lent[0] * x - self.lent[1]
            self.lent = (0.0, 0.0)

    def _begin(self, running: bool, since: Optional[float]) -> None:
        self.running, self.since, self.window, self.spoiled, self.measured = running, since, [[]], False, False

    def tick(self, now: float, free: bool, auditor_live: bool) -> bool:
        """Whether the auditor runs from ``now`` on; ends the window when it is due (its rate a sample). ``free``:
        the trainer is not training or the run is finishing: run, and start measuring afresh after.
        ``auditor_live``: an auditor runs (or is stopped) now; a run window without one throughout is no sample, nor
        a pause in which one started (it ran, forked, until the executor stopped it: the seconds since the last tick
        are charged as run)."""
        started, self.live = auditor_live and not self.live, auditor_live
        if (self.running and not auditor_live) or started:
            self.spoiled = True  # (a pause an auditor started in: it ran from its fork until the executor stopped it)
        if self.last_tick is not None and self.since is not None and not free and now > self.last_tick:
            self.trained += now - self.last_tick  # the account: the time since the last tick, as the cycle had it
            if (self.running or started) and auditor_live:
                self.ran += now - self.last_tick
                self.cost_secs += (now - self.last_tick) * self.charge
                if self.bound is None:
                    self.lent = (self.lent[0] + now - self.last_tick, self.lent[1] + (now - self.last_tick) * self.charge)
        self.last_tick = now
        if free:
            self._begin(True, None)
            self.pause_rate = self.run_rate = None
            return True
        if self.since is None:  # (a cycle begins: with a run window, if the account pays for it)
            self._begin(self.allows(run_secs(self)), now)
            return self.running
        due = run_secs(self) if self.running else pause_secs(self)
        if now - self.since < due:
            return self.running
        if self.running:
            self.run_rate = self._rate(now - self.since)
            self._begin(False, now)
            return False
        if not self.measured:  # the pause's rate: a sample with the run window's before it (once, at its due end)
            rate = self._rate(now - self.since)
            if rate is not None and self.run_rate is not None:
                base = rate if self.pause_rate is None else (rate + self.pause_rate) / 2  # the pauses on both sides
                self.samples = (self.samples + [self.run_rate / base])[-SAMPLES:]
                self._reprice()
                self.duty = min(duty_for(self.bound), UP * self.duty)  # down at once, up by steps
            self.pause_rate, self.run_rate, self.measured = rate, None, True
        if not self.allows(run_secs(self)):
            return False  # (the pause goes on while the account cannot pay for the next run window, at its new charge)
        self._begin(True, now)
        return True


@lru_cache(maxsize=None)
def rank(n: int) -> int:
    """Which of ``n`` samples, lowest first, bounds the median's: the highest ``k`` with at most :data:`MISS`
    chance that fewer than ``k`` of them fall below the median (each does with chance one half, whatever the
    noise), at least 1. Nine samples: the third lowest (a miss chance of 46/512); seven or eight: the second; three to
    six: the lowest."""
    k = 1
    while k < n and sum(comb(n, i) for i in range(k + 1)) <= MISS * 2 ** n:
        k += 1
    return k


def run_secs(dc: DutyCycle) -> float:
    """A run window: :data:`RUN_SECS` (:data:`FREE_RUN_SECS` at a duty near 1), or :data:`WINDOW_STEPS` steps."""
    return max(FREE_RUN_SECS if dc.duty >= FREE_DUTY else RUN_SECS, WINDOW_STEPS * dc.step_secs + SETTLE_SECS)


def pause_secs(dc: DutyCycle) -> float:
    """The pause after a run window: the rest of the duty's cycle, at least :data:`PAUSE_MIN_SECS` or
    :data:`WINDOW_STEPS` steps."""
    return max(PAUSE_MIN_SECS, WINDOW_STEPS * dc.step_secs + SETTLE_SECS, run_secs(dc) * (1.0 - dc.duty) / dc.duty)


def duty_for(slowdown: Optional[float]) -> float:
    """The duty that keeps ``slowdown * duty`` at :data:`TARGET` (between :data:`MIN_DUTY` and 1); the cycle passes
    its :attr:`~DutyCycle.bound`."""
    if slowdown is None:
        return START_DUTY
    if slowdown <= TARGET:
        return 1.0
    return max(MIN_DUTY, min(1.0, TARGET / slowdown))


def heard(dc: DutyCycle, now: float, wall: float, step: int, working: bool) -> None:
    """:meth:`DutyCycle.heard`."""
    dc.heard(now, wall, step, working)


def tick(dc: DutyCycle, now: float, free: bool, auditor_live: bool) -> bool:
    """:meth:`DutyCycle.tick`."""
    return dc.tick(now, free, auditor_live)
