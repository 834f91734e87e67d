"""A TF2 re-creation of ``tf.train.Coordinator``: stop requests, the first error, joining threads.

Runs in the trainer. A stop a thread of the program asked with its error lets the training loop's next steps
run, as TF's sessions do (:attr:`Coordinator.ends_steps`); the error is raised at :meth:`Coordinator.join`.
``request_stop`` may be called from any thread; a signal handler calls
:meth:`Coordinator.request_stop_from_signal`, which only sets a flag (no lock is taken inside a
signal handler, so it cannot deadlock the thread it interrupts).

``sys.exit(0)`` / ``sys.exit()`` (a ``SystemExit`` whose code is 0 or None), from the block or from a
thread, is a clean stop, not an error: it is kept apart from :attr:`Coordinator.exception` (so
the Supervisor still commits its final checkpoint) as :attr:`Coordinator.exit_request`, and
re-raised after everything else at :meth:`Coordinator.join`, so that the program still exits
there. ``sys.exit(N)`` with any other code is the program's failure, recorded like any exception.
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any, Callable, Iterable, Iterator, Mapping, Optional, TypeGuard

from procsv.common.errors import ProcsvError, TrainingStopped


def clean_stop_types() -> tuple[type[BaseException], ...]:
    """Exceptions that mean "the input is exhausted": a clean stop, never re-raised."""
    import tensorflow as tf

    return (tf.errors.OutOfRangeError, StopIteration, TrainingStopped)


def is_clean_exit(ex: object) -> TypeGuard[SystemExit]:
    """``sys.exit(0)``, ``sys.exit()`` or ``sys.exit(None)``: the program asks to end, successfully."""
    return isinstance(ex, SystemExit) and ex.code in (0, None)


class Coordinator:
    """Stop requests, the first error and the threads to join, for the trainer's own threads."""

    def __init__(self, clean_stop_exception_types: Optional[tuple[type[BaseException], ...]] = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock  # the monotonic clock of wait_for_stop, join and LooperThread
        self._clean = clean_stop_exception_types if clean_stop_exception_types is not None else clean_stop_types()
        self._lock = threading.Lock()
        self._event = threading.Event()
        self._signalled: Optional[int] = None
        # True once a stop was asked (request_stop or a signal) until clear_stop: one attribute read
        # for the step loop's check (should_stop is two calls, beside a sub-millisecond step)
        self.asked = False
        self._exc: Optional[BaseException] = None
        self._exit: Optional[SystemExit] = None  # the first sys.exit(0)/sys.exit(): re-raised at join
        self._threads: list[threading.Thread] = []
        self._joined = False

    def request_stop(self, ex: Any = None) -> None:
        """Ask everyone to stop; the first non-clean exception is kept and re-raised at join. A
        ``sys.exit(0)``/``sys.exit()`` is no error (:attr:`exception` stays None): it is kept as
        :attr:`exit_request` and re-raised at join when no error was recorded.

        ``ex`` is an exception or, as TF accepts, a ``sys.exc_info()`` tuple."""
        if isinstance(ex, tuple):
            ex = ex[1] if len(ex) >= 2 else None
        if ex is not None and not isinstance(ex, BaseException):
            raise TypeError(f"request_stop(ex): an exception or a sys.exc_info() tuple, not {type(ex).__name__}")
        with self._lock:
            if is_clean_exit(ex):
                self._exit = self._exit or ex
            elif ex is not None and self._exc is None and not isinstance(ex, self._clean):
                self._exc = ex
            self.asked = True
            self._event.set()

    def suppress_no_exception(self) -> None:
        """From now on, every exception reported is an error, ``OutOfRangeError`` and ``StopIteration``
        too, as the coordinator TF's MonitoredSession makes (``Coordinator(clean_stop_exception_types=[])``:
        a thread's exhausted input is raised when the block exits); procsv's own clean stop
        (:class:`TrainingStopped`) stays one."""
        with self._lock:
            self._clean = (TrainingStopped,)

    def clear_stop(self) -> None:
        """Forget the stop request, the recorded exception and the join, as TF's ``clear_stop()``
        (a Supervisor reused after a stop calls it before running steps again)."""
        with self._lock:
            self._exc = None
            self._exit = None
            self._signalled = None
            self._joined = False
            self.asked = False
            self._event.clear()

    @property
    def joined(self) -> bool:
        """True once :meth:`join` has finished waiting (even if it then raised)."""
        return self._joined

    def request_stop_from_signal(self, signum: int) -> None:
        self._signalled = signum
        self.asked = True

    @property
    def stop_signal(self) -> Optional[int]:
        """The signal number that asked for the stop, if a signal did."""
        return self._signalled

    def should_stop(self) -> bool:
        if self._signalled is not None and not self._event.is_set():
            self._event.set()
        return self._event.is_set()

    def wait_for_stop(self, timeout: Optional[float] = None) -> bool:
        deadline = None if timeout is None else self.clock() + timeout
        while not self.should_stop():
            left = 0.1 if deadline is None else min(0.1, deadline - self.clock())
            if left <= 0:
                return False
            self._event.wait(left)
        return True

    @contextlib.contextmanager
    def stop_on_exception(self) -> Iterator[None]:
        try:
            yield
        except BaseException as exc:
            self.request_stop(exc)

    def register_thread(self, thread: threading.Thread) -> None:
        with self._lock:
            self._threads.append(thread)

    def raise_requested_exception(self) -> None:
        """Raise the recorded exception, else a recorded ``sys.exit(0)``/``sys.exit()``."""
        if self._exc is not None:
            raise self._exc
        if self._exit is not None:
            raise self._exit

    @property
    def exception(self) -> Optional[BaseException]:
        """The first error recorded (never a clean stop, never a ``sys.exit(0)``)."""
        return self._exc

    @property
    def program_error(self) -> Optional[BaseException]:
        """The first error recorded when it is the program's (a thread's ``request_stop(ex)``,
        ``stop_on_exception``), not procsv's own (:attr:`procsv_failure`). TF's sessions treat it as
        theirs: the next runs go ahead (:attr:`ends_steps`), a ``SingularMonitoredSession``'s
        ``should_stop()`` raises it (:meth:`raise_program_error`), and a block left without an error still
        calls the hooks' ``end()`` before the close raises it."""
        exc = self._exc
        return None if exc is None or isinstance(exc, ProcsvError) else exc

    @property
    def procsv_failure(self) -> Optional[BaseException]:
        """The first error recorded when it is procsv's own (a :class:`~procsv.common.errors.ProcsvError`,
        such as a checkpoint failure): the loop ends at its next step, and no hook's ``end()`` is called."""
        exc = self._exc
        return exc if isinstance(exc, ProcsvError) else None

    def raise_program_error(self) -> None:
        """Raise :attr:`program_error`, if one was recorded: TF's coordinated session's ``should_stop()``
        (``_CoordinatedSession._check_stop``: ``raise_requested_exception()``), which a
        ``SingularMonitoredSession`` (no recoverable session around it) lets through."""
        exc = self.program_error
        if exc is not None:
            raise exc

    @property
    def ends_steps(self) -> bool:
        """Whether the stop asked so far refuses the training loop's next step (the sessions raise
        :class:`TrainingStopped`, a clean stop): a signal, a stop with no error, or procsv's own error (a
        checkpoint failure). An error a thread of the program recorded (:attr:`program_error`) does not:
        TF's sessions run the next steps and raise it when the block exits, and so do procsv's (the step
        boundary commits no checkpoint after it)."""
        return self._signalled is not None or self.program_error is None

    @property
    def exit_request(self) -> Optional[SystemExit]:
        """The first ``sys.exit(0)``/``sys.exit()`` that asked for the stop, if one did."""
        return self._exit

    def join(self, threads: Optional[Iterable[threading.Thread]] = None, stop_grace_period_secs: float = 120,
             ignore_live_threads: bool = False) -> None:
        """Join the registered (and given) threads, as TF: first wait until they all ended or a stop
        was requested (no time limit: healthy threads are never cut short); only then do they get
        ``stop_grace_period_secs`` to end. Re-raise the recorded exception, if any, else a recorded
        ``sys.exit(0)``/``sys.exit()`` (as TF re-raised whatever it recorded); else a
        ``RuntimeError`` naming the threads still alive, unless ``ignore_live_threads``."""
        with self._lock:
            all_threads = list(self._threads) + [t for t in (threads or []) if t not in self._threads]
        while any(t.is_alive() for t in all_threads) and not self.should_stop():
            self._event.wait(0.05)
        deadline = self.clock() + stop_grace_period_secs
        for t in all_threads:
            t.join(max(0.0, deadline - self.clock()))
        alive = [t.name for t in all_threads if t.is_alive()]
        with self._lock:
            self._joined = True
            self._threads = [t for t in self._threads if t not in all_threads]
        self.raise_requested_exception()
        if alive and not ignore_live_threads:
            raise RuntimeError(f"Coordinator stopped with threads still running: {' '.join(alive)}")


class LooperThread(threading.Thread):
    """Calls ``target`` at fixed-rate boundaries (first call at once) until a stop is requested."""

    def __init__(self, coord: Coordinator, timer_interval_secs: Optional[float], target: Callable[..., object],
                 args: Optional[Iterable[Any]] = None, kwargs: Optional[Mapping[str, Any]] = None) -> None:
        super().__init__(daemon=True, name=f"procsv-loop-{getattr(target, '__name__', 'target')}")
        self._coord = coord
        self._interval = timer_interval_secs
        self._target_fn = target
        self._args = tuple(args or ())
        self._kwargs = dict(kwargs or {})
        coord.register_thread(self)

    def run(self) -> None:
        with self._coord.stop_on_exception():
            start = self._coord.clock()
            k = 0
            while not self._coord.should_stop():
                self._target_fn(*self._args, **self._kwargs)
                if self._interval is None:
                    continue
                k += 1
                next_at = start + k * self._interval
                if self._coord.wait_for_stop(max(0.0, next_at - self._coord.clock())):
                    break
