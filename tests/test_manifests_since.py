"""``manifests.newest_committed_since``: what the watchdog reads at a trainer's death (real files)."""

from __future__ import annotations

import os

from procsv.common.layout import Layout, write_json
from procsv.common.manifests import Manifest, newest_committed_since

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
