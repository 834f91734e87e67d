"""Which batches the summary service may write, and when it writes ``global_step/sec``: pure rules.

Runs in the summary service process; no I/O here, so the rules are tested directly.

Delivery. Every trainer process is one *session*; it numbers its batches 1, 2, ... A session's
first batch, and any batch that restates what may not have been written, carries ``resync_from``
= P: the service writes ``SessionLog START`` at P (TensorBoard then forgets every event at a step
>= P) and then the batch, and expects the next number. A batch that is not the expected next
one -- the service was restarted and never saw the session, or batches were lost with a dead
service -- is not written: the service asks for a restatement (``resync_after`` in the
:class:`~procsv.ipc.messages.SummaryAck` it sends back) and the trainer sends everything it
still holds at steps >= P again. Hence, for each tag, the
event files never hold two values of one step and never miss one that the trainer logged and
still held. Batches of a session that is no longer the newest (a killed trainer's last words,
arriving after its successor started) are written only below the successor's start step -- its
restatements too: a superseded session never writes a START (which would purge the successor's
acknowledged points) nor becomes the current one again.

Step rate. Each batch carries the trainer's last completed step and its monotonic clock;
``global_step/sec`` is written at most every ``step_rate_secs``, from two marks of the same session --
never across a restart. A step that stood still for the period gets 0.0 at that step (a graph
program's runs that advance no step still hand off batches), as TF's step counter thread writes
whether the step moves or not; a session's stop asks for no rate (``step_rate_secs`` None).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Optional


class Verdict(str, Enum):
    """What to do with one batch."""

    WRITE = "write"  # write it (after a START if it restates)
    STALE = "stale"  # a copy of something already written: ignore silently
    RESYNC = "resync"  # not writable in order: drop it and ask the session to restate


@dataclass
class SessionState:
    """One trainer session as the service knows it: the next batch, its last START, its step-rate mark."""

    expect: int  # the next batch number to write
    start: int  # the step of its last restatement (TensorBoard purged everything at or after it)
    written: int = 0  # the last batch number written (what the acks report)
    resync_after: int = 0  # the number of a batch dropped because it was not the expected one
    rate_mark: Optional[tuple[float, int]] = None  # (monotonic time, step) of the last rate point
    superseded: bool = False  # another session restated after this one was current: it never is again


@dataclass(frozen=True)
class Decision:
    """What to do with one batch: write, drop or ask for a restatement; a START first; a step bound."""

    verdict: Verdict
    start_marker: Optional[int] = None  # write SessionLog START at this step first
    below: Optional[int] = None  # write only the rows with a step below this


@dataclass
class Sessions:
    """Every session seen and the current one: the delivery rules above, applied batch by batch."""

    known: dict[str, SessionState] = field(default_factory=dict)
    current: Optional[str] = None  # the session that restated last: the live trainer

    def admit(self, session: str, seq: int, resync_from: Optional[int], purge: bool = True) -> Decision:
        """Decide about batch ``seq`` of ``session`` and update the state as if it was written;
        ``purge`` False: a restatement that registers the session without a START (its first batch,
        when its steps repeat none logged before)."""
        if not session:  # an anonymous sender (not procsv's trainer): write as it comes
            return Decision(Verdict.WRITE)
        state = self.known.get(session)
        if resync_from is not None and state is not None and state.superseded:
            # a killed trainer's restatement, arriving after its successor registered: it must not
            # purge (START) nor take over; like its other late batches, only what is below the
            # successor's start is written
            state.expect, state.written, state.resync_after = seq + 1, seq, 0
            current = self.known.get(self.current) if self.current is not None else None
            return Decision(Verdict.WRITE, below=current.start if current is not None else None)
        if resync_from is not None:
            if state is None:
                state = self.known[session] = SessionState(expect=seq + 1, start=resync_from)
            state.expect, state.start, state.written, state.resync_after = seq + 1, resync_from, seq, 0
            if self.current != session:
                state.rate_mark = None
                previous = self.known.get(self.current) if self.current is not None else None
                if previous is not None:
                    previous.superseded = True
            self.current = session
            return Decision(Verdict.WRITE, start_marker=resync_from if purge else None)
        if state is not None and seq < state.expect:
            return Decision(Verdict.STALE)
        if state is None or seq != state.expect:
            if state is None:
                state = self.known[session] = SessionState(expect=-1, start=0)
            state.resync_after = max(state.resync_after, seq)
            return Decision(Verdict.RESYNC)
        state.expect += 1
        state.written = seq
        if session != self.current and self.current is not None:
            return Decision(Verdict.WRITE, below=self.known[self.current].start)
        return Decision(Verdict.WRITE)

    def acks(self) -> dict[str, dict[str, int]]:
        """What the acks say: per session, the last batch written and any restatement asked for."""
        return {s: {"written": st.written, "resync_after": st.resync_after} for s, st in self.known.items()}

    def step_rate(self, session: str, mono: float, step: int, every: Optional[float]) -> Optional[float]:
        """``global_step/sec`` to write now at ``step``, or None (not due, or no rate configured)."""
        state = self.known.get(session)
        if state is None or session != self.current or not every or every <= 0 or step < 0:
            return None
        mark = state.rate_mark
        if mark is None or step < mark[1] or mono < mark[0]:
            state.rate_mark = (mono, step)
            return None
        if mono - mark[0] < every:
            return None  # (a step that stood still a whole period: 0.0 at it, as TF's step counter thread writes)
        state.rate_mark = (mono, step)
        return (step - mark[1]) / (mono - mark[0])
