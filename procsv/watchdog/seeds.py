"""The watchdog's side of the launch's service seeds: each used once, for its service's first start, or discarded.

Runs in the watchdog: :meth:`ServiceSeeds.plant` forks a seed per service (:func:`procsv.services.seed.plant`)
as the :class:`~procsv.watchdog.launcher.Watchdog` is made, before it starts any thread, wherever a
fork of the launch is sound (:func:`procsv.zygote.seed.fork_hazard`; a node agent, on a ``--nnodes``
host other than node 0, starts no service), with or without ``--fork-prewarm``: a shell's ``procsv
launch`` is an interpreter with procsv's CLI imported too, and its seeds save the services'
interpreter start, their shell and what the CLI imported, and import the rest while the watchdog goes
on. The watchdog starts each service's first attempt from its seed (:meth:`ServiceSeed.start`: the
seed's own process, this process's child, reaped here by ``waitpid`` as a trainer the zygote forked
is: an :class:`~procsv.watchdog.prewarm.Adopted`), where the environment suits the seed's imports
(:func:`suits`), else discards it and spawns the service fresh. A later attempt (a replacement after a
crash or a stall's kill) starts fresh: the watchdog has threads by then, so a fork of it is no
sound start, and a spare seed held for it would be a process more per launch for a rare event.
Whatever seed the launch did not use is SIGKILLed and reaped (:meth:`ServiceSeeds.discard`); one
whose launch died exits at its pipe's EOF or by its parent-death signal.
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Mapping, Optional

from procsv.common import env as envvars
from procsv.common.spawn import inherited_env
from procsv.ipc.messages import ServiceStart
from procsv.ipc.pipe import write_framed
from procsv.watchdog.prewarm import Adopted
from procsv.watchdog.rules.state import SERVICE_ROLES

# set in a child's environment when absent (procsv.common.spawn.IMPORT_DEFAULTS): no import of a service
# reads PYTHONUNBUFFERED (its streams are procsv.common.lossyio's), nor TF_CPP_MIN_LOG_LEVEL unless TensorFlow
# was imported in the seed (in a warm launch: it was read then)
_UNBUFFERED = "PYTHONUNBUFFERED"
_TF_LOG_LEVEL = "TF_CPP_MIN_LOG_LEVEL"


def suits(born: Mapping[str, str], born_cwd: str, tensorflow: bool, env: Mapping[str, str], cwd: str) -> bool:
    """Whether a seed forked from a launch whose environment was ``born`` in ``born_cwd`` (``tensorflow``:
    with TensorFlow imported) can stand for a service started fresh with ``env`` in ``cwd`` (pure): its
    imports ran with what such a service's imports would read. procsv's own variables differ (a child's
    coordinates: :data:`procsv.common.env.ALL`): they are read once the service runs, through
    :mod:`procsv.common.bootstrap`."""
    def imported(environ: Mapping[str, str]) -> dict[str, str]:
        return {name: value for name, value in environ.items()
                if name not in envvars.ALL and name != _UNBUFFERED
                and (tensorflow or name != _TF_LOG_LEVEL)}

    return born_cwd == cwd and imported(born) == imported(env)


class ServiceSeed:
    """One planted seed (:func:`procsv.services.seed.plant`), as the watchdog holds it: its process, its
    pipe's write end (-1 once used or discarded), and the launch's environment and working directory
    when it was forked."""

    def __init__(self, role: str, pid: int, req_w: int, born: Mapping[str, str], born_cwd: str,
                 tensorflow: bool) -> None:
        self.role = role
        self.process = Adopted(pid)
        self.req_w = req_w
        self.born, self.born_cwd, self.tensorflow = dict(born), born_cwd, tensorflow

    @property
    def pid(self) -> int:
        return self.process.pid

    def start(self, env: Mapping[str, str], log_path: str, cwd: str) -> Optional[Adopted]:
        """Tell the seed to become the service started with ``env``, ``log_path`` and ``cwd``: its
        process; None (the seed discarded) if it does not suit them (:func:`suits`) or is gone."""
        if self.req_w >= 0 and suits(self.born, self.born_cwd, self.tensorflow, env, cwd):
            try:
                write_framed(self.req_w, ServiceStart(dict(env), log_path, cwd))  # (a few kB: the empty pipe takes it)
            except OSError:  # EPIPE: it died (its preload failed, say)
                pass
            else:
                os.close(self.req_w)  # (what it reads stays in the pipe; then EOF, which it never reads)
                self.req_w = -1
                return self.process
        self.discard()
        return None

    def discard(self) -> None:
        """SIGKILL the unused seed, reap it, close its pipe (once)."""
        if self.req_w < 0:
            return
        try:
            os.kill(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            self.process.wait()
        except ChildProcessError:  # (reaped already)
            pass
        os.close(self.req_w)
        self.req_w = -1


class ServiceSeeds:
    """The launch's service seeds not used yet, by role."""

    def __init__(self, seeds: Mapping[str, ServiceSeed] | None = None) -> None:
        self._seeds: dict[str, ServiceSeed] = dict(seeds or {})

    @staticmethod
    def plant(preempt_signal: int) -> "ServiceSeeds":
        """Fork a seed for each service (in the watchdog, before it starts any thread) where a fork of this
        process is sound (:func:`procsv.zygote.seed.fork_hazard`); none where it is not."""
        from procsv.services.seed import plant
        from procsv.zygote.seed import fork_hazard

        if fork_hazard() is not None:
            return ServiceSeeds()
        born, cwd, tensorflow = inherited_env(), os.getcwd(), "tensorflow" in sys.modules
        planted = [plant(role, preempt_signal) for role in SERVICE_ROLES]
        return ServiceSeeds({p.role: ServiceSeed(p.role, p.pid, p.req_w, born, cwd, tensorflow) for p in planted})

    def get(self, role: str) -> Optional[ServiceSeed]:
        """``role``'s seed (None: none was planted); :meth:`discard` ends it unless it was started by then."""
        return self._seeds.get(role)

    def discard(self) -> None:
        """Discard every seed not started (the launch ended before its services started, or a start failed)."""
        for seed in self._seeds.values():
            seed.discard()
        self._seeds.clear()

