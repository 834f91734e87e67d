"""procsv.watchdog.publish.statusfile.StatusWriter: a failing write of status.json is reported once; a
vanished directory (a logdir being deleted) only if it is still missing at the next write."""

from __future__ import annotations

import json
import os
import shutil

from procsv.common.layout import Layout
from procsv.watchdog.publish.statusfile import STATUS_EVERY, StatusWriter


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def writer(tmp_path, said: list[str]) -> tuple[StatusWriter, Layout, Clock]:
    layout = Layout(str(tmp_path / "run"))
    os.makedirs(layout.meta)
    clock = Clock()
    return StatusWriter(layout, clock, complain=said.append), layout, clock


def write(w: StatusWriter, clock: Clock, step: int) -> None:
    clock.now += STATUS_EVERY
    w.dirty = True
    assert w.due()
    w.write({"step": step})


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
    w.write({"step": 1}, durable=True)  # the final write (as Reporter.write_status makes it with force)
    assert len(said) == 1 and said[0].startswith(f"procsv: cannot write {layout.status}")
