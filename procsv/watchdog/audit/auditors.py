"""The audit's executor (issue 71): forks the auditors, hands their answers to the verdict, performs it.

Runs in the watchdog, driven by its loop (:class:`~procsv.watchdog.launcher.Watchdog`): every message it
drains (:meth:`Auditors.heard`: the commits, :class:`~procsv.ipc.messages.SaveResult`, and the auditors'
:class:`~procsv.ipc.messages.AuditResult`) and every round (:meth:`Auditors.round`: an auditor that ended
without an answer: its interval replayed by a fresh auditor, a bounded number of times, after a growing wait; the
next one to fork). What to replay and what an answer means are
:mod:`procsv.watchdog.audit.verdict`'s (pure); here they are acted on: an auditor is forked from the zygote
(never fresh: an auditor is worth only spare CPU), a verdict is recorded (an ``audit`` lifecycle record, a
line), and a trainer verdict rolls the trainer back as :func:`~procsv.watchdog.audit.verdict.rollback` decides:
the rollback's bound is noted (:func:`~procsv.watchdog.rules.bookkeeping.note_audit_rollback`:
``RunView.rollback_before``, as a group's rollback sets it) and the trainer is SIGKILLed (no emergency
checkpoint of a wrong state), which rule 1 restarts at once, not as a failure (``Cause.AUDIT``); a trainer that had finished (``--audit every`` waits
for its last verdicts: ``Findings.audit["end_waits"]``, true only while such a trainer waits, bounded by
``END_WAIT_SECS``) is restarted the same way.
The checkpoints the audit needs (:func:`~procsv.watchdog.audit.verdict.holds`) are told to the checkpoint
service (:class:`~procsv.ipc.messages.AuditHold`) whenever they change and whenever a service says hello:
retention keeps them. So are, at a rollback and at each late commit of the timeline rolled back, the
checkpoints that timeline committed after S1 (:func:`~procsv.watchdog.audit.verdict.wrong_timeline`,
:func:`~procsv.watchdog.audit.verdict.seen`: an :class:`~procsv.ipc.messages.AuditQuarantine`, with an
``audit_quarantine`` record and a line), told again at a service's hello: it moves them to the quarantine.
The auditor runs only part of the time, stopped and continued as the duty cycle says
(:mod:`procsv.watchdog.audit.duty`: pure, fed the trainer's :class:`~procsv.ipc.messages.Progress`), so that it
costs the trainer at most half a percent of its steps. What a launch's end would leave unjudged
(:func:`~procsv.watchdog.audit.carry.carried`) is persisted at every commit and verdict through the executor, and an
earlier launch's is put in the book at the start (:func:`~procsv.watchdog.audit.carry.carry_in`): replayed first.

One concern: performing the audit's decisions in the watchdog's loop (auditors, verdicts, rollbacks, what is kept).
"""

from __future__ import annotations

import socket
from typing import Callable, Optional

from procsv.common.env import AUDIT
from procsv.ipc.messages import AuditHold, AuditQuarantine, AuditResult, Hello, Message, Progress, Role, SaveResult
from procsv.watchdog.audit import duty, stillness
from procsv.watchdog.audit.carry import (carried, carry_in, kept_for_later)
from procsv.watchdog.audit.verdict import (END_WAIT_SECS, AuditBook, AuditMode, Exactness, Judged, Replay, Verdict,
                                           committed, died, end_wait, group_name, holds, late, next_replay, pending,
                                           replayed, rollback, rolled_back, seen, stopping, unrolled, wrong_timeline)
from procsv.watchdog.executor import Executor
from procsv.watchdog.rules.bookkeeping import note_audit_rollback
from procsv.watchdog.publish.events import Event, Report
from procsv.watchdog.rules.actions import Cause, Kill
from procsv.watchdog.rules.failures import describe
from procsv.watchdog.rules.state import AUDITOR, TRAINER, ChildView, RunView, auditor_slot


class Auditors:
    """The launch's audit: its :class:`AuditBook`, the auditor running (its attempt, and whether it answered)."""

    def __init__(self, mode: str, ex: Executor, view: RunView, world: int,
                 report: Callable[[list[Report]], None], tell: Callable[[Message], None], hosts: int = 1,
                 ps: bool = False, elastic: bool = False, program: str = "", platform: str = "") -> None:
        self.members, off = replayers(world, hosts, ps, elastic)
        self.book = AuditBook(mode=AuditMode(mode), group=hosts if self.members > 1 else 0,
                              known=Exactness(program=program, platform=platform))  # (config.program_fingerprint,
        # config.platform_fingerprint)
        if off is not None and self.book.mode != AuditMode.OFF:  # (no interval is eligible: said once, at the start)
            self.book.off = off
            report([Report(say=f"procsv: audit: {self.book.off}", err=True)])
        self.ex, self.view, self.report, self.tell = ex, view, report, tell
        # whom a trainer verdict names: the trainer's host (a single trainer, a group on one host: the watchdog's), or
        # a group over hosts (the chief's checkpoint cannot tell which member computed wrongly: no host blamed)
        self.host = group_name(self.book.group) if self.book.group > 1 else socket.gethostname()
        self.attempt = 0  # the auditors forked so far
        self.running: Optional[int] = None  # the attempt of the auditor asked for and not ended
        self.answered = False
        self.dead = False  # the running replay died (a member did, or its fork was given up on): its rest is killed
        self.held: Optional[list[int]] = None  # the steps the checkpoint service was last told to keep
        self.quarantined: list[AuditQuarantine] = []  # the wrong timelines' checkpoints told to it (again at its Hello)
        self.said: set[str] = set()  # the lines said once a launch: "gave_up" (the end's wait for the last verdicts
        # ran out), "dropped" (a hole under --audit every)
        self.end_waits = False  # a trainer that finished waits for the audit: the run's end held (judge reads it)
        self.duty = duty.DutyCycle()
        self.stopped: Optional[int] = None  # the attempt of the auditor this duty cycle stopped (SIGSTOP)
        self.still = stillness.Stillness()  # the running auditor's CPU readings: is it hung
        self.hung: Optional[str] = None  # why the running auditor was killed as hung (its death's reason)
        self.deferred: Optional[Judged] = None  # a trainer verdict waiting for the restart being forked to be in the view
        if self.book.mode != AuditMode.OFF and not self.book.off:  # (an earlier launch's intervals left unjudged: first)
            left, on_disk = ex.audit_left()
            said = carry_in(self.book, left, on_disk) if left is not ... else [
                "procsv: audit: .procsv/audit.json (what an earlier launch's audit left) cannot be read; its intervals, "
                "if any, are not audited"]
            report([Report(say=line, err=True) for line in said])
            self._hold()
        elif self.book.mode == AuditMode.OFF:  # (no audit: an earlier launch's intervals' checkpoints kept for the next)
            left, on_disk = ex.audit_left()
            steps, said = kept_for_later(left if left is not ... else None, program, self.book.group, on_disk)
            report([Report(say=line, err=True) for line in said])
            if steps:
                self.held = steps
                tell(AuditHold(steps))
        self._publish()

    def heard(self, msg: Message) -> None:
        """A message the watchdog drained: a commit closes an interval; an auditor's answer is judged; a
        checkpoint service's hello is told what to keep (a restarted one knows nothing)."""
        if self.book.mode == AuditMode.OFF:
            if isinstance(msg, Hello) and msg.role == Role.CHECKPOINT and self.held:
                self.tell(AuditHold(self.held))  # (an earlier launch's intervals' checkpoints: a restarted one knows nothing)
            return
        if isinstance(msg, Progress):
            trainer = self.view.children.get(TRAINER)
            if trainer is not None and msg.pid == trainer.pid:
                duty.heard(self.duty, self.ex.clock(), msg.wall_time, msg.step, bool(msg.busy) or not msg.stepped)
            return
        if isinstance(msg, SaveResult) and msg.ok and not msg.again:
            wrong = seen(self.book, msg.step, msg.attempt)
            if wrong is not None:  # a late commit of a timeline rolled back: quarantined as the rest of it
                self._quarantine(wrong)
            trainer = self.view.children.get(TRAINER)
            if late(self.book, msg.attempt) or (msg.attempt and trainer is not None and msg.attempt < trainer.attempt):
                return  # a late commit of an attempt that is gone (a rolled-back one's, say): no interval of its
            last = self.book.last.step if self.book.last is not None else msg.step
            eligible = self.members > 0 and not any(last < s <= msg.step for s in self.view.skipped_steps)
            # the step its attempt began at (its TrainerReady's): an interval from there replays a fresh start
            began = trainer.restored_step if trainer is not None and trainer.attempt == msg.attempt \
                and trainer.ready_at is not None else None
            committed(self.book, msg.step, msg.path, eligible, msg.attempt, began,
                      final=getattr(msg.reason, "value", msg.reason) == "final")
            self._holes()
            self._publish()
            self._leave()
        elif isinstance(msg, SaveResult) and msg.ok and getattr(msg.reason, "value", msg.reason) == "final":
            self.book.session_ended(msg.step)  # (again: its step's save came first; the session ended there all the same)
        elif isinstance(msg, AuditResult) and self.running == msg.attempt and not self.answered:
            self.answered = True
            self._judge(Replay(tuple(msg.differ), msg.digest, msg.host, msg.error, msg.attempt))
        elif isinstance(msg, Hello) and msg.role == Role.CHECKPOINT:
            self.held = None
            for wrong in self.quarantined:  # (one the DEALER dropped, or that a service killed mid-way never did;
                self.tell(wrong)            # moved already: nothing; a later attempt's at such a step: never)
        self._hold()

    def round(self) -> None:
        """An auditor that ended without answering: killed or crashed (or its fork from the zygote given up on, no
        auditor started), its interval is replayed by a fresh auditor (:func:`~procsv.watchdog.audit.verdict.died`); exited 0 (the program ended before its replay began), an answer
        with an error. A group's replay (:attr:`members` auditors) is one auditor for all this: it died when any member
        did (or its fork was given up on); its members still live once it answered or died are killed (a worker left
        waiting in a collective for a chief that is gone). Then the next auditor, if one is due and the zygote can fork
        it while the run goes on (or while a finished trainer waits for it)."""
        if self.book.mode == AuditMode.OFF:
            return
        if self.deferred is not None:  # (the restart asked of the zygote before the verdict: in the view now, or given up)
            trainer = self.view.children.get(TRAINER)
            if trainer is None or not self.ex.asking(TRAINER, trainer.attempt + 1):
                judged, self.deferred = self.deferred, None
                self._act(judged)
                self._leave()
        members = self._members()
        if self.running is not None and not (self.answered or self.dead):  # (a replay dies once, whatever its
            self._ended(members)                                              # members' reaps take)
        if self.running is not None and (self.answered or self.dead) and not any(c.live for c in members):
            self.running, self.hung, self.dead = None, None, False
        self._hold()
        self._watch(members)
        self._pace(members)
        if self.view.finishing or self.running is not None:
            return
        trainer = self.view.children.get(TRAINER)
        if trainer is None or not (trainer.live or self.end_waits):
            return  # (a trainer being restarted: its zygote's fork first)
        interval = next_replay(self.book, auditor_running=False, now=self.ex.clock())
        if interval is None:
            return
        if self.ex.fork_auditor(self.attempt + 1, {AUDIT: f"{interval.start}:{interval.end}"}, self.members):
            self.attempt += 1
            self.running, self.answered = self.attempt, False
            self._publish()

    def _members(self) -> list[ChildView]:
        """The running replay's processes this host started, its chief first (none asked: empty)."""
        if self.running is None:
            return []
        return [c for c in (self.view.children.get(auditor_slot(r)) for r in range(self.members))
                if c is not None and c.attempt == self.running]

    def _ended(self, members: list[ChildView]) -> None:
        """The running replay, not answered: did it end without an answer (a member's fork given up on, a member
        dead, its chief exited)? Then its death (or an answer with an error), and its members still live killed."""
        assert self.running is not None
        given_up = [auditor_slot(r) for r in range(self.members)
                    if not any(c.slot == auditor_slot(r) for c in members) and not self.ex.asking(auditor_slot(r),
                                                                                              self.running)]
        dead = next((c for c in members if not c.live and c.exit_code != 0), None)
        chief = members[0] if members and members[0].slot == AUDITOR else None
        if given_up:  # its fork was given up on (the zygote died, stalled)
            self._died(Replay((), "", self.host, "the auditor's fork was given up on (the pre-warmed trainer died or "
                                                 "stalled)", self.running))
        elif dead is not None:
            how = describe(dead.exit_code) if dead.exit_code is not None else "died"
            who = "the auditor" if self.members == 1 else f"the auditors' member {dead.slot}"
            self._died(Replay((), "", self.host, self.hung or f"{who} {how} before its answer", self.running))
        elif chief is not None and not chief.live:
            self._judge(Replay((), "", self.host, "the auditor exited with 0 before its answer", self.running))
            return
        else:
            return
        self.dead = True
        self._kill_rest(members, "the replay died")

    def _kill_rest(self, members: list[ChildView], why: str) -> None:
        """SIGKILL the replay's members still live (a group's workers, once its chief answered or any member died)."""
        for c in members:
            if c.live and not c.killed:
                self.ex.perform(Kill(c.slot, c.attempt, Cause.AUDIT, why))

    def _holes(self) -> None:
        """Intervals dropped unreplayed (the auditor fell behind past what merging covers; counted by the book): said
        once a launch under ``--audit every`` (a fault in them goes unseen for good: every later interval starts from
        the state they left)."""
        gone, self.book.dropped = self.book.dropped, []
        if not gone:
            return
        if self.book.mode == AuditMode.EVERY and "dropped" not in self.said:
            self.said.add("dropped")
            spans = ", ".join(f"{a}-{b}" for a, b in gone)
            self.report([Report(say=f"procsv: audit: the auditor cannot keep up: steps {spans} are not audited (a "
                                    "fault in them would go unseen; the auditor runs only on CPU the trainer "
                                    "leaves, see its duty in procsv status); the steps not audited are counted "
                                    "in status.json's audit.dropped_steps", err=True)])
        self._publish()

    def _watch(self, members: list[ChildView]) -> None:
        """Read the running replay's CPU (a group's: each member's) when due; SIGKILL it if
        :meth:`~procsv.watchdog.audit.stillness.Stillness.heard` finds it hung (its death then has its interval replayed by
        a fresh auditor, the hang its reason)."""
        now = self.ex.clock()
        live = [c for c in members if c.live] if not (self.answered or self.dead) else []
        if self.hung is not None or (live and not self.still.due(now)):
            return
        attempt = self.running if live else None
        used = [self.ex.cpu_secs(c.slot, c.attempt) for c in live]
        cpu = [u for u in used if u is not None] if live and all(u is not None for u in used) else None
        why = self.still.heard(now, attempt, cpu, self.stopped is None, [c.slot for c in live])
        if why is not None and attempt is not None:
            self.hung = why
            for c in live:
                self.ex.perform(Kill(c.slot, c.attempt, Cause.AUDIT, why))

    def _pace(self, members: list[ChildView]) -> None:
        """Stop or continue the replay (every member of a group's together) as the duty cycle says (it runs free while
        the trainer does not train)."""
        trainer = self.view.children.get(TRAINER)
        live = [c for c in members if c.live]
        free = self.view.finishing or trainer is None or not trainer.live
        run = duty.tick(self.duty, self.ex.clock(), free, bool(live))
        if not live:
            self.stopped = None
            return
        if run == (self.stopped == self.running):  # (stopped and to run, or running and to stop)
            for c in live:
                self.ex.pause(c.slot, c.attempt, stopped=not run)
            self.still.switched(self.ex.clock())
            self.stopped = None if run else self.running
            self._publish()

    def _finished(self) -> Optional[ChildView]:
        """The trainer, if it ended with 0 and its end awaits the judgement (its run's end)."""
        trainer = self.view.children.get(TRAINER)
        return trainer if trainer is not None and trainer.reaped and not trainer.settled \
            and trainer.exit_code == 0 else None

    def _hold(self) -> None:
        """Tell the checkpoint service the steps to keep, when they changed; set whether the run's end waits."""
        steps = holds(self.book)
        if steps != self.held:
            self.tell(AuditHold(steps))
            self.held = steps
        done = self._finished()
        if done is not None and not pending(self.book) and self.running is None:
            undecided = self.book.ended()  # (no interval after it will come: no verdict, nothing rolled back)
            if undecided is not None:
                self.report([_record(undecided, self.host)])
        now = self.ex.clock()
        wait = done is not None and end_wait(self.book, done.ended_at or now, now)  # (a running trainer's end: not yet)
        if done is not None and not wait and pending(self.book) and "gave_up" not in self.said:
            self.said.add("gave_up")
            self.report([Report(say=f"procsv: audit: the trainer finished; its last interval(s) got no verdict "
                                    f"within {END_WAIT_SECS:g} s; the run ends unaudited past step "
                                    f"{self.book.anchor if self.book.anchor is not None else 0}", err=True)])
        if wait != self.end_waits:
            self.end_waits = wait
            self._publish()

    def _judge(self, replay: Replay) -> None:
        interval = self.book.current
        kept = sum(self.book.counts.values())
        judged = replayed(self.book, replay)
        also = sum(self.book.counts.values()) - kept - 1  # (a trial's confirmation keeps the interval's own match too)
        if judged is not None and also > 0:
            self.report([_record(j, self.host) for j in self.book.verdicts[-1 - also:-1]])
        self._publish()
        if judged is None:  # a second replay of the same interval: forked at the next round
            if replay.differ and interval is not None:  # said now: under a slow duty cycle the verdict may be long
                names = ", ".join(replay.differ[:3]) + (f" and {len(replay.differ) - 3} more"
                                                        if len(replay.differ) > 3 else "")
                self.report([Report(Event.AUDIT, {"verdict": "mismatch", "start": interval.start, "end": interval.end,
                                                  "host": replay.host, "differ": list(replay.differ),
                                                  "auditors": [replay.auditor], "reason": None},
                                    say=f"procsv: audit: a replay of steps {interval.start}-{interval.end} differs from "
                                        f"the trainer's checkpoint ({names}); a second replay by a fresh auditor "
                                        "decides", err=True)])
            self._leave()
            return
        self.report([_record(judged, self.host)])
        self._act(judged)
        self._leave()

    def _act(self, judged: Judged) -> None:
        """What a verdict does to the trainer (:func:`~procsv.watchdog.audit.verdict.rollback`): a running trainer is
        killed, a finished one restarted, one that died and is not restarted yet is restarted told the bound (its
        restart's start asked of the zygote before the verdict was told none: the verdict waits for it to be in the
        view, then kills it as a running one, :meth:`round`)."""
        trainer = self.view.children.get(TRAINER)
        finished = self._finished()
        rb = rollback(judged, trainer.attempt if trainer is not None else None, trainer is not None and trainer.live,
                      finished is not None, self.view.finishing, self.view.commit_step, self.host, self.book.group)
        if rb is not None and rb.ended and self.ex.asking(TRAINER, rb.attempt + 1):
            self.deferred = judged
            return
        self.report([Report(say=said, err=True) for said in stopping(  # (a run stopping: what is rolled back, or not)
            self.book, judged, rb, trainer.attempt if trainer else 0, self.view.stop_signal is not None or self.view.finishing)])
        if rb is None and judged.verdict == Verdict.TRAINER and not judged.made:
            unrolled(self.book, judged)  # (nothing rolled back in this launch: the next one judges it again)
        blamed = judged.verdict == Verdict.TRAINER and (rb is not None or judged.made)  # (a trial blames no host)
        if blamed and self.book.group > 1:  # (counted, no host's transient fault: none can be told)
            self.view.findings.miscomputed[self.host] = self.view.findings.miscomputed.get(self.host, 0) + 1
        elif blamed and self.view.findings.audit_found(self.host):
            self.report([Report(Event.HOST_SUSPECT, {"host": self.host, "faults": self.view.findings.transient[self.host],
                                                     "limit": self.view.findings.suspect_after, "step": judged.interval.end},
                                say=f"procsv: host {self.host} is suspect: {self.view.findings.transient[self.host]} "
                                    "transient faults in this launch")])
        if rb is None:
            if judged.verdict == Verdict.TRIAL and not self.view.finishing:  # (no group running: none rolled back)
                self.book.untried()
                self.report([Report(say=f"procsv: audit: no trainer group is running to roll back on trial; steps "
                                        f"{judged.interval.start}-{judged.interval.end} stay undecided until the next "
                                        "interval it runs on", err=True)])
                self._publish()
            return
        note_audit_rollback(self.view, rb)
        rolled_back(self.book, judged)
        wrong = wrong_timeline(self.book, judged, rb.attempt, rb.why)
        if wrong is not None:  # (told before the kill: the trainer's late commits come after it)
            self._quarantine(wrong)
        if rb.finished:  # it finished before the verdict: restarted from the interval's start all the same
            self.report([Report(say=f"procsv: audit: the trainer had finished; it trains again from step "
                                    f"{judged.interval.start}", err=True)])
        elif rb.ended:  # it died before the verdict: its restart restores the interval's start, not its newest state
            self.report([Report(say=f"procsv: audit: the trainer (attempt {rb.attempt}) had ended before the verdict; "
                                    f"its restart trains again from step {judged.interval.start}", err=True)])
        else:
            self.ex.perform(Kill(TRAINER, rb.attempt, Cause.AUDIT, judged.line.format(host=self.host)))
        self._hold()
        self._publish()

    def _died(self, replay: Replay) -> None:
        """The auditor of the interval being replayed died before its answer: a fresh auditor replays it (said), or
        after too many deaths on it (or the run finishing) its verdict, not audited (said once, counted)."""
        interval = self.book.current
        judged = died(self.book, replay, self.ex.clock(), final=self.view.finishing)
        self._publish()
        self._leave()
        if judged is not None:
            self.report([_record(judged, self.host)])
        elif interval is not None:
            self.report([Report(say=f"procsv: audit: {replay.error} (steps {interval.start}-{interval.end}); a fresh "
                                    f"auditor replays them in {self.book.deaths.retry_at - self.ex.clock():.1f} s"
                                    if self.book.deaths.retry_at is not None else "", err=True)])

    def _quarantine(self, wrong: AuditQuarantine) -> None:
        """Tell the checkpoint service to quarantine a wrong timeline's checkpoints; its record and line."""
        self.tell(wrong)
        self.quarantined.append(wrong)
        names = ", ".join(str(s) for s in wrong.steps)
        self.report([Report(Event.AUDIT_QUARANTINE, {"after": wrong.after, "attempt": wrong.attempt,
                                                     "steps": list(wrong.steps), "reason": wrong.reason},
                            say=f"procsv: audit: quarantining the checkpoint(s) of step(s) {names}, committed after "
                                f"step {wrong.after} by the timeline rolled back (trainer attempt {wrong.attempt}; "
                                f"{wrong.reason}): moved to .procsv/quarantine/", err=True)])

    def _leave(self) -> None:
        """What the audit would leave the next launch now (:func:`~procsv.watchdog.audit.carry.carried`), persisted:
        at every commit and every verdict (what it holds changes only then)."""
        if self.book.mode != AuditMode.OFF:
            self.ex.carry_audit(carried(self.book))

    def _publish(self) -> None:
        """The audit's figures, as ``status.json`` and the metrics show them."""
        book = self.book
        counts = dict(book.counts)
        current = book.current
        self.view.findings.audit = {} if book.mode == AuditMode.OFF else {
            "mode": book.mode.value, "audited_steps": book.audited_steps, "committed_steps": book.covered_steps,
            "fraction": round(book.fraction, 4), "verdicts": counts, "off": book.off or None,
            "dropped_steps": book.dropped_steps, "unaudited_steps": book.unaudited_steps,
            "auditor_deaths": book.deaths.total,
            "replaying": None if current is None or self.running is None else [current.start, current.end],
            "miscomputed": dict(self.view.findings.miscomputed), "end_waits": self.end_waits,
            "duty": round(self.duty.duty, 3), **{k: None if v is None else round(v, 4) for k, v in (
                ("slowdown", self.duty.slowdown), ("bound", self.duty.bound), ("cost", self.duty.cost),
                ("spent", self.duty.spent))}}


def replayers(world: int, hosts: int, ps: bool, elastic: bool = False) -> tuple[int, Optional[str]]:
    """The auditors one replay takes (pure): one for a single trainer; a group (``--nproc N``, on one host or over
    hosts: ``world`` members in all) replays as a group of ``world`` of its own on node 0, forked from its zygote with
    a localhost ``TF_CONFIG`` (the all-reduce: every member's step needs the others'; the group's checkpoints are its
    chief's, on node 0); none, with why, where this slice audits nothing (a ``--ps`` cluster; an elastic group, whose
    intervals a smaller group may have trained: a replay by ``world`` members would differ from them)."""
    if ps:
        return 0, "a --ps cluster is not audited in this slice; audit off for this launch"
    if elastic:
        return 0, ("an elastic group (--min-nodes) is not audited in this slice (an interval trained without a host "
                   "replays otherwise with all of them); audit off for this launch")
    return world, None


def _record(judged: Judged, host: str) -> Report:
    """The ``audit`` lifecycle record of a verdict, with its line (none for a plain match): the interval it judges,
    the tensors its first replay found differing, and the auditors whose replays (or deaths) it rests on."""
    first = judged.replays[0] if judged.replays else Replay((), "", host)
    named = host if judged.verdict == Verdict.TRAINER else \
        ", ".join(sorted({r.host for r in judged.replays})) if judged.verdict == Verdict.AUDITOR else None
    errors = [r.error for r in judged.replays if r.error]
    said = judged.line.removeprefix("procsv: audit: ") if judged.verdict in (
        Verdict.NONDETERMINISTIC, Verdict.AUDITOR, Verdict.UNDECIDED, Verdict.TRIAL) or (
        judged.verdict == Verdict.UNAUDITED and len(errors) != 1) else None  # (one replay's error: it is the reason)
    reason = said or (errors[-1] if errors else None)
    return Report(Event.AUDIT, {"verdict": judged.verdict.value, "start": judged.interval.start,
                                "end": judged.interval.end, "host": named, "differ": list(first.differ),
                                "auditors": [r.auditor for r in judged.replays], "reason": reason},
                  say=judged.line.format(host=host), err=judged.verdict != Verdict.MATCH)
