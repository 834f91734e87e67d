"""Entry point and loop of the zygote process: ``python -m procsv.zygote``.

Runs in the zygote, a child of the watchdog (or of a node agent). It imports TensorFlow (and
procsv's trainer code, and any ``PROCSV_PRELOAD`` modules) but never runs a TensorFlow op: a process
that has only imported TensorFlow can fork children that train normally, whereas forking after any
op deadlocks the child. When its parent sends a :class:`ForkRequest` on its pipe, the zygote forks
twice over: an intermediate child forks the trainer, says its pid and exits at once, so the trainer
is re-parented to the zygote's parent (a child subreaper), which reaps it itself; the
:class:`ForkReply` names it once the zygote has reaped the intermediate. The trainer sets itself up,
waits for that re-parenting and the reply (the zygote then says so on the socket pair it shares with the
trainer and closes its end: so the reply comes before any message of the trainer's; a zygote killed before
it replied, given up on, says nothing, and the trainer exits without running), arms its parent-death signal on the zygote's parent
(checking after that it still is its parent), takes a process group of its own in the zygote's session (not a
session of its own: with the kernel's autogroups every session is a scheduling group of equal weight, and an auditor's
or a hot standby's ``SCHED_IDLE`` is idle only inside its group; in the zygote's session, the trainer's too, they take
only the CPU the trainer leaves), its own log file and the attempt's
environment, and runs ``procsv.trainer`` exactly as a freshly spawned trainer would, minus the
~4 s import (a request whose target is ``procsv.ps_server`` makes a ``--ps`` parameter server
instead). Nothing the zygote forked depends on it afterwards: a slow, stopped or killed zygote
costs the next fork only.

Control pipe file descriptors come in ``PROCSV_ZYGOTE_FDS="read,write,say"``: ``say`` is the
parent's stderr, where a forked trainer whose log cannot be opened says so (as a fresh spawn's
shell does) before it runs with its output discarded.

The zygote stops only when its parent says so or is gone: SIGTERM is blocked from the start and
read with its sender (:mod:`procsv.common.stopfrom`); one sent to every process of the job at once
is left to the watchdog. A forked trainer gets the signals unblocked again; a hot standby keeps them
blocked, and is forked with its promotion (SIGUSR1) blocked as well, until its wait reads them with
their senders (:mod:`procsv.trainer.standby.wait`: it is promoted only by the watchdog, its parent).
"""

from __future__ import annotations

import gc
import importlib
import os
import select
import signal
import socket
import sys
import time
from typing import NoReturn, Optional

from procsv.ipc.messages import ForkReply, ForkRequest, ZygoteReady
from procsv.ipc.pipe import FramedReader, write_framed
from procsv.common import bootstrap, env, faults, spawn, stopfrom

ADOPTION_WAIT = 30.0  # seconds a trainer waits for the intermediate child's exit to re-parent it
ANSWERED = b"!"  # the zygote's word to a trainer it forked, once its reply naming it is written: run


def main() -> int:
    stopfrom.block()  # first: TensorFlow's threads, made at its import, inherit the mask
    bootstrap.die_with_parent()
    config = bootstrap.read_config()  # once: its pipes, its preloads, its parent (every fork's too)
    authority = stopfrom.Authority.parent("the watchdog", config.parent_pid)
    if config.zygote.fds is None:
        raise KeyError(env.ZYGOTE_FDS)
    req_fd, rep_fd, say_fd = (int(x) for x in (config.zygote.fds + ",-1").split(",")[:3])
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the watchdog decides; a terminal ^C is not for us
    term = stopfrom.SignalFd.open((signal.SIGTERM,)) if stopfrom.blocked() else None
    t0 = time.monotonic()
    # the import with the cyclic collector off: ``import tensorflow`` makes about 270,000 objects that outlive
    # it, and the collector, run on every 700 new ones, visited the survivors again and again: 0.41 s of the
    # import's 2.3 s of CPU here, to find almost no garbage (0 to 1,400 objects: gc.collect() after an import
    # with it off). Back on before the user's preloads (with the collector as they leave it) and the forks
    gc.disable()
    try:
        import tensorflow  # noqa: F401  (import only: no op may run in this process)

        import procsv.trainer.supervisor  # noqa: F401
        import procsv.trainer.__main__  # noqa: F401
    finally:
        gc.enable()
    for name in config.zygote.preload:  # (the user's modules: with the collector as they leave it)
        try:
            importlib.import_module(name.strip())
        except Exception as exc:  # a bad preload only costs speed; the trainer imports it itself
            print(f"procsv zygote: could not preload {name!r}: {exc}", file=sys.stderr, flush=True)
    # every object the imports made moves to a generation no collection visits: a collection in a forked
    # trainer or standby would otherwise write every one's header, copying each page of the import into it
    # (about 0.4 s of CPU and the memory of those pages per fork; CPython's gc.freeze, for pre-fork servers)
    gc.freeze()
    write_framed(rep_fd, ZygoteReady(os.getpid(), time.monotonic() - t0))

    reader = FramedReader(req_fd)
    watched = [req_fd] + ([term.fileno()] if term is not None else [])
    inherited = (req_fd, rep_fd) + ((term.fileno(),) if term is not None else ())
    say = say_fd if say_fd >= 0 else sys.stderr.fileno()
    while True:
        ready, _, _ = select.select(watched, [], [], 1.0)
        if term is not None and term.fileno() in ready:
            _on_stop_signals(term, authority)
        if req_fd in ready:
            try:
                requests = reader.read_available()
            except EOFError:
                return 0  # the watchdog is gone or done (what we forked is not ours: it goes on)
            for req in requests:
                if isinstance(req, ForkRequest):
                    _fork(req, rep_fd, inherited, say, config.parent_pid)


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


def _fork(req: ForkRequest, rep_fd: int, inherited: tuple[int, ...], say: int, parent_pid: Optional[int]) -> None:
    """Fork the trainer through an intermediate child that exits at once (see the module docstring):
    reap it, read the trainer's pid it said, reply, then close this end of the socket pair the trainer
    waits on: the trainer named is the parent's child by then (its re-parenting is done before the
    intermediate's exit status can be read), and it runs once it reads this process's ``ANSWERED`` there, written
    after the reply, so the reply is on the parent's pipe before anything it sends (an EOF without it: this process
    was killed first, given up on, and the trainer exits without running). The pid is read only once the intermediate is reaped, never
    up to an EOF: the trainer holds the other end too, so an intermediate killed between the trainer's
    fork and its pid left the zygote blocked, unanswering, until the trainer's adoption wait ended."""
    ours, theirs = (s.detach() for s in socket.socketpair())
    held = faults.fires("zygote", "fork_stall")  # tests only: this fork's intermediate waits for the gate
    said_held = faults.fires("zygote", "pid_stall")  # tests only: ... once it forked the trainer, before its pid
    try:
        middle = os.fork()
    except OSError as exc:
        os.close(ours)
        os.close(theirs)
        write_framed(rep_fd, ForkReply(req.attempt, 0, f"fork failed: {exc}", req.rank))
        return
    if middle == 0:
        for fd in (ours,) + inherited:  # the zygote's pipes: its end must read as theirs at once
            os.close(fd)
        if held:
            faults.wait_gate()
        _intermediate(req, theirs, say, parent_pid, said_held)
    os.close(theirs)
    os.waitpid(middle, 0)  # it says the trainer's pid (or why none) and exits: once reaped, all it said is there
    os.set_blocking(ours, False)  # (never a wait for an EOF: the trainer holds the other end till the reply)
    try:
        said = os.read(ours, 256)
    except BlockingIOError:  # it said nothing: killed (its trainer may be forked: the watchdog's sweep takes it)
        said = b""
    text = said.decode(errors="replace").strip()
    if text.isdigit():
        write_framed(rep_fd, ForkReply(req.attempt, int(text), None, req.rank))
        try:
            os.write(ours, ANSWERED)  # (its reply is written: it may run)
        except OSError:  # (it died already: its end is closed; its parent reaps it)
            pass
    else:
        write_framed(rep_fd, ForkReply(req.attempt, 0, text or "fork failed", req.rank))
    os.close(ours)  # last: the trainer runs at this end's EOF, its reply written (every message it sends comes after)


def _intermediate(req: ForkRequest, theirs: int, say: int, parent_pid: Optional[int],
                  said_held: bool = False) -> NoReturn:
    """In the intermediate: fork the trainer, say its pid on ``theirs``, exit (``said_held``, tests only:
    wait for the fault gate before saying it)."""
    # a standby is forked with its promotion blocked too, so that it reads one with its sender in its
    # wait (from its first instant: no SIGUSR1 from anyone ends or promotes it meanwhile)
    if req.env.get(env.STANDBY) == "1":
        stopfrom.block((stopfrom.PROMOTE,))
    try:
        pid = os.fork()
    except OSError as exc:
        os.write(theirs, f"fork failed: {exc}\n".encode())
        os._exit(1)
    if pid:
        if said_held:
            faults.wait_gate()
        os.write(theirs, f"{pid}\n".encode())
        os._exit(0)
    spawn.exit_after(lambda: _become_trainer(req, theirs, say, parent_pid), ends_as_interpreter=_ran_the_program)


def _ran_the_program() -> bool:
    """Whether the forked trainer ran the program, so that its end is the program's (the interpreter's
    end: its non-daemon threads, its ``atexit`` handlers): not a hot standby never promoted, which ran
    the program's preamble only (its ``EXIT_NO_STANDBY`` or ``EXIT_NO_SHADOW_RUN`` is procsv's end)."""
    from procsv.trainer.standby.wait import standing_by

    return not standing_by()


def _adopted_by(parent: int, theirs: int) -> bool:
    """Wait (at most ``ADOPTION_WAIT``) for the zygote's word on ``theirs``: it writes ``ANSWERED`` and closes the
    other end once it has reaped the intermediate (which re-parents this process) and replied; True if it did and this
    process is ``parent``'s child then. False: ``parent`` is gone, no subreaper, or the zygote ended without a reply
    naming this process (killed: given up on by its parent, which started this attempt fresh; the end alone, an EOF,
    is no answer). Before, the end was taken as the answer: a trainer forked by a zygote given up on past the reply's
    bound ran beside its fresh replacement until a sweep killed it (measured, a group over two hosts: node 1's late
    worker1 joined the chief's collectives first, its kill broke the group, one restart more)."""
    ready, _, _ = select.select([theirs], [], [], ADOPTION_WAIT)
    try:
        answered = bool(ready) and os.read(theirs, len(ANSWERED)) == ANSWERED
    except OSError:
        answered = False
    os.close(theirs)
    return answered and os.getppid() == parent


def _leaves_stops_to_supervisor(child_env: dict[str, str], parent_pid: Optional[int]) -> bool:
    """A supervised group's worker (task > 0): a stop signal sent to every process of the job would end
    it at its own step boundary, one step apart from the chief, whose next collective then fails
    before its emergency checkpoint. It obeys only this zygote's parent (the watchdog, or a node
    agent), which stops the workers once the chief has committed (``stopfrom.forward_to_handlers``)."""
    if child_env.get(env.WATCHDOG) != "1" or child_env.get(env.RANK, "0") in ("", "0"):
        return False
    authority = stopfrom.Authority.parent("the watchdog", parent_pid)
    return stopfrom.forward_to_handlers(authority, f"procsv worker{child_env.get(env.RANK)}")


def _become_trainer(req: ForkRequest, theirs: int, say: int, parent_pid: Optional[int]) -> int:
    """In the forked trainer: become the zygote's parent's child (``parent_pid``, the zygote's own
    ``ChildConfig.parent_pid``), shed the zygote's state, then run procsv.trainer (which arms the
    parent-death signal on that parent, :func:`bootstrap.die_with_parent`)."""
    if parent_pid is None:
        return 70
    raw = str(parent_pid)
    os.setpgid(0, 0)  # (a group of its own for killpg, in the zygote's session: one autogroup with the trainer's)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, signal.SIG_DFL)
    if req.env.get(env.STANDBY) != "1" and not _leaves_stops_to_supervisor(req.env, parent_pid):
        stopfrom.unblock()  # (a standby reads them in its wait, with their senders)
    log = spawn.open_log(req.log_path, say)
    if say > 2:
        os.close(say)
    spawn.take_over(log, {**req.env, env.PARENT_PID: raw}, req.cwd)
    np = sys.modules.get("numpy")
    if np is not None:
        np.random.seed()  # as in a fresh process: numpy's global generator is not shared across forks
    if not _adopted_by(int(raw), theirs):  # (waited for last: the set-up above overlaps the zygote's reply)
        print(f"procsv: pid {os.getpid()}: forked for {req.env.get(env.ROLE, 'a trainer')} attempt {req.attempt}, but the "
              "pre-warmed trainer ended before it named this process (given up on: the attempt is started fresh) "
              "or its parent is gone: exiting without running", file=sys.stderr, flush=True)
        return 70  # nothing may run unsupervised, nor beside the fresh start of its attempt
    if req.argv[1:] == ["procsv.ps_server"]:  # a --ps parameter server (procsv.watchdog.pstasks), TF imported
        from procsv.ps_server import main as ps_main

        bootstrap.die_with_parent()
        return ps_main()
    from procsv.trainer.__main__ import deaf_at_exit, main as trainer_main

    sys.argv = list(req.argv)
    try:
        return trainer_main()
    finally:
        deaf_at_exit()  # as a fresh trainer, before the interpreter's end (spawn.exit_after)


if __name__ == "__main__":
    sys.exit(main())
