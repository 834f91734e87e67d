"""Non-finite training made visible (issue 41): one real ``procsv launch`` whose step 25 is poisoned,
read back from the lifecycle log; and the watchdog's observation of the trainer's messages (pure)."""

from __future__ import annotations

import os

import pytest

from conftest import PROGRAMS, finish, launch, lifecycle
from procsv.ipc.messages import NonfiniteDetected, RestoreSource, RolledBack, StepSkipped
from procsv.watchdog import observe
from procsv.watchdog.publish.events import SCHEMA, Event, check
from procsv.watchdog.rules.state import ChildView, RunView

NAN_TRAIN = os.path.join(PROGRAMS, "nan_train.py")


@pytest.mark.slow
def test_a_skipped_step_is_told_as_lifecycle_events_when_they_happen(logdir):
    # before: the rollback and the skip were lines in the trainer's log only: no lifecycle event
    code, out, err = finish(launch(logdir, "--nan-at", "25", "--steps", "60", target=NAN_TRAIN, opts=("--quiet",)), 240)
    assert code == 0, err

    # the lifecycle log: in the order they happened, with their fields
    mine = [e for e in lifecycle(logdir) if e["event"] in ("nonfinite_detected", "rolled_back", "step_skipped")]
    assert [e["event"] for e in mine] == ["nonfinite_detected", "rolled_back", "nonfinite_detected", "rolled_back",
                                          "step_skipped"], mine
    for e in mine:
        check(Event(e["event"]), {k: v for k, v in e.items() if k not in ("time", "event")})
        assert e["step"] == 25
    found = [e for e in mine if e["event"] == "nonfinite_detected"]
    assert all("NaN or infinite" in e["what"] and e["epoch"] is None and e["batch"] is None for e in found)
    back = [e for e in mine if e["event"] == "rolled_back"]
    assert [(e["restored_step"], e["source"], e["skip"]) for e in back] == [(20, "disk", False), (20, "disk", True)]
    assert all(e["path"].endswith("model.ckpt-20") and e["secs"] >= 0 for e in back)
    assert mine[-1]["skipped"] == 1 and mine[-1]["epoch"] is None


# ----------------------------------------------------------------------------- pure


def _view() -> RunView:
    view = RunView(launch_start=0.0)
    t = ChildView("trainer", "trainer", 1, 4242, 0.0)
    view.children["trainer"] = t
    view.attempts.append(t)
    return view


def test_the_watchdog_turns_the_trainers_messages_into_events_and_counts():
    view = _view()
    got = observe.heard(view, NonfiniteDetected(4242, 25, 1.0, "the loss of step 25 is NaN or infinite"), 1.0)
    got += observe.heard(view, RolledBack(4242, 25, 20, RestoreSource.MEMORY, "", True, 0.01, 1.0), 1.0)
    got += observe.heard(view, StepSkipped(4242, 25, 1.0, 1, epoch=2, batch=7), 1.0)
    got += observe.heard(view, StepSkipped(4242, 25, 2.0, 1), 2.0)  # met again after a restart: one step
    got += observe.heard(view, StepSkipped(9999, 30, 2.0, 1), 2.0)  # not the trainer's: ignored
    assert [r.event for r in got] == [Event.NONFINITE_DETECTED, Event.ROLLED_BACK, Event.STEP_SKIPPED,
                                      Event.STEP_SKIPPED]
    for r in got:
        assert r.event is not None and set(r.fields) == SCHEMA[r.event]
    assert got[1].fields["source"] == "memory" and got[2].fields["epoch"] == 2 and got[2].fields["batch"] == 7
    assert view.skipped_steps == [25] and view.rollbacks == 1 and view.nonfinite_found == 1
