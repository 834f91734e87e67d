"""Acknowledged means written: the sender's restatements against a model of the summary service.

Pure and deterministic (seeded): the real :class:`SummarySender` and :class:`SummaryBuffer` on a
fake clock, against a model of the service that applies the real delivery rules
(:class:`procsv.services.summary.sessions.Sessions`) to every batch, as the wire carries it, and
appends what it writes to a modelled event file. The service is "restarted" at random moments:
its session state and the batches queued for it are lost, the event file stays. The file is read
back with TensorBoard's rule (a ``SessionLog START`` at P forgets every point at a step >= P), and
every point the sender saw acknowledged -- indeed every point logged -- must be there exactly once.
The same thing against a real service process, with real SIGKILLs, is in test_summary_delivery.py.
"""

from __future__ import annotations

import random
from types import SimpleNamespace
from typing import Any

import pytest

from procsv.ipc.codec import decode, encode
from procsv.ipc.columns import Columns, decode_columns
from procsv.ipc.messages import SessionLogEvent, SummaryAck, SummaryBatch
from procsv.services.summary.sessions import Sessions, Verdict
from procsv.trainer.summaries import SummaryBuffer, SummarySender
from procsv.trainer.summaries import sender as sender_mod
from procsv.trainer.summaries.buffer import FLUSH_EVERY
from procsv.trainer.settings import Settings
from procsv.trainer.summaries.log import SummaryLog, restate_from


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


class ModelService:
    """The service's delivery rules over a modelled socket and event file."""

    def __init__(self) -> None:
        self.queue: list[tuple[SummaryBatch, list[Any]]] = []  # sent, not yet handled
        self.acks: list[SummaryAck] = []  # answered, not yet read by the trainer
        self.events: list[tuple[Any, ...]] = []  # ("start", P) and ("row", tag, step, value), in file order
        self.sessions = Sessions()

    def send(self, msg: Any, frames: Any) -> bool:
        decoded, payload = decode(encode(msg, frames))
        assert isinstance(decoded, SummaryBatch)
        self.queue.append((decoded, payload))
        return True

    def read_acks(self, timeout: float) -> list[SummaryAck]:
        out, self.acks = self.acks, []
        return out

    def handle(self, n: int) -> None:
        """One burst: the first ``n`` queued batches are admitted and written, then acknowledged."""
        burst, self.queue = self.queue[:n], self.queue[n:]
        sessions = set()
        for msg, payload in burst:
            cols = decode_columns(payload[0], msg.columns) if msg.columns else Columns.empty()
            decision = self.sessions.admit(msg.session, msg.seq, msg.resync_from)
            sessions.add(msg.session)
            if decision.verdict != Verdict.WRITE:
                continue
            if decision.start_marker is not None:
                self.events.append(("start", decision.start_marker))
            if decision.below is not None:
                cols = cols.below(decision.below)
            for k in range(len(cols)):
                self.events.append(("row", cols.tags[int(cols.index[k])], int(cols.steps[k]), float(cols.values[k])))
        acks = self.sessions.acks()
        for s in sorted(sessions):
            if s in acks:
                self.acks.append(SummaryAck(s, acks[s]["written"], acks[s]["resync_after"]))

    def restart(self, keep: int) -> None:
        """SIGKILL and restart: its state and all but the last ``keep`` queued batches are gone."""
        self.queue = self.queue[len(self.queue) - keep:] if keep else []
        self.sessions = Sessions()

    def read_back(self) -> dict[str, list[tuple[int, float]]]:
        """What TensorBoard's EventAccumulator (purge on) shows: a START at P forgets steps >= P.

        A point is shown unless a START after it in the file is at or below its step: one pass
        from the end of the file finds the lowest START after each point, one from the start keeps
        the shown points in file order."""
        kept = [False] * len(self.events)
        lowest = float("inf")  # the lowest START after the event at hand
        for k in range(len(self.events) - 1, -1, -1):
            ev = self.events[k]
            if ev[0] == "start":
                lowest = min(lowest, ev[1])
            else:
                kept[k] = ev[2] < lowest
        shown: dict[str, list[tuple[int, float]]] = {}
        for ev, keep in zip(self.events, kept):
            if ev[0] == "row":
                points = shown.setdefault(ev[1], [])  # a tag once written is shown, even with no point left
                if keep:
                    points.append((ev[2], ev[3]))
        return shown


def run_model(seed: int, steps: int, big_every: int, outage: tuple[int, int] = (0, 0), tags: int = 3,
              ticks: tuple[float, ...] = (0.001, 0.01, FLUSH_EVERY * 1.01)) -> None:
    """Log ``steps`` steps against the model service with random bursts and restarts, close, read back.

    During ``outage`` (first, last step) the service handles nothing, so the buffer overflows and
    drops (counted) what was never acknowledged; then only acknowledged points must all be there.
    """
    rng = random.Random(seed)
    clock = Clock()
    svc = ModelService()
    buf = SummaryBuffer(clock)
    sender = SummarySender(buf, svc.send, svc.read_acks, start_step=1, session="S")
    acked: set[tuple[str, int]] = set()
    real_ack = sender._acknowledge

    def acknowledge(written: int, step: int) -> None:  # note what the sender takes as written
        for sent in sender.inflight:
            if sent.seq <= written:
                acked.update((r[0], r[1]) for r in sent.chunk.rows)
        real_ack(written, step)

    sender._acknowledge = acknowledge  # type: ignore[method-assign]
    logged: dict[str, list[tuple[int, float]]] = {}
    restarts = 0
    for step in range(1, steps + 1):
        # most steps log 3 scalars; some log far more than a batch (and than the sender's tail)
        n = rng.randrange(5000, 30000) if big_every and step % big_every == 0 else tags
        values = {f"t{i}": float(step * 100000 + i) for i in range(n)}
        buf.scalars(values, step, 0.0)  # the rows of n scalar() calls, in order, in one call
        for tag, value in values.items():
            logged.setdefault(tag, []).append((step, value))
        sender.at_boundary(step)
        clock.t += rng.choice(ticks)
        down = outage[0] <= step <= outage[1]
        if rng.random() < 0.5 and not down:
            svc.handle(rng.randrange(0, 6))
        if step == outage[1] or (rng.random() < 0.02 and not down):
            svc.restart(keep=rng.randrange(0, 3))
            restarts += 1
    left = 1
    for _ in range(10_000):  # close(), with the service answering between its waits
        clock.t += 0.05
        sender.at_boundary(steps, urgent=True)
        svc.handle(8)
        left = sender.unconfirmed()
        if not left and not sender._resync_pending:
            sender.at_boundary(steps)
            if not sender.unconfirmed():
                break
    assert left == 0, left
    assert (buf.dropped_total > 0) == (outage != (0, 0)), buf.dropped_total
    assert restarts > 0 and sender.restatements > 0
    shown = svc.read_back()
    for tag, points in logged.items():
        got = shown.get(tag, [])
        missing = sorted(set(points) - set(got))
        lost_acked = [p for p in missing if (tag, p[0]) in acked]
        assert not lost_acked, f"seed {seed}: {tag}: {len(lost_acked)} acknowledged points lost, e.g. {lost_acked[:3]}"
        if outage != (0, 0):
            continue  # points dropped by the full buffer were never acknowledged
        assert not missing, f"seed {seed}: {tag}: {len(missing)} points lost, e.g. {missing[:3]}"
        assert sorted(got) == sorted(points), f"seed {seed}: {tag}: {len(got) - len(points)} extra points"
        if not big_every:  # and in step order, as TensorBoard reads them back
            assert got == points, f"seed {seed}: {tag}: not in step order"


@pytest.mark.parametrize("seed", range(12))
def test_random_restarts_lose_no_acknowledged_point(seed):
    run_model(seed, steps=3000, big_every=0)


@pytest.mark.parametrize("seed", range(6))  # each of these read a point back after its successor before the fix
def test_steps_cut_across_batches_are_restated_in_step_order(seed):
    """20 scalars a step and full batches (4096 rows: most batches end inside a step): a restatement
    puts the acknowledged part of its first step back before the unacknowledged rest, so each tag
    is read back in step order (out of order, its later steps released from the tail raised the
    next restatement's START above it, and the point was read back twice: seen against a real service)."""
    run_model(300 + seed, steps=3000, big_every=0, tags=20, ticks=(0.0001, 0.0002))


@pytest.mark.parametrize("seed", range(6))  # 2..5 lost acknowledged points before the fix
@pytest.mark.slow
def test_steps_larger_than_the_tail_survive_restatements(seed, monkeypatch):
    """A step with more rows than the sender keeps once acknowledged (TAIL_MAX), restated after a restart."""
    monkeypatch.setattr(sender_mod, "WINDOW", 200_000)  # many batches of one step in flight
    run_model(100 + seed, steps=400, big_every=37)


@pytest.mark.parametrize("seed", [0, 1, 5])  # each of these lost acknowledged points before the fix
@pytest.mark.slow
def test_a_restatement_into_a_full_buffer_drops_only_unacknowledged_points(seed):
    """The service is down long enough for the buffer to overflow, then restarts: the restatement
    (everything in flight, plus the acknowledged part of the step it starts at) goes back in front
    of a full buffer, which drops the oldest rows; none of them may be an acknowledged one."""
    run_model(200 + seed, steps=700, big_every=23, outage=(100, 400))


def test_a_graph_summary_of_the_restored_step_logged_again_replaces_the_dead_trainers():
    # the Supervisor page's manual summaries: at global step g, before the train op of step g + 1,
    # every 100th g logs the loss. Trainer A logs 0 and 100, trains to 130 and dies; trainer B restores
    # the checkpoint of step 100 and logs 100 again before it trains. Before: B restated from 101 (its
    # first boundary), so TensorBoard showed two losses at step 100 (CI, test_seeds_tf1[manual_summaries])
    svc = ModelService()

    def trainer(session: str, begin: int, end: int) -> None:
        clock = Clock()
        buf = SummaryBuffer(clock)
        sender = None
        for g in range(begin, end):
            if g % 100 == 0:
                buf.scalars({"loss": float(g) + (0.5 if session == "B" else 0.0)}, g, 0.0)
            if sender is None:  # the first hand-off, at the boundary of step g + 1
                sender = SummarySender(buf, svc.send, svc.read_acks, session=session,
                                       start_step=restate_from(g + 1, begin, buf.oldest_step(), False, graph=True))
            sender.at_boundary(g + 1, urgent=True)
            clock.t += FLUSH_EVERY * 1.01
            svc.handle(8)
        assert sender is not None and not sender.unconfirmed()

    trainer("A", 0, 130)
    svc.events.append(("start", 101))  # B's session start (SummaryLog.start_session): after its restored step
    trainer("B", 100, 300)
    assert svc.read_back()["loss"] == [(0, 0.0), (100, 100.5), (200, 200.5)]


class _Channels:
    """A session's connection (TrainerChannels) to the model service: its START as a file event."""

    watchdog = None

    def __init__(self, svc: ModelService) -> None:
        self.svc = svc

    def to_summary(self, msg: Any, payload: Any = ()) -> bool:
        if isinstance(msg, SessionLogEvent):  # SummaryLog.start_session's START, written as it comes
            self.svc.events.append(("start", msg.step))
            return True
        return self.svc.send(msg, payload)

    def summary_acks(self, timeout: float = 0.0) -> list[SummaryAck]:
        return self.svc.read_acks(timeout)


@pytest.mark.parametrize("graph", [True, False])
def test_a_summary_of_the_restored_step_after_a_run_that_made_no_step(graph):
    # the Supervisor page's manual summaries as procsv's seeds_tf1 example runs them: each session first
    # reads the global step (`range(sess.run(global_step), ...)`), a run that makes no step, whose boundary
    # work hands off what is due (StepBoundary.between_steps); then, at every 100th global step g, the loss
    # before the train op of step g + 1. Trainer A logs 0 and 100, trains to 130 and dies; B restores step 100.
    # Before: B's first hand-off came at that first run, with nothing logged, and fixed its first batch's
    # START at 101, so its loss at step 100 came after it, beside A's (CI, test_seeds_tf1[manual_summaries]:
    # [0, 100, 100, 200]). An eager program's point at the step it restored, logged before its first step,
    # is kept beside the dead trainer's, as guarantees.md says ("What is guaranteed", TensorBoard).
    svc = ModelService()
    settings = Settings(save_summaries_secs=None, summary_fn=None, stop_grace_secs=5.0, recovery_wait_secs=1.0,
                        init_fn=None, checkpoint_basename="model.ckpt")

    def trainer(session: str, begin: int, end: int) -> None:
        clock = Clock()
        state = SimpleNamespace(step=begin, losses=None)
        log = SummaryLog(state, clock, settings, chief=True, writes=True, writer=True,
                         graph_summary=(lambda: None) if graph else None)
        log.attach(_Channels(svc))
        log.start_session(begin, purge=session == "B", logdir=None)
        log.flush(False)  # the run that reads the global step: no step
        for g in range(begin, end):
            if g % 100 == 0:
                log.summary_computed(None, {"loss": float(g) + (0.5 if session == "B" else 0.0)})
            state.step = g + 1
            log.flush(False, urgent=True)  # the boundary of step g + 1
            clock.t += FLUSH_EVERY * 1.01
            svc.handle(8)
        assert log.sender is not None and not log.sender.unconfirmed()

    trainer("A", 0, 130)
    trainer("B", 100, 300)
    if graph:
        assert svc.read_back()["loss"] == [(0, 0.0), (100, 100.5), (200, 200.5)]
    else:
        assert svc.read_back()["loss"] == [(0, 0.0), (100, 100.0), (100, 100.5), (200, 200.5)]


@pytest.mark.parametrize("step, began, oldest, at_stop, graph, start", [
    (101, 100, 101, False, False, 101),  # eager: the first step after the restore logs at its own step
    (101, 100, 100, False, True, 100),  # graph: a summary at the restored step, then the first train op
    (101, 100, 100, False, False, 101),  # eager: logged between two sessions at the next one's step, kept beside
    (101, 100, 5, False, True, 101),  # a point logged at an explicit earlier step restates nothing before the start
    (100, 100, None, True, False, 101),  # stop() before any step, nothing logged: the earlier run's points stay
    (100, 100, 100, True, True, 100),  # graph: stop() before any step, after logging at the step it began at
    (100, 100, 100, True, False, 101),  # eager: the same, kept beside the earlier run's (as before)
    (100, 100, 101, False, True, 101),
    (100, 100, None, False, True, None),  # a run that made no step, nothing logged: no first batch yet
    (100, 100, None, False, False, None),
    (100, 100, 100, False, True, 100),  # graph: a run that made no step, after logging at the step it began at
    (100, 100, 100, False, False, 101),  # eager: the same, kept beside the earlier run's (as at the stop)
])
def test_the_first_restatement_starts_at_the_lowest_step_the_session_logged_since_it_began(
        step, began, oldest, at_stop, graph, start):
    assert restate_from(step, began, oldest, at_stop, graph) == start
