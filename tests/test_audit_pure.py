"""The audit's verdict (issue 71), pure: which intervals are replayed, and what two replays mean."""

from __future__ import annotations

import json

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from test_policies import mk, steps as kept_steps, T0
from test_watchdog_decide import Sim, of

from procsv.services.checkpoint.policy import retention
from procsv.status import audit_lines
from procsv.watchdog import observe
from procsv.watchdog.actionlines import restart_reports
from procsv.common.env import AUDIT
from procsv.ipc.messages import AuditQuarantine, AuditResult, SaveReason, SaveResult
from procsv.watchdog.audit.auditors import Auditors, _record
from procsv.watchdog.audit.carry import (carried, carry_in, kept_for_later)
from procsv.watchdog.audit.verdict import (END_WAIT_SECS, MERGE_MAX, QUEUE_MAX, RETRIES, RETRY_MAX_SECS, RETRY_SECS,
                                           SAMPLE_EVERY, AuditBook, AuditMode, AuditRollback, Exactness, Replay,
                                           Verdict, committed, died, end_wait, holds, late, next_replay, pending,
                                           replayed, rollback, rolled_back, seen, wrong_timeline)
from procsv.watchdog.publish.events import Event, Report
from procsv.watchdog.publish.metrics import spike_families
from procsv.watchdog.publish.runmetrics import StepRate, take_snapshot
from procsv.watchdog.audit import stillness
from procsv.watchdog.rules.actions import Cause, Finish, Kill, Restart, Spawn
from procsv.watchdog.rules.bookkeeping import note_audit_rollback
from procsv.watchdog.rules.state import AUDITOR, TRAINER, auditor_slot

GOOD = Replay((), "aaaa", "auditor-host")
BAD = Replay(("dense/kernel",), "bbbb", "auditor-host")


def _book(mode: AuditMode = AuditMode.EVERY, steps: tuple[int, ...] = (100, 200)) -> AuditBook:
    book = AuditBook(mode=mode)
    for s in steps:
        committed(book, s, f"/l/model.ckpt-{s}", eligible=True)
    return book


def judge(book: AuditBook, *answers: Replay) -> object:
    """The next interval replayed with ``answers`` (one per auditor): the last answer's verdict (None: none yet)."""
    next_replay(book, False)
    out = None
    for a in answers:
        out = replayed(book, a)
    return out


def test_two_replays_that_agree_with_each_other_and_not_with_the_trainer_roll_it_back_to_the_intervals_start() -> None:
    book = _book()
    assert next_replay(book, False).start == 100
    assert replayed(book, BAD) is None  # a mismatch is never believed of one auditor
    assert next_replay(book, False).start == 100  # the same interval, again
    judged = replayed(book, BAD)
    assert judged.verdict == Verdict.TRAINER and judged.rollback_before == 101
    assert "{host}" in judged.line and "rolling back to step 100" in judged.line
    committed(book, 300, "/l/model.ckpt-300", eligible=True)  # (a commit of the rolled-back timeline)
    rolled_back(book, judged)
    assert book.queue == [] and (book.last.step, book.last.path) == (100, "/l/model.ckpt-100")
    committed(book, 200, "/l/model.ckpt-200", eligible=True)  # trained again from step 100: audited again
    assert [(i.start, i.end) for i in book.queue] == [(100, 200)]


def test_a_rollback_quarantines_every_checkpoint_its_timeline_committed_after_s1_and_a_late_one_too() -> None:
    """Issue 71's audit, time-based saves: attempt 2 committed 50, 100, 200, 300 (an earlier attempt 1: 20), the
    verdict on 100-200 came after 300: 200 and 300 derive from the wrong state; 20, 50 and 100 (S1) do not. A late
    commit of attempt 2 (its snapshot in flight at the kill) is quarantined alone; the new timeline's (attempt 3)
    and one whose attempt is not said never are, even on a step of the wrong timeline."""
    book = AuditBook(mode=AuditMode.EVERY)
    for step, attempt in ((20, 1), (50, 2), (100, 2), (200, 2), (300, 2)):
        assert seen(book, step, attempt) is None
        committed(book, step, f"/l/model.ckpt-{step}", eligible=True, attempt=attempt)
        while (interval := next_replay(book, False)) is not None and interval.start < 100:
            replayed(book, GOOD)  # (20-50 twice, the launch's first; 50-100 once: the program replays exactly)
    assert next_replay(book, False).start == 100
    replayed(book, BAD)
    judged = replayed(book, BAD)
    assert judged.verdict == Verdict.TRAINER and (judged.interval.start, judged.interval.end) == (100, 200)
    rolled_back(book, judged)
    wrong = wrong_timeline(book, judged, 2, "audit: host h computed steps 100-200 wrongly")
    assert wrong is not None and (wrong.after, wrong.attempt, wrong.steps) == (100, 2, [200, 300])
    assert wrong.reason == "audit: host h computed steps 100-200 wrongly"
    assert late(book, 2) and late(book, 1) and not late(book, 3) and not late(book, 0)
    again = seen(book, 350, 2)  # the rolled-back trainer's snapshot in flight, committed after the verdict
    assert again is not None and (again.after, again.attempt, again.steps) == (100, 2, [350])
    assert seen(book, 100, 2) is None  # (S1 itself, told again: never)
    assert seen(book, 200, 3) is None and seen(book, 300, 0) is None  # the new timeline's; one not said
    committed(book, 200, "/l/model.ckpt-200", eligible=True, attempt=3)
    assert [(i.start, i.end) for i in book.queue] == [(100, 200)]  # the new timeline's interval, audited
    assert book.commits == {200: 3, 300: 0}  # (20, 50 and S1 100 let go: no rollback can go before 100 now)
    rb2 = AuditBook(mode=AuditMode.EVERY)  # a rollback whose timeline committed nothing after S1: nothing to move
    committed(rb2, 100, "/l/model.ckpt-100", eligible=True, attempt=1)
    assert wrong_timeline(rb2, judged, 1, "why") is None and rb2.rollbacks[0].steps == []


def test_two_replays_that_disagree_name_the_auditor_and_roll_nothing_back() -> None:
    book = _book(steps=(100, 200, 300))
    next_replay(book, False)
    replayed(book, GOOD)
    assert replayed(book, GOOD).verdict == Verdict.MATCH  # the first interval, replayed twice
    next_replay(book, False)
    assert replayed(book, BAD) is None
    judged = replayed(book, GOOD)  # the second auditor matches the trainer: the first computed wrongly
    assert judged.verdict == Verdict.AUDITOR and judged.rollback_before is None
    assert "auditor-host" in judged.line and not book.off


def test_a_program_whose_first_interval_replays_twice_differently_switches_the_audit_off_with_one_line() -> None:
    book = _book(steps=(100, 200, 300))
    next_replay(book, False)
    assert replayed(book, GOOD) is None  # the first interval is replayed twice whatever it says
    judged = replayed(book, Replay((), "cccc", "auditor-host"))
    assert judged.verdict == Verdict.NONDETERMINISTIC and "not deterministic" in book.off
    assert next_replay(book, False) is None
    committed(book, 400, "/l/model.ckpt-400", eligible=True)
    assert [(i.start, i.end) for i in book.queue] == [(200, 300)] and next_replay(book, False) is None


def test_matching_replays_count_their_steps_as_audited_and_a_replay_that_could_not_run_is_no_verdict() -> None:
    book = _book(steps=(100, 200, 300, 400))
    next_replay(book, False)
    replayed(book, GOOD)
    replayed(book, GOOD)
    next_replay(book, False)
    assert replayed(book, GOOD).verdict == Verdict.MATCH  # after the first, one matching replay is enough
    next_replay(book, False)
    assert replayed(book, Replay((), "", "h", "checkpoint 300 was retired")).verdict == Verdict.UNAUDITED
    assert book.audited_steps == 200 and book.covered_steps == 300 and round(book.fraction, 3) == 0.667


def test_sampled_replays_the_first_interval_then_one_in_sample_every_and_off_none() -> None:
    book = _book(AuditMode.SAMPLED, steps=tuple(range(100, 100 * (SAMPLE_EVERY + 3), 100)))
    assert [(i.start, i.end) for i in book.queue] == [(100, 200), (200, 300),
                                                      (100 * (SAMPLE_EVERY + 1), 100 * (SAMPLE_EVERY + 2))]
    assert _book(AuditMode.OFF).queue == []


def test_an_ineligible_commit_closes_no_interval_and_one_auditor_runs_at_a_time() -> None:
    book = _book(steps=(100,))
    committed(book, 200, "/l/model.ckpt-200", eligible=False)  # a rollback in force, a skipped step, a group
    assert book.queue == []
    committed(book, 300, "/l/model.ckpt-300", eligible=True)
    assert [(i.start, i.end) for i in book.queue] == [(200, 300)]
    assert next_replay(book, auditor_running=True) is None


def test_an_auditor_that_falls_behind_under_every_replays_two_waiting_intervals_as_one_and_leaves_no_step_out() -> None:
    """Measured: a graph program's 1.1 s intervals, its auditors at duty 0.5: 38 % of the intervals were dropped, and a
    bit flipped at step 700 in one of them went uncaught (every later interval starts from the state it left)."""
    book = _book(steps=(0,))
    for s in (100, 200, 300, 400, 500, 600):  # the auditor busy throughout
        committed(book, s, f"/l/model.ckpt-{s}", eligible=True, attempt=1)
    assert [(i.start, i.end) for i in book.queue] == [(0, 400), (400, 500), (500, 600)]
    assert book.queue[0].start_path == "/l/model.ckpt-0" and book.queue[0].end_path == "/l/model.ckpt-400"
    assert holds(book) == [0, 400, 500, 600]  # retention keeps what the merged interval needs, not what it spans
    for s in range(700, 2100, 100):
        committed(book, s, f"/l/model.ckpt-{s}", eligible=True, attempt=1)
    first = book.queue[0]
    assert first.steps <= 8 * 100 and book.queue[-1].end == 2000  # no longer than MERGE_MAX of the newest: then dropped
    assert all(a.end == b.start for a, b in zip(book.queue, book.queue[1:]))  # what waits has no hole
    for s in range(2100, 4100, 100):  # past what three merged intervals hold: the oldest dropped, and noted
        committed(book, s, f"/l/model.ckpt-{s}", eligible=True, attempt=1)
    spans = sorted(book.dropped + [(i.start, i.end) for i in book.queue])  # a hole is noted (said, counted)
    assert book.dropped and spans[0][0] == 0 and spans[-1][1] == 4000
    assert all(a[1] == b[0] for a, b in zip(spans, spans[1:])), spans
    sampled_ = _book(mode=AuditMode.SAMPLED, steps=(0,))
    for s in range(100, 3300, 100):
        committed(sampled_, s, f"/l/model.ckpt-{s}", eligible=True, attempt=1)
    assert len(sampled_.queue) == 3 and all(i.steps == 100 for i in sampled_.queue)  # sampled: never merged


def test_a_short_last_interval_does_not_drop_the_oldest_waiting_one_under_every() -> None:
    """Measured (seeds_tf1.loop, 1500 steps, save_model_secs 1, a bit flipped after step 700): the final save at 1500,
    10 steps after the periodic one at 1490, made the newest interval 10 steps long; a merge bounded by 8 times *that*
    could not happen, so the oldest waiting interval (556-1109, holding the fault) was dropped and the run ended with
    the flipped bit unaudited, no line said. The bound is 8 times the longest commit interval waiting."""
    book = _book(steps=(0,))
    for s in (100, 200, 300, 400, 500, 600, 610):  # the auditor busy throughout; 610: the final save
        committed(book, s, f"/l/model.ckpt-{s}", eligible=True, attempt=1)
    assert [(i.start, i.end) for i in book.queue] == [(0, 500), (500, 600), (600, 610)]  # no step left out
    assert all(a.end == b.start for a, b in zip(book.queue, book.queue[1:]))
    for s in range(700, 1500, 100):  # still bounded: never more than 8 of the commit intervals it is made of
        committed(book, s, f"/l/model.ckpt-{s}", eligible=True, attempt=1)
    assert book.queue[0].steps <= 8 * 100 and book.queue[-1].end == 1400, book.queue


def test_an_interval_begun_by_a_restart_is_not_merged_into_the_one_before() -> None:
    book = _book(steps=(0,))
    committed(book, 100, "/l/model.ckpt-100", eligible=True, attempt=1)
    committed(book, 200, "/l/model.ckpt-200", eligible=True, attempt=2)  # a restart restored 100: resumed
    committed(book, 300, "/l/model.ckpt-300", eligible=True, attempt=2)
    committed(book, 400, "/l/model.ckpt-400", eligible=True, attempt=2)
    assert [(i.start, i.end, i.resumed) for i in book.queue] == [(0, 100, True), (100, 300, True), (300, 400, False)]
    # a program's next fit (or a retry loop's next session) begins at the final commit of the one before: an
    # auditor's session ends there (test_keras_extra's fine-tuning run: 8-12 and 12-16 merged, "ended at step 12")
    fits = _book(steps=(0,))
    for s, final in ((4, False), (8, False), (12, True), (16, False), (20, False)):
        committed(fits, s, f"/l/model.ckpt-{s}", eligible=True, attempt=1, final=final)
    assert [(i.start, i.end, i.session_start) for i in fits.queue] == [(0, 12, False), (12, 16, True), (16, 20, False)]
    # a fit's end whose step its last epoch's save committed first: its final commit is an "again" (CI's run F:
    # test_keras_extra's two fits, 12-24 and 24-40 merged, "the program ended at step 24, before step 40")
    again = _book(steps=(0,))
    for s in (4, 8, 12):
        committed(again, s, f"/l/model.ckpt-{s}", eligible=True, attempt=1)
    again.session_ended(12)  # (the final SaveResult, again=True: not a commit the book counts)
    for s in (16, 20):
        committed(again, s, f"/l/model.ckpt-{s}", eligible=True, attempt=1)
    assert [(i.start, i.end, i.session_start) for i in again.queue] == [(0, 12, False), (12, 16, True), (16, 20, False)]
    # a merged interval keeps its first part's session start (CI's run F, test_keras_extra's two fits: 24-32 and
    # 32-40 merged into 24-40 lost it, then 12-24 and 24-40 merged into 12-40: "ended at step 24, before step 40")
    two = _book(steps=(0,))
    for s, final in ((6, False), (12, False), (18, False), (24, True), (32, False), (40, False), (48, False)):
        committed(two, s, f"/l/model.ckpt-{s}", eligible=True, attempt=1, final=final)
    assert all(not (i.start < 24 < i.end) for i in two.queue), [(i.start, i.end) for i in two.queue]
    assert any(i.start == 24 and i.session_start for i in two.queue), [(i.start, i.end) for i in two.queue]


def test_retention_keeps_the_steps_an_audit_holds_past_max_to_keep_and_deletes_them_once_let_go() -> None:
    committed_ = [mk(s, T0 + s) for s in range(1, 8)]
    plan = retention(committed_, max_to_keep=3, keep_every_n_hours=None, last_preserved=T0, held=frozenset({2}))
    assert kept_steps(plan.keep) == [2, 5, 6, 7] and kept_steps(plan.delete) == [1, 3, 4] and not plan.newly_preserved
    plan = retention(committed_, max_to_keep=3, keep_every_n_hours=None, last_preserved=T0)
    assert kept_steps(plan.delete) == [1, 2, 3, 4]


def test_the_audit_holds_both_ends_of_what_waits_and_the_step_a_rollback_goes_to() -> None:
    book = _book(steps=(100, 200, 300))
    assert holds(book) == [100, 200, 300]  # two intervals waiting: their ends
    next_replay(book, False)
    replayed(book, GOOD)
    replayed(book, GOOD)  # 100-200 audited
    next_replay(book, False)
    assert replayed(book, GOOD).verdict == Verdict.MATCH  # 200-300 audited: 300 is where a rollback would go
    assert holds(book) == [300]
    committed(book, 400, "/l/model.ckpt-400", eligible=True)
    next_replay(book, False)
    replayed(book, BAD)
    judged = replayed(book, BAD)
    assert judged.verdict == Verdict.TRAINER and holds(book) == [300]
    rolled_back(book, judged)
    assert holds(book) == [300]  # the rolled-back trainer restores it: kept


def test_a_finished_trainer_waits_for_every_intervals_verdict_under_every_bounded_and_never_under_sampled() -> None:
    book = _book(steps=(100, 200))
    assert pending(book) and end_wait(book, 10.0, 10.0 + END_WAIT_SECS - 1)
    assert not end_wait(book, 10.0, 10.0 + END_WAIT_SECS)
    assert not pending(_book(AuditMode.SAMPLED, steps=(100, 200)))
    next_replay(book, False)
    replayed(book, GOOD)
    assert pending(book)  # the first interval's second replay is still due
    replayed(book, GOOD)
    assert not pending(book)


def test_the_run_does_not_finish_while_the_audit_is_pending_and_a_late_verdict_restarts_the_trainer_not_as_a_failure(
        ) -> None:
    sim = Sim()
    sim.start_trainer(steps=5)
    sim.view.findings.audit = {"end_waits": True}
    sim.dies(TRAINER, 0)
    assert of(sim.tick(1.0), Finish) == []  # its last intervals' verdicts first
    trainer = sim.trainer
    book = _book()
    next_replay(book, False), replayed(book, BAD), next_replay(book, False)
    judged = replayed(book, BAD)  # (two replays that agree, not with the trainer)
    rb = rollback(judged, trainer.attempt, trainer.live, True, sim.view.finishing, 250, "h1")
    assert rb == AuditRollback(trainer.attempt, 101, 250, True, "audit: host h1 computed steps 100-200 wrongly"), rb
    note_audit_rollback(sim.view, rb)  # (what the executor does with it)
    assert trainer.regroup and sim.view.rollback_before == (101, 250, trainer.attempt)
    sim.view.findings.audit = {"end_waits": False}
    restart = of(sim.tick(1.0), Restart)
    assert len(restart) == 1 and restart[0].delay == 0.0 and restart[0].regroup, restart
    said = restart_reports(sim.view, restart[0])
    assert [r.fields.get("error") for r in said] == ["audit: host h1 computed steps 100-200 wrongly"], said


def test_status_and_prometheus_show_the_fraction_audited_and_the_miscomputing_host() -> None:
    audit = {"mode": "every", "audited_steps": 1200, "committed_steps": 1600, "fraction": 0.75,
             "verdicts": {"match": 3, "trainer": 1}, "off": None, "miscomputed": {"h1": 1}}
    assert audit_lines(audit) == ["  audit (every): 1200 of 1600 committed steps replayed bit-equal (75.0%); verdicts: "
                                  "match 3, trainer 1; computed wrongly (rolled back), by host: h1 1"]
    assert audit_lines({}) == []
    assert audit_lines(dict(audit, dropped_steps=300))[1] == ("  300 committed steps not audited: the auditor fell "
                                                              "behind and their intervals were dropped (a fault in "
                                                              "them goes unseen)")
    assert audit_lines(dict(audit, unaudited_steps=100, auditor_deaths=3))[1:] == [
        "  100 committed steps got no verdict (their replay could not be made: the audit records say why)",
        "  3 auditor(s) died before their answer (their interval replayed again by a fresh auditor, a bounded number "
        "of times)"]
    assert audit_lines(dict(audit, unaudited_steps=0, auditor_deaths=0)) == audit_lines(audit)
    assert audit_lines(dict(audit, end_waits=True))[1:] == ["  the trainer finished; the run's end waits for the "
                                                            "audit's last verdicts"]
    paced = dict(audit, duty=0.08, slowdown=0.05, cost=0.004)
    assert audit_lines(paced)[1] == ("  auditor runs 8% of the time: a running auditor slows the trainer 5.0%, so the "
                                     "audit costs it 0.40% (budget 0.5%)")
    assert audit_lines(dict(paced, spent=0.0031))[1] == audit_lines(paced)[1] + "; 0.31% of its time so far"
    assert audit_lines(dict(paced, slowdown=0.03, bound=0.05))[1] == (
        "  auditor runs 8% of the time: a running auditor slows the trainer 3.0% (at most 5.0%), so the audit costs it "
        "at most 0.40% (budget 0.5%)")  # (the bound: what the duty cycle goes by)
    sim = Sim()
    sim.view.findings.audit, sim.view.findings.miscomputed = audit, {"h1": 1}
    registry = CollectorRegistry(auto_describe=False)

    class Snap:
        def collect(self):  # type: ignore[no-untyped-def]
            yield from spike_families(take_snapshot(sim.view, 1.0, 1000.0, 900.0, StepRate()))
    registry.register(Snap())  # type: ignore[arg-type]
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for fam in text_string_to_metric_families(generate_latest(registry).decode()) for s in fam.samples}
    assert samples[("procsv_audit_miscomputed_total", (("host", "h1"),))] == 1
    assert samples[("procsv_audited_fraction", ())] == 0.75


def test_replays_that_agree_and_miss_the_trainer_before_the_program_is_known_to_replay_wait_for_the_next_interval() -> None:
    """A program whose state is not all in its checkpoint (a custom loop's Keras Dropout layer under set_random_seed: its seed
    generator restarts in every fresh process) replays the same way twice, never the trainer's way: two such
    intervals running switch the audit off, nothing rolled back. A real fault (one wrong bit stays in the state:
    the interval after it replays as the trainer ran it) is rolled back one interval later."""
    inexact = AuditBook(mode=AuditMode.EVERY)
    for s in (100, 200, 300):
        committed(inexact, s, f"/l/model.ckpt-{s}", eligible=True, attempt=1)
    first = judge(inexact, BAD, BAD)
    assert first.verdict == Verdict.UNDECIDED and first.rollback_before is None and not inexact.off
    assert holds(inexact) == [100, 200, 300]  # (the candidate's start: where a confirmed fault rolls back)
    second = judge(inexact, BAD, BAD)
    assert second.verdict == Verdict.NONDETERMINISTIC and inexact.off and second.rollback_before is None
    assert "do not replay from a checkpoint" in second.line and not any(
        v.verdict == Verdict.TRAINER for v in inexact.verdicts)

    fault = AuditBook(mode=AuditMode.SAMPLED)
    for s in (100, 200, 300):
        committed(fault, s, f"/l/model.ckpt-{s}", eligible=True, attempt=1)
    assert judge(fault, BAD, BAD).verdict == Verdict.UNDECIDED
    assert [(i.start, i.end) for i in fault.queue] == [(200, 300)]  # (the next one, sampled or not)
    confirmed = judge(fault, GOOD)
    assert confirmed.verdict == Verdict.TRAINER and (confirmed.interval.start, confirmed.interval.end) == (100, 200)
    assert confirmed.rollback_before == 101 and fault.known.exact and fault.audited_steps == 0

    known = _book(steps=())  # once an interval the trainer ran on has matched, a mismatch is the trainer's at once
    for s in (100, 200, 300):
        committed(known, s, f"/l/model.ckpt-{s}", eligible=True, attempt=1)
    judge(known, GOOD, GOOD)
    assert known.known.exact and judge(known, BAD, BAD).verdict == Verdict.TRAINER

    resumed = AuditBook(mode=AuditMode.EVERY)  # a restarted trainer's first interval: its start is a fresh process's
    committed(resumed, 100, "/l/model.ckpt-100", eligible=True, attempt=1)
    committed(resumed, 200, "/l/model.ckpt-200", eligible=True, attempt=2)
    assert judge(resumed, BAD, BAD).verdict == Verdict.TRAINER

    ends = AuditBook(mode=AuditMode.EVERY)  # the run ends with a candidate undecided: no verdict, nothing rolled back
    for s in (100, 200):
        committed(ends, s, f"/l/model.ckpt-{s}", eligible=True, attempt=1)
    judge(ends, BAD, BAD)
    assert not pending(ends)
    left = ends.ended()
    assert left.verdict == Verdict.UNAUDITED and left.rollback_before is None and ends.ended() is None


def test_an_interval_from_the_step_its_trainer_began_at_is_a_fresh_start_as_the_replays_and_proves_nothing_exact(
        ) -> None:
    """A graph program's first checkpoint (a MonitoredTrainingSession's, the graph Supervisor's) is taken as its
    session starts, at the step its trainer began at: the interval from there starts from a fresh process's state,
    as its replays do. Its match says nothing of state no checkpoint holds (a seeded tf.random op's counter): the
    next interval that differs is a candidate, and the one after switches the audit off, nothing rolled back (a
    seeded graph program measured: without this, every interval rolled back). A mismatch of it is the trainer's at
    once, as a restarted trainer's first interval's."""
    seeded = AuditBook(mode=AuditMode.EVERY)
    for s in (0, 200, 400, 600):
        committed(seeded, s, f"/l/model.ckpt-{s}", eligible=True, attempt=1, began=0)
    assert [i.resumed for i in seeded.queue] == [True, False, False]
    assert judge(seeded, GOOD, GOOD).verdict == Verdict.MATCH and not seeded.known.exact
    assert judge(seeded, BAD, BAD).verdict == Verdict.UNDECIDED
    off = judge(seeded, BAD, BAD)
    assert off.verdict == Verdict.NONDETERMINISTIC and "do not replay from a checkpoint" in seeded.off
    assert not any(v.verdict == Verdict.TRAINER for v in seeded.verdicts)

    flipped = AuditBook(mode=AuditMode.EVERY)  # a bit flipped in that first interval: the trainer's fault at once
    for s in (0, 200):
        committed(flipped, s, f"/l/model.ckpt-{s}", eligible=True, attempt=1, began=0)
    assert judge(flipped, BAD, BAD).verdict == Verdict.TRAINER

    later = AuditBook(mode=AuditMode.EVERY)  # a trainer that began before the interval (or unknown): ran on into it
    for s, began in ((200, 0), (400, 0), (600, None)):
        committed(later, s, f"/l/model.ckpt-{s}", eligible=True, attempt=1, began=began)
    assert [i.resumed for i in later.queue] == [False, False]


def test_a_kind_of_program_not_audited_says_so_once_and_switches_the_audit_off() -> None:
    """A program with no state to save: its auditor answers that it is not audited: once, not every interval."""
    book = _book(steps=(100, 200, 300, 400))
    next_replay(book, False)
    judged = replayed(book, Replay((), "", "h", "a program with no state to save: not audited in this slice"))
    assert judged.verdict == Verdict.UNAUDITED and book.off and "audit off for this launch" in judged.line
    assert next_replay(book, False) is None and not pending(book)
    assert holds(book) == []  # (the intervals it had queued are not kept past max_to_keep for ever)


def test_a_trainer_verdict_rolls_back_a_running_finished_or_dead_trainer_and_nothing_else_does() -> None:
    book = _book()
    next_replay(book, False), replayed(book, BAD), next_replay(book, False)
    trainer_fault = replayed(book, BAD)
    rb = rollback(trainer_fault, 3, True, False, False, 180, "h1")
    assert rb == AuditRollback(3, 101, 200, False, "audit: host h1 computed steps 100-200 wrongly"), rb  # stale: the end
    dead = rollback(trainer_fault, 3, False, False, False, 180, "h1")  # a trainer being restarted: its restart is told
    assert dead == AuditRollback(3, 101, 200, False, "audit: host h1 computed steps 100-200 wrongly", ended=True), dead
    assert rollback(trainer_fault, None, False, False, False, 180, "h1") is None  # no trainer
    assert rollback(trainer_fault, 3, True, False, True, 180, "h1") is None  # the run finishing
    book = _book(steps=(100, 200, 300))
    next_replay(book, False), replayed(book, GOOD), replayed(book, GOOD)  # (the first interval, replayed twice)
    next_replay(book, False), replayed(book, BAD)
    auditor_fault = replayed(book, GOOD)
    assert auditor_fault.verdict == Verdict.AUDITOR and rollback(auditor_fault, 3, True, False, False, 180, "h1") is None


def test_a_month_of_intervals_keeps_the_counts_whole_and_only_the_newest_verdicts() -> None:
    """A month of one-minute intervals is 43,200 verdicts: counted, and the status's counts are read from them in
    one step, not by walking every verdict at each publication."""
    book = _book(steps=(0,))
    for s in range(1, 5001):
        committed(book, 100 * s, f"/l/model.ckpt-{100 * s}", eligible=True, attempt=1)
        assert next_replay(book, False) is not None
        while replayed(book, GOOD) is None:  # (the first interval: replayed twice)
            pass
    assert book.counts == {"match": 5000} and book.audited_steps == 500_000 and len(book.verdicts) <= 64
    for s in range(5001, 10001):  # the commits the quarantine notes: none before the oldest interval waiting
        seen(book, 100 * s, 1)
        committed(book, 100 * s, f"/l/model.ckpt-{100 * s}", eligible=True, attempt=1)
    assert len(book.commits) <= QUEUE_MAX * MERGE_MAX + 2, sorted(book.commits)[:8]  # what waits spans, no more


def test_an_auditor_that_dies_before_its_answer_has_its_interval_replayed_by_a_fresh_one_a_bounded_number_of_times(
        ) -> None:
    """Issue 71's attack: a SIGKILLed auditor (running, or stopped by the duty cycle) left its interval unaudited for
    good (a hole in --audit every's coverage). Its interval is replayed by a fresh auditor, the answers it already had
    kept; after RETRIES deaths on one interval it is said once as not audited (its reason, counted), and the wait
    before each fresh auditor doubles with every death running (any interval), so that an auditor that always dies
    is no restart storm."""
    book = _book(steps=(100, 200, 300, 400))
    assert next_replay(book, False, now=0.0).start == 100
    killed = Replay((), "", "h", "the auditor was killed by SIGKILL before its answer", auditor=1)
    assert died(book, killed, now=0.0) is None  # replayed again, by a fresh auditor
    assert pending(book) and holds(book)[:2] == [100, 200]  # (still waiting: the run's end waits, both ends kept)
    assert next_replay(book, False, now=0.0) is None  # not at once
    assert (next_replay(book, False, now=RETRY_SECS).start, book.current.end) == (100, 200)
    assert replayed(book, Replay((), "aaaa", "h", auditor=2)) is None  # (the first interval: replayed twice)
    assert died(book, Replay((), "", "h", "killed", auditor=3), now=10.0) is None  # its second replay's auditor dies
    assert next_replay(book, False, now=10.0 + RETRY_SECS - 0.01) is None  # (an answer came between: one wait)
    assert next_replay(book, False, now=10.0 + RETRY_SECS).start == 100
    match = replayed(book, Replay((), "aaaa", "h", auditor=4))
    assert match.verdict == Verdict.MATCH and [r.auditor for r in match.replays] == [2, 4]  # the answer kept
    assert book.audited_steps == 100 and book.deaths.total == 2

    assert next_replay(book, False, now=20.0).start == 200  # (an answer ended the deaths running: no wait)
    verdicts = []
    for n in range(RETRIES + 1):
        assert next_replay(book, False, now=100.0 * (n + 1)).start == 200
        verdicts.append(died(book, Replay((), "", "h", f"killed {n}", auditor=5 + n), now=100.0 * (n + 1)))
        assert book.deaths.retry_at == 100.0 * (n + 1) + RETRY_SECS * 2 ** n  # deaths running: the wait doubles
    assert verdicts[:-1] == [None] * RETRIES  # bounded: then said once, not audited, with its reason
    gave_up = verdicts[-1]
    assert gave_up.verdict == Verdict.UNAUDITED and (gave_up.interval.start, gave_up.interval.end) == (200, 300)
    assert [r.auditor for r in gave_up.replays] == list(range(5, 6 + RETRIES))
    assert f"no verdict ({RETRIES + 1} auditors died before their answer" in gave_up.line and "killed" in gave_up.line
    assert book.counts["unaudited"] == 1 and book.unaudited_steps == 100 and book.deaths.total == RETRIES + 3
    assert holds(book) == [200, 300, 400]  # 200-300 let go: the anchor (the newest audited step) and what waits
    wait = min(RETRY_MAX_SECS, RETRY_SECS * 2 ** RETRIES)  # deaths running: the next auditor waits longer still
    assert next_replay(book, False, now=100.0 * (RETRIES + 1) + wait - 0.01) is None
    assert next_replay(book, False, now=100.0 * (RETRIES + 1) + wait).start == 300
    for n in range(20):  # an auditor that always dies, interval after interval: the waits grow to RETRY_MAX_SECS
        committed(book, 500 + 100 * n, f"/l/model.ckpt-{500 + 100 * n}", eligible=True)
        assert next_replay(book, False) is not None
        died(book, Replay((), "", "h", "killed", auditor=100 + n), now=0.0)
    assert book.deaths.retry_at == RETRY_MAX_SECS and book.counts["unaudited"] > 5
    finishing = _book(steps=(100, 200))  # the run finishing: no fresh auditor can follow, so no verdict at once
    next_replay(finishing, False, now=0.0)
    assert died(finishing, killed, now=0.0, final=True).verdict == Verdict.UNAUDITED


def test_a_trainer_verdict_decided_one_interval_later_names_the_interval_it_judges_and_its_replays_and_auditors(
        ) -> None:
    """Issue 71's attack: a candidate (two replays agree with each other, not with the trainer, before the program is
    known to replay exactly) is confirmed by the next interval's match: its verdict's record carried an empty
    ``differ`` and the later interval's auditors. It names the candidate's interval, replays and auditors."""
    book = AuditBook(mode=AuditMode.EVERY)
    for s in (100, 200, 300):
        committed(book, s, f"/l/model.ckpt-{s}", eligible=True, attempt=1)
    next_replay(book, False)
    replayed(book, Replay(("dense/kernel",), "bbbb", "a1", auditor=1))
    assert replayed(book, Replay(("dense/kernel",), "bbbb", "a2", auditor=2)).verdict == Verdict.UNDECIDED
    next_replay(book, False)
    confirmed = replayed(book, Replay((), "cccc", "a3", auditor=3))
    assert confirmed.verdict == Verdict.TRAINER and (confirmed.interval.start, confirmed.interval.end) == (100, 200)
    assert [r.auditor for r in confirmed.replays] == [1, 2], confirmed.replays
    assert "differing: dense/kernel; steps 200-300 replayed as it ran" in confirmed.line, confirmed.line
    rec = _record(confirmed, "trainer-host")
    assert (rec.fields["start"], rec.fields["end"], rec.fields["host"]) == (100, 200, "trainer-host")
    assert rec.fields["differ"] == ["dense/kernel"] and rec.fields["auditors"] == [1, 2], rec.fields
    ends = AuditBook(mode=AuditMode.EVERY)  # a candidate left undecided at the run's end: its replays, said why
    for s in (100, 200):
        committed(ends, s, f"/l/model.ckpt-{s}", eligible=True, attempt=1)
    judge(ends, Replay(("w",), "bbbb", "a", auditor=7), Replay(("w",), "bbbb", "a", auditor=8))
    left = _record(ends.ended(), "trainer-host")
    assert left.fields["auditors"] == [7, 8] and left.fields["differ"] == ["w"], left.fields
    assert "no verdict" in left.fields["reason"], left.fields


class _Ex:
    """The executor's part the audit uses, over a :class:`Sim`: an auditor's fork spawns it in the view at once."""

    def __init__(self, sim: Sim) -> None:
        self.sim, self.forked, self.performed = sim, [], []  # type: ignore[var-annotated]
        self.defer = False  # a fork asked stays pending (in ``pending``) until the test answers or drops it
        self.pending: set[int] = set()
        self.cpu: dict[int, float] = {}  # each auditor's CPU seconds (0: it uses none)
        self.paused: list[tuple[str, int, bool]] = []
        self.worker_cpu: dict[str, float] = {}  # a group's auditors' workers' CPU seconds, by slot (0: none used)
        self.reap_kills = False  # a Kill performed reaps its child at once (else the test says when it died)
        self.trainer_forks: set[int] = set()  # the trainer attempts whose start is asked of the zygote, not answered
        self.carries: list[dict] = []  # type: ignore[type-arg]  # what the audit left the next launch, each time
        self.left: object = None  # what an earlier launch's audit left (None: nothing; ...: unreadable)
        self.on_disk: dict[int, str] = {}  # the committed checkpoints at the launch's start

    def carry_audit(self, carried: dict) -> None:  # type: ignore[type-arg]
        self.carries.append(carried)

    def audit_left(self) -> tuple[object, dict[int, str]]:
        return self.left, self.on_disk

    def clock(self) -> float:
        return self.sim.now

    def fork_auditor(self, attempt: int, extra: dict, members: int = 1) -> bool:  # type: ignore[type-arg]
        self.forked.append((attempt, extra[AUDIT]))
        if self.defer:
            self.pending.add(attempt)
            return True
        for rank in range(members):  # (a group's replay: a group of auditors, slots auditor, auditor1, ...)
            observe.spawned(self.sim.view, auditor_slot(rank), AUDITOR, attempt, 1000 + 10 * attempt + rank,
                            self.sim.now, "zygote")
        return True

    def asking(self, slot: str, attempt: int) -> bool:
        return (slot == AUDITOR and attempt in self.pending) or (slot == TRAINER and attempt in self.trainer_forks)

    def pause(self, slot: str, attempt: int, stopped: bool) -> None:
        self.paused.append((slot, attempt, stopped))

    def cpu_secs(self, slot: str, attempt: int) -> float:
        return self.cpu.get(attempt, 0.0) if slot == AUDITOR else self.worker_cpu.get(slot, 0.0)

    def perform(self, action: object) -> None:
        self.performed.append(action)
        if self.reap_kills and isinstance(action, Kill) and action.slot in self.sim.view.children:
            self.sim.dies(action.slot, -9)  # (SIGKILLed: reaped at once)


def _audited(sim: Sim, steps: tuple[int, ...]) -> tuple[Auditors, _Ex, list[Report]]:
    """A launch's audit under --audit every over ``sim``'s trainer, which committed ``steps``."""
    ex, said = _Ex(sim), []  # type: ignore[var-annotated]
    audits = Auditors("every", ex, sim.view, 1, said.extend, lambda msg: None)  # type: ignore[arg-type]
    for s in steps:
        audits.heard(SaveResult(s, SaveReason.PERIODIC, True, f"/l/model.ckpt-{s}", None, 0.1, attempt=1))
    return audits, ex, said


def _to_a_mismatchs_second_replay() -> tuple[Sim, Auditors, _Ex, list[Report], list[object]]:
    """Trainer attempt 1 committed 100-400 (heard and on disk), interval 100-200 matched (twice: the probe), 200-300's
    first replay differs, and its second replay is asked (auditor 4): (the sim, the audits, the executor, what was
    said, what was told the checkpoint service)."""
    sim = Sim()
    sim.start_trainer(steps=5)
    ex, said, told = _Ex(sim), [], []  # type: ignore[var-annotated]
    audits = Auditors("every", ex, sim.view, 1, said.extend, told.append)  # type: ignore[arg-type]
    for s in (100, 200, 300, 400):
        audits.heard(SaveResult(s, SaveReason.PERIODIC, True, f"/l/model.ckpt-{s}", None, 0.1, attempt=1))
        sim.commit(s)
    for answer in (GOOD, GOOD, BAD):
        audits.round()
        audits.heard(AuditResult(1000 + audits.attempt, audits.attempt, 0, 0, list(answer.differ), answer.digest, "a"))
        sim.dies(AUDITOR, 0)
    audits.round()
    return sim, audits, ex, said, told


def _stopped_after_a_mismatch() -> tuple[Sim, Auditors, _Ex, list[Report], list[object]]:
    """:func:`_to_a_mismatchs_second_replay`, then SIGTERM to the launch: the trainer commits its stop's checkpoint 450
    and exits, the run's end decided, the second replay's auditor (4) still running."""
    import signal

    sim, audits, ex, said, told = _to_a_mismatchs_second_replay()
    assert ex.forked[-1] == (4, "200:300")  # the second replay of the mismatch
    observe.stop_requested(sim.view, signal.SIGTERM, sim.now, 120.0)
    audits.heard(SaveResult(450, SaveReason.PREEMPTED, True, "/l/model.ckpt-450", None, 0.1, attempt=1))
    sim.commit(450)
    sim.dies(TRAINER, 42)
    sim.tick(1.0)
    assert sim.view.finishing
    return sim, audits, ex, said, told


def _to_a_trainer_verdict_on_a_dead_trainer(forking: bool) -> tuple[Sim, Auditors, _Ex, list[Report], list[object]]:
    """Trainer attempt 1 committed 100-400, interval 100-200 matched (twice: the probe), 200-300's first replay differs;
    the trainer crashes (its restart decided) before the second replay agrees with the first: the verdict, reached
    with no trainer running (``forking``: its restart's start asked of the zygote, not answered yet)."""
    sim, audits, ex, said, told = _to_a_mismatchs_second_replay()
    assert ex.forked[-1] == (4, "200:300") and not ex.performed  # the second replay of the mismatch
    sim.dies(TRAINER, -9)
    assert of(sim.tick(1.0), Restart)  # its restart decided; not started yet
    if forking:
        ex.trainer_forks.add(2)
    audits.heard(AuditResult(1004, 4, 200, 300, list(BAD.differ), BAD.digest, "a"))
    sim.dies(AUDITOR, 0)
    assert [r.fields["verdict"] for r in said if r.event == Event.AUDIT][-1] == "trainer"
    return sim, audits, ex, said, told


def test_a_trainer_verdict_reached_while_the_trainer_is_dead_rolls_its_restart_back_and_quarantines_the_wrong_timeline(
        ) -> None:
    """A single trainer's wrong bit is in its checkpoints (300 and 400 hold the state 200-300 computed wrongly). The
    verdict reached while it was dead (crashed, not restarted yet) rolled nothing back: its restart restored 400, the
    wrong state, and the intervals after it, replayed from that state, matched; 300 and 400 stayed. Now the restart is
    told the bound (it restores 200: rollback_before 201), 300 and 400 are quarantined, and no kill is sent (nothing
    runs to kill). Its restart's start asked of the zygote before the verdict (told no bound) waits until it is in the
    view, then is killed and rolled back as a running trainer is."""
    sim, audits, ex, said, told = _to_a_trainer_verdict_on_a_dead_trainer(forking=False)
    assert sim.view.rollback_before == (201, 400, 1) and not [a for a in ex.performed if isinstance(a, Kill)]
    assert [(m.after, m.attempt, list(m.steps)) for m in told if isinstance(m, AuditQuarantine)] == [(200, 1, [300, 400])]
    assert of(sim.tick(), Spawn) and sim.trainer.attempt == 2 and sim.view.rollback_before is not None  # (its resume)
    assert sim.view.rollback_before[0] == 201 and holds(audits.book) == [200]
    audits.heard(SaveResult(300, SaveReason.PERIODIC, True, "/l/model.ckpt-300", None, 0.1, attempt=1))  # a late one
    assert [list(m.steps) for m in told if isinstance(m, AuditQuarantine)][-1] == [300]

    sim, audits, ex, said, told = _to_a_trainer_verdict_on_a_dead_trainer(forking=True)
    assert sim.view.rollback_before is None and not [m for m in told if isinstance(m, AuditQuarantine)]  # (waits)
    observe.spawned(sim.view, TRAINER, TRAINER, 2, 777, sim.now, "zygote")  # the zygote's answer: attempt 2 runs
    ex.trainer_forks.clear()
    audits.round()
    assert [(a.slot, a.attempt) for a in ex.performed if isinstance(a, Kill)] == [(TRAINER, 2)]
    assert sim.view.rollback_before == (201, 400, 2)
    assert [(m.after, m.attempt, list(m.steps)) for m in told if isinstance(m, AuditQuarantine)] == [(200, 2, [300, 400])]


def test_the_watchdog_replays_a_killed_auditors_interval_and_its_status_says_the_end_waits_only_once_it_does() -> None:
    """A SIGKILLed auditor's interval is replayed by a fresh auditor (its wait: RETRY_SECS), said nowhere as a verdict;
    ``audit.end_waits`` in status.json is false while the trainer runs (intervals waiting or not) and true only while
    a trainer that finished waits for its last verdicts (the run's end held)."""
    sim = Sim()
    sim.start_trainer(steps=5)
    audits, ex, said = _audited(sim, (100, 200))
    audits.round()
    assert ex.forked == [(1, "100:200")]
    assert pending(audits.book) and sim.view.findings.audit["end_waits"] is False  # the trainer runs: no end waits
    sim.dies(AUDITOR, -9)  # SIGKILL, before its answer
    audits.round()
    assert [r for r in said if r.event == Event.AUDIT] == [] and ex.forked == [(1, "100:200")]  # no verdict, a wait
    sim.now += RETRY_SECS
    audits.round()
    assert ex.forked == [(1, "100:200"), (2, "100:200")]  # the same interval, by a fresh auditor
    assert sim.view.findings.audit["auditor_deaths"] == 1
    sim.dies(TRAINER, 0)  # the trainer finished: its end waits for the interval's verdict
    audits.round()
    assert sim.view.findings.audit["end_waits"] is True and of(sim.tick(0.0), Finish) == []
    for a in (2, 3):
        audits.heard(AuditResult(1000 + a, a, 100, 200, [], "aaaa", "h"))
        sim.dies(AUDITOR, 0)
        audits.round()
    assert [(r.fields["verdict"], r.fields["auditors"]) for r in said if r.event == Event.AUDIT] == [("match", [2, 3])]
    assert sim.view.findings.audit["end_waits"] is False and of(sim.tick(0.0), Finish)


def test_an_auditor_whose_fork_the_zygote_never_answered_has_its_interval_replayed_not_the_audit_stalled() -> None:
    """An auditor's fork given up on (the zygote died or stalled before it answered: an auditor comes from the zygote
    or not at all) started no auditor; the audit waited for it for the rest of the launch (no interval replayed
    again, a finished trainer's end held the whole END_WAIT_SECS). Its interval is replayed as a dead auditor's."""
    sim = Sim()
    sim.start_trainer(steps=5)
    audits, ex, said = _audited(sim, (100, 200))
    ex.defer = True
    audits.round()
    assert ex.forked == [(1, "100:200")]
    audits.round()  # (still asked: nothing)
    assert ex.forked == [(1, "100:200")] and audits.running == 1
    ex.pending.clear()  # the zygote died: the fork given up on, no auditor started
    audits.round()
    assert audits.running is None and audits.book.deaths.total == 1 and [r for r in said if r.event] == []
    assert any("fork was given up on" in r.say and "a fresh auditor replays them" in r.say for r in said), said
    ex.defer = False
    sim.now += RETRY_SECS
    audits.round()
    assert ex.forked == [(1, "100:200"), (2, "100:200")]


def test_an_auditor_let_run_with_no_cpu_used_is_hung_its_stopped_time_not_counted_and_a_starved_one_never() -> None:
    """Stillness.heard: an auditor whose CPU does not move for HUNG_SECS of the time it was let run is hung; the time
    the duty cycle kept it stopped (a switch at any moment between two readings) counts for nothing; a starved one
    whose CPU moves a little (SCHED_IDLE beside busy processes: 0.06 s in 12 s measured) is never hung."""
    s, t = stillness.Stillness(), 0.0
    assert s.heard(t, 1, 2.0, True) is None  # (the first reading)
    while t < stillness.HUNG_SECS - 1:
        t += 1.0
        assert s.heard(t, 1, 2.0, True) is None
    t += 1.0
    assert "used no CPU in 60 s of running" in (s.heard(t, 1, 2.0, True) or ""), s
    paused = stillness.Stillness()  # let run 1 s of every 5 (from 5m + 1.5 to 5m + 2.5), read every second
    paused.heard(0.0, 1, 2.0, False)
    for k in range(1, 201):
        if k % 5 in (2, 3):
            paused.switched(k - 0.5)
        assert paused.heard(float(k), 1, 2.0, k % 5 == 2) is None, (k, paused)
    assert paused.still == 20.0, paused  # (40 s let run: half of each counted, the half before a switch's reading)
    starved = stillness.Stillness()
    for k in range(600):
        assert starved.heard(float(k), 1, 2.0 + 0.005 * k, True) is None
    fresh = stillness.Stillness()  # another auditor: counted afresh
    fresh.heard(0.0, 1, 2.0, True)
    fresh.heard(50.0, 1, 2.0, True)
    assert fresh.heard(100.0, 2, 2.0, True) is None and fresh.still == 0.0


def half_the_time(audits: Auditors) -> None:
    """The duty cycle as a trainer that a running auditor slows 0.8 % leaves it: run half the time (its account allows
    that for good; with no sample it would charge duty.PRIOR, and let it run a twenty-fifth of the time)."""
    audits.duty.samples, audits.duty.duty = [0.992] * 3, 0.5


def test_the_watchdog_kills_a_hung_auditor_and_has_its_interval_replayed_by_a_fresh_one() -> None:
    """An auditor that never answers and never dies (a deadlock: it uses no CPU) held the audit for the rest of the
    launch, a finished trainer's end the whole END_WAIT_SECS (helper-102's finding). It is SIGKILLed once it has run
    HUNG_SECS without CPU (its duty cycle's stops not counted), and its interval replayed by a fresh auditor, the hang
    said as its death's reason."""
    sim = Sim()
    sim.start_trainer(steps=5)
    audits, ex, said = _audited(sim, (100, 200))
    audits.round()
    assert ex.forked == [(1, "100:200")]
    ex.cpu[1] = 3.0
    half_the_time(audits)
    for _ in range(8 * int(stillness.HUNG_SECS)):  # the trainer trains: the duty cycle stops it half the time
        sim.now += 0.5
        audits.round()
        if ex.performed:
            break
    assert ex.performed == [Kill(AUDITOR, 1, Cause.AUDIT, ex.performed[0].reason)], ex.performed
    assert "used no CPU" in ex.performed[0].reason and sim.now >= 2 * stillness.HUNG_SECS, sim.now  # (stops not counted)
    audits.round()
    assert len(ex.performed) == 1  # (killed once)
    sim.dies(AUDITOR, -9)
    audits.round()
    assert any("used no CPU" in r.say and "a fresh auditor replays them" in r.say for r in said), said
    sim.now += RETRY_SECS
    audits.round()
    assert ex.forked == [(1, "100:200"), (2, "100:200")] and sim.view.findings.audit["auditor_deaths"] == 1



def test_an_auditors_session_that_failed_before_s2_leaves_the_answer_to_the_programs_retry_a_few_times(
        monkeypatch) -> None:
    """TF's retry loop (the seeds' retry example: an AbortedError caught, a new session opened): the auditor's
    session that failed before S2 answered "the program ended at step K" and the interval went unaudited; it now
    leaves the answer to the next session (which restores S1 again), and answers at the process's exit only if the
    program opened none (the last failure's reason). A program that retries for ever (helper-106: its auditor failed
    325 times and held a finished trainer's end the whole 300 s) is answered at the FAILED_SESSIONS_MAX-th failure. A
    session that ended cleanly before S2 answers at once, as before; one at S2 compares. (By hand:
    seeds_tf1.retry --abort-at-step 330 under --audit every: both auditors aborted at 330, retried, and replayed 0-600
    bit-equal.)"""
    import atexit

    from procsv.trainer.audit import replay as replay_module

    at_exit: list[object] = []
    monkeypatch.setattr(atexit, "register", at_exit.append)
    monkeypatch.setattr(replay_module, "_failed", [])
    answered: list[str] = []
    ended: list[int] = []

    def session() -> replay_module.AuditReplay:  # each of the program's sessions: an AuditReplay of its own
        audit = replay_module.AuditReplay(None, (0, 600), None, None)  # type: ignore[arg-type]
        monkeypatch.setattr(audit, "end", ended.append)
        monkeypatch.setattr(audit, "_answer", lambda differ, state, error: answered.append(error))
        return audit

    first = session()
    first.stopped(330, failed=True)
    assert ended == [] and answered == [] and len(at_exit) == 1, (ended, answered, at_exit)
    session().stopped(0, failed=True)  # (the next session trained nothing: still the one after it)
    session().stopped(410, failed=True)
    at_exit[0]()  # type: ignore[operator]  # the program opened no other: its exit answers, with the last reason
    assert answered == ["the program's session ended with an error at step 410, before step 600, and it opened no "
                        "other"] and len(at_exit) == 1
    session().stopped(330, failed=True)  # the third failure: no more waiting for the program's retries
    assert answered[1:] == ["the program's session ended with an error at step 330, before step 600, 3 times"]
    session().stopped(330, failed=False)  # a clean end before S2: answered now (end says the program ended short)
    session().stopped(600, failed=True)  # at S2: compared whatever ended it
    assert ended == [330, 600]


def test_a_groups_fault_kept_outside_its_checkpoint_is_rolled_back_on_trial_and_a_program_that_does_not_replay_once() -> None:
    """A group's checkpoint is its chief's: a bit flipped in a worker's copy of the weights stays in that worker, so every
    interval after it differs too (measured: the audit switched itself off, the fault taken for a program that does not
    replay). In a group the second differing interval rolls back once to the first's start, on trial, no host blamed;
    the next interval the group ran on from before its start decides: it matches (the fault was the group's: a trainer
    verdict, its rollback made already); it differs (the program does not replay: off, and no second rollback)."""
    def group_book() -> AuditBook:
        book = AuditBook(mode=AuditMode.EVERY, group=True)
        for s in (100, 200, 300):
            committed(book, s, f"/l/model.ckpt-{s}", eligible=True, attempt=1)
        assert judge(book, BAD, BAD).verdict == Verdict.UNDECIDED
        trial = judge(book, BAD, BAD)
        assert trial.verdict == Verdict.TRIAL and (trial.interval.start, trial.interval.end) == (100, 200)
        assert trial.rollback_before == 101 and "on trial" in trial.line and "{host}" not in trial.line
        assert not book.off and holds(book) == [100]  # (where it rolls back: kept until restored)
        rb = rollback(trial, 1, True, False, False, 300, "h")
        assert rb is not None and rb.before == 101 and "on trial" in rb.why and "computed" not in rb.why
        rolled_back(book, trial)
        for s, attempt in ((150, 2), (250, 2)):  # trained again from 100: first an interval from where it began
            committed(book, s, f"/l/model.ckpt-{s}", eligible=True, attempt=attempt, began=100)
        assert [i.resumed for i in book.queue] == [True, False]
        assert judge(book, GOOD).verdict == Verdict.MATCH and book.known.trial is not None  # (resumed: proves nothing)
        return book

    fault = group_book()
    confirmed = judge(fault, GOOD)  # the group computed 100-200 wrongly: it replays as it ran, now
    assert confirmed.verdict == Verdict.TRAINER and (confirmed.interval.start, confirmed.interval.end) == (100, 200)
    assert confirmed.made and confirmed.rollback_before is None and "rolled back to step 100 on trial" in confirmed.line
    assert rollback(confirmed, 2, True, False, False, 250, "h") is None  # (made already: nothing rolled back again)
    assert fault.known.exact and fault.known.trial is None and fault.anchor == 250 and fault.audited_steps == 150
    assert [v.verdict for v in fault.verdicts[-2:]] == [Verdict.MATCH, Verdict.TRAINER]  # (250's match kept too)

    inexact = group_book()
    off = judge(inexact, BAD, BAD)  # it differs again after the trial: the program's state is not all in its checkpoint
    assert off.verdict == Verdict.NONDETERMINISTIC and off.rollback_before is None and "on trial" in inexact.off
    assert not any(v.verdict == Verdict.TRAINER for v in inexact.verdicts) and holds(inexact) == []

    alone = AuditBook(mode=AuditMode.EVERY)  # a single trainer: its wrong bit is in its checkpoint, no trial (as before)
    for s in (100, 200, 300):
        committed(alone, s, f"/l/model.ckpt-{s}", eligible=True, attempt=1)
    judge(alone, BAD, BAD)
    assert judge(alone, BAD, BAD).verdict == Verdict.NONDETERMINISTIC and alone.known.trial is None

    ends = group_book()  # the run ends with the trial undecided: its rollback stands, no verdict on it
    left = ends.ended()
    assert left is not None and left.verdict == Verdict.UNAUDITED and "trial's rollback stands" in left.line


def test_a_group_auditors_member_is_named_by_its_task_in_its_exit_record_as_in_its_spawned_one() -> None:
    """A group's replay member ``auditor1``: its ``spawned`` record said auditor1, its ``exited`` one said ``auditor``
    (measured: a launch's two exits of attempt 1 both 'auditor', none 'auditor1'), so a reader
    pairing them by role and attempt found the chief's exit twice and auditor1's never."""
    from procsv.watchdog.rules.failures import Failure

    sim = Sim()
    said = observe.spawned(sim.view, auditor_slot(1), AUDITOR, 1, 4321, sim.now, "zygote")
    assert said[0].fields["role"] == "auditor1"
    ended = observe.reaped(sim.view, auditor_slot(1), 1, Failure(AUDITOR, 1, 4321, -9, 0.0, "log"), sim.now)
    assert [r.fields["role"] for r in ended if r.event == Event.EXITED] == ["auditor1"]


def test_a_trial_that_finds_no_group_running_leaves_its_candidate_undecided_and_the_next_match_rolls_back() -> None:
    """A trial verdict reached while the group is between attempts (a member died; rollback() makes none): nothing is
    rolled back. Before, the trial stayed all the same, the restarted group (consistent from the chief's checkpoint of
    300) matched from 400 on, and that match confirmed it as 'rolled back to step 100 on trial' with nothing rolled
    back (rollback_before None): the wrong steps 100-300 kept. Now its candidate waits again, and that match is a
    trainer verdict with a rollback to 100 of its own."""
    book = AuditBook(mode=AuditMode.EVERY, group=True)
    for s in (100, 200, 300):
        committed(book, s, f"/l/model.ckpt-{s}", eligible=True, attempt=1)
    judge(book, BAD, BAD)
    trial = judge(book, BAD, BAD)
    assert trial.verdict == Verdict.TRIAL and rollback(trial, 1, False, False, False, 300, "h") is None  # (dead)
    book.untried()
    assert book.known.trial is None and book.known.candidate is not None and 100 in holds(book)
    for s in (400, 500):  # the group restarted from 300, its newest checkpoint
        committed(book, s, f"/l/model.ckpt-{s}", eligible=True, attempt=2, began=300)
    assert judge(book, GOOD).verdict == Verdict.MATCH  # (resumed: proves nothing)
    confirmed = judge(book, GOOD)
    assert confirmed.verdict == Verdict.TRAINER and not confirmed.made and confirmed.rollback_before == 101
    rb = rollback(confirmed, 2, True, False, False, 500, "h")
    assert rb is not None and rb.before == 101


def test_under_audit_sampled_a_groups_trial_is_decided_by_the_next_interval_not_the_next_sample() -> None:
    """``--audit sampled`` replays the first two intervals and then one in 16; an undecided candidate has the next
    interval the trainer ran on replayed whatever the sample says. A group's trial waits the same way: before, the
    interval after its rollback was not sampled, so the trial waited for the next sample (12 intervals on here; a run
    that ended first kept the rollback with no verdict, no host named, and a program that does not replay kept its
    audit on meanwhile)."""
    book = AuditBook(mode=AuditMode.SAMPLED, group=True)
    for s in (100, 200, 300):
        committed(book, s, f"/l/model.ckpt-{s}", eligible=True, attempt=1)
    assert judge(book, BAD, BAD).verdict == Verdict.UNDECIDED
    trial = judge(book, BAD, BAD)
    assert trial.verdict == Verdict.TRIAL
    rolled_back(book, trial)
    for s in (150, 250):  # trained again from 100: the interval from where it began, then one it ran on (index 3)
        committed(book, s, f"/l/model.ckpt-{s}", eligible=True, attempt=2, began=100)
    assert [(i.start, i.end, i.resumed) for i in book.queue] == [(150, 250, False)]  # (the resumed one: not sampled)
    confirmed = judge(book, GOOD)
    assert confirmed.verdict == Verdict.TRAINER and confirmed.made and book.known.trial is None
    committed(book, 350, "/l/model.ckpt-350", eligible=True, attempt=2)  # decided: sampled as before (index 4: not)
    assert book.queue == []


def test_a_groups_replay_takes_as_many_auditors_as_members_on_one_host_or_over_hosts_and_none_with_ps_or_elastic() -> None:
    """A group over hosts (``--nnodes 2``, 4 members in all) is replayed by a group of 4 auditors on node 0 (before:
    none, the audit off for the launch)."""
    from procsv.watchdog.audit.auditors import replayers

    assert replayers(1, 1, False) == (1, None) and replayers(3, 1, False) == (3, None)
    assert replayers(4, 2, False) == (4, None)
    assert replayers(2, 1, True)[0] == 0
    members, why = replayers(2, 2, False, elastic=True)  # (an interval a smaller group trained replays otherwise)
    assert members == 0 and why is not None and "--min-nodes" in why


def test_a_groups_replay_is_one_auditor_a_members_death_is_its_death_and_the_rest_is_killed() -> None:
    """--nproc 2 on one host: each interval is replayed by a group of two auditors (auditor, auditor1). worker 1 of the
    replay SIGKILLed: the replay died (its chief, left waiting in a collective, killed), and a fresh group replays
    the interval after the wait; a worker that exits 0 after its chief's answer is no death; the duty cycle never
    stops one member without the other."""
    sim = Sim()
    sim.start_trainer(steps=5)
    ex, said = _Ex(sim), []  # type: ignore[var-annotated]
    ex.reap_kills = True
    audits = Auditors("every", ex, sim.view, 2, said.extend, lambda msg: None)  # type: ignore[arg-type]
    assert audits.members == 2 and not audits.book.off and audits.book.group
    for s in (100, 200):
        audits.heard(SaveResult(s, SaveReason.PERIODIC, True, f"/l/model.ckpt-{s}", None, 0.1, attempt=1))
    audits.round()
    assert ex.forked == [(1, "100:200")] and {AUDITOR, "auditor1"} <= set(sim.view.children)
    sim.dies("auditor1", -9)
    audits.round()
    assert [(a.slot, a.attempt) for a in ex.performed if isinstance(a, Kill)] == [(AUDITOR, 1)]  # its chief, left
    assert audits.book.deaths.total == 1 and audits.running is None
    assert any("the auditors' member auditor1 was killed by SIGKILL" in r.say for r in said), [r.say for r in said]
    sim.now += RETRY_SECS
    audits.round()
    assert ex.forked == [(1, "100:200"), (2, "100:200")]
    audits.heard(AuditResult(1020, 2, 100, 200, [], "aaaa", "h"))  # (the first interval: replayed twice)
    sim.dies(AUDITOR, 0)
    sim.dies("auditor1", 0)
    audits.round()
    assert audits.book.deaths.total == 1 and ex.forked[-1] == (3, "100:200")  # no death: the second replay
    assert audits.running == 3 and [p for p in ex.paused if p[1] == 3] in ([], [(AUDITOR, 3, True), ("auditor1", 3, True)])


def test_a_group_replays_one_dead_member_is_one_death_however_many_rounds_its_chief_takes_to_be_reaped() -> None:
    """worker 1 of a group's replay SIGKILLed (by hand: kill -9 of auditor1, digits --nproc 2 --audit every): the
    replay died once. Before, every round until each member was reaped counted it again (the dead member, then the
    chief the watchdog SIGKILLed when it was reaped: 'a fresh auditor replays them in 1.0 s', '... in 2.0 s', then
    'no verdict (3 auditors died before their answer ...)': one kill left the interval unaudited)."""
    sim = Sim()
    sim.start_trainer(steps=5)
    ex, said = _Ex(sim), []  # type: ignore[var-annotated]
    audits = Auditors("every", ex, sim.view, 2, said.extend, lambda msg: None)  # type: ignore[arg-type]
    for s in (100, 200):
        audits.heard(SaveResult(s, SaveReason.PERIODIC, True, f"/l/model.ckpt-{s}", None, 0.1, attempt=1))
    audits.round()
    sim.dies("auditor1", -9)
    audits.round()  # the replay died: its chief SIGKILLed, not reaped yet
    assert [(a.slot, a.attempt) for a in ex.performed if isinstance(a, Kill)] == [(AUDITOR, 1)]
    sim.view.children[AUDITOR].killed = True  # (as the executor marks a child it sent SIGKILL)
    for _ in range(3):
        audits.round()  # (rounds before the chief's reap)
    sim.dies(AUDITOR, -9)  # reaped: killed by the watchdog, for the replay's death
    audits.round()
    assert audits.book.deaths.total == 1 and audits.running is None and not audits.book.verdicts
    assert len([r for r in said if "a fresh auditor replays them" in r.say]) == 1, [r.say for r in said]
    sim.now += RETRY_SECS
    audits.round()
    assert ex.forked == [(1, "100:200"), (2, "100:200")]


def test_a_group_replay_with_one_member_stopped_is_hung_though_the_others_wait_using_cpu() -> None:
    """A replay member stopped by someone else (SIGSTOP; not the duty cycle) leaves the others waiting in a collective,
    whose threads still use CPU. Their CPU summed kept moving: the replay was never found hung, and a finished run's
    end waited the whole END_WAIT_SECS (found by an attack, by hand). Each member is read apart: one still for
    HUNG_SECS of let-run time makes the replay hung, named, every member killed, and a fresh group replays it."""
    s = stillness.Stillness()
    t = 0.0
    assert s.heard(t, 1, [2.0, 3.0], True, ["auditor", "auditor1"]) is None
    while t < stillness.HUNG_SECS - 1:
        t += 1.0
        assert s.heard(t, 1, [2.0 + 0.01 * t, 3.0], True, ["auditor", "auditor1"]) is None
    t += 1.0
    why = s.heard(t, 1, [2.0 + 0.01 * t, 3.0], True, ["auditor", "auditor1"])
    assert why == "the auditors' member auditor1 used no CPU in 60 s of running (hung)", why

    sim = Sim()
    sim.start_trainer(steps=5)
    ex, said = _Ex(sim), []  # type: ignore[var-annotated]
    audits = Auditors("every", ex, sim.view, 2, said.extend, lambda msg: None)  # type: ignore[arg-type]
    for step in (100, 200):
        audits.heard(SaveResult(step, SaveReason.PERIODIC, True, f"/l/model.ckpt-{step}", None, 0.1, attempt=1))
    audits.round()
    assert audits.running == 1
    half_the_time(audits)
    for _ in range(8 * int(stillness.HUNG_SECS)):  # the trainer trains: the duty cycle stops them half the time
        sim.now += 0.5
        ex.cpu[1] = ex.cpu.get(1, 2.0) + 0.01  # the chief waits in a collective: its threads use CPU
        audits.round()
        if ex.performed:
            break
    kills = [(a.slot, a.attempt) for a in ex.performed if isinstance(a, Kill)]
    assert sorted(kills) == [(AUDITOR, 1), ("auditor1", 1)], kills
    assert "member auditor1 used no CPU" in ex.performed[0].reason


def test_a_trainer_verdict_reached_while_the_run_stops_says_that_nothing_is_rolled_back_and_which_checkpoints_stay(
        ) -> None:
    """SIGTERM to the launch between a mismatch and its second replay: the trainer commits its stop's checkpoint (450)
    and exits; the second replay agrees with the first after the run's end was decided. No trainer may start again in
    this launch, so nothing is rolled back; the verdict's own line says 'rolling back to step 200'. Before, nothing
    more was said: the checkpoints of the wrong timeline (300, 400 and the stop's 450) stayed, and a launch again
    resumed 450, the fault kept (measured by hand, digits under --audit every, SIGTERM after the mismatch line: the
    stop's checkpoint was the wrong timeline's). Now one line says nothing is rolled back and which checkpoints stay."""
    sim, audits, ex, said, told = _stopped_after_a_mismatch()
    audits.heard(AuditResult(1004, 4, 200, 300, list(BAD.differ), BAD.digest, "a"))
    assert [r.fields["verdict"] for r in said if r.event == Event.AUDIT][-1] == "trainer"
    assert sim.view.rollback_before is None and not [a for a in ex.performed if isinstance(a, Kill)]
    assert not [m for m in told if isinstance(m, AuditQuarantine)]
    assert said[-1].say == ("procsv: audit: the run is stopping, so nothing is rolled back to step 200 in this launch: "
                            "the checkpoint(s) of step(s) 300, 400, 450, committed after step 200, hold the state "
                            "computed wrongly; launching again with --audit replays steps 200-300 first and rolls back "
                            "to step 200 (without it, the newest is resumed, the fault kept)")
    left = ex.carries[-1]  # the interval left to the next launch, with what waited behind it
    assert left["pending"][0][:2] == [200, 300] and left["newest"] == 450 and left["exact"] is True, left


def test_a_trainer_verdict_during_a_stops_grace_kills_the_trainer_before_its_stop_checkpoint_and_says_so() -> None:
    """SIGTERM to the launch, the trainer still writing its stop's checkpoint when the second replay agrees with the
    first: the trainer is killed (its stop's checkpoint would hold the state computed wrongly), 300 and 400
    quarantined, no restart follows (a stop was asked). Before, the only line was the verdict's, ending 'rolling back
    to step 200', and the run ended with no word that nothing trains again: now one line says the trainer is killed
    before its stop's checkpoint and that launching again resumes from step 200."""
    import signal

    sim, audits, ex, said, told = _to_a_mismatchs_second_replay()
    observe.stop_requested(sim.view, signal.SIGTERM, sim.now, 120.0)
    sim.tick(0.1)
    audits.heard(AuditResult(1004, 4, 200, 300, list(BAD.differ), BAD.digest, "a"))
    assert [(a.slot, a.attempt) for a in ex.performed if isinstance(a, Kill)] == [(TRAINER, 1)]
    assert [list(m.steps) for m in told if isinstance(m, AuditQuarantine)] == [[300, 400]]
    assert ("procsv: audit: the run is stopping: the trainer is killed before its stop's checkpoint, which would hold "
            "the state computed wrongly; launching again resumes from step 200") in [r.say for r in said]


def test_intervals_a_stop_left_unjudged_are_replayed_first_by_the_next_launch_which_rolls_back_and_quarantines(
        ) -> None:
    """A stop (SIGTERM, a preemption) between a fault and its verdict: interval 200-300's first replay differed, the
    trainer wrote its stop's checkpoint 450 and exited, and the shutdown killed the second replay's auditor. Before,
    the interval was said unaudited and forgotten; the next launch resumed 450, the wrong state, and its audit began
    at its own first commit: the fault passed for good. Now the launch leaves 200-300 and the intervals queued
    behind it to the next launch (``.procsv/audit.json``), whose audit replays them first, holds their checkpoints,
    and on the verdict rolls its trainer back to step 200 and quarantines every checkpoint after it, the earlier
    launch's (300, 400, 450) included; the interval from 450 to its own first commit is audited too."""
    from procsv.ipc.messages import Hello, Role

    sim, audits, ex, said, told = _stopped_after_a_mismatch()
    sim.dies(AUDITOR, -15)  # the shutdown's SIGTERM: auditor 4 ends without its answer
    audits.round()
    last = [r for r in said if r.event == Event.AUDIT][-1]
    assert last.fields["verdict"] == "unaudited" and "left to the next launch with --audit" in last.say, last
    left = json.loads(json.dumps(ex.carries[-1]))  # (as the file holds it)
    assert [p[:2] for p in left["pending"]] == [[200, 300], [300, 400], [400, 450]], left
    assert left["newest"] == 450 and left["exact"] is True

    sim2 = Sim()  # the next launch; its trainer resumes 450
    ex2, said2, told2 = _Ex(sim2), [], []  # type: ignore[var-annotated]
    ex2.left, ex2.on_disk = left, {s: f"/l/model.ckpt-{s}" for s in (100, 200, 300, 400, 450)}
    audits2 = Auditors("every", ex2, sim2.view, 1, said2.extend, told2.append)  # type: ignore[arg-type]
    assert ("procsv: audit: steps 200-300, 300-400, 400-450, committed by an earlier launch and not audited yet: "
            "replayed first") in [r.say for r in said2]
    assert holds(audits2.book) == [200, 300, 400, 450]  # retention keeps them for the replays
    audits2.heard(Hello(Role.CHECKPOINT, 1, 1))
    sim2.start_trainer(steps=5)
    audits2.heard(SaveResult(500, SaveReason.PERIODIC, True, "/l/model.ckpt-500", None, 0.1, attempt=1))
    sim2.commit(500)
    assert audits2.book.queue[-1].start == 450 and audits2.book.queue[-1].resumed  # from the newest: audited too
    for answer in (BAD, BAD):  # two replays agree, not with the trainer: the program was known to replay exactly
        audits2.round()  # (four waiting: the oldest two merged, as a launch's own are when its auditor falls behind)
        assert ex2.forked[-1][1] == "200:400"
        audits2.heard(AuditResult(1000 + audits2.attempt, audits2.attempt, 200, 400, list(answer.differ),
                                  answer.digest, "a"))
        sim2.dies(AUDITOR, 0)
    assert [r.fields["verdict"] for r in said2 if r.event == Event.AUDIT][-1] == "trainer"
    assert [(a.slot, a.attempt) for a in ex2.performed if isinstance(a, Kill)] == [(TRAINER, 1)]
    assert sim2.view.rollback_before is not None and sim2.view.rollback_before[0] == 201
    assert [(m.after, list(m.steps)) for m in told2 if isinstance(m, AuditQuarantine)] == [(200, [300, 400, 450, 500])]
    assert ex2.carries[-1]["pending"] == [] and ex2.carries[-1]["newest"] == 200  # (the new timeline starts there)


def test_what_an_earlier_launch_left_is_taken_where_its_checkpoints_are_on_disk_and_said_otherwise() -> None:
    """An interval whose checkpoint is gone (retention while the audit was off, a person) cannot be replayed: said,
    counted as dropped; the newest commit is where the next interval starts only while it is the newest on disk (the
    new trainer resumes from it); a file of another layout (a group's audit, a single trainer's now) or version, or
    one not readable, is said and left, and so is one of another program or other arguments (its replays would
    differ without a fault: a false verdict, the user's work rolled back); a launch without the audit takes nothing; what a book leaves, taken back,
    is the same intervals (their flags kept)."""
    book = _book(steps=(100, 200, 300))
    assert all(i.resumed for i in book.queue)  # (commits of no attempt said: each a fresh start)
    book.queue[:1] = [replace_interval(book.queue[0], resumed=False)]
    left = carried(book)
    again = AuditBook(mode=AuditMode.EVERY)
    on_disk = {s: f"/m/model.ckpt-{s}" for s in (100, 200, 300)}
    assert carry_in(again, left, on_disk) == [
        "procsv: audit: steps 100-200, 200-300, committed by an earlier launch and not audited yet: replayed first"]
    assert [(i.start, i.end, i.resumed, i.end_path) for i in again.queue] == [
        (100, 200, False, "/m/model.ckpt-200"), (200, 300, True, "/m/model.ckpt-300")]
    assert again.last is not None and again.last.step == 300 and again.commits == {200: 0, 300: 0}

    gone = AuditBook(mode=AuditMode.EVERY)
    said = carry_in(gone, left, {100: "/m/model.ckpt-100", 300: "/m/model.ckpt-300", 400: "/m/model.ckpt-400"})
    assert said == ["procsv: audit: steps 100-200 of an earlier launch were not audited and cannot be: the checkpoint(s) "
                    "of step(s) 200 are gone",
                    "procsv: audit: steps 200-300 of an earlier launch were not audited and cannot be: the checkpoint(s) "
                    "of step(s) 200 are gone"]
    assert gone.queue == [] and gone.dropped_steps == 200 and gone.last is None  # (400 is newer: resumed from there)

    other = AuditBook(mode=AuditMode.EVERY, known=Exactness(program='["train.py", "--lr", "0.1", "ab12"]'))
    assert carry_in(other, left, on_disk) == [
        "procsv: audit: an earlier launch's audit of another program or other arguments (not said by the earlier "
        "launch: a replay by this one could differ from its checkpoints without a fault) left 2 interval(s) "
        "unaudited: not audited in this launch"]
    assert not other.queue and other.last is None and not other.commits
    ran = '["train.py", "--steps", "1500", "--lr", "0.1", "ab12"]'  # (the line says what differs: the user's to judge)
    for now, change in (('["train.py", "--steps", "3000", "--lr", "0.1", "ab12"]', "arguments: --steps 1500 then, "
                         "--steps 3000 now"),
                        ('["train.py", "--steps", "1500", "--lr", "0.1", "--warm", "ab12"]', "arguments: (none) then, "
                         "--warm now"),
                        ('["train.py", "--steps", "1500", "--lr", "0.1", "cd34"]', "train.py's source edited since"),
                        ('["tune.py", "--steps", "1500", "--lr", "0.1", "ab12"]', "TARGET train.py then, tune.py now")):
        relaunch = AuditBook(mode=AuditMode.EVERY, known=Exactness(program=now))
        assert carry_in(relaunch, {**left, "program": ran}, on_disk) == [
            f"procsv: audit: an earlier launch's audit of another program or other arguments ({change}: a replay by "
            "this one could differ from its checkpoints without a fault) left 2 interval(s) unaudited: not audited in "
            "this launch"], now
        assert not relaunch.queue and relaunch.last is None
    moved = AuditBook(mode=AuditMode.EVERY, known=Exactness(platform="TensorFlow 2.21.0, AMD EPYC (1 CPUs, flags ad39)"))
    assert carry_in(moved, {**left, "platform": "TensorFlow 2.21.0, AMD EPYC (2 CPUs, flags ad39)"}, on_disk) == [
        "procsv: audit: an earlier launch's audit on another machine or TensorFlow (TensorFlow 2.21.0, AMD EPYC (2 CPUs, "
        "flags ad39) then, TensorFlow 2.21.0, AMD EPYC (1 CPUs, flags ad39) now: a replay here could differ from its "
        "checkpoints without a fault, the floating-point kernels chosen otherwise) left 2 interval(s) unaudited: not "
        "audited in this launch"]  # (a preempted run relaunched on a smaller VM: no false verdict)
    assert not moved.queue and moved.last is None and not moved.commits
    assert carried(moved)["platform"] == moved.known.platform
    group = AuditBook(mode=AuditMode.EVERY, group=1)
    assert carry_in(group, left, on_disk) == ["procsv: audit: an earlier launch's audit of another layout left 2 "
                                              "interval(s) unaudited: not audited in this launch"] and not group.queue
    bad = AuditBook(mode=AuditMode.EVERY)
    assert "is not readable" in carry_in(bad, {"pending": [["x"]]}, on_disk)[0] and not bad.queue
    written = json.loads(json.dumps(left))  # (as the file holds it)
    for edit in ({"pending": [[float("inf"), 200, False, False, 0]]}, {"pending": [[100.7, 200, False, False, 0]]},
                 {"pending": [[200, 100, False, False, 0]]}, {"pending": [[True, 200, False, False, 0]]},
                 {"pending": [["100", "200", False, False, 0]]}, {"pending": {"100": 200}}, {"newest": 300.0},
                 {"group": None}, {"exact": "yes"}):  # (a file edited by hand: none is read as another interval)
        book = AuditBook(mode=AuditMode.EVERY)
        assert carry_in(book, {**written, **edit}, on_disk) == [
            "procsv: audit: what an earlier launch's audit left (.procsv/audit.json) is not readable; its intervals, "
            "if any, are not audited"], edit
        assert not book.queue and book.last is None and not book.commits and book.dropped_steps == 0, edit
    for garbage in ([], 5, "audit", [written]):  # (JSON, not what a launch writes: said, not silently taken as nothing)
        assert "is not readable" in carry_in(AuditBook(mode=AuditMode.EVERY), garbage, on_disk)[0], garbage
    assert carry_in(AuditBook(mode=AuditMode.EVERY), None, on_disk) == []  # (no file: an audit's first launch)
    # many stop/relaunch cycles: every launch's first interval is a resumed one, which no merge crosses; more than
    # wait for an auditor were said "replayed first" and the oldest dropped silently, uncounted
    many = {**left, "newest": 200, "pending": [[s, s + 10, True, True, 0] for s in range(10, 200, 10)]}
    book = AuditBook(mode=AuditMode.EVERY)
    said = carry_in(book, many, {s: f"/m/model.ckpt-{s}" for s in range(10, 201, 10)})
    assert [(i.start, i.end) for i in book.queue] == [(170, 180), (180, 190), (190, 200)] and QUEUE_MAX == 3
    assert said == [f"procsv: audit: steps {', '.join(f'{s}-{s + 10}' for s in range(10, 170, 10))} of an earlier "
                    "launch were not audited and will not be: more intervals were left than wait for an auditor (at "
                    "most 3; the oldest dropped, counted in status.json's audit.dropped_steps)",
                    "procsv: audit: steps 170-180, 180-190, 190-200, committed by an earlier launch and not audited "
                    "yet: replayed first"], said
    assert book.dropped_steps == 160 and book.commits == {s: 0 for s in range(180, 201, 10)}
    assert carry_in(AuditBook(mode=AuditMode.EVERY), written, on_disk) == carry_in(AuditBook(mode=AuditMode.EVERY),
                                                                                   left, on_disk)
    assert carry_in(AuditBook(mode=AuditMode.OFF), left, on_disk) == []
    sim = Sim()
    ex, said2 = _Ex(sim), []  # type: ignore[var-annotated]
    ex.left = ...  # (a file there that cannot be read)
    Auditors("every", ex, sim.view, 1, said2.extend, lambda msg: None)  # type: ignore[arg-type]
    assert [r.say for r in said2] == ["procsv: audit: .procsv/audit.json (what an earlier launch's audit left) cannot "
                                      "be read; its intervals, if any, are not audited"]


def replace_interval(interval, **changes):  # type: ignore[no-untyped-def]
    import dataclasses

    return dataclasses.replace(interval, **changes)


def test_the_programs_fingerprint_changes_with_its_arguments_and_its_source(tmp_path) -> None:
    """What the carried intervals are compared by (``config.program_fingerprint``): a relaunch of the same command is
    the same program; other arguments, or the script edited between the launches, are not (its replays of the earlier
    launch's intervals would differ without a fault)."""
    from procsv.watchdog.config import program_fingerprint

    script = tmp_path / "train.py"
    script.write_text("print('step')\n")
    same = program_fingerprint("train.py", ["--lr", "0.1"], str(tmp_path))
    assert same == program_fingerprint("train.py", ["--lr", "0.1"], str(tmp_path))
    assert same != program_fingerprint("train.py", ["--lr", "0.2"], str(tmp_path))
    script.write_text("print('another step')\n")
    assert same != program_fingerprint("train.py", ["--lr", "0.1"], str(tmp_path))
    module = program_fingerprint("procsv.examples.digits", [], str(tmp_path))
    assert module == program_fingerprint("procsv.examples.digits", [], str(tmp_path)) and '""]' not in module


def test_a_launch_without_the_audit_keeps_an_earlier_launchs_unjudged_intervals_checkpoints_for_the_next_with_it(
        ) -> None:
    """Measured before: digits, a bit flipped at 250, the watchdog killed as 400 commits (100-400 left unjudged), a
    launch without --audit to 1200 whose retention kept 800-1200: the next launch with --audit found 100-400 gone,
    said so, and ended with other weights than a clean run, the fault passed for good. Now a launch without --audit
    holds their checkpoints from retention (told at its start and again at a checkpoint service's hello), with one
    line; not another program's, another layout's or a file not readable (nothing held, nothing said)."""
    from procsv.ipc.messages import AuditHold, Hello, Role

    book = _book(steps=(100, 200, 300, 400))
    left = json.loads(json.dumps({**carried(book), "program": '["t.py", "ab"]'}))  # (as the file holds it)
    on_disk = {s: f"/l/model.ckpt-{s}" for s in (200, 300, 400)}  # (100 already gone)
    assert kept_for_later(left, '["t.py", "ab"]', 0, on_disk) == ([200, 300, 400], [
        "procsv: audit: steps 200-300, 300-400, committed by an earlier launch under --audit, are not audited yet and "
        "this launch runs without it: their checkpoints (step(s) 200, 300, 400) are kept past retention until a launch "
        "with --audit replays them (removing .procsv/audit.json lets them go)"])
    for other in ((left, '["t.py", "--lr", "0.2", "ab"]', 0), (left, '["t.py", "ab"]', 2), (None, '["t.py", "ab"]', 0),
                  ({**left, "pending": [[1.5, 2, False, False, 0]]}, '["t.py", "ab"]', 0),
                  ({**left, "pending": []}, '["t.py", "ab"]', 0)):
        assert kept_for_later(other[0], other[1], other[2], on_disk) == ([], []), other

    sim = Sim()
    ex, said, told = _Ex(sim), [], []  # type: ignore[var-annotated]
    ex.left, ex.on_disk = left, on_disk
    audits = Auditors("off", ex, sim.view, 1, said.extend, told.append, program='["t.py", "ab"]')  # type: ignore[arg-type]
    assert [r.say for r in said] == kept_for_later(left, '["t.py", "ab"]', 0, on_disk)[1]
    assert told == [AuditHold([200, 300, 400])]
    audits.heard(SaveResult(500, SaveReason.PERIODIC, True, "/l/model.ckpt-500", None, 0.1, attempt=1))
    audits.heard(Hello(Role.CHECKPOINT, 1, 1))  # (a restarted checkpoint service: told again)
    assert told == [AuditHold([200, 300, 400])] * 2 and ex.carries == []  # (the file is left as it is)
    ex2, said2, told2 = _Ex(sim), [], []  # type: ignore[var-annotated]
    ex2.left, ex2.on_disk = ..., on_disk  # (a file that cannot be read: a launch with --audit says so; this holds none)
    Auditors("off", ex2, sim.view, 1, said2.extend, told2.append, program='["t.py", "ab"]')  # type: ignore[arg-type]
    assert said2 == [] and told2 == []
