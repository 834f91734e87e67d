"""Entry point and loop of the zygote process: ``python -m procsv.zygote``.

Runs in the zygote, a child of the watchdog. It imports TensorFlow (and procsv's trainer code,
and any ``PROCSV_PRELOAD`` modules) but never runs a TensorFlow op: a process that has only
imported TensorFlow can fork children that train normally, whereas forking after any op
deadlocks the child. When the watchdog sends a :class:`ForkRequest` on its pipe, the zygote forks;
the child becomes the trainer (new session, its own log file, the attempt's environment) and
runs ``procsv.trainer`` exactly as a freshly spawned trainer would, minus the ~4 s import (a
request whose target is ``procsv.ps_server`` makes a ``--ps`` parameter server instead). The
zygote reaps its children and reports each exit status with :class:`ChildExit`.

Control pipe file descriptors come in ``PROCSV_ZYGOTE_FDS="read,write"``.

The zygote's end takes the trainers it forked along (their parent-death signal is armed on it), so
it stops only when its parent (the watchdog, or a node agent) says so or is gone: SIGTERM is
blocked from the start and read with its sender (:mod:`procsv.common.stopfrom`); one sent to every
process of the job at once is left to the watchdog, which stops the trainer in order (its emergency
checkpoint first). A forked trainer gets the signals unblocked again; a hot standby keeps them
blocked, and is forked with its promotion (SIGUSR1) blocked as well, until its wait reads them with
their senders (:mod:`procsv.trainer.standby.wait`: it is promoted only by the watchdog).
"""

from __future__ import annotations

import importlib
import os
import select
import signal
import sys
import time
import traceback

from procsv.ipc.messages import ChildExit, ForkReply, ForkRequest, ZygoteReady
from procsv.ipc.pipe import FramedReader, write_framed
from procsv.common import bootstrap, env, stopfrom


def main() -> int:
    stopfrom.block()  # first: TensorFlow's threads, made at its import, inherit the mask
    bootstrap.die_with_parent()
    authority = stopfrom.Authority.parent("the watchdog")
    req_fd, rep_fd = (int(x) for x in os.environ[env.ZYGOTE_FDS].split(","))
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the watchdog decides; a terminal ^C is not for us
    term = stopfrom.SignalFd.open((signal.SIGTERM,)) if stopfrom.blocked() else None
    t0 = time.monotonic()
    import tensorflow  # noqa: F401  (import only: no op may run in this process)

    import procsv.trainer.supervisor  # noqa: F401
    import procsv.trainer.__main__  # noqa: F401

    for name in filter(None, os.environ.get(env.PRELOAD, "").split(",")):
        try:
            importlib.import_module(name.strip())
        except Exception as exc:  # a bad preload only costs speed; the trainer imports it itself
            print(f"procsv zygote: could not preload {name!r}: {exc}", file=sys.stderr, flush=True)
    write_framed(rep_fd, ZygoteReady(os.getpid(), time.monotonic() - t0))

    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    reader = FramedReader(req_fd)
    watched = [req_fd, wake_r] + ([term.fileno()] if term is not None else [])
    inherited = (req_fd, rep_fd, wake_r, wake_w) + ((term.fileno(),) if term is not None else ())
    while True:
        ready, _, _ = select.select(watched, [], [], 1.0)
        if term is not None and term.fileno() in ready:
            _on_stop_signals(term, authority)
        if wake_r in ready:
            try:
                os.read(wake_r, 512)
            except BlockingIOError:
                pass
        _reap(rep_fd)
        if req_fd in ready:
            try:
                requests = reader.read_available()
            except EOFError:
                return 0  # the watchdog is gone or done: our children die with us
            for req in requests:
                if isinstance(req, ForkRequest):
                    _fork(req, rep_fd, inherited)


def _on_stop_signals(term: stopfrom.SignalFd, authority: stopfrom.Authority) -> None:
    """End as a SIGTERM ends this process (killed by it) if the watchdog sent it or is gone; else
    leave it to the watchdog, with a line in the log."""
    for sig in term.read():
        if authority.obeys(sig):
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            stopfrom.unblock()
            os.kill(os.getpid(), signal.SIGTERM)  # delivered before kill() returns: this process ends here
        else:
            print(authority.left_line("procsv zygote", sig), file=sys.stderr, flush=True)


def _reap(rep_fd: int) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
        write_framed(rep_fd, ChildExit(pid, code))


def _fork(req: ForkRequest, rep_fd: int, inherited: tuple[int, ...]) -> None:
    # a standby is forked with its promotion blocked too, so that it reads one with its sender in its
    # wait (from its first instant: no SIGUSR1 from anyone ends or promotes it meanwhile)
    promotion = (stopfrom.PROMOTE,) if req.env.get(env.STANDBY) == "1" else ()
    stopfrom.block(promotion)
    try:
        pid = os.fork()
    except OSError as exc:
        stopfrom.unblock(promotion)
        write_framed(rep_fd, ForkReply(req.attempt, 0, f"fork failed: {exc}", req.rank))
        return
    if pid:
        stopfrom.unblock(promotion)
        write_framed(rep_fd, ForkReply(req.attempt, pid, None, req.rank))
        return
    code = 70
    try:
        code = _become_trainer(req, inherited)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _leaves_stops_to_supervisor(child_env: dict[str, str]) -> bool:
    """A supervised group's worker (task > 0): a stop signal sent to every process of the job would end
    it at its own step boundary, one step apart from the chief, whose next collective then fails
    before its emergency checkpoint. It obeys only this zygote's parent (the watchdog, or a node
    agent), which stops the workers once the chief has committed (``stopfrom.forward_to_handlers``)."""
    if child_env.get(env.WATCHDOG) != "1" or child_env.get(env.RANK, "0") in ("", "0"):
        return False
    zygote, parent = os.getppid(), os.environ.get(env.PARENT_PID, "")  # (still the zygote's environment)
    if not parent.isdigit():
        return False
    authority = stopfrom.Authority(int(parent), "the watchdog", lambda: os.getppid() == zygote)
    return stopfrom.forward_to_handlers(authority, f"procsv worker{child_env.get(env.RANK)}")


def _become_trainer(req: ForkRequest, inherited: tuple[int, ...]) -> int:
    """In the forked child: shed the zygote's state, then run procsv.trainer."""
    os.setsid()
    signal.set_wakeup_fd(-1)
    for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, signal.SIG_DFL)
    if req.env.get(env.STANDBY) != "1" and not _leaves_stops_to_supervisor(req.env):
        stopfrom.unblock()  # (a standby reads them in its wait, with their senders)
    for fd in inherited:
        os.close(fd)
    log = os.open(req.log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    os.close(null)
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    os.environ.clear()
    os.environ.update(req.env)
    os.environ[env.PARENT_PID] = str(os.getppid())
    os.chdir(req.cwd)
    np = sys.modules.get("numpy")
    if np is not None:
        np.random.seed()  # as in a fresh process: numpy's global generator is not shared across forks
    if req.argv[1:] == ["procsv.ps_server"]:  # a --ps parameter server (procsv.watchdog.pstasks), TF imported
        from procsv.ps_server import main as ps_main

        bootstrap.die_with_parent()
        return ps_main()
    from procsv.trainer.__main__ import main as trainer_main

    sys.argv = list(req.argv)
    return trainer_main()


if __name__ == "__main__":
    sys.exit(main())
