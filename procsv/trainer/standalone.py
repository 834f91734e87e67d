"""A plain ``python train.py`` run: the Supervisor starts and stops the two services itself.

Runs in the trainer, only when no watchdog launched it. :class:`OwnServices` takes the logdir
lock, creates a private runtime directory (mode 0700), starts the checkpoint and summary
services as child processes (``PROCSV_WATCHDOG=0``: they report to no watchdog) and, at
:meth:`OwnServices.release`, stops them (SIGTERM, SIGKILL after the grace period), kills the
helpers the program started that escaped its process group (``setsid``; the trainer is their
subreaper meanwhile, so one whose parent died is found too), removes the runtime directory and
releases the lock. Nothing restarts a crashed process in this mode, and a SIGKILLed program cleans
up nothing: that is what ``procsv launch`` is for.
"""

from __future__ import annotations

import subprocess
import sys
from typing import Optional

from procsv.common import env as envvars, spawn
from procsv.common.bootstrap import ChildContext
from procsv.common.orphans import Orphans, become_subreaper
from procsv.common.layout import Layout, LogdirLock, RuntimeDir, release_runtime_dir
from procsv.ipc.transport import Endpoints
from procsv.common.eventnames import continued_file

SERVICE_ROLES = ("summary", "checkpoint")


class OwnServices:
    """The services, lock and runtime directory a standalone Supervisor owns."""

    def __init__(self, layout: Layout) -> None:
        self.layout = layout
        self._lock = LogdirLock(layout)
        self.processes: dict[str, subprocess.Popen[bytes]] = {}  # role -> process
        self.runtime_dir = ""
        self.orphans: Optional[Orphans] = None
        self._continued: Optional[str] = None  # the tag of the event file the summary service was asked to continue

    def start(self, continue_events: Optional[str] = None) -> Endpoints:
        """Lock the logdir and start both services; return their endpoints. ``continue_events``: the
        summary service continues that earlier service's event file (:attr:`events_tag`) when it is
        still the newest (TF's summary writer kept open across sessions: one file)."""
        self.layout.create()
        stale = self._lock.acquire()
        if stale is not None:
            print(f"procsv: took over the lock of {self.layout.logdir}: the run that held it (pid {stale}) died "
                  "without releasing it (SIGKILL?); taking it over", file=sys.stderr, flush=True)
        self._continued = continue_events
        self.runtime_dir = RuntimeDir.create().path
        self.orphans = Orphans(outside_group_only=True, spare_existing=True)  # (before the services start)
        for role in SERVICE_ROLES:
            env = spawn.child_env(role=role, attempt=1, logdir=self.layout.logdir, runtime_dir=self.runtime_dir,
                                  supervised=False)
            env.pop(envvars.SUMMARY_CONTINUE, None)
            if role == "summary" and continue_events:
                env[envvars.SUMMARY_CONTINUE] = continue_events
            self.processes[role] = spawn.spawn(spawn.service_argv(role), env, self.layout.attempt_log(role, 1))
        return Endpoints(self.runtime_dir)

    @property
    def events_tag(self) -> Optional[str]:
        """The tag that ends the name of the summary service's event file (None: not started): the file it
        continued, if it did (that file is still the newest), else its own."""
        proc = self.processes.get("summary")
        if proc is None:
            return None
        if self._continued and continued_file(self.layout.logdir, self._continued):
            return self._continued
        return f"procsv-{proc.pid}"

    def release(self, grace_secs: float) -> None:
        """Stop the services (SIGTERM, then SIGKILL after ``grace_secs``), clean up, unlock."""
        for proc in self.processes.values():
            if proc.poll() is None:
                proc.terminate()
        for proc in self.processes.values():
            try:
                proc.wait(timeout=grace_secs)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self._sweep(known={proc.pid for proc in self.processes.values()})
        self.processes = {}
        if self.runtime_dir:
            release_runtime_dir(self.runtime_dir)
            self.runtime_dir = ""
        self._lock.release()

    def _sweep(self, known: set[int], reap_secs: float = 5.0) -> None:
        """Kill the helpers that escaped the program's process group, reap them, stop adopting."""
        orphans, self.orphans = self.orphans, None
        if orphans is None:
            return
        killed = orphans.sweep_and_reap(known, reap_secs)
        if orphans.enabled:
            become_subreaper(False)
        if killed:
            print(f"procsv: killed {len(killed)} process(es) the run left behind in a session of their own "
                  f"(pids {', '.join(map(str, killed))}): a helper started with setsid outlived the run",
                  file=sys.stderr, flush=True)


def connect(ctx: Optional[ChildContext], chief: bool, layout: Optional[Layout],
            continue_events: Optional[str] = None) -> tuple[Endpoints, Optional[OwnServices]]:
    """The services a Supervisor's session talks to: the launch's (``ctx``), else, in plain python, two
    this process starts for a chief with a logdir (returned, to release at the stop; the summary service
    continues the ``continue_events`` file, :meth:`OwnServices.start`); a worker, or a Supervisor without
    a logdir, connects to none."""
    if ctx is not None:
        return ctx.endpoints, None
    if not chief or layout is None:
        return Endpoints(""), None
    own = OwnServices(layout)
    return own.start(continue_events), own
