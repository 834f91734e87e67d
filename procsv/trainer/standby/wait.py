"""A hot-standby trainer's wait: run the program up to restoring, then wait to be promoted.

Runs in the trainer process, in the main thread, inside the first Supervisor's
``prepare_or_wait_for_session`` (or ``managed_session``) when its configuration says it is a standby
(``ChildConfig.standby``, from ``PROCSV_STANDBY=1``): the watchdog
forked this process from the zygote while another trainer trains (:mod:`procsv.watchdog.rules.standby`).
By then the program has done everything before that call: its module is imported, its data
loaded, its model and optimizer built, its Supervisor created. The standby tells the watchdog
(:class:`StandbyReady`) and waits for the watchdog's SIGUSR1, with no thread, no socket and no CPU spent
(all its preparation ran at idle CPU priority where that can be undone:
:mod:`procsv.trainer.standby.priority`); the watchdog's SIGTERM ends it at once (exit 0: it has
nothing to save). A SIGTERM/SIGINT from anyone else (Slurm's or systemd's to every process of the
job at once) is left to the watchdog while it lives, so that the run ends as a stop of the watchdog
alone ends it; a SIGUSR1 from anyone else (``kill -USR1``, ``scancel --signal=USR1``) is ignored,
with a line in the log naming its sender: promoted by anyone, the standby would train beside the
trainer it stands by for. The zygote forks a standby with the stop signals and SIGUSR1 blocked
(:mod:`procsv.common.stopfrom`), and the wait reads them with their senders; at the promotion a
SIGUSR1 still pending is read (and ignored), the signals are unblocked, and a stop signal still
pending reaches the trainer's stop handlers like any stop of a trainer. A standby not forked with
them blocked takes a SIGUSR1 from anyone, as it always did. Promoted, it goes on exactly as a trainer that
just reached this point: it connects to the services, asks for the dead trainer's in-memory
snapshot, restores, and trains. What the program did before (printing, opening files) it did
when the standby was prepared, not at the promotion.
"""

from __future__ import annotations

import os
import select
import signal
import sys
import time
from dataclasses import replace
from typing import Any, NoReturn, Optional

import psutil
import zmq

from procsv.common import env, stopfrom
from procsv.common.bootstrap import ChildConfig, ChildContext, Resume
from procsv.common.layout import promotion_file
from procsv.ipc.codec import ProtocolError, decode
from procsv.ipc.messages import Promotion, StandbyReady
from procsv.ipc.transport import make_socket, send
from procsv.trainer import outcome
from procsv.trainer.ends import deathnotice
from procsv.trainer.standby import priority, servers


_standing_by = False  # this process is a hot standby not promoted (yet): :func:`stand_by`, :func:`wait_for_promotion`



def leave() -> NoReturn:
    """End this process at once with 0, nothing of the program's after it (no checkpoint, no teardown): a standby
    the run no longer needs, an auditor that answered (issue 71). A clean end: a standby's death-notice mutex is
    released first (else the watchdog read its end as a death, a ``death_noticed`` record before its exit 0 whenever
    its teardown was slow: at idle CPU priority on a loaded machine, seconds)."""
    deathnotice.release()
    os._exit(0)

def stand_by() -> None:
    """This process starts as a hot standby (the trainer's bootstrap, before the program runs): until
    its promotion it runs the program's preamble only, and its end is procsv's, not the program's."""
    global _standing_by
    _standing_by = True


def standing_by() -> bool:
    """Whether this process is a hot standby never promoted: its end (``EXIT_NO_STANDBY``,
    ``EXIT_NO_SHADOW_RUN``) runs none of the program's end (its threads, its ``atexit`` handlers)."""
    return _standing_by


def wait_for_promotion(ctx: ChildContext) -> ChildConfig:
    """Block until the watchdog's SIGUSR1 (promotion); exit 0 on its SIGTERM. Afterwards this process is
    no standby: returns its configuration (``ctx.config``) as promoted (:func:`take_promotion`)."""
    promoted = False

    def on_promote(signum: int, frame: Any) -> None:  # only where SIGUSR1 is not blocked (_Senders)
        nonlocal promoted
        promoted = True

    r, w = os.pipe()
    os.set_blocking(w, False)
    old_wakeup = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
    old_usr1 = signal.signal(signal.SIGUSR1, on_promote)
    old_term = signal.signal(signal.SIGTERM, lambda signum, frame: leave())  # unless blocked (below)
    senders = _Senders.open(ctx.config.parent_pid)
    if outcome.early_stop_signal() is not None:
        leave()  # the run ended while this standby was still getting ready
    if senders is not None:
        senders.take_stops()  # one that came while it was getting ready
    prepared = max(0.0, time.time() - psutil.Process().create_time())
    if ctx.supervised:
        zctx: zmq.Context[Any] = zmq.Context()
        sock = make_socket(zctx, zmq.PUSH, linger_ms=1000)
        sock.connect(ctx.endpoints.watchdog)
        send(sock, StandbyReady(os.getpid(), ctx.attempt, prepared))
        sock.close()
        zctx.term()
    print(f"procsv: standby ready after {prepared:.2f} s; waiting to be promoted", flush=True)
    waited = time.monotonic()
    watched = [r] + (senders.fds() if senders is not None else [])
    try:
        while not promoted:
            ready, _, _ = select.select(watched, [], [], 5.0)
            if r in ready:
                os.read(r, 512)  # the signal numbers: their handlers have run
            if senders is not None:
                promoted = promoted or senders.take_promotion()
                if not promoted:
                    senders.take_stops()
    finally:
        signal.set_wakeup_fd(old_wakeup)
        signal.signal(signal.SIGUSR1, old_usr1)
        signal.signal(signal.SIGTERM, old_term)
        os.close(r)
        os.close(w)
        if senders is not None:  # now a trainer: a stop signal still pending goes to its handlers
            senders.close()
    global _standing_by
    _standing_by = False  # a trainer from here on: its end is the program's
    os.environ[env.STANDBY] = "0"  # a Supervisor built later in this process reads no standby (its read_config)
    servers.release()  # a server it starts from now on is the trainer's
    config = take_promotion(ctx)
    priority.restore()  # back to normal CPU priority, every thread (a no-op if it was never lowered)
    print(f"procsv: promoted from standby (waited {time.monotonic() - waited:.1f} s)", file=sys.stderr, flush=True)
    return config


def take_promotion(ctx: ChildContext) -> ChildConfig:
    """Read the watchdog's :class:`Promotion` of this standby: ``ctx.config`` as a trainer spawned for
    this attempt now would have it (:meth:`ChildConfig.promoted`): no standby, the run's steps to skip,
    the step whose rollback this attempt is (none said: no rollback) and the launch's start step.
    The environment is set to match, for a Supervisor built later in this process. A standby that finds
    no record keeps the configuration of its fork (the watchdog writes one before every promotion)."""
    path = promotion_file(ctx.endpoints.runtime_dir, ctx.attempt, ctx.rank)
    try:
        with open(path, "rb") as fh:
            msg, _ = decode([fh.read()], accept={Promotion})
    except (OSError, ProtocolError):
        return replace(ctx.config, standby=False)
    assert isinstance(msg, Promotion)
    told = Resume(tuple(sorted(set(msg.skip_steps))), msg.rollback_before, msg.launch_start_step)
    for name in (env.SKIP_STEPS, env.ROLLBACK_BEFORE, env.LAUNCH_START_STEP):
        os.environ.pop(name, None)
    os.environ.update(told.environ())
    return ctx.config.promoted(told)


class _Senders:
    """The signals a standby forked by the zygote has blocked, read with their senders: the stop
    signals (the watchdog's, or anyone's once it is gone, end the wait) and SIGUSR1 (the watchdog's
    alone promotes). The watchdog is this process's parent (``PROCSV_PARENT_PID``: the zygote's
    fork is re-parented to it), and lives while it is."""

    def __init__(self, stops: stopfrom.SignalFd, promotions: Optional[stopfrom.SignalFd],
                 watchdog: stopfrom.Authority) -> None:
        self.stops = stops
        self.promotions = promotions
        self.watchdog = watchdog

    @staticmethod
    def open(parent_pid: Optional[int]) -> "Optional[_Senders]":
        """None where the stop signals are not blocked (not forked by a zygote: a SIGTERM ends the wait
        from anyone, as it always did) or their senders cannot be read (then they are unblocked, and
        SIGUSR1 too: the handlers take them from anyone again). A SIGUSR1 that is not blocked is left
        to its handler."""
        if not stopfrom.blocked():
            stopfrom.unblock((stopfrom.PROMOTE,))
            return None
        watchdog = stopfrom.Authority.parent("the watchdog", parent_pid)
        stops = stopfrom.SignalFd.open()
        if stops is None:
            stopfrom.unblock(stopfrom.STOP_SIGNALS + (stopfrom.PROMOTE,))
            return None
        promotions = stopfrom.SignalFd.open((stopfrom.PROMOTE,)) if stopfrom.blocked((stopfrom.PROMOTE,)) else None
        if promotions is None:
            stopfrom.unblock((stopfrom.PROMOTE,))
        return _Senders(stops, promotions, watchdog)

    def fds(self) -> list[int]:
        return [self.stops.fileno()] + ([self.promotions.fileno()] if self.promotions is not None else [])

    def take_stops(self) -> None:
        """Exit 0 on a stop signal the watchdog sent (or anyone's once it is gone); say so for another."""
        for sig in self.stops.read():
            if self.watchdog.obeys(sig):
                leave()
            print(self.watchdog.left_line("procsv standby", sig), flush=True)

    def take_promotion(self) -> bool:
        """Whether a pending SIGUSR1 came from the watchdog; says so in the log for anyone else's."""
        promoted = False
        for sig in self.promotions.read() if self.promotions is not None else []:
            if self.watchdog.sent(sig):
                promoted = True
            else:
                print(self.watchdog.ignored_line("procsv standby", sig, "a standby is promoted"), flush=True)
        return promoted

    def close(self) -> None:
        """Read a SIGUSR1 still pending (delivered, it would end the trainer), then unblock the signals."""
        self.take_promotion()
        self.stops.close()
        if self.promotions is not None:
            self.promotions.close()
        stopfrom.unblock(stopfrom.STOP_SIGNALS + (stopfrom.PROMOTE,))
