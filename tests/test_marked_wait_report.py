"""``Supervisor.waiting()``'s end: the step after a marked wait is reported at the next boundary, whatever the
progress throttle (``PROGRESS_EVERY``). Plain Python: a real :class:`StepBoundary` and :class:`StepState`, the
collaborators it touches at a boundary as stand-ins, the watchdog's channel as a list."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from procsv.ipc.messages import Busy, Progress
from procsv.trainer.boundary import StepBoundary
from procsv.trainer.step_boundary import NEVER, StepState


class _Channels:
    def __init__(self) -> None:
        self.sent: list[Any] = []

    def to_watchdog(self, msg: Any) -> None:
        self.sent.append(msg)


def _boundary() -> tuple[list[float], StepState, StepBoundary, _Channels]:
    """A real StepBoundary and StepState on a settable clock (``now[0]``), the watchdog's channel a list."""
    now = [0.0]
    clock = lambda: now[0]  # noqa: E731
    state = StepState(clock, SimpleNamespace(exception=None), SimpleNamespace(advance=lambda before: None))
    summaries = SimpleNamespace(buffer=SimpleNamespace(on_batch=None), flush=lambda **kw: None, wake_at=lambda: NEVER,
                                next_periodic=NEVER, writes=False, unwritten_from=None)
    rollback = SimpleNamespace(work=lambda: False, bound=lambda: None, judge_deferred=lambda step: None)
    settings = SimpleNamespace(save_summaries_secs=0, stop_grace_secs=1.0)
    b = StepBoundary(state, clock, SimpleNamespace(exception=None), None, summaries,  # type: ignore[arg-type]
                     rollback, settings, chief=True)  # type: ignore[arg-type]
    ch = _Channels()
    b._channels = ch  # type: ignore[assignment]
    return now, state, b, ch


def test_the_step_after_a_marked_wait_is_reported_within_the_progress_throttle():
    """A step reported at t=0; at t=0.02 the program waits in ``sv.waiting()`` for 0.05 s, and its step ends at
    0.08: the next step's boundary (before PROGRESS_EVERY, 0.1 s, passed) must tell the watchdog the wait ended,
    else it holds WAITING (the stuck rule off) while the next step may deadlock: --hang-timeout alone, 600 s.
    (Before, no report went until 0.1 s.)"""
    now, state, b, ch = _boundary()
    state.step = 5
    b.after_step()  # the first step's report, at 0.0
    assert [m.stepped for m in ch.sent] == [True]
    now[0] = 0.02
    with b.waiting():
        now[0] = 0.07
    state.step = 6
    now[0] = 0.08
    if now[0] >= state.at:  # (as ManagedSession.run: the next step's boundary)
        state.boundary(state.step)
    assert [(m.busy, m.step) for m in ch.sent if isinstance(m, Progress)][-1] == (Busy.NONE, 6), ch.sent


def test_a_loop_of_marked_waits_without_a_step_sends_one_report_a_step():
    """A program polling ``with sv.waiting(): poll()`` a thousand times at one step sends one WAITING report (the
    watchdog keeps the first one's clock for the same wait): before, one message a turn. After a step, or another
    report in between, the next marked wait is reported again."""
    now, state, b, ch = _boundary()
    state.step = 5
    b.after_step()
    for _ in range(1000):
        with b.waiting():
            pass
    waits = lambda: [(m.busy, m.step) for m in ch.sent if m.busy == Busy.WAITING]  # noqa: E731
    assert waits() == [(Busy.WAITING, 5)], len(ch.sent)
    state.step = 6
    now[0] = 0.5
    b.after_step()  # the step after the waits: reported
    with b.waiting():
        pass
    with b.waiting():
        pass
    assert waits() == [(Busy.WAITING, 5), (Busy.WAITING, 6)]
    b.report_busy(Busy.NONE)  # another report in between: the next wait is a new one to the watchdog
    with b.waiting():
        pass
    assert waits() == [(Busy.WAITING, 5), (Busy.WAITING, 6), (Busy.WAITING, 6)]
    assert [m.busy for m in ch.sent][-2:] == [Busy.NONE, Busy.WAITING]
