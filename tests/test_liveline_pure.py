"""Pure parts of the live line and the report's step series: throttle, texts, the bounded series.

Plus the terminal writer on a real pseudo-terminal: output scrolls above the live line.
"""

from __future__ import annotations

import os
import pty
import select
import time

from procsv.watchdog.publish.events import Event
from procsv.watchdog.publish.liveline import Facts, LiveLine, ago, due, event_text, format_line, wanted
from procsv.watchdog.publish.output import ERASE, Terminal
from procsv.watchdog.publish.series import StepSeries, halve, rate


def test_the_live_line_is_drawn_on_a_terminal_only_and_not_when_quiet():
    assert wanted(quiet=False, isatty=True)
    assert not wanted(quiet=False, isatty=False)
    assert not wanted(quiet=True, isatty=True)


def test_redraws_are_throttled_by_the_injected_clock():
    assert due(100.0, None)
    assert not due(100.2, 100.0)
    assert due(100.25, 100.0)
    draws, last = 0, None
    for i in range(1000):  # 10 s of a loop running every 10 ms
        now = i * 0.01
        if due(now, last):
            draws, last = draws + 1, now
    assert draws == 40  # at most 4 a second


def test_the_line_shows_every_fact_and_fits_the_terminal():
    facts = Facts(step=4120, steps_per_sec=81.27, checkpoint_age=125.0, restarts=2, goodput=0.934,
                  last_event=event_text(Event.RESTORED, {"step": 4120, "secs": 0.3141}) or "")
    text = format_line(facts, 200)
    assert text == ("procsv | step 4120 | 81.3 steps/s | checkpoint 2 m 05 s ago | restarts 2 | goodput 0.93 | "
                    "restored step 4120 in 0.31 s")
    short = format_line(facts, 40)
    assert len(short) == 39 and short.endswith("...")
    none = format_line(Facts(0, None, None, 0, None, ""), 200)
    assert none == "procsv | step 0 | - steps/s | checkpoint none yet | restarts 0 | goodput -"


def test_event_texts():
    assert ago(7.9) == "7 s" and ago(3 * 3600 + 14 * 60) == "3 h 14 m"
    assert event_text(Event.EXITED, {"role": "trainer", "attempt": 1, "signal": "SIGKILL"}) == \
        "trainer.1 killed by SIGKILL"
    assert event_text(Event.EXITED, {"role": "summary", "attempt": 1, "code": 0}) is None
    assert event_text(Event.CHECKPOINT_COMMITTED, {"step": 40, "secs": 0.012, "path": "p", "reason": "timer"}) == \
        "checkpoint step 40 committed in 0.01 s"
    assert event_text(Event.SPAWNED, {"role": "trainer", "attempt": 1, "pid": 1, "via": "fresh"}) is None


def test_live_bookkeeping_rate_and_checkpoint_age():
    line = LiveLine()
    for i in range(50):
        line.progress(10.0 + i * 0.1, 100 + i * 2)  # 20 steps/s
    line.event(Event.CHECKPOINT_COMMITTED, {"step": 150, "secs": 0.1, "path": "p", "reason": "timer"})
    facts = line.facts(15.0, 198, restarts=0, goodput=0.5, committed_at=13.0)  # the view's last commit
    assert facts.steps_per_sec is not None and abs(facts.steps_per_sec - 20.0) < 1e-6
    assert facts.checkpoint_age == 2.0 and facts.last_event.startswith("checkpoint step 150")
    line.event(Event.EXITED, {"role": "trainer", "attempt": 1, "pid": 1, "noticed": 15.0, "signal": "SIGKILL"})
    assert line.facts(15.05, 198, 0, None).steps_per_sec is None  # no trainer stepping: no rate
    assert line.facts(15.05, 198, 0, None).last_event == "trainer.1 killed by SIGKILL"
    for i in range(50):
        line.progress(10.0 + i * 0.1, 100 + i * 2)
    line.progress(15.1, 40)  # a restart resumed from step 40: the rate starts again
    assert line.facts(15.2, 40, 1, None).steps_per_sec is None
    assert line.facts(30.0, 40, 1, None).steps_per_sec is None  # no progress for long: no rate


def test_the_series_stays_bounded_keeps_the_ends_and_every_fall_back():
    s = StepSeries(max_points=100, spacing=0.1)
    t, step = 0.0, 0
    for i in range(100_000):  # ~2.8 h of progress every 100 ms, with a restart every 10,000 offers
        t += 0.1
        step = step - 300 if i % 10_000 == 9_999 else step + 1
        s.add(t, step)
    pts = s.points()
    assert 50 <= len(pts) <= 101
    assert pts[0] == (0.1, 1) and pts[-1] == (t, step)
    assert [p[0] for p in pts] == sorted(p[0] for p in pts)
    falls = sum(1 for a, b in zip(pts, pts[1:]) if b[1] < a[1])
    assert falls == 10


def test_halve_and_rate():
    pts = [(float(i), i) for i in range(10)]
    assert halve(pts) == [(0.0, 0), (2.0, 2), (4.0, 4), (6.0, 6), (8.0, 8), (9.0, 9)]
    assert (5.0, 1) in halve(pts[:6] + [(5.0, 1)] + pts[7:])
    assert rate(pts, 4.0) == 1.0
    assert rate(pts[:1], 4.0) is None
    assert rate([(0.0, 0), (1.0, 50), (2.0, 10), (3.0, 20)], 10.0) == 10.0  # since the fall back


def _read_until(fd: int, needle: bytes, timeout: float) -> bytes:
    buf, deadline = b"", time.monotonic() + timeout
    while needle not in buf and time.monotonic() < deadline:
        r, _, _ = select.select([fd], [], [], 0.1)
        if r:
            buf += os.read(fd, 65536)
    return buf


def test_output_scrolls_above_the_live_line_on_a_real_pty():
    master, slave = pty.openpty()
    out = os.fdopen(slave, "w")
    term = Terminal(out=out, err=out)
    try:
        term.status("procsv | step 1")
        assert _read_until(master, b"step 1", 5).endswith(ERASE.encode() + b"procsv | step 1")
        term.line("[trainer.1] hello")
        got = _read_until(master, b"hello\r\n" + ERASE.encode() + b"procsv | step 1", 5)
        assert got.startswith(ERASE.encode() + b"[trainer.1] hello")  # erased, printed, drawn again
        term.status("procsv | step 1")  # unchanged: no redraw
        term.status("procsv | step 2")
        assert _read_until(master, b"step 2", 5).endswith(ERASE.encode() + b"procsv | step 2")
    finally:
        term.close()
        assert _read_until(master, ERASE.encode(), 5).endswith(ERASE.encode())  # erased at the end
        out.close()
        os.close(master)


def test_the_timeline_is_cut_at_each_fall_back():
    from procsv.reportplot import segments

    pts = [(0.0, 1), (1.0, 50), (2.0, 90), (5.0, 41), (6.0, 80), (9.0, 61)]
    assert segments(pts) == [pts[:3], pts[3:5], pts[5:]]
    assert segments([]) == []
