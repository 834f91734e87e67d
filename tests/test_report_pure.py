"""``procsv report``'s reading of lifecycle events (pure: records in, restarts out)."""

from __future__ import annotations

from procsv.report import event_series, last_launch, restarts


def _ev(t: float, event: str, **fields: object) -> dict[str, object]:
    return {"time": t, "event": event, **fields}


def test_restarts_carry_their_cause_label_and_what_was_restored():
    events = [
        _ev(0.0, "launch", target="t", args=[], pid=1),
        _ev(1.0, "spawned", role="trainer", attempt=1, pid=10, via="zygote"),
        _ev(2.0, "first_step", pid=10, step=1, secs_since_spawn=1.0),
        _ev(5.0, "chaos_kill", role="trainer", pid=10, signal="SIGKILL"),
        _ev(5.1, "death_noticed", role="trainer", attempt=1, pid=10, noticed=5.05),
        _ev(5.1, "restarting", attempt=2, delay=0.0, error="trainer attempt 1 (pid 10) died"),
        _ev(5.2, "exited", role="trainer", attempt=1, pid=10, noticed=5.05, signal="SIGKILL"),
        _ev(5.5, "restored", pid=11, step=40, path="p", secs=0.25, skipped=[]),
        _ev(9.0, "hang_detected", pid=11, attempt=2, step=77, reason="no step for 3 s"),
        _ev(9.5, "exited", role="trainer", attempt=2, pid=11, noticed=9.5, code=42),
        _ev(9.5, "restarting", attempt=3, delay=0.0, error="trainer attempt 2 (pid 11) exited with code 42"),
        _ev(9.9, "restored", pid=12, step=77, path="p", secs=0.5, skipped=[]),
        _ev(12.0, "exited", role="trainer", attempt=3, pid=12, noticed=12.0, code=42),
        _ev(12.0, "restarting", attempt=4, delay=0.0, error="preempted"),
        _ev(12.4, "restored", pid=13, step=90, path="p", secs=0.1, skipped=[]),
    ]
    got = restarts(events)
    assert [(r.attempt, r.label, r.restored_step, r.at) for r in got] == [
        (2, "chaos SIGKILL", 40, 5.05), (3, "hang", 77, 9.5), (4, "preempted", 90, 12.0)]
    assert got[0].cause == "trainer attempt 1 (pid 10) was killed by SIGKILL (chaos: SIGKILL)"
    assert got[1].cause == "trainer attempt 2 (pid 11) exited with code 42 (hung: no step for 3 s)"
    assert got[2].cause.startswith("trainer attempt 3 was preempted")
    assert event_series(events) == [(2.0, 1), (5.5, 40), (9.0, 77), (9.9, 77), (12.4, 90)]


def test_a_groups_restart_on_a_workers_death_notice_blames_that_worker_not_the_chief_killed_after_it():
    # with a standby group ready, worker1's death notice restarts the group and the chief is SIGKILLed at once
    # (group_now): before, the report's line said the chief was killed, from the chief's exited record
    events = [
        _ev(0.0, "launch", target="t", args=[], pid=1),
        _ev(1.0, "spawned", role="trainer", attempt=1, pid=10, via="zygote"),
        _ev(1.0, "spawned", role="worker1", attempt=1, pid=20, via="zygote"),
        _ev(5.1, "death_noticed", role="worker1", attempt=1, pid=20, noticed=5.05),
        _ev(5.1, "restarting", attempt=2, delay=0.0, error="worker1 attempt 1 (pid 20) died"),
        _ev(5.15, "exited", role="trainer", attempt=1, pid=10, noticed=5.12, signal="SIGKILL"),
        _ev(5.2, "exited", role="worker1", attempt=1, pid=20, noticed=5.05, signal="SIGKILL"),
        _ev(5.3, "restored", pid=11, step=50, path="p", secs=0.05, skipped=[], source="memory"),
    ]
    got = restarts(events)
    assert [(r.attempt, r.label, r.restored_step, r.at) for r in got] == [(2, "SIGKILL", 50, 5.05)]
    assert got[0].cause == "worker1 attempt 1 (pid 20) was killed by SIGKILL", got[0].cause


def test_only_the_last_launch_counts():
    events = [_ev(0.0, "launch"), _ev(1.0, "restarting", attempt=2), _ev(5.0, "launch"), _ev(6.0, "first_step", step=1)]
    assert last_launch(events) == events[2:]
    assert restarts(last_launch(events)) == []


def test_a_ps_launch_reports_restarts_per_task_and_the_workers_given_up_on():
    # issue 43: before, report.json and `procsv report` counted the chief's restarts only
    from procsv.report import RunReport, render
    from procsv.watchdog.publish import recovery
    from procsv.watchdog.publish.runmetrics import task_summary
    from procsv.watchdog.rules.state import ChildView, RunView

    view = RunView(launch_start=0.0)
    view.tasks_alone = True
    view.children = {"trainer": ChildView("trainer", "trainer", 2, 10, 0.0),
                     "worker1": ChildView("worker1", "worker", 3, 11, 0.0),
                     "ps0": ChildView("ps0", "ps", 1, 12, 0.0),
                     "summary": ChildView("summary", "summary", 1, 13, 0.0)}
    view.tasks_given_up = ["worker1"]
    tasks = task_summary(view)
    assert tasks == {"chief": {"role": "chief", "restarts": 1, "given_up": False},
                     "ps0": {"role": "ps", "restarts": 0, "given_up": False},
                     "worker1": {"role": "worker", "restarts": 2, "given_up": True}}
    summary = {**recovery.summarize([]), "goodput": None, "wall_s": 10.0, "tasks": tasks}
    text = render(RunReport("/run", "stopped", 50, None, None, None, None, summary))
    assert "  tasks: chief 1 restart(s), ps0 0 restart(s), worker1 2 restart(s) (given up on)" in text
    view.tasks_alone = False
    assert task_summary(view) == {}


def test_a_live_group_rollback_is_read_as_a_rollback_not_a_restart():
    # the restarting record names the step a trainer group's rollback skips; before, procsv report on a
    # live launch (no report.json yet) said "1 restart(s)" and "0 rollback(s)"
    from procsv.report import RunReport, group_rollbacks, nonfinite, plain_restarts, render

    events = [
        _ev(0.0, "launch", target="t", args=[], pid=1),
        _ev(1.0, "nonfinite_detected", pid=10, step=70, epoch=None, batch=None, what="NaN", repeats=1, peer=None),
        _ev(1.0, "nonfinite_detected", pid=20, step=70, epoch=None, batch=None, what="NaN", repeats=0, peer=10),
        _ev(1.1, "step_skipped", pid=10, step=70, epoch=None, batch=None, skipped=1),
        _ev(1.1, "restarting", attempt=2, delay=0.0, rollback_step=70, error="trainer attempt 1 (pid 10) exited with "
            "code 5: GroupRollback: ..."),
        _ev(1.2, "exited", role="trainer", attempt=1, pid=10, noticed=1.05, code=5),
        _ev(2.0, "restored", pid=11, step=50, path="p", secs=0.1, skipped=[70]),
    ]
    got = restarts(events)
    assert [(r.attempt, r.rollback_step, r.label) for r in got] == [(2, 70, "rollback 70")] and not plain_restarts(got)
    assert group_rollbacks(events, None) == 1 and nonfinite(events, None) == ([(1.1, 70)], 1)
    rep = RunReport(logdir="/x", state="running", step=80, live_pid=None, started_at=0.0, ended_at=3.0, goodput=None,
                    summary=None, restarts=got, skipped=[(1.1, 70)], rollbacks=1, group_rollbacks=1, detected=1)
    text = render(rep)
    assert "procsv report: 0 restart(s), 1 rollback(s) of the trainer group, goodput -" in text, text
    assert "  group rollback at " in text and "[rollback 70]: the trainer group rolled back to skip step 70" in text
    assert "non-finite: 1 rollback(s) of the trainer group (restarted, every member skipping the step), 1 step(s) " \
           "skipped (NaN or infinite loss): 70; 1 time(s) found non-finite" in text, text


def test_a_loss_spike_is_named_and_its_rollback_counted_with_the_non_finite_ones() -> None:
    from procsv.report import RunReport, nonfinite, render, spike_words

    events = [
        _ev(0.0, "launch", target="t", args=[], pid=1),
        _ev(1.0, "spike_detected", pid=10, step=65, onset=64, loss=14.8876, threshold=2.602, median=0.2925,
            action="rollback", epoch=None, batch=None),
        _ev(1.0, "rolled_back", pid=10, step=64, restored_step=60, source="memory", path="m", skip=False, secs=0.01,
            epoch=None, batch=None),
        _ev(1.0, "spike_replayed", pid=10, step=65, onset=64, reproduced=True, loss=14.8876, replay_loss=14.8876,
            host="h"),
        _ev(1.0, "rolled_back", pid=10, step=64, restored_step=60, source="memory", path="m", skip=True, secs=0.01,
            epoch=None, batch=None),
        _ev(1.0, "step_skipped", pid=10, step=64, epoch=None, batch=None, skipped=1),
        _ev(1.0, "step_skipped", pid=10, step=65, epoch=None, batch=None, skipped=2),
        _ev(2.0, "spike_detected", pid=10, step=80, onset=80, loss=3.0, threshold=2.0, median=1.0, action="warn",
            epoch=None, batch=None),
    ]
    skipped, rollbacks = nonfinite(events, None)
    rep = RunReport(logdir="/x", state="succeeded", step=90, live_pid=None, started_at=0.0, ended_at=3.0, goodput=None,
                    summary=None, skipped=skipped, rollbacks=rollbacks, spikes=[e for e in events if "spike" in e["event"]])
    text = render(rep)
    # (before: "non-finite: 2 rollback(s), 2 step(s) skipped (NaN or infinite loss twice, or a loss spike's steps): 64,
    # 65; 0 time(s) found non-finite": a spike's rollbacks and skips were said non-finite)
    assert "  loss-spike rollbacks: 2 rollback(s), 2 step(s) skipped (a loss spike's steps): 64, 65\n" in text, text
    assert "non-finite" not in text, text
    assert "  loss spikes: 2: steps 64-65 (loss 14.9 against a threshold of 2.6, median 0.292): rollback, the data's " \
           "(again when replayed): skipped; step 80 (loss 3 against a threshold of 2, median 1): warn" in text, text
    transient = {"event": "spike_replayed", "step": 80, "reproduced": False, "host": "node-3"}
    assert spike_words(events[-1], transient).endswith(": warn, a transient fault of host node-3 (not again when "
                                                      "replayed): kept")
    unreplayable = {**transient, "differs_at": 61}  # (its input did not come back: no fault of the host, and the
    # replayed state is kept, training on; before: "stopped")
    assert spike_words(events[-1], unreplayable).endswith(": warn, no verdict (the replay's input differed from step "
                                                         "61): kept")


def test_procsv_status_says_a_spikes_rollbacks_and_skips_are_a_spikes_not_non_finite() -> None:
    # before: "non-finite: 2 rollback(s), 1 step(s) skipped: 65; 0 time(s) found non-finite" for a run whose only
    # rollbacks were a loss spike's (--on-spike rollback)
    from procsv.status import render as render_status

    spikes = {"seen": 1, "by_action": {"rollback": 1}, "transient_faults": {}, "suspect_hosts": [], "suspect_after": 3,
              "last": {"step": 65, "onset": 65, "loss": 14.9, "threshold": 2.6, "median": 0.29, "action": "rollback"}}
    base = {"state": "succeeded", "step": 90, "restarts": 0, "skipped_steps": [65], "rollbacks": 2, "spikes": spikes}
    text = render_status({**base, "nonfinite_detected": 0}, "/x")
    assert "  loss-spike rollbacks: 2 rollback(s), 1 step(s) skipped: 65\n" in text and "non-finite" not in text, text
    both = render_status({**base, "skipped_steps": [25, 65], "rollbacks": 4, "nonfinite_detected": 1}, "/x")
    assert "  non-finite and loss-spike rollbacks: 4 rollback(s), 2 step(s) skipped: 25, 65; 1 time(s) found " \
           "non-finite\n" in both, both
    nan = render_status({**base, "skipped_steps": [25], "nonfinite_detected": 1, "spikes": None}, "/x")
    assert nan.endswith("\n  non-finite: 2 rollback(s), 1 step(s) skipped: 25; 1 time(s) found non-finite"), nan
