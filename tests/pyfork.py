"""``run_python``: a test's direct run of a Python program (``python PROGRAM ARGS``, ``-c``, ``-m``), forked
from a fork server that has already imported TensorFlow instead of started afresh.

Runs in the pytest (xdist worker) process. ``import tensorflow`` costs about 2-2.5 s of CPU in every
process that makes it, and the suite's plain reference runs and TF-twin runs (programs run under
TensorFlow's own classes, compared with procsv's) each made it to do a second of work. The fork
server (``tests/pyfork_server.py``, started at the first run that can use it and ended with the session:
``close()``) imports it once; each run is a fork of it that runs the
program as a fresh interpreter would (its own pid, ``sys.argv``, ``sys.path[0]``, ``__main__``,
working directory, environment, stdin/stdout/stderr; its exit code, or ``-N`` if a signal killed
it). Like procsv's own zygote, the server never runs a TensorFlow op, so its forks train normally.

Correctness first: a run falls back to a plain ``subprocess.run`` (same result, no saving) when the
server could not run it faithfully: an environment that differs from the server's in a variable read
at interpreter start or TensorFlow's import (:func:`import_time_env`), a program file that does not
exist, an interpreter option, or the quick tier (``--quick``: its guard refuses TensorFlow in every
process a test starts, so no server imports it). A test whose subject is how the process itself
behaves (its process tree, its ``/proc`` cmdline or environ, an import failure) starts it with
``subprocess`` itself; a ``python -m procsv`` command's exit code and output are a fresh one's here
(``docs/testing.md``).

The CPU of a forked run is the server's child's, not this process's: ``tests/cpu_profile.py`` charges
each test the growth of the server's CPU meanwhile (its own, and that of the runs it reaped:
``/proc/<pid>/stat``), so each test is charged its runs (the first run, the server's import too).
``ForkServer.reported`` is what the server said each run used.
"""

from __future__ import annotations

import json
import locale
import os
import resource
import select
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import time
import threading
from typing import Any, Callable, Mapping, Optional, Sequence

SERVER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "pyfork_server.py")
# TensorFlow, and the watchdog's code (``conftest.launch`` forks ``procsv launch`` from the server: its
# import is about 0.3 s of CPU a launch; it imports no trainer code and patches nothing of TensorFlow's)
PRELOAD = ("tensorflow", "procsv.watchdog.launcher")

# read when the interpreter starts or TensorFlow (Keras, NumPy, oneDNN, OpenMP, the C++ runtime) is
# imported: a run whose value of one differs from the server's cannot be a fork of it
_IMPORT_TIME_PREFIXES = ("TF_", "CUDA", "OMP_", "KMP_", "PYTHON", "KERAS", "XLA_", "LD_", "LC_", "MKL",
                         "OPENBLAS", "NPY_", "NUMPY", "GRPC_", "ABSL", "MALLOC", "GLIBC")
_IMPORT_TIME_NAMES = ("LANG", "LANGUAGE", "HOME", "TMPDIR", "TEMP", "TMP")
# ... but these, of those prefixes, are read only when the program makes something: ``TF_CONFIG`` (TensorFlow's
# cluster spec) when a strategy or cluster resolver is made (``TFConfigClusterResolver`` reads it then; procsv's
# zygote forks each trainer, TensorFlow imported, with its own ``TF_CONFIG``)
_RUN_TIME_NAMES = ("TF_CONFIG",)


def import_time_env(env: Mapping[str, str]) -> dict[str, str]:
    """The variables of ``env`` that a process reads before its program runs (the interpreter's
    start, TensorFlow's import): the part of a run's environment a fork cannot take on."""
    return {k: v for k, v in env.items()
            if (k.startswith(_IMPORT_TIME_PREFIXES) or k in _IMPORT_TIME_NAMES) and k not in _RUN_TIME_NAMES}


class ForkedRun(subprocess.CompletedProcess):  # type: ignore[type-arg]
    """``subprocess.run``'s result, with the run's ``pid`` and whether the fork server ran it (``forked``)."""

    def __init__(self, args: Any, returncode: int, stdout: Any, stderr: Any, pid: int, forked: bool) -> None:
        super().__init__(args, returncode, stdout, stderr)
        self.pid, self.forked = pid, forked


class ForkServer:
    """One fork server (a child of this process) that imported ``preload`` with ``env``."""

    def __init__(self, env: Mapping[str, str], preload: Sequence[str] = PRELOAD) -> None:
        self.env, self.preload = dict(env), tuple(preload)
        self.folder = tempfile.mkdtemp(prefix="pyfork-", dir="/tmp")
        self.path = os.path.join(self.folder, "sock")
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(self.path)
        listener.listen(16)
        theirs, self._control = os.pipe()  # (the server reads: EOF once this process closed its end or ended)
        try:
            self.proc = subprocess.Popen(
                [sys.executable, SERVER, str(theirs), str(listener.fileno()), ",".join(self.preload)],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, env=self.env, cwd=self.folder,
                pass_fds=(theirs, listener.fileno()))
        finally:
            os.close(theirs)
            listener.close()
        self.reported = 0.0  # CPU seconds the server reported (its runs', its own): not in RUSAGE_CHILDREN yet
        self._server_cpu = 0.0

    def can_run(self, env: Mapping[str, str]) -> bool:
        return import_time_env(env) == import_time_env(self.env)

    def run(self, argv: Sequence[str], env: Mapping[str, str], cwd: str, timeout: Optional[float],
            capture_output: bool, text: bool,
            connected: Optional[Callable[[socket.socket], None]] = None, teardown: Optional[bool] = None) -> ForkedRun:
        """Run ``python *argv`` as a fork (see the module docstring); as ``subprocess.run`` would.
        ``connected(conn)`` is called with the run's connection once the request is sent: ``kill``
        written on it (from another thread) SIGKILLs the run."""
        args = [sys.executable, *argv]
        ends: list[int] = []  # ours: the read ends of the pipes
        theirs: list[int] = []
        if capture_output:
            for _ in range(2):
                r, w = os.pipe()
                ends.append(r)
                theirs.append(w)
            std = [0, *theirs]
        else:
            std = [0, 1, 2]
        try:
            conn = self.request(argv, env, cwd, std, teardown=teardown)
        finally:
            for fd in theirs:
                os.close(fd)
        if connected is not None:
            connected(conn)
        try:
            return self._wait(conn, args, ends, timeout, text)
        finally:
            conn.close()
            for fd in ends:
                os.close(fd)

    def request(self, argv: Sequence[str], env: Mapping[str, str], cwd: str, std: Sequence[int],
                setsid: bool = False, netns: Optional[str] = None, replay: Optional[bool] = None,
                teardown: Optional[bool] = None) -> socket.socket:
        """Ask for ``python *argv`` with ``std`` as its stdin, stdout and stderr; the run's connection
        (its replies come on it: the pid, then the status). ``replay``: whether the run's stderr begins
        with what the server's import of TensorFlow wrote there, as a fresh process's that imports it
        does; ``teardown``: whether the run ends with the interpreter's teardown of its modules (by
        default both, but for a ``python -m procsv ...``: the procsv command imports no TensorFlow
        when started afresh; the server's docstring says why the teardown is skipped)."""
        command = list(argv[:2]) == ["-m", "procsv"]
        if replay is None:
            replay = not command
        if teardown is None:
            teardown = not command
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            conn.connect(self.path)
            umask = os.umask(0o022)
            os.umask(umask)
            body = json.dumps({"argv": list(argv), "env": dict(env), "cwd": cwd, "umask": umask,
                               "cpus": sorted(os.sched_getaffinity(0)), "setsid": setsid,
                               "netns": netns, "replay": replay, "teardown": teardown}).encode()
            data = struct.pack(">I", len(body)) + body
            sent = socket.send_fds(conn, [data], list(std))
            if sent < len(data):  # (never an empty send: a quick run's server may have closed the connection)
                conn.sendall(data[sent:])
        except BaseException:
            conn.close()
            raise
        return conn

    def count(self, done: Mapping[str, Any]) -> None:
        """Add a run's last reply to what the server reported (its CPU, the server's own since the last)."""
        self.reported += done["cpu"] + done["server_cpu"] - self._server_cpu
        self._server_cpu = done["server_cpu"]

    def _wait(self, conn: socket.socket, args: list[str], ends: list[int], timeout: Optional[float],
              text: bool) -> ForkedRun:
        deadline = None if timeout is None else time.monotonic() + timeout
        chunks: dict[int, list[bytes]] = {fd: [] for fd in ends}
        open_ends, said = list(ends), b""
        replies: list[dict[str, Any]] = []
        killed = False
        while len(replies) < 2 or open_ends:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            watched = open_ends + ([conn.fileno()] if len(replies) < 2 else [])
            ready, _, _ = select.select(watched, [], [], left)
            if not ready and deadline is not None and time.monotonic() >= deadline and not killed:
                if replies:  # as subprocess.run: kill it, then wait for it and its output
                    conn.sendall(b"kill\n")
                killed = True
                deadline = None
                continue
            for fd in ready:
                if fd == conn.fileno():
                    got = conn.recv(65536)
                    if not got:
                        raise RuntimeError(f"the fork server ended during a run: {said!r}")
                    said += got
                    while b"\n" in said:
                        line, said = said.split(b"\n", 1)
                        replies.append(json.loads(line))
                        if "error" in replies[-1]:
                            raise RuntimeError(f"the fork server could not run {args}: {replies[-1]['error']}")
                        if killed and len(replies) == 1:
                            conn.sendall(b"kill\n")
                else:
                    got = os.read(fd, 1 << 16)
                    if got:
                        chunks[fd].append(got)
                    else:
                        open_ends.remove(fd)
        pid, done = replies[0]["pid"], replies[1]
        self.count(done)
        status = done["status"]
        code = os.waitstatus_to_exitcode(status)
        out, err = (self._decode(b"".join(chunks[fd]), text) for fd in ends) if ends else (None, None)
        if killed:
            raise subprocess.TimeoutExpired(args, timeout or 0.0, output=out, stderr=err)
        return ForkedRun(args, code, out, err, pid, forked=True)

    @staticmethod
    def _decode(data: bytes, text: bool) -> Any:
        if not text:
            return data
        return data.decode(locale.getpreferredencoding(False)).replace("\r\n", "\n").replace("\r", "\n")

    def close(self) -> float:
        """End the server (EOF on its control pipe) and reap it; returns the CPU seconds this process's
        ``RUSAGE_CHILDREN`` gained by reaping it (its own and its runs')."""
        before = _children_cpu()
        os.close(self._control)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self.folder, ignore_errors=True)
        return _children_cpu() - before


def _children_cpu() -> float:
    got = resource.getrusage(resource.RUSAGE_CHILDREN)
    return got.ru_utime + got.ru_stime


_servers: list[ForkServer] = []
# A server for each import-time environment a process's runs ask for, up to two: with one, the first run's
# environment decided for the whole worker, and a worker whose first run came with another one (a test that
# sets a ``TF_`` variable, say) started every later run afresh, 2-3 s of CPU each, for the rest of the suite.
MAX_SERVERS = 2


def close() -> None:
    """End every fork server of this process (at the end of the test session)."""
    while _servers:
        _servers.pop().close()


def _server_for(env: Mapping[str, str]) -> Optional[ForkServer]:
    if os.environ.get("PROCSV_TEST_QUICK_TF_LOG"):  # the quick tier: no process imports TensorFlow
        return None
    for server in [s for s in _servers if s.proc.poll() is not None]:  # (a signal to this process group)
        _servers.remove(server)
        server.close()
    for server in _servers:
        if server.can_run(env):
            return server
    if len(_servers) >= MAX_SERVERS:
        return None  # a third import-time environment in one process: its runs start afresh
    _servers.append(ForkServer(env, PRELOAD))
    return _servers[-1]


def run_python(argv: Sequence[str], *, env: Optional[Mapping[str, str]] = None,
               cwd: Optional[str | os.PathLike[str]] = None, timeout: Optional[float] = None,
               capture_output: bool = True, text: bool = True) -> ForkedRun:
    """``subprocess.run([sys.executable, *argv], ...)``, forked from this process's fork server when it
    can run it faithfully (see the module docstring), else started afresh: ``argv`` is a program and
    its arguments, or ``-c CODE ARGS``, or ``-m MODULE ARGS``; ``env`` is the whole environment (this
    process's if None), ``cwd`` the working directory (this process's if None). Raises
    ``subprocess.TimeoutExpired`` as ``subprocess.run`` does, the run killed."""
    env = dict(os.environ if env is None else env)
    cwd = os.getcwd() if cwd is None else os.fspath(cwd)  # (a path object, as subprocess.run takes)
    server = _server_for(env) if _forkable(argv, cwd) else None
    if server is None:
        done = subprocess.run([sys.executable, *argv], env=env, cwd=cwd, timeout=timeout,
                              capture_output=capture_output, text=text)
        return ForkedRun(done.args, done.returncode, done.stdout, done.stderr, 0, forked=False)
    return server.run(argv, env, cwd, timeout, capture_output, text)


def _forkable(argv: Sequence[str], cwd: str) -> bool:
    """Whether a fork can be ``python *argv`` run in ``cwd``: ``-c CODE``, ``-m MODULE``, or a program
    file that exists (the interpreter's own refusals, and its options, are a fresh interpreter's)."""
    if not argv:
        return False
    if argv[0] in ("-c", "-m"):
        return len(argv) >= 2
    return not argv[0].startswith("-") and os.path.isfile(os.path.join(cwd, argv[0]))


class Running:
    """A run started in the background (:func:`start_python`), as a ``subprocess.Popen`` with its output
    read by a thread: :meth:`result` waits for it, :meth:`kill` SIGKILLs it."""

    def __init__(self, argv: Sequence[str], env: Optional[Mapping[str, str]], cwd: Optional[str]) -> None:
        self.args = [sys.executable, *argv]
        self._lock = threading.Lock()
        self._conn: Optional[socket.socket] = None
        self._proc: Optional[subprocess.Popen[str]] = None
        self._killed = False
        self._outcome: list[Any] = []
        self._thread = threading.Thread(target=self._run, args=(list(argv), env, cwd), daemon=True)
        self._thread.start()

    def _run(self, argv: list[str], env: Optional[Mapping[str, str]], cwd: Optional[str]) -> None:
        try:
            full = dict(os.environ if env is None else env)
            where = os.getcwd() if cwd is None else cwd
            server = _server_for(full) if _forkable(argv, where) else None
            if server is not None:
                self._outcome.append(server.run(argv, full, where, None, True, True, self._connected))
                return
            with self._lock:
                self._proc = subprocess.Popen(self.args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                              env=full, cwd=where, start_new_session=True)
                if self._killed:
                    self._proc.kill()
            out, err = self._proc.communicate()
            self._outcome.append(ForkedRun(self.args, self._proc.returncode, out, err, self._proc.pid, forked=False))
        except BaseException as exc:  # (given to the caller by result())
            self._outcome.append(exc)

    def _connected(self, conn: socket.socket) -> None:
        with self._lock:
            self._conn = conn
            if self._killed:
                self._send_kill()

    def _send_kill(self) -> None:
        try:
            if self._conn is not None:
                self._conn.sendall(b"kill\n")
            if self._proc is not None:
                self._proc.kill()
        except OSError:
            pass  # it ended meanwhile

    def kill(self) -> None:
        """SIGKILL the run (if it has not ended)."""
        with self._lock:
            self._killed = True
            self._send_kill()

    def result(self, timeout: float) -> ForkedRun:
        """The run's result, waiting at most ``timeout`` seconds (then it is killed: AssertionError with its output)."""
        self._thread.join(timeout)
        if self._thread.is_alive():
            self.kill()
            self._thread.join()
            got = self._outcome[0]
            said = f"\nstdout:\n{got.stdout}\nstderr:\n{got.stderr}" if isinstance(got, ForkedRun) else ""
            raise AssertionError(f"{self.args} did not finish in {timeout} s{said}")
        got = self._outcome[0]
        if isinstance(got, BaseException):
            raise got
        assert isinstance(got, ForkedRun)
        return got


def start_python(argv: Sequence[str], *, env: Optional[Mapping[str, str]] = None,
                 cwd: Optional[str] = None) -> Running:
    """:func:`run_python` in the background (stdout and stderr captured as text): for a reference run
    made beside the run it is compared with. Started afresh (in a session of its own), it is a
    ``subprocess.Popen``'s."""
    return Running(argv, env, cwd)


class ForkedPopen(subprocess.Popen):  # type: ignore[type-arg]
    """A ``subprocess.Popen`` of ``python ARGV`` whose process is a fork of a fork server (see the module
    docstring), not this process's child: its status comes from the server on the run's connection
    (``poll``, ``wait``, ``communicate`` read it there); everything else (its pipes, ``pid``,
    ``send_signal``, ``kill``) is a Popen's own. Closing the connection (this object collected while
    the run is alive) kills the run, as the server does with every run whose caller is gone."""

    def __init__(self, server: ForkServer, argv: Sequence[str], netns: Optional[str] = None,
                 imports_tf: Optional[bool] = None, **kwargs: Any) -> None:
        self._server, self._conn, self._said, self._netns = server, None, b"", netns
        self._replay = imports_tf
        self._replies: list[dict[str, Any]] = []
        super().__init__([sys.executable, *argv], **kwargs)

    def _execute_child(self, args: Any, executable: Any, preexec_fn: Any, close_fds: Any, pass_fds: Any, cwd: Any,
                       env: Any, startupinfo: Any, creationflags: Any, shell: Any, p2cread: int, p2cwrite: int,
                       c2pread: int, c2pwrite: int, errread: int, errwrite: int, *rest: Any) -> None:
        start_new_session = bool(rest[-2]) if len(rest) >= 2 else False  # (..., start_new_session, process_group)
        std = [p2cread if p2cread != -1 else 0, c2pwrite if c2pwrite != -1 else 1, errwrite if errwrite != -1 else 2]
        try:
            self._conn = self._server.request(args[1:], env, cwd, std, setsid=start_new_session, netns=self._netns,
                                              replay=self._replay)
            self._read_replies(block=True, until=1)
        finally:
            self._close_pipe_fds(p2cread, p2cwrite, c2pread, c2pwrite, errread, errwrite)  # type: ignore[attr-defined]
        if "error" in self._replies[0]:
            raise OSError(f"the fork server could not run {args}: {self._replies[0]['error']}")
        self.pid = int(self._replies[0]["pid"])
        self._child_created = True

    def _read_replies(self, block: bool, until: int) -> None:
        """Read the server's reply lines until there are ``until`` (or, not ``block``ing, what is there)."""
        conn = self._conn
        assert conn is not None
        while len(self._replies) < until:
            conn.setblocking(block)
            try:
                got = conn.recv(65536)
            except BlockingIOError:
                return
            if not got:  # the server ended: it killed every run first
                self._replies += [{"status": signal_status(9), "cpu": 0.0, "server_cpu": self._server._server_cpu}]
                return
            self._said += got
            while b"\n" in self._said:
                line, self._said = self._said.split(b"\n", 1)
                self._replies.append(json.loads(line))

    def _try_wait(self, wait_flags: int) -> tuple[int, int]:
        self._read_replies(block=not wait_flags & os.WNOHANG, until=2)
        if len(self._replies) < 2:
            return (0, 0)
        if self._conn is not None:
            self._server.count(self._replies[1])
            self._conn.close()
            self._conn = None
        return (self.pid, int(self._replies[1]["status"]))

    def _internal_poll(self, _deadstate: Optional[int] = None, **_: Any) -> Optional[int]:
        if self.returncode is None:
            if not self._waitpid_lock.acquire(False):  # type: ignore[attr-defined]
                return None
            try:
                if self.returncode is None:
                    pid, status = self._try_wait(os.WNOHANG)
                    if pid == self.pid:
                        self._handle_exitstatus(status)  # type: ignore[attr-defined]
            except OSError:
                if _deadstate is not None:
                    self.returncode = _deadstate
            finally:
                self._waitpid_lock.release()  # type: ignore[attr-defined]
        return self.returncode


def signal_status(signum: int) -> int:
    """The wait status of a process a signal ended."""
    return signum & 0x7F


def forks(argv: Sequence[str], env: Optional[Mapping[str, str]] = None, cwd: Optional[str] = None) -> bool:
    """Whether :func:`popen_python` (without ``preexec_fn``) would run ``python *argv`` as a fork of the
    fork server (starting the server if none runs yet)."""
    full = dict(os.environ if env is None else env)
    return _forkable(argv, os.getcwd() if cwd is None else cwd) and _server_for(full) is not None


def popen_python(argv: Sequence[str], *, env: Optional[Mapping[str, str]] = None, cwd: Optional[str] = None,
                 netns: Optional[str] = None, imports_tf: Optional[bool] = None,
                 **kwargs: Any) -> subprocess.Popen:  # type: ignore[type-arg]
    """``subprocess.Popen([sys.executable, *argv], ...)`` (in the named network namespace ``netns``: ``ip
    netns exec NETNS python ...``), forked from this process's fork server when it can run it faithfully
    (:func:`run_python`'s conditions; no ``preexec_fn``), else started afresh. ``imports_tf`` false: the
    program, started afresh, imports no TensorFlow, so its fork's stderr does not begin with what the
    server's import of it wrote (None: true but for a ``python -m procsv ...`` command)."""
    full = dict(os.environ if env is None else env)
    where = os.getcwd() if cwd is None else cwd
    server = _server_for(full) if _forkable(argv, where) and kwargs.get("preexec_fn") is None else None
    if server is None:
        inside = ["ip", "netns", "exec", netns] if netns else []
        return subprocess.Popen([*inside, sys.executable, *argv], env=full, cwd=where, **kwargs)
    return ForkedPopen(server, argv, netns=netns, imports_tf=imports_tf, env=full, cwd=where, **kwargs)
