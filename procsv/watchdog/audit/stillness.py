"""Whether the auditor now running is hung: let run, and using no CPU (issue 71).

Runs in the watchdog: :class:`~procsv.watchdog.audit.auditors.Auditors` reads the running auditor's CPU seconds
(:meth:`~procsv.watchdog.executor.Executor.cpu_secs`) when :meth:`Stillness.due` says, hands each reading to
:meth:`Stillness.heard`, and SIGKILLs an auditor it finds hung (its interval is then replayed as a dead auditor's:
:func:`~procsv.watchdog.audit.verdict.died`). Pure: readings and the injected clock in, a reason out.

An auditor sends nothing while it replays (no session with the services, no progress:
:mod:`procsv.trainer.audit.replay`), so its silence says nothing; its CPU does. A replay computes; an auditor
starved of CPU (it runs at ``SCHED_IDLE``, beside busy processes) still gets some, for the kernel's weight of an
idle-class task is small, not zero (a busy loop at ``SCHED_IDLE`` beside four CPU-bound processes on 2 cores, load
8-10: 0.06 s of CPU in 12 s). One that used none at all for :data:`HUNG_SECS` of the time it was let run (the duty
cycle's stops, SIGSTOP, are not counted) is blocked: a deadlock, a read that never returns. Before, such an
auditor held the audit for the rest of the launch (no interval replayed again; under ``--audit every`` a
finished trainer's end waited the whole ``END_WAIT_SECS``). A group's replay (N auditors) is hung when any one
member is: each member's CPU is read and counted apart. Their sum was, and a member stopped by someone else
(SIGSTOP) left the others waiting in a collective, whose threads still used CPU: the replay was never found hung,
and a finished run's end waited the whole ``END_WAIT_SECS``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

HUNG_SECS = 60.0  # let run this long using no CPU at all: hung
READ_SECS = 1.0  # the auditor's CPU is read at most this often


@dataclass
class Stillness:
    """The running auditor's last CPU reading (its attempt, the seconds of each of its members, when) and how long
    each member has been let run since its CPU last moved (:attr:`still`: the longest)."""

    attempt: Optional[int] = None
    cpu: tuple[float, ...] = ()
    at: Optional[float] = None
    stills: tuple[float, ...] = ()

    @property
    def still(self) -> float:
        """The longest any member has been let run since its CPU last moved."""
        return max(self.stills, default=0.0)

    def due(self, now: float) -> bool:
        """Whether the auditor's CPU should be read now (once every :data:`READ_SECS`)."""
        return self.at is None or now - self.at >= READ_SECS

    def switched(self, now: float) -> None:
        """The duty cycle stopped or continued the auditor at ``now``: the time since the last reading is left out
        (its state in it is not known whole), so that the time counted between two readings was all let run, or
        none."""
        if self.at is not None:
            self.at = now

    def heard(self, now: float, attempt: Optional[int], cpu: Optional[float | Sequence[float]], let_run: bool,
              names: Sequence[str] = ()) -> Optional[str]:
        """Auditor ``attempt``'s CPU seconds ``cpu`` read at ``now`` (a group's replay: each member's, ``names`` theirs;
        ``attempt`` or ``cpu`` None: none runs, or one is gone), ``let_run``: it was not stopped by the duty cycle since
        the last reading. The reason it is hung, once one member used no CPU for :data:`HUNG_SECS` of let-run time;
        else None."""
        cpus = (cpu,) if isinstance(cpu, (int, float)) else tuple(cpu) if cpu is not None else None
        if attempt is None or cpus is None or attempt != self.attempt or self.at is None or len(cpus) != len(self.cpu):
            self.attempt, self.cpu, self.at = attempt, cpus or (), now  # (a new auditor, or none)
            self.stills = (0.0,) * len(self.cpu)
            return None
        span = now - self.at if let_run else 0.0
        self.stills = tuple(0.0 if c > old else s + span for c, old, s in zip(cpus, self.cpu, self.stills))
        self.cpu, self.at = cpus, now
        if self.still < HUNG_SECS:
            return None
        who = "the auditor" if len(self.stills) < 2 else \
            f"the auditors' member {names[self.stills.index(self.still)] if len(names) == len(self.stills) else self.stills.index(self.still)}"
        return f"{who} used no CPU in {self.still:.0f} s of running (hung)"
