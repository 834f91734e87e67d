"""procsv.watchdog.statusfile.StatusWriter: a failing write of status.json is reported once; a
vanished directory (a logdir being deleted) only if it is still missing at the next write; a
change of the step alone is written after STEP_EVERY, a change of state after STATUS_EVERY."""

from __future__ import annotations

import json
import os
import shutil

from procsv.common.layout import Layout
from procsv.watchdog.statusfile import STEP_EVERY, STATUS_EVERY, StatusWriter


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def writer(tmp_path, said: list[str]) -> tuple[StatusWriter, Layout, Clock]:
    layout = Layout(str(tmp_path / "run"))
    os.makedirs(layout.meta)
    clock = Clock()
    return StatusWriter(layout, clock, lambda: 1.0, complain=said.append), layout, clock


def write(w: StatusWriter, clock: Clock, step: int) -> None:
    clock.now += STATUS_EVERY
    w.dirty = True
    w.maybe_write(lambda now, wall: {"step": step})


def test_a_vanished_directory_is_reported_only_if_it_is_still_gone_at_the_next_write(tmp_path):
    said: list[str] = []
    w, layout, clock = writer(tmp_path, said)
    write(w, clock, 1)
    shutil.rmtree(layout.meta)
    write(w, clock, 2)
    assert said == []  # the loop's check reports a lost logdir before the next write
    write(w, clock, 3)
    assert len(said) == 1 and said[0].startswith(f"procsv: cannot write {layout.status} (No such file")
    write(w, clock, 4)
    assert len(said) == 1  # once
    os.makedirs(layout.meta)
    write(w, clock, 5)
    assert said[1] == f"procsv: {layout.status} is written again"
    with open(layout.status) as f:
        assert json.load(f) == {"step": 5}


def test_a_directory_back_before_the_next_write_is_never_reported(tmp_path):
    said: list[str] = []
    w, layout, clock = writer(tmp_path, said)
    shutil.rmtree(layout.meta)
    write(w, clock, 1)
    os.makedirs(layout.meta)
    write(w, clock, 2)
    shutil.rmtree(layout.meta)
    write(w, clock, 3)  # a new vanishing: again one write of grace
    assert said == []


def test_any_other_failure_is_reported_at_once(tmp_path):
    said: list[str] = []
    w, layout, clock = writer(tmp_path, said)
    os.makedirs(os.path.join(layout.status, "blocker"))  # rename onto a non-empty directory fails
    write(w, clock, 1)
    assert len(said) == 1 and said[0].startswith(f"procsv: cannot write {layout.status}")


def test_the_final_write_reports_a_vanished_directory_at_once(tmp_path):
    """No write comes after the final one: its failure is reported even when it is the first."""
    said: list[str] = []
    w, layout, clock = writer(tmp_path, said)
    shutil.rmtree(layout.meta)
    w.maybe_write(lambda now, wall: {"step": 1}, force=True)
    assert len(said) == 1 and said[0].startswith(f"procsv: cannot write {layout.status}")


def test_a_step_alone_is_written_after_progress_every_and_a_state_change_after_status_every(tmp_path):
    w, layout, clock = writer(tmp_path, [])
    record = {"step": 0, "state": "running"}
    w.maybe_write(lambda now, wall: dict(record))  # the first write

    def on_disk() -> dict[str, object]:
        with open(layout.status) as f:
            return dict(json.load(f))

    record["step"] = 1
    w.progressed = True
    clock.now += STATUS_EVERY
    w.maybe_write(lambda now, wall: dict(record))
    assert on_disk()["step"] == 0  # a step alone is not worth a write this soon
    clock.now += STEP_EVERY - STATUS_EVERY
    w.maybe_write(lambda now, wall: dict(record))
    assert on_disk()["step"] == 1
    record.update(step=2, state="stopping")
    w.dirty = True  # a state change (with the step that came along)
    clock.now += STATUS_EVERY
    w.maybe_write(lambda now, wall: dict(record))
    assert on_disk() == {"step": 2, "state": "stopping"}
    assert STATUS_EVERY < STEP_EVERY
