"""The fork server of the tests' direct runs: ``python tests/pyfork_server.py CONTROL_FD LISTEN_FD MODULES``.

Runs in a long-lived helper process, one per pytest (xdist worker) process, started by
:mod:`pyfork` (which also documents the protocol's client side). It imports ``MODULES``
(comma-separated: ``tensorflow`` for the suite's runs, none in the fork server's own quick tests)
and nothing else of its own: like procsv's zygote (``procsv/zygote/__main__.py``), it never runs a
TensorFlow op, so no runtime, no eager context and no threads beyond what the import made exist
when it forks. Each request (one connection on ``LISTEN_FD``) names a program and gets a child that
runs it as ``python ARGV...`` would, with the caller's stdin, stdout and stderr (passed with the
request, SCM_RIGHTS), environment and working directory.

The protocol, on each connection: the request is a 4-byte big-endian length and that much JSON
(``{"argv": [...], "env": {...}, "cwd": "...", "umask": N, "cpus": [...], "setsid": B}``: the caller's umask
and CPU affinity, which a child of its own would inherit; ``setsid``: the child takes a session of its own;
``netns``, if there: the child joins that named network namespace first; ``replay``, false: what the
server's import wrote on stderr is not replayed in the child, whose program, run afresh, imports none of it;
``teardown``, false: the child leaves before the interpreter's teardown, :func:`_leave_before_teardown`), its first bytes carrying three file descriptors
(stdin, stdout, stderr). The server answers one JSON line ``{"pid": N}`` (or ``{"error": "..."}``),
then, once it has reaped the child, ``{"status": WAITSTATUS, "cpu": S, "server_cpu": S}`` (the
child's CPU seconds, its own reaped descendants' included, and the server's own so far: the
caller's CPU accounting adds them, as its ``RUSAGE_CHILDREN`` cannot see them before the server
is reaped). The caller may write ``kill`` (or close the connection): the child is SIGKILLed; it is
never reaped before then, so its pid cannot have been reused. EOF on ``CONTROL_FD`` (the caller
ended or closed it) ends the server: every child still running is killed and reaped first.

In the child (never back in the server's loop): the caller's descriptors on 0, 1 and 2, the
server's own closed, ``os.environ`` replaced, the working directory changed, then the program runs
as CPython's own ``pymain_run_python`` runs it: a pristine ``__main__`` module, ``sys.argv`` and
``sys.path[0]`` as the interpreter sets them for a script, ``-c`` or ``-m`` (``runpy``, as ``python
-m`` does). The child leaves the interpreter the normal way (a ``SystemExit`` up through this
module's frames), so non-daemon threads are joined, ``atexit`` handlers run and the standard
streams are flushed, as at the end of a fresh process; an uncaught exception goes to
``sys.excepthook`` with the program's frames only and exits 1. A child asked for with ``teardown``
false (by default, a ``python -m procsv ...``: a launch, an agent, the CLI's commands) stops there,
by ``os._exit``, before the interpreter's teardown of its modules (:func:`_leave_before_teardown`):
the TensorFlow it would tear down is the server's, not the command's. A test of what a fresh launch's whole end does (its output to the last
byte) starts one fresh, as ``tests/test_live_line.py``'s launch on a terminal does.

Left as the server has them (callers that depend on them do not use the server): the hash seed
(shared by every child: random per process all the same), ``/proc/PID/cmdline`` and
``/proc/PID/environ`` (the server's: ``os.environ`` changes do not show there), the modules the
server imported (TensorFlow's and this file's, a handful of the standard library's).
"""

from __future__ import annotations

import builtins
import io
import json
import os
import resource
import select
import signal
import socket
import struct
import sys
import types
from typing import Any, NoReturn, Optional

# a fresh `python PROGRAM` has the program's folder first on sys.path, not this one's (each child
# puts its own there): nothing the import below finds may come from tests/
del sys.path[0]

MAX_REQUEST = 16 << 20


class _Run:
    """One request: its connection, its child (``pidfd`` readable once the child exited)."""

    def __init__(self, conn: socket.socket, pid: int) -> None:
        self.conn, self.pid, self.pidfd, self.killed = conn, pid, os.pidfd_open(pid), False

    def kill(self) -> None:
        if not self.killed:  # (unreaped until its pidfd says it ended: the pid is still its)
            os.kill(self.pid, signal.SIGKILL)
            self.killed = True


def _cpu(who: int) -> float:
    got = resource.getrusage(who)
    return got.ru_utime + got.ru_stime


def _read_request(conn: socket.socket) -> tuple[dict[str, Any], list[int]]:
    """The request on a new connection and the three descriptors sent with it (ValueError if malformed)."""
    data, fds, _flags, _addr = socket.recv_fds(conn, 65536, 3)
    if len(data) < 4 or len(fds) != 3:
        for fd in fds:
            os.close(fd)
        raise ValueError("a request carries a length and three file descriptors")
    (size,) = struct.unpack(">I", data[:4])
    if size > MAX_REQUEST:
        raise ValueError(f"a request of {size} bytes")
    body = data[4:]
    while len(body) < size:
        more = conn.recv(size - len(body))
        if not more:
            raise ValueError("the request ended early")
        body += more
    return json.loads(body), fds


def _reply(conn: socket.socket, what: dict[str, Any]) -> None:
    try:
        conn.sendall(json.dumps(what).encode() + b"\n")
    except OSError:
        pass  # the caller is gone: its child is killed when its connection reads as closed


def serve(control: int, listener: socket.socket, said: bytes) -> None:
    """The server's loop (see the module docstring); returns at EOF on ``control``."""
    runs: dict[int, _Run] = {}  # by connection fd
    by_pidfd: dict[int, _Run] = {}
    while True:
        watched = [control, listener.fileno(), *runs, *by_pidfd]
        ready, _, _ = select.select(watched, [], [])
        if control in ready and not os.read(control, 4096):
            for run in runs.values():
                run.kill()
            for run in runs.values():
                os.waitpid(run.pid, 0)
            return
        for fd in ready:  # (ended and asked-to-kill first: a descriptor closed here is not reused before the accept)
            if fd in runs:
                try:
                    got = runs[fd].conn.recv(64)
                except OSError:
                    got = b""
                if not got or b"kill" in got:  # asked to, or the caller is gone (or timed out)
                    runs[fd].kill()
            if fd in by_pidfd:
                run = by_pidfd.pop(fd)
                _pid, status, usage = os.wait4(run.pid, 0)
                os.close(run.pidfd)
                _reply(run.conn, {"status": status, "cpu": usage.ru_utime + usage.ru_stime,
                                  "server_cpu": _cpu(resource.RUSAGE_SELF)})
                del runs[run.conn.fileno()]
                run.conn.close()
        if listener.fileno() in ready:
            conn, _ = listener.accept()
            conn.settimeout(30)  # a caller sends its request at once
            try:
                request, fds = _read_request(conn)
            except (OSError, ValueError) as exc:
                _reply(conn, {"error": f"bad request: {exc}"})
                conn.close()
                continue
            ours = [conn, listener, *(run.conn for run in runs.values())]
            pid = _fork(request, fds, ours, [control, *by_pidfd], said)
            for fd in fds:
                os.close(fd)
            if pid is None:
                conn.close()
                continue
            conn.settimeout(None)
            run = _Run(conn, pid)
            runs[conn.fileno()], by_pidfd[run.pidfd] = run, run
            _reply(conn, {"pid": pid})


def _fork(request: dict[str, Any], fds: list[int], ours: list[socket.socket], also: list[int],
          said: bytes) -> Optional[int]:
    """Fork the child of ``request`` (it never returns here); its pid, or None (said on its connection,
    ``ours[0]``) if none. ``ours`` and ``also`` are the server's sockets and descriptors (the child closes them)."""
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        pid = os.fork()
    except OSError as exc:
        _reply(ours[0], {"error": f"fork failed: {exc}"})
        return None
    if pid == 0:
        try:
            _become_program(request, fds, ours, also, said)
        except SystemExit as stop:
            if not request.get("teardown", True):
                _leave_before_teardown(stop)
            raise
    return pid


def _leave_before_teardown(stop: SystemExit) -> NoReturn:
    """End a ``python -m procsv ...`` child as the interpreter ends a fresh one, up to and including the flush
    of its standard streams (CPython's ``Py_FinalizeEx``: the exit status, or the message of a ``SystemExit``
    that is neither, first; then non-daemon threads joined; then ``atexit`` handlers), and leave by
    ``os._exit`` before the teardown that follows: the collection and the clearing of every module. In
    this fork that teardown is mostly the server's TensorFlow, which a fresh ``procsv`` command never
    imports: freeing its objects copies every page of them out of the server's memory first (a forked
    ``procsv status``: 0.19 s of CPU, 0.035 s without; about a sixth of a short launch's)."""
    import atexit
    import threading

    code = stop.code
    if code is None:
        status = 0
    elif isinstance(code, int):
        status = code
    else:
        print(code, file=sys.stderr)
        status = 1
    threading._shutdown()  # type: ignore[attr-defined]
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        if stream is None or getattr(stream, "closed", False):  # (skipped, as the interpreter's flush skips them)
            continue
        try:
            stream.flush()
        except (OSError, ValueError):
            status = 120  # as the interpreter's exit when a flush of its standard streams fails
    os._exit(status & 0xFF)


def _become_program(request: dict[str, Any], fds: list[int], ours: list[socket.socket], also: list[int],
                    said: bytes) -> NoReturn:
    """In the child: become ``python ARGV`` (see the module docstring) and run it; leaves by SystemExit."""
    if request.get("setsid"):  # a session of its own (``start_new_session``), first: as a Popen's child
        os.setsid()
    if request.get("netns"):  # another network namespace (``ip netns exec NAME``: the tests' second host)
        _enter_netns(request["netns"])
    for sock in ours:  # closed as objects: a socket object closed by number alone would close that number again
        sock.close()  # when it is collected (the program's own descriptor by then: ZeroMQ's signaler died so)
    for fd in also:
        os.close(fd)
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
    for fd in fds:
        if fd > 2:
            os.close(fd)
    os.chdir(request["cwd"])
    os.umask(request["umask"])  # what a child of the caller inherits now (``on_one_core``: one core)
    os.sched_setaffinity(0, request["cpus"])
    os.environ.clear()
    os.environ.update(request["env"])
    if said and request.get("replay", True):  # what the import wrote to stderr, as a fresh process would have
        os.write(2, said)
    out = sys.stdout  # a fresh process buffers it by line on a terminal only (by block, or none: PYTHONUNBUFFERED)
    if isinstance(out, io.TextIOWrapper) and not out.write_through:
        out.reconfigure(line_buffering=os.isatty(1))
    np = sys.modules.get("numpy")
    if np is not None:
        np.random.seed()  # numpy's global generator is seeded at its import: reseed, as a fresh process's is
    argv: list[str] = list(request["argv"])
    sys.orig_argv = [sys.executable, *argv]
    main = types.ModuleType("__main__")
    main.__dict__["__builtins__"] = builtins
    sys.modules["__main__"] = main
    if argv[0] == "-m":
        import runpy

        sys.argv = ["-m", *argv[2:]]  # runpy sets argv[0] to the module's file, as `python -m` shows it
        sys.path.insert(0, os.getcwd())

        def run() -> None:
            runpy._run_module_as_main(argv[1], alter_argv=True)  # type: ignore[attr-defined]
    elif argv[0] == "-c":
        sys.argv = ["-c", *argv[2:]]
        sys.path.insert(0, "")
        from importlib.machinery import BuiltinImporter

        main.__dict__["__loader__"] = BuiltinImporter
        code = compile(argv[1], "<string>", "exec")

        def run() -> None:
            exec(code, main.__dict__)
    else:
        from importlib.machinery import SourceFileLoader

        program = os.path.abspath(argv[0])  # (__file__ and the code's file name: absolute, as since 3.9)
        sys.argv = list(argv)
        sys.path.insert(0, os.path.dirname(os.path.realpath(program)))
        main.__dict__.update(__file__=program, __cached__=None, __loader__=SourceFileLoader("__main__", program))
        with open(program, "rb") as fh:
            code = compile(fh.read(), program, "exec")

        def run() -> None:
            exec(code, main.__dict__)
    try:
        run()
    except SystemExit:
        raise
    except BaseException as exc:  # as the interpreter reports an uncaught exception: the program's frames only
        tb = exc.__traceback__
        while tb is not None and (tb.tb_frame.f_code.co_filename == __file__):
            tb = tb.tb_next
        sys.excepthook(type(exc), exc.with_traceback(tb), tb)  # (the hook prints the exception's own)
        if isinstance(exc, KeyboardInterrupt):  # a fresh interpreter ends by SIGINT then
            import atexit

            signal.signal(signal.SIGINT, signal.SIG_DFL)
            atexit.register(os.kill, os.getpid(), signal.SIGINT)
        raise SystemExit(1) from None
    raise SystemExit(0)


def _enter_netns(name: str) -> None:
    """Join the named network namespace, as ``ip netns exec NAME`` does for the program it runs (its
    sysfs remount aside: nothing run this way reads /sys/class/net)."""
    import ctypes

    fd = os.open(os.path.join("/var/run/netns", name), os.O_RDONLY)
    try:
        if ctypes.CDLL(None, use_errno=True).setns(fd, 0x40000000) != 0:  # CLONE_NEWNET
            raise OSError(ctypes.get_errno(), f"setns {name}")
    finally:
        os.close(fd)


def main() -> None:
    control, listen_fd = int(sys.argv[1]), int(sys.argv[2])
    listener = socket.socket(fileno=listen_fd)
    os.set_inheritable(control, False)
    err = os.dup(2)  # the import's stderr goes to a file, replayed in every child
    log = os.open(os.path.join(os.path.dirname(listener.getsockname()), "import.err"),
                  os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(log, 2)
    import gc

    gc.disable()  # (about a fifth of TensorFlow's import's CPU: as the zygote's, procsv.zygote.__main__)
    try:
        for name in filter(None, sys.argv[3].split(",")):
            __import__(name)
    finally:
        gc.enable()

    gc.freeze()  # what the import made is never collected in a child: a collection would copy every page of it
    sys.stderr.flush()
    os.lseek(log, 0, os.SEEK_SET)
    said = b""
    while chunk := os.read(log, 1 << 16):
        said += chunk
    os.close(log)
    os.dup2(err, 2)
    os.close(err)
    serve(control, listener, said)


if __name__ == "__main__":
    main()
