"""The watchdog's half of the death notice: a thread that wakes when the trainer dies.

Runs in the watchdog. See :mod:`procsv.common.mutex` for why a robust mutex beats the pidfd by
50-100 ms for a process that imported TensorFlow.
"""

from __future__ import annotations

import errno
import threading
import time
from typing import Callable

from procsv.common.mutex import RobustMutex


class DeathWatch:
    """In the watchdog: waits (in a thread) until the trainer releases the mutex or dies holding it.

    ``on_event(died, at)`` is called from the thread: ``died`` is True for "owner died" (an
    unclean death) and False for a clean release; ``at`` is the injected ``clock`` (the watchdog's
    monotonic clock) read at the wake-up.
    The thread first waits until the trainer holds the mutex (polling ``trylock``), so a trainer
    that dies before taking it is left to the pidfd; :meth:`cancel` (the watchdog's, as it reaps the
    trainer or gives up on it) ends that wait.
    """

    def __init__(self, mutex: RobustMutex, on_event: Callable[[bool, float], None],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.mutex = mutex
        self._clock = clock
        self._on_event = on_event
        self._cancelled = False
        self.waiting = False  # True once the trainer holds the mutex and the watch blocks on it (tests wait for it)
        self.thread = threading.Thread(target=self._run, name="procsv-deathwatch", daemon=True)
        self.thread.start()

    def cancel(self) -> None:
        self._cancelled = True

    def close(self, timeout: float = 1.0) -> bool:
        """Once the trainer is reaped: let the thread end; True if it did within ``timeout``.

        The thread unmaps the mutex and deletes its file as it returns, whenever that is (never
        unmapped under a waiting thread, never left behind by a reaped trainer); it returns within
        milliseconds of the trainer's death (the kernel wakes a waiter on a dead owner's robust
        mutex at its exit; the polling before it ends on :meth:`cancel`), later on a loaded machine.
        """
        self.cancel()
        self.thread.join(timeout)
        return not self.thread.is_alive()

    def _run(self) -> None:
        try:
            self._watch()
        finally:
            self.mutex.remove()  # no process holds it (dead, released, reaped) or will (cancelled)

    def _watch(self) -> None:
        while not self._cancelled:
            rc = self.mutex.trylock()
            if rc == errno.EBUSY:
                break  # the trainer holds it: now wait for its release or death
            if rc == errno.EOWNERDEAD:  # it took the mutex and died before we started waiting
                self._on_event(True, self._clock())
                return
            if rc == 0:
                self.mutex.unlock()
            time.sleep(0.002)
        if self._cancelled:
            return
        self.waiting = True
        rc = self.mutex.lock()
        at = self._clock()
        if not self._cancelled:
            self._on_event(rc == errno.EOWNERDEAD, at)
