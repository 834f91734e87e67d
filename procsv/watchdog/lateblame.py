"""A trainer group's breaker found after its attempt was judged: the ``breaker`` record.

Runs in the watchdog. Node 1's agent's report of its member's end (or ``node_lost``) often comes in
after node 0's chief failed in its next collective, and that failure is judged at once (the restart
waits for no other host: rule 11, :mod:`procsv.watchdog.rules.group`). When the member turns out to
have been cut off (killed by a signal procsv did not send, or its host lost),
:func:`breaker_found` records it as the attempt's breaker: the chief's ``broken_by`` (what
``report.json`` counts) and ``last_error`` if that still named the end judged, and returns the
``breaker`` record with its line for the loop to write. Asked after every end observed
(:func:`procsv.watchdog.observe.reaped`: ``ChildEnds`` for this host's, ``RemoteMembers`` for another
host's members) and by the executor after ``NodeLost``.
No I/O and no clock here.
"""

from __future__ import annotations

from procsv.watchdog.publish.events import Event, Report
from procsv.watchdog.rules.group import late_breaker
from procsv.watchdog.rules.state import TRAINER, RunView


def breaker_found(view: RunView) -> list[Report]:
    """The ``breaker`` record (and its line) of the chief's attempt, if a member of it was found cut off
    after the attempt was judged by a peer's collective failure
    (:func:`procsv.watchdog.rules.group.late_breaker`); the view then names that member
    (``broken_by``, and ``last_error`` if that still named the one judged). Empty: nothing to correct."""
    chief = view.children.get(TRAINER)
    found = late_breaker(view, chief) if chief is not None else None
    if chief is None or found is None or chief.broken_by is None:
        return []
    judged, chief.broken_by = chief.broken_by.headline(), found
    if view.last_error == judged:
        view.last_error = found.headline()
    return [Report(Event.BREAKER, {"attempt": chief.attempt, "role": found.slot, "pid": found.pid,
                                   "error": found.headline(), "judged": judged},
                   say=f"procsv: {found.headline()}: it broke the trainer group's attempt {chief.attempt} (the end "
                       f"judged first, {judged}, was its consequence)", err=True)]
