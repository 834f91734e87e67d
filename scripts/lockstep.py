"""Lockstep turns: several process trees take turns at training, so that they are compared at
the same moments of a noisy machine.

Used by ``bench_keras.py`` (a). On these shared 2-core machines the speed drifts by 5-15 % from
one second to the next, in a single process with nothing else running: runs of a minute apiece,
one after the other, cannot resolve a 2 % difference. Here each contender is a real process tree
(``procsv launch`` with its watchdog, services and standby, or one plain ``python``), all started
at once and all kept: the harness lets one contender train a block of K batches while the others
wait, then the next, in a rotating order, for hundreds of rounds. A block lasts about a tenth of
a second, so neighbouring blocks of different contenders see the same machine, and the sums over
all blocks compare them.

Between its turns a contender's training process waits on a FIFO, and its background processes
(for procsv: the watchdog and the two services, named by the harness) are stopped with SIGSTOP.
Their work then happens only during their own contender's turns (a checkpoint the service is
still writing when procsv's turn ends is finished in procsv's next turn, not in another's). Idle
TensorFlow processes (a trainer waiting, procsv's standby and zygote) are not stopped: stopping
one wakes each of its dozens of threads twice, a cost no real run has.

Time-driven work runs on the wall clock, which keeps going while a contender waits: its timers
would fire up to three times as often per second of its turns as in a run of its own. The child
side's :meth:`Turns.clock` stands still while it waits; the training program gives it to its
timers (procsv's trainer: the in-memory snapshot interval, progress, hand-offs). The stopped
services' and watchdog's own timers still read the wall clock: each fires at most once when its
process goes on, so they are charged somewhat more per second of procsv's turns than in a real
run (the figure is conservative for procsv).

The child side (:class:`Turns`) runs in the training process: :meth:`Turns.block` is called at
each batch; every K batches it reports the block's time and waits for its next turn. Protocol,
over two FIFOs in the child's folder: the child writes ``ready <pid>`` once, then one line per
block (``<secs> <extra> <cpu>``: its wall seconds, the extra figure over it, and the CPU seconds the
training process used over it, every thread: ``time.process_time``); the harness writes ``go`` or ``stop`` for each turn.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from typing import IO, Any, Callable, Optional

import psutil

GO, DONE = "turn.go", "turn.done"


class TrainingClock:
    """A monotonic clock that stands still between :meth:`pause` and :meth:`resume`: the time a
    program has trained, when it takes turns with something else. Given to procsv's Supervisor as
    its ``clock``, the step boundary's timers (progress, summary hand-offs, the in-memory snapshot
    interval) fire as often per second of training as in a run of its own; on the wall clock,
    with the other side's turns between, they would fire once at nearly every turn."""

    def __init__(self) -> None:
        self.waited = 0.0  # seconds spent paused
        self._since: Optional[float] = None

    def __call__(self) -> float:
        now = time.monotonic() if self._since is None else self._since
        return now - self.waited

    def pause(self) -> None:
        if self._since is None:
            self._since = time.monotonic()

    def resume(self) -> None:
        if self._since is not None:
            self.waited += time.monotonic() - self._since
            self._since = None


class Turns:
    """The training process's side: blocks of ``k`` batches, each run only when given the turn."""

    def __init__(self, folder: str, k: int, extra: Callable[[], float] = lambda: 0.0) -> None:
        self.k, self.extra = k, extra
        self.done: IO[str] = open(os.path.join(folder, DONE), "w", buffering=1)
        self.done.write(f"ready {os.getpid()}\n")
        self.go: IO[str] = open(os.path.join(folder, GO))
        self.calls = 0
        self.t0 = 0.0
        self.x0 = 0.0
        self.c0 = 0.0
        self.training = TrainingClock()  # stands still while waiting for turns (stopped, or the others')

    def clock(self) -> float:
        """The time this process has trained (:class:`TrainingClock`): on the wall clock, its
        timers would fire up to three times as often per second of its turns."""
        return self.training()

    def block(self) -> bool:
        """Called before each batch; False once the harness says stop (the caller ends ``fit``)."""
        self.calls += 1
        if (self.calls - 1) % self.k:
            return True
        if self.calls > 1:
            self.done.write(f"{time.perf_counter() - self.t0:.9f} {self.extra() - self.x0:.9f} "
                            f"{time.process_time() - self.c0:.9f}\n")
        self.training.pause()
        word = self.go.readline().strip()
        self.training.resume()
        self.t0, self.x0, self.c0 = time.perf_counter(), self.extra(), time.process_time()
        return word == "go"


class Contender:
    """The harness's side of one process tree."""

    def __init__(self, name: str, folder: str, cmd: list[str], env: dict[str, str], cwd: str,
                 background: Callable[[psutil.Process], bool] = lambda p: False) -> None:
        self.name, self.folder = name, folder
        self.background = background  # which processes of the tree to stop between its turns
        for fifo in (GO, DONE):
            os.mkfifo(os.path.join(folder, fifo))
        self.log = open(os.path.join(folder, "stderr.txt"), "w")
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=self.log, env=env, cwd=cwd,
                                     start_new_session=True)
        self.go: Optional[IO[str]] = None
        self.done: Optional[IO[str]] = None
        self.stopped: list[psutil.Process] = []
        self.pid = 0  # the training process's (procsv's trainer, not its launch)

    def connect(self, timeout: float) -> None:
        """Wait for the child's ``ready`` (its model built, its first batch about to run)."""
        fd = os.open(os.path.join(self.folder, DONE), os.O_RDONLY | os.O_NONBLOCK)
        deadline = time.monotonic() + timeout
        buf = b""
        while not buf.endswith(b"\n"):
            try:
                buf += os.read(fd, 64)
            except BlockingIOError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                os.close(fd)
                raise SystemExit(f"lockstep: {self.name} ended or did not start (exit {self.proc.poll()}); "
                                 f"its stderr: {self.tail()}")
            time.sleep(0.05)
        os.set_blocking(fd, True)
        self.pid = int(buf.split()[1])
        self.done = os.fdopen(fd)
        self.go = open(os.path.join(self.folder, GO), "w", buffering=1)

    def tree(self) -> list[psutil.Process]:
        try:
            root = psutil.Process(self.proc.pid)
            return [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def pause(self) -> None:
        """SIGSTOP the tree's background processes (its trainer is waiting for its next turn)."""
        self.stopped = [p for p in self.tree() if self.background(p)]
        for p in self.stopped:
            try:
                p.send_signal(signal.SIGSTOP)
            except psutil.NoSuchProcess:
                pass

    def resume(self) -> None:
        for p in self.stopped:
            try:
                p.send_signal(signal.SIGCONT)
            except psutil.NoSuchProcess:
                pass

    def turn(self) -> tuple[float, float, float]:
        """Run one block: (its seconds, the child's extra figure over it, the CPU seconds its training
        process used over it)."""
        assert self.go is not None and self.done is not None
        self.resume()
        self.go.write("go\n")
        line = self.done.readline()
        if not line:
            raise SystemExit(f"lockstep: {self.name} ended mid-run (exit {self.proc.wait()}); its stderr: "
                             f"{self.tail()}")
        self.pause()
        secs, extra, cpu = line.split()
        return float(secs), float(extra), float(cpu)

    def finish(self, timeout: float) -> int:
        """Let it end ``fit`` normally (procsv commits and its launch exits) and return its exit code."""
        assert self.go is not None
        self.resume()
        self.go.write("stop\n")
        try:
            return self.proc.wait(timeout)
        finally:
            self.log.close()

    def kill(self) -> None:
        for p in self.tree():
            try:
                p.send_signal(signal.SIGCONT)
                p.kill()
            except psutil.NoSuchProcess:
                pass

    def tail(self) -> str:
        try:
            with open(os.path.join(self.folder, "stderr.txt")) as fh:
                return fh.read()[-2000:]
        except OSError:
            return ""

    def cpu_secs(self, exclude: Any = ()) -> float:
        """CPU seconds used so far by the tree's processes, except the pids in ``exclude``."""
        total = 0.0
        for p in self.tree():
            try:
                if p.pid not in exclude:
                    t = p.cpu_times()
                    total += t.user + t.system
            except psutil.NoSuchProcess:
                pass
        return total


def quiesce(contenders: list[Contender], max_secs: float = 60.0) -> None:
    """Wait until every tree is idle (a standby being prepared, services importing TensorFlow)."""
    deadline = time.monotonic() + max_secs
    while time.monotonic() < deadline:
        procs = [p for c in contenders for p in c.tree()]
        for p in procs:
            try:
                p.cpu_percent()
            except psutil.NoSuchProcess:
                pass
        time.sleep(0.5)
        busy = 0.0
        for p in procs:
            try:
                busy += p.cpu_percent()
            except psutil.NoSuchProcess:
                pass
        if busy < 5:
            return
