"""What the trainer's bootstrap and its Supervisors tell each other, as values.

Runs in the trainer. The bootstrap (:mod:`procsv.trainer.__main__`) runs the user's module with
``runpy``, so it never holds the Supervisor the module creates and cannot receive a return value
from it. Two facts cross that boundary, through this module only and one way each, so that the
bootstrap and the Supervisor never import each other:

* bootstrap -> Supervisor: a SIGTERM/SIGINT that arrived before any Supervisor installed its own
  handlers (:func:`catch_early_stop`, :func:`early_stop_signal`);
* Supervisor -> bootstrap: an :class:`Outcome` per Supervisor, asked for at exit
  (:func:`register`, :func:`collect`); from it the bootstrap tells the watchdog whether an exit
  with 42 is a preemption (:func:`exit_report`).
"""

from __future__ import annotations

import signal
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Optional, Union

from procsv.common.exitcodes import EXIT_PREEMPTED

EXIT_UNSAVED = 1  # the final (or, after a signal, the emergency) checkpoint did not commit


@dataclass(frozen=True)
class Outcome:
    """What the Supervisors of this process achieved."""

    steps_completed: int = 0  # steps completed by this process (0: it failed during start-up, if it fails)
    stopped_by_signal: bool = False  # a SIGTERM/SIGINT stopped training
    supervised: int = 0  # Supervisors that started a session
    unsaved: bool = False  # a final (or emergency) checkpoint did not commit
    # the SIGTERM/SIGINT that stopped a Supervisor whose checkpoint of its last step then committed
    # (0: none did): what makes an exit with 42 a preemption, which the trainer's exit report claims
    saved_after: int = 0
    committed: bool = False  # a checkpoint of a step past the one it began at committed while it lived

    def merge(self, other: "Outcome") -> "Outcome":
        return Outcome(self.steps_completed + other.steps_completed,
                       self.stopped_by_signal or other.stopped_by_signal, self.supervised + other.supervised,
                       self.unsaved or other.unsaved, self.saved_after or other.saved_after,
                       self.committed or other.committed)

    @property
    def preempted(self) -> bool:
        """A stop signal stopped training and the checkpoint committed: an exit with 42 is then a
        preemption ("saved, restart me"), and the trainer says so in its exit report. Not for a
        program without a checkpoint (nothing committed), nor when any final checkpoint failed."""
        return self.stopped_by_signal and bool(self.saved_after) and not self.unsaved

    @property
    def phase(self) -> str:
        """``startup`` if no step completed, else ``run`` (recorded in the error file)."""
        return "startup" if self.steps_completed == 0 else "run"

    @property
    def clean_exit_code(self) -> int:
        """The exit code of a process whose program returned normally: 1 (a failure, which the restart
        policy counts and a restart resumes from the newest committed checkpoint) if the final or
        emergency checkpoint did not commit; else 42 ("saved, restart me") after a signal, and 0."""
        if self.unsaved:
            return EXIT_UNSAVED
        return EXIT_PREEMPTED if self.stopped_by_signal else 0


def of(steps_completed: int, stopped_by: Union[bool, int, None], unsaved: bool, saved: bool,
       committed: bool = False) -> Outcome:
    """One Supervisor's outcome: ``stopped_by`` is the signal that stopped it (False or None: none),
    ``saved`` whether the checkpoint of its last step is committed, ``committed`` whether any of a step
    past the one it began at committed while it lived."""
    signum = int(stopped_by) if stopped_by else 0
    return Outcome(steps_completed, bool(signum), 1, unsaved, signum if saved else 0, committed)


class Slot:
    """One Supervisor's outcome. Held strongly while its session runs (what the bootstrap reads at
    exit, even if the program dropped it unstopped); from its stop on, held through a weak reference
    and kept as read at that stop, so that this registry does not keep a stopped Supervisor (and its
    graph) alive for the life of the process; held strongly again if it opens another session."""

    def __init__(self, provider: Callable[[], Outcome]) -> None:
        self._read: weakref.WeakMethod[Callable[[], Outcome]] = weakref.WeakMethod(provider)
        self._held: Optional[Callable[[], Outcome]] = provider
        self.last = Outcome()

    def keep(self) -> None:
        """Its stop: keep what it achieved, and let it go."""
        read = self._read()
        if read is not None:
            self.last = read()
        self._held = None

    def hold(self, provider: Callable[[], Outcome]) -> None:
        """Another session of the same Supervisor."""
        self._held = provider

    def __call__(self) -> Outcome:
        read = self._held or self._read()
        return read() if read is not None else self.last


_providers: list[Slot] = []
_early_signal: Optional[int] = None


def register(provider: Callable[[], Outcome]) -> Slot:
    """A Supervisor registers how to read its outcome (a bound method) when its session starts; it
    calls the slot's :meth:`Slot.keep` at each stop."""
    slot = Slot(provider)
    _providers.append(slot)
    return slot


def any_registered() -> bool:
    """Whether a Supervisor of this process has started a session already."""
    return bool(_providers)


def collect() -> Outcome:
    """The outcome of every Supervisor of this process so far."""
    total = Outcome()
    for slot in _providers:
        total = total.merge(slot())
    return total


def catch_early_stop() -> None:
    """Remember a SIGTERM/SIGINT that arrives before a Supervisor installs its own handlers."""

    def on_signal(signum: int, frame: Any) -> None:
        global _early_signal
        _early_signal = signum

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)


def early_stop_signal() -> Optional[int]:
    """The stop signal received before a Supervisor started, if any."""
    return _early_signal


def exit_report(result: Outcome, pid: int, role: str, attempt: int) -> Optional[dict[str, Any]]:
    """The trainer's exit report for the watchdog when it exits with 42 as a preemption (None when
    it is not one: the watchdog then judges the 42 as a failure). The bootstrap writes it."""
    if not result.preempted:
        return None
    try:
        name = signal.Signals(result.saved_after).name
    except ValueError:
        name = str(result.saved_after)
    return {"pid": pid, "role": role, "attempt": attempt, "code": EXIT_PREEMPTED, "preempted": True,
            "signal": name, "steps_completed": result.steps_completed}
