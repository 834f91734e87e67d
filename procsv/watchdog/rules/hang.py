"""The watchdog's hang decision, a pure function of timestamps (no clock of its own).

Runs in the watchdog. The trainer reports progress after every step (throttled to 100 ms); a
trainer that has been silent for longer than its timeout is hung. Before its first step the
longer ``startup_timeout`` applies (import, restore and tf.function tracing happen then); while
the trainer says it is busy on purpose (a snapshot, its final checkpoint) the longer
``busy_timeout`` applies instead, so a trainer stuck in a snapshot copy is still caught. A trainer
that reports, before its first step, that it is reading its input again (``Busy.INPUT``: a resumed
Keras ``fit`` drawing earlier epochs, which may take longer than any fixed start-up allowance) gets
``startup_timeout`` from each such report instead of from its start. A report before the first step
that is not busy (the end of a TF1 Supervisor's start-up checkpoint, taken as its session becomes
ready: ``Progress.stepped`` False) leaves ``startup_timeout`` on, from the start.

:func:`hang_actions` is rule 4 of the decision function (:func:`procsv.watchdog.rules.decide.decide`
composes it): for a hung trainer the stacks of the run's trainers are taken first (:class:`TakeStacks`:
where it hangs, kept in the logdir); once they are back, or ``stacks_secs`` after they were asked for,
it gets SIGTERM, then SIGKILL once its grace (``hang.kill_at``) passed. A step reported meanwhile
ends the judgement (the stacks taken stay, as a record of a stall that passed); nothing else does: the
capture itself wakes the trainer's main thread, which must not read as the activity that ends a stuck verdict.
"""

from __future__ import annotations

import signal

from dataclasses import dataclass
from typing import Optional, Sequence

from procsv.ipc.message_base import Busy
from procsv.watchdog.rules.actions import Action, Cause, Kill, Signal, TakeStacks
from procsv.watchdog.rules.state import PS, SERVER, TRAINER, WORKER, Activity, ChildView, RunView


@dataclass(frozen=True)
class HangLimits:
    """How long a trainer may go without a step: running, starting up, and busy on purpose; how long
    it may be stuck (:func:`stuck_reason`)."""

    hang_timeout: Optional[float]  # None or <= 0: hang detection off
    startup_timeout: Optional[float]
    busy_timeout: Optional[float] = None  # while busy on purpose (None or <= 0: no limit)
    stacks_secs: float = 10.0  # the stacks taken before a hung trainer's SIGTERM are waited for this long (0: none taken)
    stuck_secs: float = 0.0  # --stuck-secs: no step and no activity this long is a hang (0: off; the launch's default 10)


# how little a process does while it is stuck: CPU seconds per second over the window (its idle threads' wake-ups:
# a trainer group's member waiting for a peer in a collective uses ~0.002), and bytes read or written in all (a
# line of a library's warning printed now and then is not work)
IDLE_CPU = 0.01
IDLE_IO = 64 * 1024
# ... and its descendants, in all: one that keeps running beside it (a metrics agent, a TensorBoard it started: ~2%
# of a core) is not a trainer's work; a data loader's worker that computes uses most of a core
IDLE_KIDS_CPU = 0.1
IDLE_KIDS_IO = 1024 * 1024
SAMPLE_GAP = 3.0  # samples further apart than this (the watchdog's loop was held up) judge nothing


LEARN_FACTOR = 2.0  # a quiet wait that ended in a step, this many times over, is the stuck limit from then on
# a stuck verdict doubles its slot's limit up to this many times --stuck-secs (10, 20, 40, 80 s): a quiet wait that
# ends within it costs at most three restarts; a deadlock that recurs past its first step is found in 80 s each time
# (before the cap, the limit doubled up to --hang-timeout: ~1 h of verdicts to give up at the default 10 restarts)
JUDGED_CAP = 8.0


def quiet_span(now: float, samples: Sequence[Activity], peers: Sequence[Sequence[Activity]] = ()) -> float:
    """How long the process (and every one of ``peers``) has been as quiet as a stuck one up to ``now``:
    the span of the newest run of looks, each quiet since the one before (0.0 if the newest is not)."""
    span = _quiet_tail(now, samples)
    for peer in peers:
        span = min(span, _quiet_tail(now, peer))
    return span


def _quiet_tail(now: float, samples: Sequence[Activity]) -> float:
    if not samples or now - samples[-1].at > SAMPLE_GAP:
        return 0.0
    start = len(samples) - 1
    while start > 0 and samples[start].at - samples[start - 1].at <= SAMPLE_GAP and \
            samples[start].woke == samples[start - 1].woke and samples[start].state not in ("D", "T", "t") and \
            _idle(samples[start - 1:start + 1]):
        start -= 1
    return samples[-1].at - samples[start].at


def looks_kept(view: RunView, limits: HangLimits) -> float:
    """How long the looks at a process are kept for :func:`stuck_reason`: the run's longest stuck limit
    (--stuck-secs, or twice a slot's longest quiet wait that ended in a step: its window, and its peers'
    over the same span, must be covered), no longer than --hang-timeout (which finds the hang first),
    and two gaps. (Before, --stuck-secs alone: a learned limit past it was never covered, and a slot
    that had waited 9 s once was never judged stuck again.)"""
    learned = max((max(c.hang.quiet_max, c.hang.judged_max) for c in view.children.values()), default=0.0)
    span = max(limits.stuck_secs, LEARN_FACTOR * learned)
    if limits.hang_timeout is not None and limits.hang_timeout > 0:
        span = min(span, max(limits.stuck_secs, limits.hang_timeout))
    return span + 2 * SAMPLE_GAP


def stuck_peers(view: RunView, t: ChildView) -> list[list[Activity]]:
    """The looks at ``t``'s peers for the stuck rule (:func:`peers_of`)."""
    return [c.hang.samples for c in peers_of(view, t)]


def peers_of(view: RunView, t: ChildView) -> list[ChildView]:
    """``t``'s peers for the stuck rule: its group's members (the same attempt); with ``--ps``, every
    task of the job (each restarts alone: any attempt), the parameter servers too (a worker waits on
    them while they apply another worker's update)."""
    return [c for c in view.children.values() if c is not t and c.live and (
        c.role in (TRAINER, WORKER, PS, SERVER) if view.tasks_alone else c.role in (TRAINER, WORKER) and c.attempt == t.attempt)]


def inherit(child: ChildView, before: Optional[ChildView]) -> None:
    """A slot's next attempt (spawned, or a standby promoted into it) keeps what the stuck rule learned of the
    slot's quiet waits: those that ended in a step, and those judged stuck."""
    if before is not None:
        child.hang.quiet_max, child.hang.judged_max = before.hang.quiet_max, before.hang.judged_max


def judged_together(view: RunView, t: ChildView) -> list[ChildView]:
    """Whose stuck limit a stuck verdict on ``t`` raises: ``t``, and its group's members (the same
    attempt: they were as quiet, and each of them could have been judged first); with ``--ps``, ``t``
    alone (each task restarts alone)."""
    return [t] + ([] if view.tasks_alone else [c for c in view.children.values() if c is not t and
                                                c.role in (TRAINER, WORKER) and c.attempt == t.attempt])


def stuck_reason(now: float, samples: Sequence[Activity], last_progress: Optional[float], secs: float,
                 peers: Sequence[Sequence[Activity]] = (), learned: float = 0.0, judged: float = 0.0) -> Optional[str]:
    """A one-line reason if the trainer is stuck at ``now``, else None: no step for ``secs`` and,
    through samples that cover those ``secs`` (none more than :data:`SAMPLE_GAP` apart), it used
    almost no CPU, read and wrote almost nothing, and its main thread never ran; and every one of its
    group's ``peers`` (their samples over the same span) did as little: a member that waits in a
    collective while a peer computes (an evaluation, a slow step) is waiting, not stuck. A process in
    uninterruptible I/O (``D``: storage, which may be slow) or stopped (``T``, ``t``: SIGSTOP, a
    debugger) is left to ``--hang-timeout``. Slow work in the trainer is never stuck: it uses CPU, or reads or
    writes, or its main thread runs. ``learned``: the longest such quiet wait of this trainer that
    ended in a step (a remote call, a sleep: :func:`quiet_span`): the limit is :data:`LEARN_FACTOR`
    times it, where that is longer than ``secs``. ``judged``: the longest limit this slot was judged stuck
    at before (a verdict may be wrong: a wait that would have ended, on a remote service, a file
    system that is slow today), likewise: the same wait in the next attempt is given twice as long,
    so a wait that ends is killed two or three times, each time later, never at every attempt; at most
    :data:`JUDGED_CAP` times ``secs`` (a deadlock that recurs is not given longer and longer for good)."""
    if secs <= 0 or last_progress is None:
        return None
    limit = stuck_limit(secs, learned, judged)
    if limit <= secs:
        rule = f"--stuck-secs {secs:g}"
    elif limit > LEARN_FACTOR * learned:
        rule = f"{LEARN_FACTOR:g} x its last stuck limit, {judged:.1f} s" if LEARN_FACTOR * judged <= JUDGED_CAP * secs \
            else f"{JUDGED_CAP:g} x --stuck-secs, the most a stuck verdict raises it to"
    else:
        rule = f"{LEARN_FACTOR:g} x its longest quiet wait that ended in a step, {learned:.1f} s"
    secs = limit
    if now - last_progress < secs:
        return None
    since = max(last_progress, now - secs)
    window = _covering(samples, since, now)
    if window is None:
        return None
    first, last = window[0], window[-1]
    if any(a.state in ("D", "T", "t") for a in window) or last.woke != first.woke or not _idle(window):
        return None
    for peer in peers:
        covered = _covering(peer, since, now)
        if covered is None or not _idle(covered) or any(a.state in ("D", "T", "t") for a in covered):
            return None
    where = f" in {last.syscall}" if last.syscall else ""
    return (f"stuck for {now - last_progress:.1f} s ({rule}): no step, {last.cpu - first.cpu:.2f} s "
            f"of CPU, {last.io - first.io} bytes read or written, its main thread asleep{where}"
            + (" (its group's members too)" if peers else ""))


def stuck_limit(secs: float, learned: float, judged: float) -> float:
    """The stuck limit of a trainer (:func:`stuck_reason`): ``secs`` (--stuck-secs), or twice its longest quiet
    wait that ended in a step (``learned``), or twice the limit it was last judged stuck at (``judged``), no more
    than :data:`JUDGED_CAP` times ``secs``: whichever is longest."""
    return max(secs, LEARN_FACTOR * learned, min(LEARN_FACTOR * judged, JUDGED_CAP * secs))


def _covering(samples: Sequence[Activity], since: float, now: float) -> Optional[list[Activity]]:
    """The samples from the newest one at or before ``since`` to the newest, if they cover it to ``now``."""
    start = next((i for i in range(len(samples) - 1, -1, -1) if samples[i].at <= since), None)
    if start is None:
        return None
    window = list(samples[start:])
    if now - window[-1].at > SAMPLE_GAP or any(b.at - a.at > SAMPLE_GAP for a, b in zip(window, window[1:])):
        return None
    return window


def _idle(window: Sequence[Activity]) -> bool:
    """Whether the process, and its descendants (a data loader's workers: read at every look but the
    first of a quiet window), used almost no CPU and did almost no I/O through ``window``."""
    first, last = window[0], window[-1]
    if last.cpu - first.cpu > IDLE_CPU * max(last.at - first.at, 1.0) or last.io - first.io > IDLE_IO:
        return False
    if any(a.kids_cpu < 0 for a in window[1:]):
        return False  # (its descendants were not looked at: not known to be quiet)
    # (a descendant that ended takes its counts away: increases only, between two looks at them)
    pairs = [(a, b) for a, b in zip(window, window[1:]) if a.kids_cpu >= 0]
    return sum(max(0.0, b.kids_cpu - a.kids_cpu) for a, b in pairs) <= IDLE_KIDS_CPU * max(last.at - first.at, 1.0) \
        and sum(max(0, b.kids_io - a.kids_io) for a, b in pairs) <= IDLE_KIDS_IO


def hang_reason(now: float, *, started: float, last_progress: Optional[float], busy: str, stepped: bool,
                limits: HangLimits) -> Optional[str]:
    """A one-line reason if the trainer is hung at ``now``, else None. ``busy`` names what the
    trainer said it is busy with since ``last_progress`` ("" if it is not); ``stepped``: its first
    step was seen (a report before it, the start-up checkpoint's snapshot, leaves the start-up limit on)."""
    if last_progress is None or (not busy and not stepped):
        limit, secs, why = limits.startup_timeout, now - started, "no first step within --startup-timeout {limit:g} s of its start"
    elif busy == Busy.INPUT:  # still before the first step: its limit, per report
        limit, secs, why = limits.startup_timeout, now - last_progress, \
            "no progress putting back fit's input for {secs:.1f} s (--startup-timeout {limit:g} s)"
    elif busy == Busy.WAITING:  # the program's own wait (Supervisor.waiting): the user's bound, from its start
        limit, secs, why = limits.hang_timeout, now - last_progress, \
            "waiting in the program's sv.waiting() for {secs:.1f} s with no step (--hang-timeout {limit:g} s)"
    elif busy:
        limit, secs, why = limits.busy_timeout, now - last_progress, "busy with {busy} for {secs:.1f} s (limit {limit:g} s)"
    else:
        limit, secs, why = limits.hang_timeout, now - last_progress, \
            "no step completed for {secs:.1f} s (--hang-timeout {limit:g} s)"
    return why.format(busy=busy, secs=secs, limit=limit) if limit and limit > 0 and secs > limit else None


def hang_actions(view: RunView, t: ChildView, now: float, limits: HangLimits) -> list[Action]:
    """Rule 4: a trainer that makes no progress."""
    if not t.live or t.ending_at is not None:
        return []  # (an attempt whose end came in is observed as ended within a bound: not hung)
    if t.hang.kill_at is not None:  # (a stop that came since does not put it off to the stop's grace)
        return [Kill(t.slot, t.attempt, Cause.HANG)] if now >= t.hang.kill_at else []
    if view.stop_signal is not None:
        return []
    if t.hang.cause:
        return []
    # judged at this stall, its stacks asked for: the judgement holds until a step (the capture's own pause
    # of the process wakes its main thread: the stuck rule would no longer see it asleep)
    reason = t.hang.reason if stacks_asked(t) and t.hang.reason else \
        hang_reason(now, started=t.started, last_progress=t.last_progress_at, busy=t.busy,
                    stepped=t.first_step_at is not None, limits=limits)
    stuck_for = t.hang.stuck_for if stacks_asked(t) and t.hang.reason else 0.0
    since = stuck_clock(view, t)
    # (a peer busy on purpose, a snapshot or the program's marked wait: its group waits for it, not stuck)
    if reason is None and not t.busy and since is not None and not any(c.busy for c in peers_of(view, t)):
        # with --ps, a task no other worker waits for: stuck while quiet as the others complete steps (the
        # parameter servers serve them: it is not waiting on a busy one); else only while every task is as quiet
        others_step = view.tasks_alone and any(
            c is not t and c.live and c.role in (TRAINER, WORKER) and c.last_work_at is not None
            and c.last_work_at > now - limits.stuck_secs for c in view.children.values())
        peers = [] if others_step else stuck_peers(view, t)
        reason = stuck_reason(now, t.hang.samples, since, limits.stuck_secs, peers, t.hang.quiet_max,
                              t.hang.judged_max)
        if reason is not None:  # (the quiet wait: not a computation before it)
            stuck_for = stuck_limit(limits.stuck_secs, t.hang.quiet_max, t.hang.judged_max)  # (the limit it was judged at)
    if reason is None:
        return []
    asked = t.hang.stacks_asked_at if stacks_asked(t) else None
    if limits.stacks_secs > 0 and asked is None:
        return [TakeStacks(t.slot, t.attempt, reason, stuck_for)]
    if asked is not None and not t.hang.stacks_in and now < asked + limits.stacks_secs:
        return []  # the stacks are being taken: the signal would move them
    blamed = next((c for c in view.children.values() if t.hang.stacks_in and c.slot == t.hang.culprit != t.slot
                   and c.attempt == t.attempt and c.live), None)
    if blamed is not None:  # a group's member its peers wait for (the stacks say): it is the one hung
        return [Signal(blamed.slot, blamed.attempt, signal.SIGTERM, Cause.HANG,
                       f"{reason} at {t.slot}, which waits for it in TensorFlow while it does not", stuck_for)]
    return [Signal(t.slot, t.attempt, signal.SIGTERM, Cause.HANG, reason, stuck_for)]


def stuck_clock(view: RunView, t: ChildView) -> Optional[float]:
    """Since when :func:`stuck_reason` may judge ``t`` (None: not yet): its last progress, past its first
    step; before it, in an attempt that restored a checkpoint of a step past 0 (a restart, a relaunch: it
    runs steps again), from its restore's end (its TrainerReady), and every member's of its group,
    except with ``--ps``. A hang recurring at the same step after each restore is in that first step, since the
    restore is the step before it (an in-memory snapshot of the step before the hang, persisted at its end):
    before, every such attempt was left to ``--startup-timeout`` (1800 s). Before its restore's end, and at a
    fresh start, ``--startup-timeout`` alone (import, the restore's wait on the checkpoint service, tracing)."""
    if t.first_step_at is not None:
        return t.last_progress_at
    if view.tasks_alone or t.ready_at is None or t.restored_step <= 0:
        return None
    restored = [c.ready_at for c in view.children.values()
                if c is not t and c.live and c.role in (TRAINER, WORKER) and c.attempt == t.attempt]
    if any(at is None for at in restored):
        return None  # (a member still restoring waits on the checkpoint service, quiet; its peers wait for it)
    return max([t.ready_at, t.last_progress_at or t.ready_at] + [at for at in restored if at is not None])


def stacks_asked(t: ChildView) -> bool:
    """Whether ``t``'s stacks were asked for at this stall (not at an earlier one that passed: a step
    reported since)."""
    asked = t.hang.stacks_asked_at
    return asked is not None and (t.last_progress_at is None or t.last_progress_at <= asked)
