"""The goodput breakdown in one pass over the attempts (issue 66) gives what the quadratic one it
replaced gave, to the bit, on many seeded launches (``tests/goodput_oracle.py`` keeps the old one;
``scripts/bench_goodput.py`` times both)."""

from __future__ import annotations

import os
import random

from goodput_oracle import breakdown_quadratic, random_launch
from procsv import goodput as gp


def test_the_linear_breakdown_equals_the_quadratic_one_on_many_seeded_launches():
    rng = random.Random(66)
    cases = 0
    for n in [0, 1, 2, 3] * 100 + list(range(4, 60)) * 20:
        launch, after = random_launch(rng, n)
        new, old = gp.breakdown(launch, after), breakdown_quadratic(launch, after)
        assert new.secs == old.secs and new.wall == old.wall, (launch, after, new, old)
        cases += 1
    assert cases == 400 + 56 * 20


def test_kept_below_is_the_next_restored_attempts_step_else_the_next_launchs():
    def att(ready: bool, restored: int) -> gp.Attempt:
        return gp.Attempt(spawned=0.0, ready=1.0 if ready else None, restored_step=restored)

    atts = (att(True, 0), att(False, 7), att(True, 30), att(False, 9), att(False, 8))
    assert gp.kept_below(atts, 55) == [30, 30, 55, 55, 55]
    assert gp.kept_below(atts) == [30, 30, None, None, None]
    assert gp.kept_below(()) == []



def test_a_watchdog_round_computes_the_breakdown_once_for_its_four_consumers(tmp_path, monkeypatch):
    """status.json, procsv's scalars, the metrics snapshot and the live line, all due in one round,
    share the round's breakdown (``badput.Shared``): one pass over the attempts, not four. Called as
    the launcher's round calls them (``Launcher.round``)."""
    from procsv.common.layout import Layout
    from procsv.watchdog.config import LaunchConfig
    from procsv.watchdog.publish import badput, liveline
    from procsv.watchdog.publish.reporting import Reporter
    from procsv.watchdog.publish.runscalars import Sent, due
    from procsv.watchdog.rules.state import ChildView, RunView

    view = RunView(launch_start=0.0)
    for n in range(1, 4):
        c = ChildView("trainer", "trainer", n, 100 + n, started=10.0 * n)
        c.ready_at, c.first_step_at, c.last_work_at, c.work_step = 10.0 * n + 1, 10.0 * n + 2, 10.0 * n + 8, 80 * n
        c.ended_at = 10.0 * n + 9 if n < 3 else None
        view.attempts.append(c)
    view.step = 240
    calls = []
    of_launch = badput.of_launch
    monkeypatch.setattr(badput, "of_launch", lambda v, now: calls.append(now) or of_launch(v, now))
    layout = Layout(str(tmp_path / "run"))
    os.makedirs(layout.logs, exist_ok=True)
    os.makedirs(os.path.dirname(layout.status), exist_ok=True)
    now = [40.0]
    out = Reporter(LaunchConfig("t", [], layout.logdir, metrics_port=0), layout, lambda: now[0], lambda: 1000.0 + now[0])
    out.live = liveline.LiveLine()
    try:
        shared = badput.Shared(view, now[0])
        out.write_status(view, None, force=True, shared=shared)
        points, _ = due(view, shared.now, 1040.0, Sent(), shared)
        out.publish(view, shared=shared)
        out.draw_live(view, shared=shared)
        assert calls == [40.0], calls  # once, at the round's time
        assert out.snapshot is not None and out.snapshot.goodput == shared().goodput
        assert dict(zip(points[-1].tags, points[-1].values))["procsv/goodput"] == shared().goodput
        assert shared() is shared()
        # without the round's: each consumer computes its own (as before issue 66)
        now[0] = 45.0
        out.write_status(view, None, force=True)
        out.publish(view, force=True)
        out.draw_live(view)
        assert calls == [40.0, 45.0, 45.0, 45.0], calls
    finally:
        out.close_io()
