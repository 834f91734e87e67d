"""A forked trainer's one-shot "ready" message that arrives before the zygote's answer names it.

Runs in the watchdog. A trainer (or hot standby) forked from the zygote does not wait for the
zygote's :class:`~procsv.ipc.messages.ForkReply`: it sets up, restores and says ``TrainerReady`` (a
standby ``StandbyReady``) as soon as it can. At load the watchdog may read that message first (the
zygote was not scheduled in between, or both were ready in one poll and the message socket came
first): the view does not know the pid yet, ``observe.heard`` drops the message, and it is never
sent again (the restarted trainer's restore is not recorded: ``restored_step`` stays None in
``status.json``). :class:`EarlyReady` holds such a message while a fork is pending and gives it
back once the reply made its pid known; with no fork pending it is dropped, as before.
"""

from __future__ import annotations

from typing import Union

from procsv.ipc.messages import StandbyReady, TrainerReady

OneShot = Union[TrainerReady, StandbyReady]


class EarlyReady:
    """The held messages, in the order they arrived."""

    def __init__(self) -> None:
        self._held: list[OneShot] = []

    def hold(self, msg: object, known: set[int], forking: bool) -> bool:
        """Keep ``msg`` (True) if it is a one-shot ready message from a pid the view does not know
        (``known``) while a fork is pending (``forking``); False: observe it now."""
        if forking and isinstance(msg, (TrainerReady, StandbyReady)) and msg.pid not in known:
            self._held.append(msg)
            return True
        return False

    def __len__(self) -> int:
        return len(self._held)

    def release(self, known: set[int], forking: bool) -> list[OneShot]:
        """The held messages whose pid is known now, in arrival order; with no fork pending any
        more, the others are dropped (their process is not one the watchdog started)."""
        out = [m for m in self._held if m.pid in known]
        self._held = [m for m in self._held if m.pid not in known] if forking else []
        return out
