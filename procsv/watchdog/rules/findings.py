"""What the trainers found wrong with the training itself, as the watchdog tallies it: plain data and
one pure rule.

Runs in the watchdog. Its observation of the trainers' :class:`~procsv.ipc.messages.NonfiniteDetected`,
:class:`~procsv.ipc.messages.SpikeDetected` and :class:`~procsv.ipc.messages.SpikeReplayed`
(:mod:`procsv.watchdog.observe`) changes a :class:`Findings` through its methods; ``status.json``,
the Prometheus snapshot and procsv's TensorBoard scalars read it (:mod:`procsv.watchdog.publish`).

A *transient fault* is a loss spike that did not come again when replayed from a snapshot before its
onset (``--on-spike rollback``: a ``spike_replayed`` record with ``reproduced`` false), or an interval
two audit replays agree the trainer computed wrongly (``--audit``: an ``audit`` record with verdict
``trainer``), counted for the host that computed it. A host whose transient faults in this launch reach ``--suspect-after``
(:data:`SUSPECT_AFTER` by default) is *suspect* (:func:`suspect`): reported once, as a line, a
``host_suspect`` lifecycle record, in ``status.json`` and Prometheus. Nothing else follows from it:
no host is excluded and no run stopped for it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Optional

SUSPECT_AFTER = 3  # --suspect-after: a host's transient faults in a launch that make it suspect


def suspect(faults: int, limit: int) -> bool:
    """Whether a host with ``faults`` transient faults is suspect under ``--suspect-after limit``."""
    return faults >= limit


@dataclass(frozen=True)
class SpikeSeen:
    """A loss spike as its ``spike_detected`` record tells it (the fields ``procsv status`` shows)."""

    step: int
    onset: int
    loss: float
    threshold: float
    median: float
    action: str  # rollback | stop | warn


@dataclass
class Findings:
    """The launch's findings: non-finite losses or states found (a group's step: once; the group's rollbacks of them in
    place), loss spikes
    (by ``--on-spike`` action, and the last one), transient faults by host, and the hosts reported
    suspect (in the order they became so) under ``suspect_after``."""

    suspect_after: int = SUSPECT_AFTER
    nonfinite: int = 0
    group_in_place: int = 0  # a trainer group's rollbacks in place (its chief's RolledBack of the group)
    spikes: int = 0
    by_action: dict[str, int] = field(default_factory=dict)
    last_spike: Optional[SpikeSeen] = None
    transient: dict[str, int] = field(default_factory=dict)
    suspects: list[str] = field(default_factory=list)
    # --audit (issue 71): the hosts whose trainer an audit found computing wrongly (each also a transient fault
    # of the host, above), and the audit's figures as status.json shows them (set by procsv.watchdog.audit)
    miscomputed: dict[str, int] = field(default_factory=dict)
    audit: dict[str, Any] = field(default_factory=dict)  # ("end_waits": a finished trainer waits for its verdicts)
    audit_rollbacks: dict[int, str] = field(default_factory=dict)  # trainer attempt -> why an audit rolled it back

    def spiked(self, seen: SpikeSeen) -> None:
        """A spike found (its ``spike_detected``)."""
        self.spikes += 1
        self.by_action[seen.action] = self.by_action.get(seen.action, 0) + 1
        self.last_spike = seen

    def replayed(self, host: str, reproduced: bool, input_differs: bool = False) -> bool:
        """A spike's replay said whose it was (its ``spike_replayed``); True if ``host`` became suspect by it.
        ``input_differs``: the replayed steps before the onset gave other losses than the first run's (the
        program's input did not come back with the restored state): no verdict on the host, no fault."""
        if reproduced or input_differs:
            return False
        self.transient[host] = self.transient.get(host, 0) + 1
        if host in self.suspects or not suspect(self.transient[host], self.suspect_after):
            return False
        self.suspects.append(host)
        return True

    def audit_found(self, host: str) -> bool:
        """An audit found the trainer on ``host`` computing wrongly: a transient fault of the host; True if it
        became suspect by it."""
        self.miscomputed[host] = self.miscomputed.get(host, 0) + 1
        return self.replayed(host, reproduced=False)

    def spikes_json(self) -> dict[str, Any]:
        """``status.json``'s ``spikes``."""
        return {"seen": self.spikes, "by_action": dict(sorted(self.by_action.items())),
                "last": None if self.last_spike is None else asdict(self.last_spike),
                "transient_faults": dict(sorted(self.transient.items())), "suspect_hosts": list(self.suspects),
                "suspect_after": self.suspect_after}
