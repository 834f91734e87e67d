"""What every child process of a run (trainer, checkpoint service, summary service) does first.

Runs in each child (imported by the trainer, both services and the zygote). The watchdog passes the run's coordinates in environment variables; this
module reads them, ties the child's life to its parent (Linux parent-death signal, so killing the
watchdog -- even with SIGKILL -- takes its children along), and records a failure as data: the
child writes its own traceback to ``logs/<role>.<attempt>.error.json`` (atomically) before dying.

It is the one module that reads a ``PROCSV_*`` variable: :meth:`ChildConfig.parse` turns the
environment into one typed, versioned record (:func:`read_config`, once per child: a service's
:func:`run_service`, the zygote's start, each ``procsv.Supervisor``), and the child hands that
record on explicitly (constructor arguments, :attr:`ChildContext.config`). Where a setting is both a
program's argument and a launch flag, :func:`resolve` is the one precedence rule
(``docs/python-api.md``, "Settings: argument, launch flag, default").

One concern: a child's start (its configuration read once, typed and versioned; its tie to its parent;
its failure recorded as data).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import time
import traceback
from dataclasses import dataclass, replace
from typing import Callable, Mapping, Optional, TypeVar

from procsv.common import env, stopfrom
from procsv.common.layout import Layout, spilled_error_file, write_json
from procsv.ipc.transport import Endpoints


_PR_SET_PDEATHSIG = 1

CONFIG_VERSION = 4  # ChildConfig's schema: a field added, removed or given another meaning is a new version (2: Resume; 3: LaunchSettings.group_in_place; 4: audit)

T = TypeVar("T")


def resolve(argument: Optional[T], launch: Optional[T], default: T) -> T:
    """The one precedence rule of every setting that is both a program's argument and a launch flag
    (pure): the program's explicit argument, else the launch's value (``procsv launch``'s flag, or its
    default), else the built-in default. A program behaves the same under ``procsv launch`` as in
    plain python wherever it said what it wants; the launch fills in only what it left unsaid."""
    if argument is not None:
        return argument
    return launch if launch is not None else default


def _number(name: str, raw: str, kind: Callable[[str], T]) -> T:
    try:
        return kind(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r}: not a {'whole ' if kind is int else ''}number") from None


def _int(environ: Mapping[str, str], name: str, default: int) -> int:
    raw = environ.get(name, "")
    return _number(name, raw, int) if raw else default


def _optional_int(environ: Mapping[str, str], name: str) -> Optional[int]:
    raw = environ.get(name)
    return None if raw is None else _number(name, raw, int)


def _optional_float(environ: Mapping[str, str], name: str) -> Optional[float]:
    raw = environ.get(name)
    return None if raw is None else _number(name, raw, float)


def _pid(raw: Optional[str]) -> Optional[int]:
    return int(raw) if raw is not None and raw.isdigit() else None


def _pids(raw: str) -> tuple[int, ...]:
    """``"4120,4188"`` as pids (unset or empty: none; anything not a pid is passed over)."""
    return tuple(int(p) for p in raw.split(",") if p.strip().isdigit() and int(p) > 0)


def _steps(raw: str) -> tuple[int, ...]:
    """``"40,70"`` as steps (unset or empty: none; anything not a step is passed over)."""
    return tuple(sorted({int(p.strip()) for p in raw.split(",") if p.strip().isdigit()}))


def _step(raw: Optional[str]) -> Optional[int]:
    """A step, or None (unset, empty, or not a step)."""
    return int(raw.strip()) if raw is not None and raw.strip().isdigit() else None


def _interval(raw: Optional[str]) -> Optional[tuple[int, int]]:
    """``"S1:S2"`` as the steps S1 < S2 (unset or empty: None); anything else is a ValueError naming the variable."""
    if not raw:
        return None
    first, _, last = raw.partition(":")
    if not (first.isdigit() and last.isdigit() and int(first) < int(last)):
        raise ValueError(f"{env.AUDIT}={raw!r}: give the audited interval as S1:S2, two steps, S1 < S2")
    return int(first), int(last)


def _off(raw: str) -> bool:
    return raw.strip().lower() in ("0", "off", "no", "false")


@dataclass(frozen=True)
class Place:
    """A trainer's place in its group (``--nproc``, ``--nnodes``, ``--ps``): the part of
    :class:`ChildConfig` :mod:`procsv.cluster` answers a program with, read alone (:func:`read_place`)
    so that nothing else of the record can fail it."""

    rank: int = 0  # PROCSV_RANK: this trainer's task (0: the chief)
    nproc: int = 1  # PROCSV_NPROC: the group's size, over every host
    hosts: int = 1  # PROCSV_GROUP_HOSTS: the hosts the group runs on now
    ps: int = 0  # PROCSV_PS: the parameter-server tasks

    @staticmethod
    def parse(environ: Mapping[str, str]) -> "Place":
        return Place(rank=_int(environ, env.RANK, 0), nproc=_int(environ, env.NPROC, 1),
                     hosts=_int(environ, env.GROUP_HOSTS, 1), ps=_int(environ, env.PS, 0))


@dataclass(frozen=True)
class GroupConfig:
    """What the watchdog tells a trainer group's members and node 0's checkpoint service about the
    group's in-memory tier (``docs/replicas.md``). Texts their consumer validates stay text."""

    pin: Optional[str] = None  # PROCSV_GROUP_PIN: the group's restore record for this attempt
    snapshot_steps: str = ""  # PROCSV_GROUP_SNAPSHOT_STEPS: K (procsv.common.env.group_snapshot_steps)
    remote: bool = False  # PROCSV_GROUP_REMOTE=1: a member of host 1..M-1 (its copies go to node 0 over CURVE)
    peer_bind: str = ""  # PROCSV_GROUP_PEER_BIND: node 0's checkpoint service binds its CURVE ROUTER there
    peer_max_bytes: str = ""  # PROCSV_GROUP_PEER_MAX_BYTES: node 0's service's bound on one peer copy

    @staticmethod
    def parse(environ: Mapping[str, str]) -> "GroupConfig":
        return GroupConfig(pin=environ.get(env.GROUP_PIN), snapshot_steps=environ.get(env.GROUP_SNAPSHOT_STEPS, ""),
                           remote=environ.get(env.GROUP_REMOTE) == "1",
                           peer_bind=environ.get(env.GROUP_PEER_BIND, ""),
                           peer_max_bytes=environ.get(env.GROUP_PEER_MAX_BYTES, ""))


@dataclass(frozen=True)
class LaunchSettings:
    """The launch's settings a child reads (``procsv launch``'s flags, and the variables a user may set
    for it). None: the launch gave none, so that :func:`resolve` lets the program's argument or the
    default decide. Texts their consumer validates stay text (``memory_snapshots``:
    :func:`procsv.common.env.memory_budget`; ``checkpoint_nice``: a value that is no number leaves the
    nice level as it is)."""

    checkpoint_failure_limit: Optional[int] = None  # PROCSV_CHECKPOINT_FAILURE_LIMIT (--on-checkpoint-failure)
    allow_reinit: Optional[bool] = None  # PROCSV_ALLOW_REINIT (--allow-reinit)
    on_nonfinite: Optional[str] = None  # PROCSV_ON_NONFINITE (--on-nonfinite)
    on_spike: Optional[str] = None  # PROCSV_ON_SPIKE (--on-spike)
    max_skips: Optional[int] = None  # PROCSV_MAX_SKIPS (--max-skips)
    skip_window: Optional[int] = None  # PROCSV_SKIP_WINDOW (--skip-window)
    save_deadline: Optional[float] = None  # PROCSV_SAVE_DEADLINE
    summary_deadline: Optional[float] = None  # PROCSV_SUMMARY_DEADLINE
    summary_continue: Optional[str] = None  # PROCSV_SUMMARY_CONTINUE (a standalone summary service's)
    checkpoint_nice: Optional[str] = None  # PROCSV_CHECKPOINT_NICE
    memory_snapshots: str = ""  # PROCSV_MEMORY_SNAPSHOTS
    nonfinite_check: bool = True  # PROCSV_NONFINITE_CHECK (0, off, no, false: no detection)
    group_in_place: bool = True  # PROCSV_GROUP_ROLLBACK (restart: a group's rollback always restarts every member)
    graph_fast_run: bool = True  # PROCSV_GRAPH_FAST_RUN (0: every graph run through Session.run)

    @staticmethod
    def parse(environ: Mapping[str, str]) -> "LaunchSettings":
        reinit = environ.get(env.ALLOW_REINIT)
        return LaunchSettings(
            checkpoint_failure_limit=_optional_int(environ, env.CHECKPOINT_FAILURE_LIMIT),
            allow_reinit=None if reinit is None else reinit == "1",
            on_nonfinite=environ.get(env.ON_NONFINITE),
            on_spike=environ.get(env.ON_SPIKE),
            max_skips=_optional_int(environ, env.MAX_SKIPS),
            skip_window=_optional_int(environ, env.SKIP_WINDOW),
            save_deadline=_optional_float(environ, env.SAVE_DEADLINE),
            summary_deadline=_optional_float(environ, env.SUMMARY_DEADLINE),
            summary_continue=environ.get(env.SUMMARY_CONTINUE),
            checkpoint_nice=environ.get(env.CHECKPOINT_NICE),
            memory_snapshots=environ.get(env.MEMORY_SNAPSHOTS, ""),
            nonfinite_check=not _off(environ.get(env.NONFINITE_CHECK, "")),
            group_in_place=environ.get(env.GROUP_ROLLBACK, "").strip().lower() != "restart",
            graph_fast_run=environ.get(env.GRAPH_FAST_RUN, "1") != "0",
        )


@dataclass(frozen=True)
class ZygoteConfig:
    """The pre-warmed trainer's own: its pipes and the modules it imports too."""

    fds: Optional[str] = None  # PROCSV_ZYGOTE_FDS: "read,write,say"
    preload: tuple[str, ...] = ()  # PROCSV_PRELOAD

    @staticmethod
    def parse(environ: Mapping[str, str]) -> "ZygoteConfig":
        return ZygoteConfig(environ.get(env.ZYGOTE_FDS), tuple(filter(None, environ.get(env.PRELOAD, "").split(","))))


@dataclass(frozen=True)
class Resume:
    """What the watchdog tells a trainer that starts in the middle of a run, decided by the watchdog and
    never read from its records (a spawn's environment, or a standby's :class:`Promotion
    <procsv.ipc.messages.Promotion>`): the steps the run skipped so far (every launch of the logdir), the
    step B whose rollback this group attempt is (its chief restores a state before B; None: it is none),
    and the step this launch's first trainer began at (None: this is the launch's first, or unknown)."""

    skip_steps: tuple[int, ...] = ()  # PROCSV_SKIP_STEPS
    rollback_before: Optional[int] = None  # PROCSV_ROLLBACK_BEFORE
    launch_start_step: Optional[int] = None  # PROCSV_LAUNCH_START_STEP

    @staticmethod
    def parse(environ: Mapping[str, str]) -> "Resume":
        """The part of ``environ`` that says it (pure)."""
        return Resume(_steps(environ.get(env.SKIP_STEPS, "")), _step(environ.get(env.ROLLBACK_BEFORE)),
                      _step(environ.get(env.LAUNCH_START_STEP)))

    def environ(self) -> dict[str, str]:
        """As a child's environment says it (what :meth:`parse` reads back)."""
        out = {env.SKIP_STEPS: ",".join(map(str, self.skip_steps))}
        if self.rollback_before is not None:
            out[env.ROLLBACK_BEFORE] = str(self.rollback_before)
        if self.launch_start_step is not None:
            out[env.LAUNCH_START_STEP] = str(self.launch_start_step)
        return out


@dataclass(frozen=True)
class ChildConfig:
    """Everything the watchdog (or a Supervisor that starts its own services) tells a child, typed:
    the one record of a child's configuration (:data:`CONFIG_VERSION`). Built by :meth:`parse` from
    the child's environment (the transport; each variable is described in :mod:`procsv.common.env`);
    nothing else in procsv reads a ``PROCSV_*`` variable. Its parts: the child's coordinates (here),
    its ``place`` in a group, the group's in-memory tier (``group``), what a hot standby and a group's
    restart are told (here), the ``launch``'s settings and the ``zygote``'s own. A number that is not
    one is a ``ValueError`` naming its variable, when the child starts."""

    version: int = CONFIG_VERSION
    # the child's coordinates in its run
    logdir: Optional[str] = None  # PROCSV_LOGDIR
    runtime_dir: Optional[str] = None  # PROCSV_RUNTIME_DIR
    role: str = "trainer"  # PROCSV_ROLE
    attempt: int = 1  # PROCSV_ATTEMPT
    supervised: bool = False  # PROCSV_WATCHDOG=1: a watchdog supervises this child
    parent_pid: Optional[int] = None  # PROCSV_PARENT_PID: the process it dies with (None: unset or not a pid)
    supervisor_pid: Optional[int] = None  # PROCSV_SUPERVISOR_PID: the process that started it
    death_mutex: Optional[str] = None  # PROCSV_DEATH_MUTEX
    predecessors: tuple[int, ...] = ()  # PROCSV_PREDECESSORS: this host's earlier trainer processes not reaped yet
    preempt_signal: Optional[int] = None  # PROCSV_PREEMPT_SIGNAL
    place: Place = Place()
    group: GroupConfig = GroupConfig()
    # a hot standby's, and a group's restart's (the watchdog's at the spawn, or the promotion's)
    standby: bool = False  # PROCSV_STANDBY=1
    shadow_run: bool = True  # PROCSV_SHADOW_RUN (0: a standby group's members skip the step's run on shadows)
    shadow_memory: str = ""  # PROCSV_SHADOW_MEMORY: bytes, a standby group's one figure
    audit: Optional[tuple[int, int]] = None  # PROCSV_AUDIT: an auditor's interval (S1, S2) (issue 71); None: no auditor
    resume: Resume = Resume()  # PROCSV_SKIP_STEPS, PROCSV_ROLLBACK_BEFORE, PROCSV_LAUNCH_START_STEP
    launch: LaunchSettings = LaunchSettings()
    zygote: ZygoteConfig = ZygoteConfig()

    @property
    def in_group(self) -> bool:
        """One of several trainers of a ``procsv launch --nproc N`` group."""
        return self.place.nproc > 1

    @staticmethod
    def parse(environ: Mapping[str, str]) -> "ChildConfig":
        """The record ``environ`` holds (pure: any mapping; a number that is not one raises ValueError, as
        does a schema version other than this install's: :func:`check_version`)."""
        check_version(environ.get(env.CONFIG_VERSION, ""))
        preempt = environ.get(env.PREEMPT_SIGNAL, "")
        return ChildConfig(
            logdir=environ.get(env.LOGDIR) or None,
            runtime_dir=environ.get(env.RUNTIME_DIR) or None,
            role=environ.get(env.ROLE, "trainer"),
            attempt=_int(environ, env.ATTEMPT, 1),
            supervised=environ.get(env.WATCHDOG) == "1",
            parent_pid=_pid(environ.get(env.PARENT_PID)),
            supervisor_pid=_pid(environ.get(env.SUPERVISOR_PID)),
            death_mutex=environ.get(env.DEATH_MUTEX) or None,
            predecessors=_pids(environ.get(env.PREDECESSORS, "")),
            preempt_signal=int(preempt) if preempt.isdigit() else None,
            place=Place.parse(environ),
            group=GroupConfig.parse(environ),
            standby=environ.get(env.STANDBY) == "1",
            shadow_run=environ.get(env.SHADOW_RUN) != "0",
            shadow_memory=environ.get(env.SHADOW_MEMORY, ""),
            audit=_interval(environ.get(env.AUDIT)),
            resume=Resume.parse(environ),
            launch=LaunchSettings.parse(environ),
            zygote=ZygoteConfig.parse(environ),
        )

    def promoted(self, told: "Resume") -> "ChildConfig":
        """This standby's record once promoted (pure): no standby, and what its promotion told it."""
        return replace(self, standby=False, resume=told)


def check_version(written: str) -> None:
    """Refuse a configuration its parent wrote in another schema (pure): ``written`` is the parent's
    :data:`CONFIG_VERSION` (empty: no parent wrote one, as in a plain ``python train.py``). A child of
    another procsv install (upgraded in place under a running launch, or a host's agent installed apart)
    would read the variables with another meaning: it stops at its start with one line instead."""
    if written and written != str(CONFIG_VERSION):
        raise ValueError(f"{env.CONFIG_VERSION}={written!r}: this process reads procsv's configuration "
                         f"version {CONFIG_VERSION}, and its parent wrote another: the launch and this process "
                         f"run different procsv installs (install one procsv version for the whole run, then relaunch)")


def read_place() -> Place:
    """This process's :class:`Place`, from its environment (each call: :mod:`procsv.cluster`'s functions)."""
    return Place.parse(os.environ)


@dataclass(frozen=True)
class FaultConfig:
    """The tests' fault injection of this process (:mod:`procsv.common.faults`), read alone and never
    failing: every process reads it, the watchdog and a node agent too, at each fault point."""

    spec: str = ""  # PROCSV_FAULT: "<process>:<point>[:<n>[-<m>]][@<attempt>]", several separated by ","
    gate: str = ""  # PROCSV_FAULT_GATE: the file whose creation ends a stall
    attempt: int = 1  # PROCSV_ATTEMPT (1 if unset, 0 if not a number: no point fires)

    @staticmethod
    def parse(environ: Mapping[str, str]) -> "FaultConfig":
        attempt = environ.get(env.ATTEMPT, "1")
        return FaultConfig(environ.get(env.FAULT, ""), environ.get(env.FAULT_GATE, ""),
                           int(attempt) if attempt.isdigit() else 0)


def read_faults() -> FaultConfig:
    """This process's :class:`FaultConfig`, from its environment (each fault point)."""
    return FaultConfig.parse(os.environ)


def read_config() -> ChildConfig:
    """This process's :class:`ChildConfig`, from its environment: called once by each child's start
    (a service's :func:`run_service`, the zygote's main, each ``procsv.Supervisor``)."""
    return ChildConfig.parse(os.environ)


@dataclass(frozen=True)
class ChildContext:
    """The coordinates of this child inside its run, and its whole configuration (``config``)."""

    layout: Layout
    endpoints: Endpoints
    role: str
    attempt: int
    supervised: bool
    rank: int = 0  # this trainer's task in a group launched with --nproc N (0: the chief)
    nproc: int = 1  # the group's size
    config: ChildConfig = ChildConfig()

    @property
    def in_group(self) -> bool:
        """One of several trainers of a ``procsv launch --nproc N`` group."""
        return self.nproc > 1

    @staticmethod
    def from_config(config: ChildConfig) -> Optional["ChildContext"]:
        """The context ``config`` names; None outside a run (no logdir or runtime directory given)."""
        if not config.logdir or not config.runtime_dir:
            return None
        return ChildContext(layout=Layout(config.logdir), endpoints=Endpoints(config.runtime_dir), role=config.role,
                            attempt=config.attempt, supervised=config.supervised, rank=config.place.rank,
                            nproc=config.place.nproc, config=config)

    @staticmethod
    def from_env() -> Optional["ChildContext"]:
        """:meth:`from_config` of :func:`read_config`."""
        return ChildContext.from_config(read_config())


def die_with_parent(sig: int = signal.SIGKILL, parent_pid: Optional[int] = None,
                    preempt_signal: Optional[int] = None) -> None:
    """Ask the kernel to send ``sig`` to this process when its parent dies; exit if it already has.
    Also ignore the run's ``--preempt-signal`` (:data:`env.PREEMPT_SIGNAL`; the spawn's shell ignores
    it before exec already): the watchdog alone handles it. ``parent_pid`` and ``preempt_signal``
    given (a zygote seed, forked before its environment is set): those, not the environment's."""
    preempt = os.environ.get(env.PREEMPT_SIGNAL, "") if preempt_signal is None else str(preempt_signal)
    if preempt.isdigit():
        signal.signal(int(preempt), signal.SIG_IGN)
    parent = os.environ.get(env.PARENT_PID) if parent_pid is None else str(parent_pid)
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the watchdog's process-group kill still applies
        pass
    if parent and parent.isdigit() and os.getppid() != int(parent):
        os._exit(70)  # the parent died before the death signal was armed


def write_error_file(ctx: Optional[ChildContext], exc: BaseException, phase: str,
                     steps_completed: Optional[int] = None, committed: Optional[bool] = None) -> None:
    """Record ``exc`` with its traceback as this attempt's error file (best effort, atomic); a trainer
    also says how many steps it completed and whether a checkpoint of its committed while it lived
    (the watchdog tells the same failure again by them)."""
    if ctx is None:
        return
    write_error_record(ctx.layout, ctx.role, ctx.attempt, exc, phase, ctx.endpoints.runtime_dir, steps_completed,
                       committed)


def write_error_record(layout: Layout, role: str, attempt: int, exc: BaseException, phase: str,
                       runtime_dir: Optional[str] = None, steps_completed: Optional[int] = None,
                       committed: Optional[bool] = None) -> None:
    """Write ``logs/<role>.<attempt>.error.json`` for ``exc`` in this process (best effort, atomic).

    If the logdir cannot take it (a full filesystem, often the very reason the child fails), the
    record goes to the run's runtime directory, where the watchdog looks next, so the root cause
    still reaches the user's terminal."""
    record = {
        "role": role,
        "attempt": attempt,
        "pid": os.getpid(),
        "time": time.time(),
        "phase": phase,
        "type": type(exc).__name__,
        "message": str(exc),
        "traceback": "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)),
    }
    if steps_completed is not None:
        record["steps_completed"] = steps_completed
    if committed is not None:
        record["committed"] = committed
    try:
        write_json(layout.error_file(role, attempt), record)
        return
    except OSError as err:
        failed = err
    if runtime_dir is not None:
        try:
            write_json(spilled_error_file(runtime_dir, role, attempt), record)
            return
        except OSError:
            pass
    print(f"procsv: could not write error file: {failed}", file=sys.stderr)


def run_service(name: str, main: Callable[[ChildContext], int]) -> int:
    """The whole bootstrap of a service process: block the stop signals, die with the parent, read the
    context, run ``main``.

    The stop signals are blocked first, before any thread exists, so that every thread of the
    service has them blocked and the service's loop reads them with their senders
    (:mod:`procsv.common.stopfrom`): a service stops on its supervisor's SIGTERM, not on one sent
    to every process of the job at once, which would cost the trainer's emergency checkpoint.
    A failure is recorded as this attempt's error file (with the traceback) and re-raised, so the
    process still exits non-zero and the watchdog prints the child's own traceback.
    """
    stopfrom.block()
    die_with_parent()
    ctx = ChildContext.from_env()
    if ctx is None:
        print(f"procsv {name}: {env.LOGDIR} and {env.RUNTIME_DIR} must be set", file=sys.stderr)
        return 2
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    try:
        return main(ctx)
    except BaseException as exc:
        write_error_file(ctx, exc, "run")
        raise


def process_age() -> float:
    """Seconds since this process started: its start time in ``/proc/self/stat`` (clock ticks since
    boot) against ``CLOCK_BOOTTIME``. (psutil's ``create_time`` adds the boot time that ``/proc/stat``
    rounds to a whole second, so a wall time made from it can be a second off.)"""
    with open("/proc/self/stat") as fh:
        after_name = fh.read().rsplit(")", 1)[1].split()  # the name may hold spaces and parentheses
    started = int(after_name[19]) / os.sysconf("SC_CLK_TCK")  # field 22, starttime
    return max(0.0, time.clock_gettime(time.CLOCK_BOOTTIME) - started)
