"""``manifests.newest_committed_since``: what the watchdog reads at a trainer's death (real files)."""

from __future__ import annotations

import json
import os

import pytest

from procsv.common.layout import Layout, write_json
from procsv.common import manifests
from procsv.common.manifests import (Manifest, last_checkpoint, list_committed, newest_committed,
                                      newest_committed_since)
from procsv.watchdog import observe
from procsv.watchdog.rules.actions import GiveUp, Restart
from procsv.watchdog.rules.decide import Limits
from procsv.watchdog.rules.hang import HangLimits
from procsv.watchdog.rules.policy import RestartPolicy
from procsv.watchdog.rules.state import TRAINER

from test_watchdog_decide import Sim, of

LAUNCH = 1_000_000.0  # the launch's start, wall time


def _manifest(layout: Layout, step: int, committed_at: float) -> None:
    os.makedirs(layout.manifests, exist_ok=True)
    m = Manifest(step, f"model.ckpt-{step}", {"model.ckpt-%d.index" % step: {"size": 1, "crc32c": 0}},
                 committed_at, "steps")
    write_json(os.path.join(layout.manifests, f"model.ckpt-{step}.json"), m.to_json())


def test_the_newest_step_above_the_base_committed_in_this_launch(tmp_path):
    layout = Layout(str(tmp_path))
    assert newest_committed_since(layout, LAUNCH, -1) is None  # no manifests folder yet
    _manifest(layout, 100, LAUNCH + 1)
    _manifest(layout, 150, LAUNCH + 2)
    assert newest_committed_since(layout, LAUNCH, 100) == 150
    assert newest_committed_since(layout, LAUNCH, -1) == 150
    assert newest_committed_since(layout, LAUNCH, 150) is None


def test_an_earlier_launch_s_or_a_damaged_manifest_is_no_progress(tmp_path):
    layout = Layout(str(tmp_path))
    _manifest(layout, 100, LAUNCH + 1)
    _manifest(layout, 300, LAUNCH - 60)  # an earlier launch's newest (the trainer may have skipped it as corrupt)
    with open(os.path.join(layout.manifests, "model.ckpt-400.json"), "w") as fh:
        fh.write('{"version": 2, "step": 4')  # damaged
    with open(os.path.join(layout.manifests, "notes.json"), "w") as fh:
        fh.write("{}")  # no step in the name
    assert newest_committed_since(layout, LAUNCH, -1) == 100
    assert newest_committed_since(layout, LAUNCH, 100) is None


def test_a_manifest_whose_step_in_the_file_differs_from_its_name_or_that_is_hidden_does_not_count(tmp_path):
    layout = Layout(str(tmp_path))
    _manifest(layout, 100, LAUNCH + 1)
    os.rename(os.path.join(layout.manifests, "model.ckpt-100.json"), os.path.join(layout.manifests, "model.ckpt-200.json"))
    _manifest(layout, 300, LAUNCH + 2)
    os.rename(os.path.join(layout.manifests, "model.ckpt-300.json"), os.path.join(layout.manifests, ".model.ckpt-300.json"))
    assert newest_committed_since(layout, LAUNCH, -1) is None
    _manifest(layout, 50, LAUNCH + 3)
    assert newest_committed_since(layout, LAUNCH, -1) == 50


def test_what_cannot_be_read_as_a_manifest_is_none_not_an_error(tmp_path):
    """The watchdog reads this at a trainer's death: nothing on disk may stop the run there."""
    layout = Layout(str(tmp_path))
    os.makedirs(os.path.dirname(layout.manifests), exist_ok=True)
    with open(layout.manifests, "w") as fh:
        fh.write("")  # a file where the folder should be
    assert newest_committed_since(layout, LAUNCH, -1) is None
    os.unlink(layout.manifests)
    _manifest(layout, 100, LAUNCH + 1)
    bad = {
        "model.ckpt-400.json": '{"version": 2, "step": 1e999, "prefix": "p", "files": {}, "committed_at": 1e999, "reason": "x"}',
        "model.ckpt-500.json": "[" * 100_000 + "]" * 100_000,  # deeper than the JSON parser recurses
        "model.ckpt-600.json": None,  # a folder
    }
    for name, text in bad.items():
        path = os.path.join(layout.manifests, name)
        if text is None:
            os.mkdir(path)
        else:
            with open(path, "w") as fh:
                fh.write(text)
    with open(os.path.join(layout.manifests, "model.ckpt-400.json")) as fh:
        m = Manifest.from_json(json.load(fh))
    assert m is None  # an overflowing step or time is damage, not an OverflowError
    assert newest_committed_since(layout, LAUNCH, -1) == 100


@pytest.mark.slow
def test_newest_committed_is_list_committed_s_last_and_reads_only_from_the_top(tmp_path, monkeypatch):
    """status.json's last checkpoint, written twice a second by the watchdog: a run keeping
    thousands of checkpoints must not read thousands of manifests for it."""
    layout = Layout(str(tmp_path))
    assert newest_committed(layout) is None and last_checkpoint(layout) is None
    for step in range(10, 2010, 10):
        _manifest(layout, step, LAUNCH + step)
    with open(os.path.join(layout.manifests, "model.ckpt-5000.json"), "w") as fh:
        fh.write("{")  # damaged: skipped, as list_committed skips it
    _manifest(layout, 4000, LAUNCH)
    os.rename(os.path.join(layout.manifests, "model.ckpt-4000.json"), os.path.join(layout.manifests, "model.ckpt-4500.json"))
    reads: list[str] = []
    real = manifests.read_json
    monkeypatch.setattr(manifests, "read_json", lambda path: reads.append(path) or real(path))
    m = newest_committed(layout)
    assert m is not None and m.step == 2000
    assert len(reads) == 3  # 5000 (damaged), 4500 (says 4000 inside), 2000
    monkeypatch.setattr(manifests, "read_json", real)
    os.unlink(os.path.join(layout.manifests, "model.ckpt-4500.json"))
    assert list_committed(layout)[-1] == m
    assert last_checkpoint(layout) == {"step": 2000, "path": os.path.join(str(tmp_path), "model.ckpt-2000")}
    for name in os.listdir(layout.manifests):
        if name != "model.ckpt-5000.json":
            os.unlink(os.path.join(layout.manifests, name))
    assert newest_committed(layout) is None  # only a damaged one


def _death(sim, layout: Layout, launch_wall: float) -> None:  # type: ignore[no-untyped-def]
    """What procsv.watchdog.exits does at a trainer's death, on the Sim's clocks (wall = LAUNCH + now)."""
    t = sim.trainer
    since = observe.attempt_began_wall(t, launch_wall, LAUNCH + sim.now, sim.now)
    step = newest_committed_since(layout, since, observe.unheard_floor(t))
    if step is not None:
        observe.committed_on_disk(sim.view, TRAINER, t.attempt, step)
    sim.dies(TRAINER, -9)


def test_an_earlier_attempt_s_commit_that_later_ones_skip_is_not_their_progress(tmp_path):
    """Attempt 1 commits 40 and dies; every later attempt skips 40 (unreadable: it stays on disk),
    restores 30 and dies before committing. Read since the launch began, 40 was each one's
    progress (their base is their restore, 30), and the run restarted forever; read since each
    attempt began, it gives up."""
    layout = Layout(str(tmp_path))
    sim = Sim(Limits(restart=RestartPolicy(max_restarts=2), hang=HangLimits(None, None)))
    sim.start_trainer()
    sim.now += 5.0
    _manifest(layout, 40, LAUNCH + sim.now)
    sim.commit(40)
    sim.now += 1.0
    _death(sim, layout, LAUNCH)
    outcomes = []
    for _ in range(4):
        actions = sim.tick(1.0) + sim.tick(1.0)
        outcomes.append("restart" if of(actions, Restart) else "give up" if of(actions, GiveUp) else "")
        if not of(actions, Restart):
            break
        sim.tick(40.0)  # past any backoff: the next attempt starts
        sim.now += 1.0
        sim.ready(30)
        sim.progress(31)
        assert sim.trainer.commit_base == 30 and observe.unheard_floor(sim.trainer) == 30
        sim.now += 2.0
        _death(sim, layout, LAUNCH)
    assert outcomes[0] == "restart" and outcomes[-1] == "give up", outcomes
