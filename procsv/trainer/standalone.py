"""A plain ``python train.py`` run: the Supervisor starts and stops the two services itself.

Runs in the trainer, only when no watchdog launched it. :class:`OwnServices` takes the logdir
lock, creates a private runtime directory (mode 0700), starts the checkpoint and summary
services as child processes (``PROCSV_WATCHDOG=0``: they report to no watchdog) and, at
:meth:`OwnServices.release`, stops them (SIGTERM, SIGKILL after the grace period), removes the
runtime directory and releases the lock. Nothing restarts a crashed process in this mode.
"""

from __future__ import annotations

import shutil
import subprocess
import sys

from procsv.common import spawn
from procsv.common.layout import Layout, LogdirLock, RuntimeDir
from procsv.ipc.transport import Endpoints

SERVICE_ROLES = ("summary", "checkpoint")


class OwnServices:
    """The services, lock and runtime directory a standalone Supervisor owns."""

    def __init__(self, layout: Layout) -> None:
        self.layout = layout
        self._lock = LogdirLock(layout)
        self.processes: dict[str, subprocess.Popen[bytes]] = {}  # role -> process
        self.runtime_dir = ""

    def start(self) -> Endpoints:
        """Lock the logdir and start both services; return their endpoints."""
        self.layout.create()
        stale = self._lock.acquire()
        if stale is not None:
            print(f"procsv: took over the lock of {self.layout.logdir}: the run that held it (pid {stale}) died "
                  "without releasing it (SIGKILL?); taking it over", file=sys.stderr, flush=True)
        self.runtime_dir = RuntimeDir.create().path
        for role in SERVICE_ROLES:
            env = spawn.child_env(role=role, attempt=1, logdir=self.layout.logdir, runtime_dir=self.runtime_dir,
                                  supervised=False)
            self.processes[role] = spawn.spawn(spawn.service_argv(role), env, self.layout.attempt_log(role, 1))
        return Endpoints(self.runtime_dir)

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
        self.processes = {}
        if self.runtime_dir:
            shutil.rmtree(self.runtime_dir, ignore_errors=True)
            self.runtime_dir = ""
        self._lock.release()
