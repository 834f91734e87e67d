"""procsv's own TensorBoard scalars: which points are due (pure), and the socket they leave by.

Runs in the watchdog's loop. :func:`due` looks at the view and what was sent so far and returns
the :class:`~procsv.ipc.messages.RunScalars` due now, by global step:

* a **recovery**, at the first step of each restarted trainer attempt (its restored step + 1):
  ``procsv/restarts`` (restarts so far), ``procsv/recovery_secs`` (the kill or death to that first
  step, as in the recovery report) and ``procsv/steps_redone`` (this restart's);
* a **commit**, at the checkpoint's step: ``procsv/checkpoint_commit_secs`` (the checkpoint
  service's persist time) and ``procsv/checkpoint_age_secs`` 0 (if several commit within one round
  of the loop, only the last is sent);
* a **non-finite event** (issue 41), when a rollback or a skipped step was reported: ``procsv/rollbacks``
  and ``procsv/steps_skipped`` (the run's counts), at the newest skipped step (else at the step then);
* a **loss spike** (issue 68), when one was found or a replay found one the machine's:
  ``procsv/loss_spikes`` and ``procsv/transient_faults`` (the launch's counts), at the last spike's step;
* every :data:`SCALARS_EVERY` seconds once a step was completed, and once when the outcome is
  decided: ``procsv/restarts``, ``procsv/goodput``, ``procsv/time_share/<kind>`` (the share of
  this launch's wall time so far of each kind of :mod:`procsv.goodput`) and
  ``procsv/checkpoint_age_secs`` (since the last commit of this launch).

The summary service adds ``procsv/summaries_dropped`` to each point and writes them into the run
``procsv`` (:mod:`procsv.services.summary.procsvrun`). :class:`ScalarSender` sends them on a
DEALER connected to ``summary.sock`` without ever blocking: a point the socket's queue
(:data:`SNDHWM` messages, while the service is down) cannot take is dropped.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable, Optional

import zmq

from procsv.goodput import Breakdown
from procsv.ipc.messages import RunScalars
from procsv.ipc.transport import make_socket, send
from procsv.watchdog.publish import badput, recovery
from procsv.watchdog.rules.state import RunView

SCALARS_EVERY = 10.0  # seconds between periodic points
SNDHWM = 64  # points queued for a summary service that is down or slow; beyond that they are dropped


@dataclass(frozen=True)
class Sent:
    """What :func:`due` has already produced (the watchdog's monotonic clock for times)."""

    next_periodic: float = 0.0
    commits: int = 0  # ``view.commits`` when the last commit point went out
    recovered: int = 1  # trainer attempts (by index in ``view.attempts``) whose recovery point is out or moot
    nonfinite: tuple[int, int] = (0, 0)  # (rollbacks, skipped steps) when the last non-finite point went out
    spikes: tuple[int, int] = (0, 0)  # (loss spikes, transient faults) when the last spike point went out
    final: bool = False


def due(view: RunView, now: float, wall: float, sent: Sent,
        spent: Optional[Callable[[], Breakdown]] = None) -> tuple[list[RunScalars], Sent]:
    """The points due at ``now`` / ``wall`` and the new :class:`Sent`; ``spent``: the launch's breakdown at
    ``now`` (the round's :class:`~procsv.watchdog.publish.badput.Shared`), asked for only when a periodic point is due."""
    out: list[RunScalars] = []
    attempts = view.attempts
    i = sent.recovered
    while i < len(attempts):
        a = attempts[i]
        if a.first_step_at is None:
            if i == len(attempts) - 1:
                break  # still restoring: its point comes with its first step
            i += 1  # died before a first step: the next attempt's recovery covers it
            continue
        rec = recovery.recoveries(attempts[i - 1:i + 1])[0]
        tags, values = ["procsv/restarts"], [float(i - view.not_restarts(before=a.attempt))]  # (a rollback, a regroup: none)
        if rec["total_s"] is not None:
            tags.append("procsv/recovery_secs")
            values.append(float(rec["total_s"]))
        if rec["steps_redone"] is not None:
            tags.append("procsv/steps_redone")
            values.append(float(rec["steps_redone"]))
        if view.group_nodes:
            tags.append("procsv/group_hosts")
            values.append(float(len(view.group_nodes)))
        out.append(RunScalars(a.restored_step + 1, wall, tags, values))
        i += 1
    sent = replace(sent, recovered=i)
    if view.commits > sent.commits and view.last_commit_step is not None:
        out.append(RunScalars(view.last_commit_step, wall,
                              ["procsv/checkpoint_commit_secs", "procsv/checkpoint_age_secs"],
                              [float(view.last_commit_secs), 0.0]))
        sent = replace(sent, commits=view.commits)
    counts = (view.rollbacks, len(view.skipped_steps))
    if counts != sent.nonfinite:
        at = view.skipped_steps[-1] if counts[1] != sent.nonfinite[1] else view.step
        out.append(RunScalars(at, wall, ["procsv/rollbacks", "procsv/steps_skipped"], [float(c) for c in counts]))
        sent = replace(sent, nonfinite=counts)
    found = view.findings
    spikes = (found.spikes, sum(found.transient.values()))
    if spikes != sent.spikes and found.last_spike is not None:
        out.append(RunScalars(found.last_spike.step, wall, ["procsv/loss_spikes", "procsv/transient_faults"],
                              [float(c) for c in spikes]))
        sent = replace(sent, spikes=spikes)
    stepped = any(a.first_step_at is not None for a in attempts)
    final = view.finishing and not sent.final
    if stepped and (now >= sent.next_periodic or final):
        tags, values = ["procsv/restarts"], [float(max(0, len(attempts) - 1 - view.not_restarts()))]
        spent_now = spent() if spent is not None else badput.of_launch(view, now)
        if spent_now.goodput is not None:  # (stepped: badput.goodput's gate is passed)
            tags.append("procsv/goodput")
            values.append(spent_now.goodput)
        if spent_now.wall > 0:
            tags += [f"procsv/time_share/{k}" for k in spent_now.secs]
            values += [v / spent_now.wall for v in spent_now.secs.values()]
        if view.group_nodes:  # an elastic group's hosts now (rule 15)
            tags.append("procsv/group_hosts")
            values.append(float(len(view.group_nodes)))
        if view.last_commit_at is not None:
            tags.append("procsv/checkpoint_age_secs")
            values.append(max(0.0, now - view.last_commit_at))
        out.append(RunScalars(view.step, wall, tags, values))
        sent = replace(sent, next_periodic=now + SCALARS_EVERY, final=sent.final or view.finishing)
    return out, sent


class ScalarSender:
    """The watchdog's DEALER to ``summary.sock``; :meth:`tick` sends what :func:`due` says, never blocking."""

    def __init__(self, zctx: zmq.Context[Any], endpoint: str) -> None:
        self.sock = make_socket(zctx, zmq.DEALER, sndhwm=SNDHWM)
        self.sock.connect(endpoint)
        self.sent = Sent()

    def tick(self, view: RunView, now: float, wall: float, spent: Optional[Callable[[], Breakdown]] = None) -> None:
        points, self.sent = due(view, now, wall, self.sent, spent)
        for p in points:
            send(self.sock, p)  # (False: the queue is full, the point dropped)

    def close(self) -> None:
        self.sock.close(0)
