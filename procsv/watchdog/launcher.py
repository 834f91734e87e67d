"""The watchdog: one event loop that starts the run's processes, watches them, restarts them.

Runs in the ``procsv launch`` process. Everything it waits for is a file descriptor in one
ZeroMQ poller: the PULL socket its children report to, a pidfd per child (readable the moment
the child dies, so a death is noticed within milliseconds), and a wakeup fd for SIGTERM/SIGINT.
Decisions (restart or not, how long to wait) come from :mod:`procsv.watchdog.policy`; this
module only carries them out and records what happened (status.json, logs/lifecycle.jsonl).
"""

from __future__ import annotations

import importlib.util
import json
import os
import queue
import random
import re
import shutil
import signal
import socket
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import psutil
import zmq

from procsv.ipc.codec import ProtocolError, decode
from procsv.ipc.messages import Hello, Progress, SaveResult, TrainerReady
from procsv.ipc.transport import Endpoints, make_socket
from procsv.common import spawn
from procsv.common.env import DEATH_MUTEX
from procsv.common.layout import RuntimeDir
from procsv.common.mutex import RobustMutex
from procsv.watchdog.deathwatch import DeathWatch
from procsv.common.bootstrap import EXIT_PREEMPTED
from procsv.common.errors import UsageError
from procsv.common.layout import Layout, LogdirLock, read_json, write_json
from procsv.watchdog.lifecycle import ProcState, RunState, transition
from procsv.status import last_checkpoint
from procsv.watchdog import report
from procsv.watchdog.chaos import ChaosPlan, parse_chaos
from procsv.watchdog.hang import HangLimits, hang_reason
from procsv.watchdog.policy import Action, History, RestartPolicy, TrainerExit, decide
from procsv.watchdog.prewarm import Zygote, ZygoteUnavailable, zygote_env

SERVICE_ROLES = ("summary", "checkpoint")
SERVICE_RESTART_LIMIT = 5  # service crashes within SERVICE_RESTART_WINDOW before the run gives up
SERVICE_RESTART_WINDOW = 60.0
ZYGOTE_WAIT = 120.0  # how long the first trainer waits for the zygote before it is spawned fresh
STATUS_EVERY = 0.5
TICK_MS = 100

# stderr lines every TF process prints that say nothing about the user's program
_NOISE = re.compile(r"^(WARNING: All log messages before absl|[EWI]0000 |.*(cuda|cuInit|oneDNN|TF-TRT|"
                    r"computation placer|cpu_feature_guard|rebuild TensorFlow with|AVX|Unable to register))")


@dataclass
class LaunchConfig:
    target: str
    args: list[str]
    logdir: str
    max_restarts: int = 10
    stop_grace_secs: float = 120.0
    quiet: bool = False
    hang_timeout: float = 600.0
    startup_timeout: float = 1800.0
    hang_grace_secs: float = 10.0
    chaos: Optional[str] = None
    prewarm: bool = True
    preload: list[str] = field(default_factory=list)
    cwd: str = field(default_factory=os.getcwd)


@dataclass
class Child:
    """One attempt of one role, as the watchdog sees it."""

    role: str
    attempt: int
    popen: Any
    pidfd: int
    started: float
    log_path: str
    state: ProcState = ProcState.STARTING
    restarts: int = 0
    create_time: Optional[float] = None
    first_step_at: Optional[float] = None
    step: int = 0
    log_pos: int = 0
    made_progress: bool = False
    busy: bool = False
    last_progress_at: Optional[float] = None
    hang_kill_at: Optional[float] = None
    hang_cause: str = ""
    record: Optional[report.AttemptRecord] = None
    watch: Optional[DeathWatch] = None
    decided_early: bool = False  # its death notice already triggered the restart decision
    noticed_wall: Optional[float] = None

    @property
    def pid(self) -> int:
        return int(self.popen.pid)

    def set_state(self, new: ProcState) -> None:
        self.state = transition(self.state, new)  # type: ignore[assignment]


def check_target(target: str, cwd: str) -> None:
    """Raise UsageError if TARGET is neither an existing .py file nor an importable module."""
    if target.endswith(".py") or os.sep in target:
        path = os.path.join(cwd, target)
        if not os.path.isfile(path):
            raise UsageError(f"training script {target!r} does not exist (looked in {cwd})")
        return
    sys.path.insert(0, cwd)
    try:
        spec = importlib.util.find_spec(target)
    except (ImportError, ValueError) as exc:
        raise UsageError(f"cannot find training module {target!r}: {exc}") from None
    finally:
        sys.path.remove(cwd)
    if spec is None:
        raise UsageError(f"cannot find training module {target!r} (not importable from {cwd}); "
                         "pass an importable module name or a path to a .py file")


class Watchdog:
    def __init__(self, cfg: LaunchConfig, policy: Optional[RestartPolicy] = None,
                 clock: Callable[[], float] = time.monotonic, rng: Optional[random.Random] = None) -> None:
        self.cfg = cfg
        self.policy = policy or RestartPolicy(max_restarts=cfg.max_restarts)
        self.clock = clock
        self.rng = rng or random.Random()
        self.layout = Layout(os.path.abspath(cfg.logdir))
        self.lock = LogdirLock(self.layout)
        self.children: dict[str, Child] = {}
        self.history = History()
        self.state = RunState.RUNNING
        self.step = 0
        self.restored_step: Optional[int] = None
        self.last_error: Optional[str] = None
        self.stop_signal: Optional[int] = None
        self.stop_deadline: Optional[float] = None
        self.restart_at: Optional[float] = None
        self.finishing = False
        self.service_crashes: list[float] = []
        self.runtime_dir = ""
        self.exit_code = 0
        self._status_dirty = True
        self._status_at = 0.0
        self._events: Any = None
        self.started_wall = time.time()
        self.launch_start = clock()
        self.limits = HangLimits(cfg.hang_timeout, cfg.startup_timeout)
        self.chaos: Optional[ChaosPlan] = parse_chaos(cfg.chaos) if cfg.chaos else None
        self.chaos_rng = random.Random(self.chaos.seed if self.chaos else None)
        self.chaos_at: Optional[float] = None
        self.attempts: list[report.AttemptRecord] = []
        self.zygote: Optional[Zygote] = None
        self._dead_zygotes: list[Zygote] = []
        self.dying: list[Child] = []  # trainers whose death was noticed but who are not reaped yet
        self._notices: "queue.SimpleQueue[tuple[Child, bool, float, float]]" = queue.SimpleQueue()
        self._notice_r, self._notice_w = os.pipe()
        os.set_blocking(self._notice_w, False)

    # ------------------------------------------------------------------ main
    def run(self) -> int:
        check_target(self.cfg.target, self.cfg.cwd)
        self.layout.create()
        self.lock.acquire()
        try:
            return self._run_locked()
        finally:
            self.lock.release()

    def _run_locked(self) -> int:
        self._events = open(self.layout.lifecycle, "a", buffering=1)
        self.runtime_dir = tempfile.mkdtemp(prefix="procsv-")  # mode 0700: sockets only we can reach
        endpoints = Endpoints(self.runtime_dir)
        zctx = zmq.Context()
        self.pull = make_socket(zctx, zmq.PULL)
        self.pull.bind(endpoints.watchdog)
        self.poller = zmq.Poller()
        self.poller.register(self.pull, zmq.POLLIN)
        wake_r, wake_w = socket.socketpair()
        wake_r.setblocking(False)
        wake_w.setblocking(False)
        old_wakeup = signal.set_wakeup_fd(wake_w.fileno(), warn_on_full_buffer=False)
        old = {s: signal.signal(s, self._on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
        self.poller.register(wake_r.fileno(), zmq.POLLIN)
        self.poller.register(self._notice_r, zmq.POLLIN)
        self.log("launch", target=self.cfg.target, args=self.cfg.args, pid=os.getpid())
        self.say(f"procsv: launching {self.cfg.target} {' '.join(self.cfg.args)} in {self.layout.logdir}")
        try:
            for role in SERVICE_ROLES:
                self._spawn(role)
            if self.cfg.prewarm:
                self._start_zygote()
                self.restart_at = self.clock()  # the first trainer is forked as soon as the zygote is ready
            else:
                self._spawn("trainer")
            while not self._done():
                timeout = TICK_MS
                for sock, _ in self.poller.poll(timeout):
                    if sock is self.pull:
                        self._drain_messages()
                    elif sock == wake_r.fileno():
                        self._drain_wakeups(wake_r)
                    elif self.zygote is not None and sock == self.zygote.fd:
                        self._on_zygote()
                    elif sock == self._notice_r:
                        self._drain_notices()
                    else:
                        self._on_pidfd(sock)
                self._tick()
            self._shutdown_services()
        finally:
            for child in [*self.children.values(), *self.dying]:
                self._kill_group(child, signal.SIGKILL)
                self._reap(child)
            for z in [self.zygote, *self._dead_zygotes]:
                if z is not None:
                    z.close()
            signal.set_wakeup_fd(old_wakeup)
            for s, h in old.items():
                signal.signal(s, h)
            wake_r.close()
            wake_w.close()
            self.pull.close(0)
            zctx.term()
            shutil.rmtree(self.runtime_dir, ignore_errors=True)
            self._write_status(force=True)
            self._final_report()
            self._events.close()
        return self.exit_code

    def _final_report(self) -> None:
        summary = report.summarize(self.attempts, self.launch_start, self.clock())
        try:
            write_json(os.path.join(self.layout.logs, "report.json"), summary)
        except OSError:
            pass
        if summary["restarts"] or self.chaos is not None:
            self.say(report.render(summary))

    # ------------------------------------------------------------------ spawning
    def _spawn(self, role: str) -> Child:
        prev = self.children.get(role)
        attempt = prev.attempt + 1 if prev else 1
        env = spawn.child_env(role=role, attempt=attempt, logdir=self.layout.logdir,
                              runtime_dir=self.runtime_dir, supervised=True)
        argv = spawn.trainer_argv(self.cfg.target, self.cfg.args) if role == "trainer" else spawn.service_argv(role)
        log_path = self.layout.attempt_log(role, attempt)
        popen: Any = None
        via = "fresh"
        mutex = self._death_mutex(attempt) if role == "trainer" else None
        if mutex is not None:
            env[DEATH_MUTEX] = mutex.path
        if role == "trainer" and self.zygote is not None and self.zygote.ready:
            try:
                popen = self.zygote.fork(attempt, self.cfg.target, self.cfg.args, env, log_path, self.cfg.cwd)
                via = "zygote"
            except ZygoteUnavailable as exc:
                self.say(f"procsv: pre-warmed trainer unavailable ({exc}); starting a fresh one")
                self._drop_zygote()
        if popen is None:
            popen = spawn.spawn(argv, env, log_path, cwd=self.cfg.cwd)
        child = Child(role, attempt, popen, os.pidfd_open(popen.pid), self.clock(), log_path)
        child.restarts = attempt - 1
        try:
            child.create_time = psutil.Process(popen.pid).create_time()
        except psutil.Error:
            pass
        self.children[role] = child
        self.poller.register(child.pidfd, zmq.POLLIN)
        if role == "trainer":
            child.record = report.AttemptRecord(attempt, child.started)
            self.attempts.append(child.record)
            if mutex is not None:
                child.watch = DeathWatch(
                    mutex, alive=lambda: child.pidfd >= 0,
                    on_event=lambda died, at: self._post_notice(child, died, at))
        elif self.chaos is not None and self.chaos.target == role:
            self.chaos_at = child.started + self.chaos.delay(self.chaos_rng)
        self.log("spawned", role=role, attempt=attempt, pid=popen.pid, via=via)
        self._status_dirty = True
        return child

    def _death_mutex(self, attempt: int) -> Optional[RobustMutex]:
        try:
            return RobustMutex(RuntimeDir(self.runtime_dir).trainer_mutex(attempt), create=True)
        except OSError:
            return None  # no early notice: the pidfd alone tells of the death

    def _post_notice(self, child: Child, died: bool, at: float) -> None:
        """Runs in a DeathWatch thread: hand the notice to the main loop."""
        self._notices.put((child, died, at, time.time()))
        try:
            os.write(self._notice_w, b"!")
        except BlockingIOError:
            pass

    def _drain_notices(self) -> None:
        try:
            os.read(self._notice_r, 4096)
        except BlockingIOError:
            pass
        while not self._notices.empty():
            child, died, at, wall = self._notices.get()
            if died and child is self.children.get("trainer") and child.pidfd >= 0:
                self._on_death_notice(child, at, wall)

    def _on_death_notice(self, child: Child, at: float, wall: float) -> None:
        """The trainer died holding its mutex (not a clean exit): decide now, reap later."""
        child.noticed_wall = wall
        if child.record is not None:
            child.record.ended = at
        self.log("death_noticed", role="trainer", attempt=child.attempt, pid=child.pid, noticed=wall)
        exit_ = TrainerExit(1, child.first_step_at is not None, child.made_progress, self.stop_signal is not None)
        decision = decide(self.policy, self.history, exit_, self.rng.random())
        if decision.action != Action.RESTART:
            return  # giving up or stopping: wait for the exit status to tell the whole story
        self.history = decision.history
        child.decided_early = True
        child.set_state(ProcState.FAILED)
        child.set_state(ProcState.RESTARTING)
        self.dying.append(child)
        self.restart_at = self.clock() + decision.delay
        self._status_dirty = True

    def _start_zygote(self) -> None:
        env = zygote_env(self.layout.logdir, self.runtime_dir)
        self.zygote = Zygote(env, self.layout.attempt_log("zygote", 1), self.cfg.cwd, self.cfg.preload)
        self.poller.register(self.zygote.fd, zmq.POLLIN)
        self.log("spawned", role="zygote", attempt=1, pid=self.zygote.pid)

    def _on_zygote(self) -> None:
        assert self.zygote is not None
        was_ready = self.zygote.ready
        self.zygote.pump()
        if self.zygote.ready and not was_ready:
            self.log("zygote_ready", pid=self.zygote.pid, import_secs=round(self.zygote.import_secs or 0, 3))
        if not self.zygote.alive():
            self.say("procsv: the pre-warmed trainer (zygote) died; restarts will start fresh trainers", err=True)
            self._drop_zygote()

    def _drop_zygote(self) -> None:
        if self.zygote is None:
            return
        try:
            self.poller.unregister(self.zygote.fd)
        except KeyError:
            pass
        self.log("zygote_gone", pid=self.zygote.pid)
        # forked trainers still need their exit statuses: keep the pipe until they are reaped
        self._dead_zygotes.append(self.zygote)
        self.zygote = None

    # ------------------------------------------------------------------ events
    def _on_signal(self, signum: int, frame: Any) -> None:
        pass  # handled in the loop, through the wakeup fd

    def _drain_wakeups(self, wake_r: socket.socket) -> None:
        try:
            data = wake_r.recv(64)
        except BlockingIOError:
            return
        for signum in data:
            if signum in (signal.SIGTERM, signal.SIGINT):
                self._request_stop(signum)

    def _request_stop(self, signum: int) -> None:
        if self.stop_signal is not None:
            if signum == signal.SIGINT:  # a second Ctrl-C: stop waiting for the grace period
                self.say("procsv: second interrupt, killing the run now")
                self.stop_deadline = self.clock()
            return
        self.stop_signal = signum
        self.stop_deadline = self.clock() + self.cfg.stop_grace_secs
        name = signal.Signals(signum).name
        self.log("preempted", signal=name)
        self.say(f"procsv: {name} received, asking the trainer to checkpoint and stop "
                 f"(up to {self.cfg.stop_grace_secs:g} s)")
        self.restart_at = None
        trainer = self.children.get("trainer")
        if trainer and trainer.popen.poll() is None and trainer.state in (ProcState.STARTING, ProcState.RUNNING):
            trainer.set_state(ProcState.STOPPING)
            self._signal(trainer, signal.SIGTERM)
        self._status_dirty = True

    def _drain_messages(self) -> None:
        while True:
            try:
                frames = self.pull.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            try:
                msg, _ = decode(frames)
            except ProtocolError as exc:
                self.say(f"procsv: ignored a malformed message: {exc}")
                continue
            self._on_message(msg)

    def _on_message(self, msg: Any) -> None:
        if isinstance(msg, Hello):
            child = self.children.get(msg.role)
            if child and child.pid == msg.pid and child.state == ProcState.STARTING:
                child.set_state(ProcState.RUNNING)
        elif isinstance(msg, TrainerReady):
            child = self.children.get("trainer")
            if child and child.pid == msg.pid:
                self.step = msg.step
                child.step = msg.step
                if child.record is not None:
                    child.record.ready = self.clock()
                    child.record.restored_step = child.record.last_step = msg.step
                if msg.restored_from:
                    self.restored_step = msg.step
                    self.say(f"procsv: trainer attempt {msg.attempt} restored step {msg.step} "
                             f"from {os.path.basename(msg.restored_from)} in {msg.restore_secs:.2f} s")
                for prefix in msg.skipped:
                    self.say(f"procsv: skipped corrupt checkpoint {prefix}")
                self.log("restored" if msg.restored_from else "initialized", pid=msg.pid, step=msg.step,
                         path=msg.restored_from, secs=round(msg.restore_secs, 4), skipped=msg.skipped)
        elif isinstance(msg, Progress):
            child = self.children.get("trainer")
            if child and child.pid == msg.pid:
                now = self.clock()
                if child.first_step_at is None and not msg.busy:
                    child.first_step_at = now
                    self.log("first_step", pid=msg.pid, step=msg.step,
                             secs_since_spawn=round(child.first_step_at - child.started, 3))
                    if child.record is not None:
                        child.record.first_step = now
                    if self.chaos is not None and self.chaos.target == "trainer":
                        self.chaos_at = now + self.chaos.delay(self.chaos_rng)
                if child.state == ProcState.STARTING:
                    child.set_state(ProcState.RUNNING)
                child.step = msg.step
                child.busy = bool(msg.busy)
                child.last_progress_at = now
                if child.record is not None and not msg.busy:
                    child.record.last_progress = now
                    child.record.last_step = msg.step
                self.step = msg.step
        elif isinstance(msg, SaveResult):
            if msg.ok:
                self.step = max(self.step, msg.step)
                trainer = self.children.get("trainer")
                if trainer:
                    trainer.made_progress = True
                self.log("checkpoint_committed", step=msg.step, path=msg.path, reason=msg.reason,
                         secs=round(msg.persist_secs, 4))
            else:
                self.log("checkpoint_failed", step=msg.step, error=msg.error)
                self.say(f"procsv: checkpoint at step {msg.step} failed: {msg.error}")
        self._status_dirty = True

    def _on_pidfd(self, fd: int) -> None:
        child = next((c for c in [*self.children.values(), *self.dying] if c.pidfd == fd), None)
        if child is None:
            self.poller.unregister(fd)
            return
        noticed = child.noticed_wall or time.time()
        if child.record is not None and child.record.ended is None:
            child.record.ended = self.clock()
        if child.watch is not None:
            child.watch.cancel()
        self._reap(child)
        code = child.popen.returncode
        self._drain_messages()  # anything it said before dying (a last checkpoint result)
        self._tail_log(child)
        self.log("exited", role=child.role, attempt=child.attempt, pid=child.pid, noticed=noticed, **_describe(code))
        if child.decided_early:
            self.dying.remove(child)
            if child.record is not None:
                child.record.cause = child.hang_cause or _describe_text(code)
            cause = self._root_cause(child, code)
            self.last_error = cause.splitlines()[0]
            self.say(f"procsv: {self.last_error}; restarted (restart {self.history.restarts})", err=True)
            self.log("restarting", attempt=child.attempt + 1, delay=0.0, error=self.last_error)
        elif child.role == "trainer":
            self._on_trainer_exit(child, code)
        else:
            self._on_service_exit(child, code)
        self._status_dirty = True

    def _on_trainer_exit(self, child: Child, code: int) -> None:
        if child.record is not None:
            child.record.cause = child.hang_cause or _describe_text(code)
        exit_ = TrainerExit(code, child.first_step_at is not None, child.made_progress, self.stop_signal is not None)
        child.set_state(ProcState.EXITED if code == 0 else ProcState.FAILED)
        decision = decide(self.policy, self.history, exit_, self.rng.random())
        self.history = decision.history
        if decision.action == Action.FINISH:
            self.say(f"procsv: trainer finished at step {self.step}")
            self._finish(RunState.SUCCEEDED, 0)
        elif decision.action == Action.STOPPED:
            self.say(f"procsv: trainer stopped at step {self.step} ({_describe_text(code)})")
            self._finish(RunState.STOPPED, 128 + (self.stop_signal or signal.SIGTERM))
        elif code == EXIT_PREEMPTED and decision.action == Action.RESTART:
            self.say(f"procsv: trainer attempt {child.attempt} was preempted and saved its state; restarting")
            self.log("restarting", attempt=child.attempt + 1, delay=0.0, error="preempted")
            child.set_state(ProcState.RESTARTING)
            self.restart_at = self.clock()
        else:
            cause = self._root_cause(child, code)
            if child.hang_cause:
                cause = f"{cause.splitlines()[0]} ({child.hang_cause})\n" + "\n".join(cause.splitlines()[1:])
            self.last_error = cause.splitlines()[0]
            if decision.action == Action.GIVE_UP:
                self.say(f"procsv: giving up: {decision.reason}.\n{cause}", err=True)
                self.log("gave_up", reason=decision.reason, error=self.last_error)
                self._finish(RunState.FAILED, 1)
            else:
                self.say(f"procsv: {cause.splitlines()[0]}; restarting in {decision.delay:.1f} s "
                         f"(restart {self.history.restarts})", err=True)
                self.log("restarting", attempt=child.attempt + 1, delay=round(decision.delay, 3),
                         error=self.last_error)
                child.set_state(ProcState.RESTARTING)
                self.restart_at = self.clock() + decision.delay

    def _on_service_exit(self, child: Child, code: int) -> None:
        child.set_state(ProcState.EXITED if code == 0 else ProcState.FAILED)
        if self.finishing:
            return
        now = self.clock()
        self.service_crashes = [t for t in self.service_crashes if now - t < SERVICE_RESTART_WINDOW] + [now]
        cause = self._root_cause(child, code)
        if len(self.service_crashes) > SERVICE_RESTART_LIMIT:
            self.last_error = f"{child.role} service keeps failing: {cause.splitlines()[0]}"
            self.say(f"procsv: giving up: the {child.role} service failed {len(self.service_crashes)} times "
                     f"in {SERVICE_RESTART_WINDOW:g} s.\n{cause}", err=True)
            self._request_stop(signal.SIGTERM)
            self.exit_code = 1
            return
        self.say(f"procsv: {cause.splitlines()[0]}; restarting the {child.role} service", err=True)
        child.set_state(ProcState.RESTARTING)
        self._spawn(child.role)

    def _finish(self, state: RunState, code: int) -> None:
        self.state = transition(self.state, state)  # type: ignore[assignment]
        self.exit_code = self.exit_code or code
        self.finishing = True
        self.log("finished", state=state.value, exit_code=self.exit_code, step=self.step)

    # ------------------------------------------------------------------ timers
    def _tick(self) -> None:
        now = self.clock()
        trainer = self.children.get("trainer")
        zygote_warming = (self.zygote is not None and not self.zygote.ready and self.zygote.alive()
                          and now - self.launch_start < ZYGOTE_WAIT)
        if self.restart_at is not None and now >= self.restart_at and not self.finishing and not zygote_warming:
            self.restart_at = None
            if trainer:
                self.log("restarted", attempt=trainer.attempt + 1)
            self._spawn("trainer")
        if self.stop_deadline is not None and now >= self.stop_deadline and trainer and trainer.popen.poll() is None:
            self.say(f"procsv: trainer did not stop within {self.cfg.stop_grace_secs:g} s; killing it")
            self._kill_group(trainer, signal.SIGKILL)
            self.stop_deadline = None
        if self.stop_signal is not None and (trainer is None or trainer.popen.poll() is not None) \
                and not self.finishing:
            # stopped while waiting to restart: nothing is running any more
            self._finish(RunState.STOPPED, 128 + self.stop_signal)
        if trainer and not self.finishing:
            self._check_hang(trainer, now)
            self._chaos_tick(now)
        if trainer:
            self._tail_log(trainer)
        self._write_status()

    def _check_hang(self, trainer: Child, now: float) -> None:
        if trainer.decided_early or trainer.popen.poll() is not None or self.stop_signal is not None:
            return
        if trainer.hang_kill_at is not None:
            if now >= trainer.hang_kill_at:
                self.say(f"procsv: hung trainer did not exit within {self.cfg.hang_grace_secs:g} s; killing it")
                self._kill_group(trainer, signal.SIGKILL)
                trainer.hang_kill_at = None
            return
        if trainer.hang_cause:
            return
        reason = hang_reason(now, started=trainer.started, last_progress=trainer.last_progress_at,
                             busy=trainer.busy, limits=self.limits)
        if reason is None:
            return
        trainer.hang_cause = f"hang: {reason}"
        self.log("hang_detected", pid=trainer.pid, attempt=trainer.attempt, step=trainer.step, reason=reason)
        self.say(f"procsv: trainer attempt {trainer.attempt} (pid {trainer.pid}) is hung: {reason}; "
                 f"sending SIGTERM, SIGKILL in {self.cfg.hang_grace_secs:g} s", err=True)
        if trainer.record is not None:
            trainer.record.killed_at = now
        trainer.set_state(ProcState.STOPPING)
        self._signal(trainer, signal.SIGTERM)
        trainer.hang_kill_at = now + self.cfg.hang_grace_secs

    def _chaos_tick(self, now: float) -> None:
        if self.chaos is None or self.chaos_at is None or now < self.chaos_at or self.stop_signal is not None:
            return
        victim = self.children.get(self.chaos.target)
        self.chaos_at = None
        if victim is None or victim.decided_early or victim.popen.poll() is not None or victim.busy:
            return  # nothing to kill, or the trainer is writing its final checkpoint
        name = signal.Signals(self.chaos.signal).name
        self.log("chaos_kill", role=victim.role, pid=victim.pid, signal=name)
        self.say(f"procsv: chaos: sending {name} to the {victim.role} (pid {victim.pid})")
        if victim.record is not None:
            victim.record.killed_at = now
        self._signal(victim, self.chaos.signal)

    def _done(self) -> bool:
        return self.finishing

    # ------------------------------------------------------------------ shutdown
    def _shutdown_services(self) -> None:
        services = [c for c in self.children.values() if c.role in SERVICE_ROLES and c.popen.poll() is None]
        for c in services:
            c.set_state(ProcState.STOPPING)
            self._signal(c, signal.SIGTERM)
        deadline = self.clock() + min(self.cfg.stop_grace_secs, 30.0)
        for c in services:
            try:
                c.popen.wait(timeout=max(0.1, deadline - self.clock()))
            except Exception:
                self.say(f"procsv: the {c.role} service did not stop in time; killing it")
                self._kill_group(c, signal.SIGKILL)
            self._reap(c)
            self.log("exited", role=c.role, attempt=c.attempt, pid=c.pid, **_describe(c.popen.returncode))

    def _signal(self, child: Child, sig: int) -> None:
        try:
            os.kill(child.pid, sig)
        except ProcessLookupError:
            pass

    def _kill_group(self, child: Child, sig: int) -> None:
        """Signal the child's whole process group (it leads its own session)."""
        try:
            os.killpg(child.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def _reap(self, child: Child) -> None:
        if child.popen.returncode is None:
            try:
                child.popen.wait(timeout=5)
            except Exception:
                self._kill_group(child, signal.SIGKILL)
                child.popen.wait()
        self._kill_group(child, signal.SIGKILL)  # anything the child left behind in its group
        if child.pidfd >= 0:
            try:
                self.poller.unregister(child.pidfd)
            except KeyError:
                pass
            os.close(child.pidfd)
            child.pidfd = -1
        if child.state in (ProcState.STARTING, ProcState.RUNNING, ProcState.STOPPING):
            child.set_state(ProcState.EXITED if child.popen.returncode == 0 else ProcState.FAILED)

    # ------------------------------------------------------------------ reporting
    def _root_cause(self, child: Child, code: int) -> str:
        """First line: what happened; then the child's own traceback, if it wrote one."""
        head = f"{child.role} attempt {child.attempt} (pid {child.pid}) {_describe_text(code)}"
        if child.role == "trainer" and child.first_step_at is None:
            head += " before completing a step"
        err = read_json(self.layout.error_file(child.role, child.attempt))
        if isinstance(err, dict) and err.get("pid") == child.pid:
            head += f": {err.get('type')}: {err.get('message')}"
            tb = str(err.get("traceback", "")).rstrip()
            return f"{head}\n{_indent(tb)}\n  (full log: {child.log_path})"
        return f"{head}\n  (full log: {child.log_path})"

    def _tail_log(self, child: Child) -> None:
        if self.cfg.quiet:
            return
        try:
            with open(child.log_path, "rb") as fh:
                fh.seek(child.log_pos)
                data = fh.read()
        except OSError:
            return
        end = data.rfind(b"\n")
        if end < 0:
            return
        child.log_pos += end + 1
        for line in data[:end].decode(errors="replace").splitlines():
            if line.strip() and not _NOISE.match(line):
                print(f"[{child.role}.{child.attempt}] {line}", flush=True)

    def say(self, text: str, err: bool = False) -> None:
        print(text, file=sys.stderr if err else sys.stdout, flush=True)

    def log(self, event: str, **fields: Any) -> None:
        if self._events is not None:
            self._events.write(json.dumps({"time": time.time(), "event": event, **fields}) + "\n")

    def status_record(self) -> dict[str, Any]:
        procs = [{"role": "watchdog", "pid": os.getpid(), "state": "exited" if self.finishing else "running",
                  "restarts": 0, "create_time": psutil.Process().create_time()}]
        for role in ("trainer", "checkpoint", "summary"):
            c = self.children.get(role)
            if c is not None:
                procs.append({"role": role, "pid": c.pid, "state": c.state.value, "restarts": c.restarts,
                              "attempt": c.attempt, "create_time": c.create_time})
        return {
            "version": 1,
            "state": self.state.value,
            "step": self.step,
            "restarts": self.history.restarts,
            "restored_step": self.restored_step,
            "last_checkpoint": last_checkpoint(self.layout),
            "last_error": self.last_error,
            "goodput": report.goodput(self.attempts, self.launch_start, self.clock()),
            "prewarm": None if self.zygote is None else {"pid": self.zygote.pid, "ready": self.zygote.ready},
            "exit_code": self.exit_code if self.finishing else None,
            "processes": procs,
            "target": self.cfg.target,
            "args": self.cfg.args,
            "logdir": self.layout.logdir,
            "started_at": self.started_wall,
            "updated_at": time.time(),
        }

    def _write_status(self, force: bool = False) -> None:
        now = self.clock()
        if not force and (not self._status_dirty or now - self._status_at < STATUS_EVERY):
            return
        self._status_dirty = False
        self._status_at = now
        write_json(self.layout.status, self.status_record(), durable=force)


def _describe(code: Optional[int]) -> dict[str, Any]:
    if code is None:
        return {"code": None}
    if code < 0:
        try:
            return {"signal": signal.Signals(-code).name}
        except ValueError:
            return {"signal": str(-code)}
    return {"code": code}


def _describe_text(code: Optional[int]) -> str:
    d = _describe(code)
    return f"was killed by {d['signal']}" if "signal" in d else f"exited with code {d.get('code')}"


def _indent(text: str) -> str:
    return "\n".join("  | " + line for line in text.splitlines())
