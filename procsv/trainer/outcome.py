"""What the trainer's bootstrap and its Supervisors tell each other, as values.

Runs in the trainer. The bootstrap (:mod:`procsv.trainer.__main__`) runs the user's module with
``runpy``, so it never holds the Supervisor the module creates and cannot receive a return value
from it. Two facts cross that boundary, through this module only and one way each, so that the
bootstrap and the Supervisor never import each other:

* bootstrap -> Supervisor: a SIGTERM/SIGINT that arrived before any Supervisor installed its own
  handlers (:func:`catch_early_stop`, :func:`early_stop_signal`);
* Supervisor -> bootstrap: an :class:`Outcome` per Supervisor, asked for at exit
  (:func:`register`, :func:`collect`).
"""

from __future__ import annotations

import signal
from dataclasses import dataclass
from typing import Any, Callable, Optional

from procsv.common.exitcodes import EXIT_PREEMPTED

EXIT_UNSAVED = 1  # the final (or, after a signal, the emergency) checkpoint did not commit


@dataclass(frozen=True)
class Outcome:
    """What the Supervisors of this process achieved."""

    steps_completed: int = 0  # steps completed by this process (0: it failed during start-up, if it fails)
    stopped_by_signal: bool = False  # a SIGTERM/SIGINT stopped training
    supervised: int = 0  # Supervisors that started a session
    unsaved: bool = False  # a final (or emergency) checkpoint did not commit

    def merge(self, other: "Outcome") -> "Outcome":
        return Outcome(self.steps_completed + other.steps_completed,
                       self.stopped_by_signal or other.stopped_by_signal, self.supervised + other.supervised,
                       self.unsaved or other.unsaved)

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


_providers: list[Callable[[], Outcome]] = []
_early_signal: Optional[int] = None


def register(provider: Callable[[], Outcome]) -> None:
    """A Supervisor registers how to read its outcome when its session starts."""
    _providers.append(provider)


def any_registered() -> bool:
    """Whether a Supervisor of this process has started a session already."""
    return bool(_providers)


def collect() -> Outcome:
    """The outcome of every Supervisor of this process so far."""
    total = Outcome()
    for provider in _providers:
        total = total.merge(provider())
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
