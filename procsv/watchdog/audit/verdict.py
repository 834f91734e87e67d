"""The audit's decisions (issue 71): which committed intervals are replayed, and what the replays mean.

Runs in the watchdog. Pure: no clock, no process, no file. The watchdog sees every commit
(:class:`~procsv.ipc.messages.SaveResult`); two consecutive commits S1 < S2 of a single trainer are an
*interval*, which an auditor (a trainer process of its own, forked from the zygote at ``SCHED_IDLE``)
replays from checkpoint S1 to step S2 and compares, tensor by tensor, with checkpoint S2 read back from
disk (:class:`~procsv.ipc.messages.AuditResult`). :class:`AuditBook` holds what the audit knows;
:func:`committed` says which interval to replay next, :func:`replayed` what a replay means. The
executor (:mod:`procsv.watchdog.audit.auditors`) forks the auditors and performs the verdicts.

The verdicts, for an interval whose first replay differs from the trainer's checkpoint: a second
replay, by a fresh auditor. Both replays agree with each other and not with the trainer: the trainer's
machine computed wrongly (:attr:`Verdict.TRAINER`): the trainer is rolled back to S1 (the newest audited
state) and trains on. The replays disagree: the auditor's machine (or the program) is at fault
(:attr:`Verdict.AUDITOR`): nothing is rolled back. The first interval of a launch is replayed twice
whatever the first replay says: two replays of the same steps that differ mean the program's steps are
not deterministic (:attr:`Verdict.NONDETERMINISTIC`), and the audit switches itself off.

Replays that agree with each other and not with the trainer are believed of the trainer's machine only
once the program's steps are known to replay from a checkpoint as its trainer ran them: a program whose
state is not all in its checkpoint (a Keras ``Dropout`` layer under ``keras.utils.set_random_seed``: its
seed generator restarts in every fresh process) replays the same way twice and never the trainer's way.
Until an interval the trainer ran on from before its start (not :attr:`Interval.resumed`: an interval from the
step its trainer began at is resumed, a graph program's checkpoint at its session's start included) has matched
(:attr:`Exactness.exact`), such a result is a *candidate*: the next such interval decides. It matches: the
program replays exactly and the candidate was the trainer's fault (a wrong bit stays in the state, so the
interval after it replays as the trainer ran it), rolled back to the candidate's start; it also differs:
the program's replay from a checkpoint is not its trainer's, and the audit switches off
(:attr:`Verdict.NONDETERMINISTIC`). A trainer that ends with a candidate undecided gets no verdict
(:meth:`AuditBook.ended`).

A group (``--nproc N``, on one host or over hosts: the replay is a group of as many auditors, on node 0) breaks that rule's premise: its checkpoint is
its chief's, and a wrong bit in a worker's copy of the weights stays in that worker, outside every checkpoint, so every
interval after it differs too (measured: a bit flipped in worker 1 in the first interval audited, the next interval
differed as well, and the audit switched itself off, the fault taken for a program that does not replay). So in a
group the second interval running that differs rolls the group back once to the candidate's start, on trial
(:attr:`Verdict.TRIAL`: every member restarts from the chief's checkpoint, consistent again), no host blamed; the next
interval the group ran on from before its start decides: it matches, the candidate was the group's fault
(:attr:`Verdict.TRAINER`, its rollback already made: :attr:`Judged.made`); it differs, the program does not replay
(:attr:`Verdict.NONDETERMINISTIC`, off). A program that does not replay pays that one rollback, once a launch.

An auditor that dies before its answer (SIGKILLed, running or stopped by its duty cycle; killed by the OOM killer;
crashed) says nothing of its interval: :func:`died` has it replayed again by a fresh auditor, the answers it already
had kept, at most :data:`RETRIES` times; then it is said once as not audited (:attr:`Verdict.UNAUDITED`, with the
deaths' reasons, its steps counted in :attr:`AuditBook.unaudited_steps`; the deaths: :class:`Deaths`). Each fresh auditor after a death waits
:data:`RETRY_SECS`, doubled with every death running (on any interval; an answer ends the run of deaths), at most
:data:`RETRY_MAX_SECS`: an auditor that dies on every interval is no restart storm. A replay that answered with an
error (a checkpoint gone, the program ended short) is not replayed again: another would say the same.

A rollback leaves the checkpoints the wrong timeline committed after S1 (S2 and every later one: each holds a
state derived from the wrong one). Where the new timeline commits the same steps again it rewrites them in
place; time-based saves (``save_model_secs``) land on other steps, and the wrong ones would stay, listed in the
``checkpoint`` state file beside the new ones and retiring them (retention keeps the highest steps). So the
book notes every commit's step and attempt (:func:`seen`), and a rollback says which of them to quarantine
(:func:`wrong_timeline`: every step after S1 committed by the rolled-back attempt or an earlier one), as does a
late commit of such an attempt after it (:func:`seen`); the checkpoint service moves them
(:class:`~procsv.ipc.messages.AuditQuarantine`).

A launch's end leaves intervals unjudged: waiting, being replayed, a candidate undecided, and a trainer verdict the end
rolled nothing back for (a stop, a preemption, the watchdog killed). Their checkpoints hold what the next launch resumes
from, so a fault in them would pass for good: :func:`~procsv.watchdog.audit.carry.carried` says what the book leaves the next launch (the watchdog
persists it at every commit and verdict, ``<logdir>/.procsv/audit.json``), and :func:`~procsv.watchdog.audit.carry.carry_in` puts it in the next
launch's book: those intervals are replayed first (their checkpoints held), the interval from the newest commit to the
new trainer's first is one too, and a trainer verdict on one rolls the new trainer back to its start and quarantines
every checkpoint after it, the earlier launch's included.

One concern: the audit's decisions, from the commits it hears to what a verdict means and leaves behind.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, replace
from typing import Optional

from procsv.ipc.messages import AuditQuarantine
from procsv.watchdog.rules.actions import AuditRollback

END_WAIT_SECS = 300.0  # --audit every: how long a trainer that finished waits for its last intervals' verdicts
SAMPLE_EVERY = 16  # --audit sampled: one committed interval in 16 (after the launch's first two, always replayed)
UNSUPPORTED = "not audited in this slice"  # (procsv.trainer.audit.replay.UNSUPPORTED: a kind of program, not an interval)
QUEUE_MAX = 3  # intervals waiting for an auditor; past it, two are merged (--audit every) or the oldest dropped
RECENT = 64  # the verdicts kept (their counts are kept whole)
RETRIES = 2  # a dead auditor's interval is replayed again by a fresh auditor at most this many times (then: unaudited)
RETRY_SECS = 1.0  # the wait before a fresh auditor after one died; doubled with every death running (any interval)
RETRY_MAX_SECS = 60.0  # ... at most this
MERGE_MAX = 8  # a merged interval is at most this many times the longest commit interval waiting (past it: the oldest dropped)


class AuditMode(str, enum.Enum):
    """``procsv launch --audit``."""

    OFF = "off"
    SAMPLED = "sampled"
    EVERY = "every"


class Verdict(str, enum.Enum):
    """What a finished audit of an interval says."""

    MATCH = "match"  # the replay is the trainer's checkpoint, bit for bit: the interval is audited
    TRAINER = "trainer"  # two replays agree with each other, not with the trainer: its machine computed wrongly
    AUDITOR = "auditor"  # two replays disagree, one of them with the trainer: the auditor's machine (or the program)
    NONDETERMINISTIC = "nondeterministic"  # the first interval's two replays differ: the audit switches off
    UNDECIDED = "undecided"  # two replays agree, not with the trainer, before the program's replay is known exact
    UNAUDITED = "unaudited"  # the replay could not be made (a checkpoint gone, the replay ended short): no verdict
    TRIAL = "trial"  # a group's two intervals running differ (replays agree): rolled back once to tell a member's
    # fault (kept outside the chief's checkpoint) from a program that does not replay; no host blamed yet


@dataclass(frozen=True)
class Interval:
    """Two consecutive committed checkpoints: the steps ``start`` < ``end`` and their paths."""

    start: int
    end: int
    start_path: str
    end_path: str
    resumed: bool = False  # the trainer that committed ``end`` began at ``start`` (a restore, a restart, or a launch's
    # first checkpoint taken as its session started: a graph program's, a MonitoredTrainingSession's): its own start
    # is a fresh process's, as the replay's is
    session_start: bool = False  # ``start`` was a session's final commit (a program's next fit, a retry loop's
    # next session begins there): an auditor's session cannot run on across it, so it is never merged into one before
    part: int = 0  # a merged interval's longest commit interval (0: not merged, its own ``steps``)

    @property
    def longest(self) -> int:
        """The longest of the commit intervals (two consecutive commits) this interval is made of."""
        return self.part or self.steps

    @property
    def steps(self) -> int:
        return self.end - self.start


@dataclass(frozen=True)
class Replay:
    """One auditor's answer (an :class:`~procsv.ipc.messages.AuditResult`, as the verdict reads it):
    the tensors that differ from the trainer's checkpoint ``end``, a digest of its whole replayed state,
    its host, why it could not replay (empty: it did), and the auditor's attempt (0: not said)."""

    differ: tuple[str, ...]
    digest: str
    host: str
    error: str = ""
    auditor: int = 0


@dataclass(frozen=True)
class Judged:
    """A verdict on ``interval`` (``replays``: the answers it rests on) and, for :attr:`Verdict.TRAINER`, the
    step whose newest state before it the trainer restores (``rollback_before``: the interval's ``start`` + 1)."""

    verdict: Verdict
    interval: Interval
    replays: tuple[Replay, ...]
    line: str
    made: bool = False  # a trainer verdict whose rollback its trial made already (a group's): nothing rolled back again

    @property
    def rollback_before(self) -> Optional[int]:
        rolls = self.verdict == Verdict.TRIAL or (self.verdict == Verdict.TRAINER and not self.made)
        return self.interval.start + 1 if rolls else None


@dataclass(frozen=True)
class Newest:
    """The newest commit seen: its step and path, the trainer attempt that committed it (None: unknown, or a
    rollback's start), and whether it was a session's final commit."""

    step: int
    path: str
    attempt: Optional[int] = None
    final: bool = False


@dataclass
class Deaths:
    """The auditors that died before their answer: the interval being replayed's (their replays, :attr:`lost`), the
    deaths running (since the last answer, on any interval: the wait before the next auditor), when the next may
    start, and the launch's count."""

    lost: list[Replay] = field(default_factory=list)
    running: int = 0
    retry_at: Optional[float] = None  # no auditor before this time (None: no wait)
    total: int = 0

    def died(self, replay: Replay, now: float) -> None:
        """An auditor died at ``now``: the next waits :data:`RETRY_SECS`, doubled with every death running."""
        self.lost.append(replay)
        self.total += 1
        self.running += 1
        self.retry_at = now + min(RETRY_MAX_SECS, RETRY_SECS * 2 ** (self.running - 1))

    def answered(self) -> None:
        """An auditor answered: the auditors do not die on every interval; no wait."""
        self.running, self.retry_at = 0, None

    def forget(self) -> None:
        """Another interval is replayed (or this one judged): its deaths start at none."""
        self.lost = []


@dataclass
class Exactness:
    """What the audit learned of the program's replay from a checkpoint, and the verdicts that wait on it."""

    probed: bool = False  # the first interval was replayed twice (the program's determinism)
    exact: bool = False  # an interval not resumed matched: the program's steps replay from a checkpoint exactly
    candidate: Optional[Judged] = None  # replays agree, not with the trainer, before :attr:`exact`: undecided (its
    # interval and replays: its verdict, one interval later, rests on them)
    trial: Optional[Judged] = None  # a group's candidate rolled back on trial (:attr:`Verdict.TRIAL`), undecided: the
    # next interval the group ran on from before its start decides
    program: str = ""  # what the program is (TARGET, its arguments, its source's digest): these facts are its; an
    # earlier launch's intervals are carried in only for the same (:func:`carry_in`)
    platform: str = ""  # what it runs on (TensorFlow's version, the CPU's model, flags and count: config.platform_
    # fingerprint): an earlier launch's intervals are carried in only for the same too

    def probe(self) -> None:
        """An interval got its verdict's replays: the first interval's second replay (its determinism) was made."""
        self.probed = True

    def matched(self, resumed: bool) -> None:
        """An interval's replays matched the trainer: not :attr:`Interval.resumed`, the program replays exactly."""
        self.exact = self.exact or not resumed

    def proven(self) -> None:
        """An interval after a candidate (or a trial) matched: the program replays exactly."""
        self.exact = True

    def waits(self, undecided: Optional[Judged] = None, trial: Optional[Judged] = None) -> None:
        """What waits for the next interval now: a candidate, a trial (each None: nothing)."""
        self.candidate, self.trial = undecided, trial


@dataclass
class AuditBook:
    """What the audit of this launch knows: the mode, the last commit seen, the intervals waiting, the one
    being replayed and its answers so far, the steps audited and committed since the audit began, and why
    it switched off (empty: it did not)."""

    mode: AuditMode = AuditMode.OFF
    # the hosts a group's audit spans (its chief's checkpoints; a member's wrong state can stay outside them): 1, a group
    # on one host; more, a group over hosts (a verdict names the group, no member told); 0, a single trainer's audit
    group: int = 0
    last: Optional[Newest] = None  # the newest commit seen
    seen: int = 0  # intervals seen
    queue: list[Interval] = field(default_factory=list)
    current: Optional[Interval] = None
    answers: list[Replay] = field(default_factory=list)
    audited_steps: int = 0
    covered_steps: int = 0  # the steps of every interval seen (the denominator of the fraction audited)
    dropped: list[tuple[int, int]] = field(default_factory=list)  # intervals dropped unreplayed, not yet said
    dropped_steps: int = 0  # the steps of every interval dropped unreplayed (--audit every: a hole)
    off: str = ""
    verdicts: list[Judged] = field(default_factory=list)  # the newest RECENT (a month of intervals is not kept)
    counts: dict[str, int] = field(default_factory=dict)  # every verdict of the launch, by kind
    anchor: Optional[int] = None  # where a rollback goes: the newest audited step (a trainer verdict's start)
    known: Exactness = field(default_factory=Exactness)  # what the replays told of the program's steps
    deaths: Deaths = field(default_factory=Deaths)  # the auditors dead before their answer
    unaudited_steps: int = 0  # the steps of the intervals judged :attr:`Verdict.UNAUDITED` (no replay could be made)
    commits: dict[int, int] = field(default_factory=dict)  # step -> the attempt of its newest commit seen (0: not said)
    rollbacks: list[AuditQuarantine] = field(default_factory=list)  # each rollback's quarantine (its steps: at the time)

    def oldest_start(self) -> Optional[int]:
        """The oldest step a rollback could still go to: the start of an interval waiting, being replayed or
        undecided, else the newest commit's (where the next interval starts); None: no commit yet."""
        undecided = self.known.candidate.interval if self.known.candidate is not None else None
        starts = [i.start for i in (*self.queue, self.current, undecided) if i is not None]
        return min(starts + ([self.last.step] if self.last is not None else [])) if starts or self.last else None

    @property
    def fraction(self) -> float:
        """The fraction of the committed steps audited (0 before any interval)."""
        return self.audited_steps / self.covered_steps if self.covered_steps else 0.0

    def commit(self, step: int, path: Optional[str], eligible: bool, attempt: int = 0,
               began: Optional[int] = None, final: bool = False) -> None:
        """A commit of ``step`` at ``path`` (not an ``again``) by trainer ``attempt`` (0: unknown), which began at step
        ``began`` (its restore's or its initialization's; None: unknown). ``eligible``: the interval it closes was
        trained by one trainer on its own, exactly (no rollback in force, no skipped step in it, not a group): else
        it is not replayed, and the next starts at this commit. An interval from the step its trainer began at is
        :attr:`Interval.resumed` whoever committed its start (a checkpoint at the session's start: that trainer's
        state at ``start`` was a fresh process's too)."""
        if path is None:
            return
        last, self.last = self.last, Newest(step, path, attempt or None, final)  # (``final``: a session's last commit)
        if self.mode == AuditMode.OFF or self.off or last is None or step <= last.step or not eligible:
            return
        fresh = last.attempt is None or last.attempt != attempt or (began is not None and last.step <= began)
        interval = Interval(last.step, step, last.path, path, resumed=fresh, session_start=last.final)
        index, self.seen = self.seen, self.seen + 1
        self.covered_steps += interval.steps
        undecided = self.known.candidate is not None or self.known.trial is not None  # (the next interval decides)
        if sampled(index, self.mode) or (undecided and not interval.resumed):
            queued = [*self.queue, interval]
            self.queue = waiting(queued, self.mode)
            gone = [i for i in queued if not any(j.start <= i.start and i.end <= j.end for j in self.queue)]
            self.dropped.extend((i.start, i.end) for i in gone)  # (a hole: said, counted in the status)
            self.dropped_steps += sum(i.steps for i in gone)

    def session_ended(self, step: int) -> None:
        """A session's final commit of ``step`` was committed before (an ``again``: a Keras fit's end after its
        last epoch's save): if it is the newest commit, the next interval begins a session all the same."""
        if self.last is not None and self.last.step == step:
            self.last = replace(self.last, final=True)

    def rolled_back(self, judged: Judged) -> None:
        """The trainer was rolled back to ``judged``'s start: the commits after it are superseded; the intervals
        waiting are dropped and the next interval starts there (the restarted trainer restores exactly that
        checkpoint, which the audit holds: its steps trained again are audited too)."""
        self.queue = []  # (the restarted trainer begins there: its next interval is resumed)
        self.known.waits(trial=self.known.trial)
        self.last = Newest(judged.interval.start, judged.interval.start_path)

    def next_replay(self, auditor_running: bool, now: Optional[float] = None) -> Optional[Interval]:
        """The interval an auditor should replay at ``now`` (None: one runs, or nothing waits, or the audit is off, or
        an auditor died and the next waits until :attr:`Deaths.retry_at`; ``now`` None: no such wait applies)."""
        if auditor_running or self.off or self.mode == AuditMode.OFF:
            return None
        if self.deaths.retry_at is not None and now is not None and now < self.deaths.retry_at:
            return None
        if self.current is None:
            if not self.queue:
                return None
            self.current, self.queue, self.answers = self.queue[0], self.queue[1:], []
            self.deaths.forget()
        return self.current

    def died(self, replay: Replay, now: float, final: bool = False) -> Optional[Judged]:
        """The auditor of :attr:`current` ended at ``now`` without an answer (``replay``: its ``error`` says how): None,
        the interval is replayed again by a fresh auditor (:meth:`next_replay`, after the wait); or, after
        :data:`RETRIES` such deaths on it (or at once if ``final``: no auditor can follow, the run is finishing), its
        verdict: not audited, with the deaths' reasons."""
        interval = self.current
        if interval is None:
            return None
        self.deaths.died(replay, now)
        lost = self.deaths.lost
        if not final and len(lost) <= RETRIES:
            return None
        why = "; ".join(dict.fromkeys(r.error for r in lost))
        judged = self._close(Judged(Verdict.UNAUDITED, interval, (*self.answers, *lost),
                                    f"procsv: audit of steps {interval.start}-{interval.end}: no verdict "
                                    f"({len(lost)} auditor{'s' if len(lost) > 1 else ''} died before their answer: {why})"
                                    + ("; left to the next launch with --audit, which replays it first" if final else "")))
        if final:  # (the run's end killed it: its interval waits for the next launch, :func:`carried`)
            self.queue.insert(0, interval)
        return judged

    def replayed(self, replay: Replay) -> Optional[Judged]:
        """An auditor's answer on :attr:`AuditBook.current`: a verdict, or None when a second replay is due
        (:func:`next_replay` then returns the same interval again)."""
        interval = self.current
        if interval is None:
            return None
        self.deaths.answered()
        answers = self.answers = [*self.answers, replay]
        if replay.error and UNSUPPORTED in replay.error:  # every interval would say it again: once, and off
            self.off = f"{replay.error}; audit off for this launch"
            return self._close(Judged(Verdict.UNAUDITED, interval, tuple(answers), f"procsv: audit: {self.off}"))
        if replay.error:
            return self._close(Judged(Verdict.UNAUDITED, interval, tuple(answers),
                                       f"procsv: audit of steps {interval.start}-{interval.end}: no verdict ({replay.error})"))
        first = answers[0]
        if len(answers) == 1 and (first.differ or not self.known.probed):
            return None  # a second replay: a mismatch is never believed of one auditor; the first interval, always
        self.known.probe()
        span = f"steps {interval.start}-{interval.end}"
        candidate, trial = self.known.candidate, self.known.trial
        if len(answers) == 1 or (first.digest == replay.digest and not replay.differ):
            if candidate is not None and not interval.resumed:  # the program replays exactly: the candidate was the trainer's
                replays = candidate.replays  # (the verdict is the candidate's: its interval, its replays)
                self.known.proven()
                self.known.waits()
                return self._trainer(candidate.interval, replays, replays[-1].differ if replays else (),
                                     f"; {span} replayed as it ran, so the program's steps replay exactly")
            if trial is not None and not interval.resumed:  # the trial told: the group computed the candidate wrongly
                self.known.proven()
                self.known.waits()
                self.audited_steps += interval.steps  # (this interval, of the new timeline, matched: audited)
                self.anchor = interval.end
                self._keep(Judged(Verdict.MATCH, interval, tuple(answers), ""))
                return self._trainer(trial.interval, trial.replays, trial.replays[-1].differ if trial.replays else (),
                                     f"; after the trial's rollback {span} replayed as the group ran it, so the "
                                     "program's steps replay exactly", made=True)
            self.known.matched(interval.resumed)
            self.audited_steps += interval.steps
            self.anchor = interval.end
            return self._close(Judged(Verdict.MATCH, interval, tuple(answers), ""))
        if first.digest == replay.digest:
            if interval.resumed or self.known.exact:
                return self._trainer(interval, tuple(answers), replay.differ, "")
            if trial is not None:  # the group rolled back on trial and still differs: the program does not replay
                self.known.waits()
                self.off = (f"two replays agree with each other and not with the trainer group in steps "
                            f"{trial.interval.start}-{trial.interval.end} and again in {span}, after the group was "
                            "rolled back on trial: the program's steps do not replay from a checkpoint as its group ran "
                            "them (state no checkpoint holds); audit off for this launch")
                return self._close(Judged(Verdict.NONDETERMINISTIC, interval, tuple(answers), f"procsv: audit: {self.off}"))
            if candidate is None:  # undecided until the next interval the trainer ran on (see the module's docstring)
                undecided = Judged(Verdict.UNDECIDED, interval, tuple(answers),
                                   f"procsv: audit: two replays of {span} agree with each other, not with the "
                                   f"trainer's checkpoint: the next interval tells the trainer's fault from a "
                                   f"program whose steps do not replay from a checkpoint; nothing rolled back yet")
                self.known.waits(undecided)
                return self._close(undecided)
            if self.group:  # a member's wrong state stays outside the chief's checkpoints: tell by one rollback
                self.anchor = candidate.interval.start  # (kept until the rolled-back group restored it)
                tried = Judged(Verdict.TRIAL, candidate.interval, candidate.replays,
                               f"procsv: audit: two replays agree with each other and not with the trainer group in "
                               f"two intervals running (steps {candidate.interval.start}-{candidate.interval.end}, "
                               f"{span}): a member's wrong state stays outside the chief's checkpoint, or the "
                               f"program's steps do not replay; rolling back to step {candidate.interval.start} on "
                               "trial (the next interval tells them apart; no host blamed yet)")
                self.known.waits(trial=tried)
                return self._close(tried)
            self.known.waits()
            self.off = (f"two replays agree with each other and not with the trainer in two intervals running "
                        f"(steps {candidate.interval.start}-{candidate.interval.end}, {span}): the program's steps do not replay from a "
                        "checkpoint as its trainer ran them (state no checkpoint holds: random numbers of a seeded "
                        "Keras Dropout layer or of tf.random ops, a counter or iterator of its own); audit off for "
                        "this launch")
            return self._close(Judged(Verdict.NONDETERMINISTIC, interval, tuple(answers), f"procsv: audit: {self.off}"))
        if not self.counts and self.audited_steps == 0:
            self.off = (f"the program's steps are not deterministic: two replays of {span} from the same checkpoint "
                        "differ (no verdict can rest on a replay); audit off for this launch")
            return self._close(Judged(Verdict.NONDETERMINISTIC, interval, tuple(answers), f"procsv: audit: {self.off}"))
        hosts = ", ".join(sorted({a.host for a in answers}))
        return self._close(Judged(Verdict.AUDITOR, interval, tuple(answers),
                                   f"procsv: audit: two replays of {span} disagree with each other: the auditor's machine "
                                   f"({hosts}) is at fault, not the trainer's; nothing rolled back"))

    def _trainer(self, interval: Interval, answers: tuple[Replay, ...], differ: tuple[str, ...], why: str,
                 made: bool = False) -> Judged:
        """The trainer's machine computed ``interval`` wrongly: roll back to its start (``made``: its trial's rollback
        did already)."""
        if not made:
            self.anchor = interval.start  # (kept until the rolled-back trainer restored it)
        span = f"steps {interval.start}-{interval.end}"
        names = ", ".join(differ[:3]) + (f" and {len(differ) - 3} more" if len(differ) > 3 else "")
        back = f"rolled back to step {interval.start} on trial" if made else f"rolling back to step {interval.start}"
        who = f"the trainer group over {self.group} hosts ({group_name(self.group)}: its chief's checkpoint cannot " \
            "tell which member)" if self.group > 1 else f"the trainer{' group' if self.group else ''} on host {{host}}"
        return self._close(Judged(Verdict.TRAINER, interval, answers,
                                  f"procsv: audit: {who} computed {span} wrongly (two replays "
                                  f"agree with each other, not with its checkpoint; differing: {names}{why}): {back}",
                                  made))

    def untried(self) -> None:
        """The trial's rollback could not be made (no group running: between two attempts): nothing was rolled back,
        so its candidate waits again, undecided. The next interval the group runs on decides as it would have before
        the trial (the group restarted whole from the chief's checkpoint, consistent again): it matches, a trainer
        verdict on the candidate with a rollback of its own; before, the trial stayed and that match confirmed it as
        'rolled back on trial' with nothing rolled back, the wrong steps kept."""
        trial = self.known.trial
        if trial is not None:
            self.known.waits(undecided=Judged(Verdict.UNDECIDED, trial.interval, trial.replays, trial.line))

    def ended(self) -> Optional[Judged]:
        """The trainer finished with nothing left to replay and a candidate undecided: no verdict on it (None: no
        candidate). Nothing is rolled back: no later interval could tell a fault from a program that does not
        replay."""
        candidate, trial = self.known.candidate, self.known.trial
        self.known.waits()
        if candidate is None and trial is None:
            return None
        undecided = candidate if candidate is not None else trial
        assert undecided is not None
        interval, replays = undecided.interval, undecided.replays
        judged = Judged(Verdict.UNAUDITED, interval, replays, f"procsv: audit of steps {interval.start}-{interval.end}: no "
                        "verdict (its replays differ from the trainer's checkpoint and the run ended before an interval "
                        "after it told a fault from a program that does not replay exactly); "
                        + ("nothing rolled back" if trial is None else "its trial's rollback stands"))
        self._keep(judged)
        return judged

    def _keep(self, judged: Judged) -> None:
        self.verdicts = [*self.verdicts[-(RECENT - 1):], judged]
        self.counts[judged.verdict.value] = self.counts.get(judged.verdict.value, 0) + 1
        if judged.verdict == Verdict.UNAUDITED:
            self.unaudited_steps += judged.interval.steps

    def _close(self, judged: Judged) -> Judged:
        self.current, self.answers = None, []
        self.deaths.forget()
        self._keep(judged)
        return judged


def waiting(queue: list[Interval], mode: AuditMode) -> list[Interval]:
    """The intervals that wait for an auditor, at most :data:`QUEUE_MAX`. An auditor slower than the trainer (a
    loaded machine: its duty cycle; intervals shorter than its start-up) falls behind; under ``--audit every``
    two consecutive intervals waiting are then replayed as one (the first pair that can: the second neither
    :attr:`Interval.resumed` nor :attr:`Interval.session_start`, the whole at most :data:`MERGE_MAX` times the
    longest commit interval waiting: not the newest, which the final save, a few steps after a periodic one,
    makes short), so that no step goes
    unaudited: a dropped interval is a hole a fault in it passes through for good (every later interval starts
    from the state it left). Otherwise (sampled, nothing can merge) the oldest is dropped."""
    if len(queue) <= QUEUE_MAX:
        return queue
    if mode == AuditMode.EVERY:
        unit = max(i.longest for i in queue)
        for i, (a, b) in enumerate(zip(queue, queue[1:])):
            if a.end == b.start and not (b.resumed or b.session_start) and b.end - a.start <= MERGE_MAX * unit:
                merged = Interval(a.start, b.end, a.start_path, b.end_path, resumed=a.resumed,
                                  session_start=a.session_start, part=max(a.longest, b.longest))
                return waiting([*queue[:i], merged, *queue[i + 2:]], mode)
    return queue[-QUEUE_MAX:]


def sampled(index: int, mode: AuditMode) -> bool:
    """Whether interval ``index`` (0: the launch's first) is replayed under ``mode``: under ``sampled``, the first
    two (a mismatch of the first is decided by the second: the module's docstring), then one in :data:`SAMPLE_EVERY`."""
    if mode == AuditMode.EVERY:
        return True
    return mode == AuditMode.SAMPLED and (index % SAMPLE_EVERY == 0 or index == 1)  # (the first two: the probe)


def holds(book: AuditBook) -> list[int]:
    """The committed steps retention must keep for the audit (sorted): both ends of every interval waiting or
    being replayed (an auditor restores the one and reads the other) and :attr:`AuditBook.anchor`."""
    if book.off:  # (an audit switched off keeps nothing: the intervals it had queued would be held for ever)
        return []
    waiting = [*book.queue, *([book.current] if book.current is not None else [])]
    steps = {s for i in waiting for s in (i.start, i.end)} | ({book.anchor} if book.anchor is not None else set()) \
        | ({book.known.candidate.interval.start} if book.known.candidate is not None else set()) \
        | ({book.known.trial.interval.start} if book.known.trial is not None else set())
    return sorted(steps)


def pending(book: AuditBook) -> bool:
    """Whether a finished trainer must wait before the run ends: ``--audit every`` (and on) with an interval
    waiting or being replayed (a verdict after the run's end could roll nothing back)."""
    return book.mode == AuditMode.EVERY and not book.off and (book.current is not None or bool(book.queue))


def end_wait(book: AuditBook, ended_at: float, now: float) -> bool:
    """Whether the run's end still waits for the audit (:func:`pending`, at most :data:`END_WAIT_SECS` after
    the trainer ended at ``ended_at``)."""
    return pending(book) and now - ended_at < END_WAIT_SECS


def committed(book: AuditBook, step: int, path: Optional[str], eligible: bool, attempt: int = 0,
              began: Optional[int] = None, final: bool = False) -> None:
    """:meth:`AuditBook.commit`."""
    return book.commit(step, path, eligible, attempt, began, final)


def rolled_back(book: AuditBook, judged: Judged) -> None:
    """:meth:`AuditBook.rolled_back`."""
    return book.rolled_back(judged)


def next_replay(book: AuditBook, auditor_running: bool, now: Optional[float] = None) -> Optional[Interval]:
    """:meth:`AuditBook.next_replay`."""
    return book.next_replay(auditor_running, now)


def died(book: AuditBook, replay: Replay, now: float, final: bool = False) -> Optional[Judged]:
    """:meth:`AuditBook.died`."""
    return book.died(replay, now, final)


def replayed(book: AuditBook, replay: Replay) -> Optional[Judged]:
    """:meth:`AuditBook.replayed`."""
    return book.replayed(replay)


def seen(book: AuditBook, step: int, attempt: int) -> Optional[AuditQuarantine]:
    """A commit of ``step`` by trainer ``attempt`` (0: not said; every new commit, late ones too, an audit's off or
    not): noted for :func:`wrong_timeline`. A late commit of a timeline rolled back (an attempt rolled back or an
    earlier one, past that rollback's S1: a snapshot in flight at the kill, or the dead trainer's in-memory one
    persisted) is quarantined at once: the quarantine of that step alone (None: it is not such a commit; one whose
    attempt is not said never is)."""
    if book.mode == AuditMode.OFF:
        return None
    for done in book.rollbacks:
        if step > done.after and 0 < attempt <= done.attempt:
            return AuditQuarantine(done.after, done.attempt, [step], done.reason)
    if book.off:
        return None  # (no rollback will come: nothing to note)
    book.commits[step] = attempt
    floor = book.oldest_start()
    for s in [s for s in book.commits if floor is not None and s <= floor]:
        del book.commits[s]  # (no rollback can go before it: a month of commits is not kept)
    return None


def late(book: AuditBook, attempt: int) -> bool:
    """Whether a commit of trainer ``attempt`` is of a timeline an audit rolled back (no interval of the audit)."""
    return bool(attempt) and any(attempt <= done.attempt for done in book.rollbacks)


def wrong_timeline(book: AuditBook, judged: Judged, attempt: int, why: str) -> Optional[AuditQuarantine]:
    """Trainer ``attempt`` was rolled back to ``judged``'s start S1 (``why``: the restart's reason): the checkpoints
    to quarantine, every step after S1 committed by that attempt or an earlier one (None: none); noted, so that a
    late commit of that timeline is quarantined too (:func:`seen`). Never S1, never a later attempt's commit."""
    after = judged.interval.start
    steps = sorted(s for s, a in book.commits.items() if s > after and a <= attempt)
    for s in steps:
        del book.commits[s]
    decided = AuditQuarantine(after, attempt, steps, why)
    book.rollbacks.append(decided)
    return decided if steps else None


def stopping(book: AuditBook, judged: Judged, rb: Optional[AuditRollback], attempt: int, stop: bool) -> list[str]:
    """The line of a trainer verdict reached while the run stops (pure; ``rb``: its rollback, ``attempt``: the trainer's,
    ``stop``: a stop was asked): none but for a trainer verdict. The run's end decided (``rb`` None): nothing is rolled
    back in this launch (no trainer may start again), and the checkpoints its timeline committed after S1 (by
    ``attempt`` or an earlier one, the stop's own among them when it was heard) hold the state computed wrongly: the
    interval is left to the next launch (:func:`unrolled`, :func:`carried`), which judges it again and rolls back. A running trainer asked to stop (killed by ``rb``): it writes no stop's
    checkpoint, which would hold that state, and no restart follows: a launch again resumes S1."""
    start = judged.interval.start
    if judged.verdict != Verdict.TRAINER or not stop or (rb is not None and (rb.finished or rb.ended)):
        return []
    if rb is not None:
        return [f"procsv: audit: the run is stopping: the trainer is killed before its stop's checkpoint, which would "
                f"hold the state computed wrongly; launching again resumes from step {start}"]
    wrong = sorted(s for s, a in book.commits.items() if s > start and a <= attempt)
    held = (f"the checkpoint(s) of step(s) {', '.join(str(s) for s in wrong)}, committed after step {start}, hold the "
            "state computed wrongly") if wrong else f"no checkpoint after step {start} was heard"
    return [f"procsv: audit: the run is stopping, so nothing is rolled back to step {start} in this launch: {held}; "
            f"launching again with --audit replays steps {start}-{judged.interval.end} first and rolls back to step "
            f"{start} (without it, the newest is resumed, the fault kept)"]


def unrolled(book: AuditBook, judged: Judged) -> None:
    """A trainer verdict the run's end rolled nothing back for (:func:`stopping`): its interval waits again, for the
    next launch (:func:`carried`), whose replays judge it again and roll its trainer back (no auditor follows in this
    launch: the run is finishing)."""
    if judged.interval not in book.queue:
        book.queue.insert(0, judged.interval)


def group_name(hosts: int) -> str:
    """What a verdict on a group over ``hosts`` hosts names instead of a host (pure): its chief's checkpoint, all the
    audit compares with, holds the all-reduced result of every member's step, not which member computed it."""
    return f"group of nodes 0-{hosts - 1}"


def rollback(judged: Judged, attempt: Optional[int], live: bool, finished: bool, finishing: bool, commit_step: int,
             host: str, hosts: int = 1) -> Optional[AuditRollback]:
    """What a verdict does to the trainer (``attempt``, None: none; ``live``: running; ``finished``: ended with 0,
    its end waiting for the audit), the run ``finishing`` or not, ``commit_step`` the newest step committed: a
    trainer verdict rolls the trainer back to the interval's start (:class:`AuditRollback`), a running one (killed),
    a finished one (restarted) or one that died and is not restarted yet (:attr:`AuditRollback.ended`: nothing to
    kill; its restart restores before the bound: a single trainer's wrong bit is in its checkpoints, so a restart
    from its newest one would carry it on, and the next intervals, replayed from that state, would match). A
    group's trial finding no group running rolls nothing back (:meth:`AuditBook.untried`); anything else, or a run
    already finishing, rolls nothing back (None). ``host``: the trainer's; a group over ``hosts`` hosts is named as
    the group (:func:`group_name`)."""
    before = judged.rollback_before
    ended = not (live or finished)
    if attempt is None or finishing or before is None or (ended and judged.verdict != Verdict.TRAINER):
        return None
    span = f"steps {judged.interval.start}-{judged.interval.end}"
    return AuditRollback(attempt, before, max(commit_step, judged.interval.end), finished,
                         f"audit: {f'the {group_name(hosts)}' if hosts > 1 else f'host {host}'} computed {span} wrongly"
                         if judged.verdict == Verdict.TRAINER else
                         f"audit: the group rolled back to step {judged.interval.start} on trial ({span} and the next "
                         "interval differ from two agreeing replays)", ended)
