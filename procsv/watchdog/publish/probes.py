"""``/healthz`` and ``/readyz`` on the ``--metrics-port`` endpoint: a liveness and a readiness probe.

Runs in the watchdog process. The loop stamps a :class:`LoopPulse` at the end of every round (one
float and one bool replaced; no lock the loop could wait on); the metrics HTTP server's threads
(:mod:`procsv.watchdog.publish.metrics`) answer a probe from it with the pure functions
:func:`healthz` and :func:`readyz` at the time of the request.

- ``/healthz``: 200 while the watchdog loop turns -- also while it stops the run in order, which
  is the same loop -- and 503 once no round completed for :data:`STALL_SECS` (the loop is stuck:
  a kubelet's liveness probe then restarts the pod). Before the first round the time is counted
  from the moment the endpoint was bound.
- ``/readyz``: 503 until a trainer of this launch completed its first step, then 200 for the rest
  of the launch (a trainer restart does not make the run unready: the watchdog restores it within
  the pod).

The probes say nothing the metrics do not (no step, no path): only whether the loop turns and
whether training started. What ``--metrics-host 0.0.0.0`` exposes is the whole endpoint, the
metrics included (docs/observability.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

from procsv.watchdog.rules.state import WORKER, RunView

STALL_SECS = 10.0  # no loop round for longer than this: /healthz answers 503
HEALTHZ = "/healthz"
READYZ = "/readyz"


@dataclass(frozen=True)
class ProbeAnswer:
    """An HTTP answer to a probe: the status code (200 or 503) and one line of text."""

    code: int
    text: str

    @property
    def status(self) -> str:
        """The WSGI status line."""
        return "200 OK" if self.code == 200 else "503 Service Unavailable"


def healthz(last_round: float, now: float, stall_secs: float = STALL_SECS) -> ProbeAnswer:
    """Liveness at monotonic time ``now``, given when the loop last completed a round."""
    idle = now - last_round
    if idle > stall_secs:
        return ProbeAnswer(503, f"stalled: no watchdog loop round for {idle:.1f} s (more than {stall_secs:g} s)\n")
    return ProbeAnswer(200, "ok: the watchdog loop turns\n")


def readyz(stepped: bool) -> ProbeAnswer:
    """Readiness: whether a trainer of this launch completed a step."""
    if stepped:
        return ProbeAnswer(200, "ready: training started\n")
    return ProbeAnswer(503, "not ready: no trainer completed a step yet\n")


def stepped(view: RunView) -> bool:
    """Whether any trainer attempt of this launch (this host's or, in a group, any member) completed a step."""
    return any(a.first_step_at is not None for a in view.attempts) or \
        any(c.role == WORKER and c.first_step_at is not None for c in view.children.values())


class LoopPulse:
    """What the loop tells the probe threads: when it last completed a round, and whether training started.

    Written only by the loop (:meth:`turned`), read by the HTTP threads (:meth:`answer`); each
    attribute is replaced whole, so a reader sees an old or a new value, never a torn one.
    """

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self.last_round = clock()  # the endpoint's bind counts as the start of the wait for the first round
        self.stepped = False

    def turned(self, view: RunView) -> None:
        """A round of the watchdog's loop completed (called at the end of each)."""
        self.beat(self.stepped or stepped(view))

    def beat(self, stepped_now: bool) -> None:
        """A round of a loop completed; ``stepped_now``: a trainer has completed a step (it latches)."""
        if stepped_now:
            self.stepped = True
        self.last_round = self._clock()

    def answer(self, path: str) -> Optional[ProbeAnswer]:
        """The answer to a probe's path (None: not a probe)."""
        if path == HEALTHZ:
            return healthz(self.last_round, self._clock())
        if path == READYZ:
            return readyz(self.stepped)
        return None
