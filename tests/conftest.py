"""Shared helpers for procsv's tests: real processes, bounded waits, leftover-process scans."""

from __future__ import annotations

import contextlib

import fcntl
import gc
import glob
import importlib.metadata
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import time
from email.parser import Parser
from typing import Any, Callable, Iterator, Optional

import psutil
import pytest
from packaging.requirements import Requirement

import longest_first
import pyfork
import rewrite_cache
import yardstick
from pyfork import run_python  # noqa: F401  (the tests' direct runs of a program: see tests/pyfork.py)

HERE = os.path.dirname(os.path.abspath(__file__))
PROGRAMS = os.path.join(HERE, "programs")
REPO = os.path.dirname(HERE)

# the helper modules that assert on a test's behalf report a failed assert as a test module does
pytest.register_assert_rewrite("hosts_helpers", "elastic_helpers")


QUICK_GUARD = os.path.join(HERE, "quick_guard")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--quick", action="store_true",
                     help="the quick tier: only the tests not marked slow (none starts a TensorFlow process; "
                          "one that does fails, naming itself)")
    parser.addoption("--cpu-log", default=None,
                     help="append one JSON line per test to this file: its CPU seconds, of this process and of the "
                          "processes it waited for (tests/cpu_profile.py; scripts/suite_cpu.py sums it up)")


_QUICK_LOG_POS = pytest.StashKey[int]()


def _quick_audit(event: str, args: tuple) -> None:
    """Under ``--quick``: a process started with an environment that does not carry the guard (an ``env=``
    dict not built from os.environ) or a Python started with -I, -E or -S (it ignores PYTHONPATH or site)
    is one the guard cannot see: recorded in the log as if it had imported TensorFlow."""
    if event != "subprocess.Popen":
        return
    _executable, argv, _cwd, env = args
    log = os.environ.get("PROCSV_TEST_QUICK_TF_LOG")
    argv = [argv] if isinstance(argv, (str, bytes)) else list(argv or [])
    flags = [a for a in argv[1:3] if isinstance(a, str) and a[:1] == "-" and a[:2] != "--" and set(a[1:]) & set("IES")]
    unguarded = env is not None and env.get("PROCSV_TEST_QUICK_TF_LOG") != log
    if log and (unguarded or (flags and "python" in os.path.basename(str(argv[0])))):
        with open(log, "a") as fh:
            fh.write(f"a process the guard cannot see (env without it, or -I/-E/-S): {argv[:6]}\n")


def _compile_packages() -> None:
    """Write the bytecode of procsv's own packages once, in the controller (an editable install compiles
    nothing, and with PYTHONDONTWRITEBYTECODE set, as on this project's machines, no process writes it
    either: every watchdog, service and zygote a test starts would compile the modules it imports from
    source, about 0.2 s of CPU a launch). A cache older than its source is rewritten here and ignored
    by Python anyway."""
    import compileall

    for package in ("procsv", "services", "ipc"):
        compileall.compile_dir(os.path.join(REPO, package), quiet=1)


# The pytest process's own cyclic collector runs on every 20,000 new objects, not 700: a worker's heap holds
# TensorFlow once a test imported it there (about 270,000 objects), and each full collection visited it all
# again, about 0.1 s each; 3.8 s of a worker's 16.5 s of CPU went to collections over four test files, 2.2
# of 14.8 this way. A test that needs a collection calls gc.collect() (as ever); the processes the tests start
# keep Python's default (a fork server's children: it starts fresh).
GC_THRESHOLD = (20_000, 10, 10)


def pytest_configure(config: pytest.Config) -> None:
    gc.set_threshold(*GC_THRESHOLD)
    if not hasattr(config, "workerinput"):  # the controller (or a run without xdist): once per run
        _compile_packages()
        tests = [pathlib.Path(p) for p in sorted(glob.glob(os.path.join(HERE, "test_*.py")))]
        rewrite_cache.prewrite(config, [pathlib.Path(HERE, "conftest.py"), *tests], min(os.cpu_count() or 1, 4))
        config.pluginmanager.register(yardstick, "yardstick")  # the machine's speed beside the run's CPU
    if config.getoption("--cpu-log"):
        import cpu_profile

        config.pluginmanager.register(cpu_profile, "cpu_profile")
    if not config.getoption("--quick"):
        return
    config.option.markexpr = f"({config.option.markexpr}) and not slow" if config.option.markexpr else "not slow"
    # every process a test starts (with this environment) loads quick_guard/sitecustomize.py, which
    # refuses TensorFlow and records who asked in this process's own log (one per xdist worker)
    os.environ["PROCSV_TEST_QUICK_TF_LOG"] = f"/tmp/procsv-quick-tf-{os.getpid()}.log"
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (QUICK_GUARD, os.environ.get("PYTHONPATH")) if p)
    # ... but not this one: a pytest-xdist worker inherited the guard from the controller; a test may
    # import TensorFlow in its own process (that starts no TensorFlow process)
    sys.meta_path[:] = [f for f in sys.meta_path if type(f).__name__ != "_NoTensorFlow"]
    sys.addaudithook(_quick_audit)  # (an audit hook cannot be removed: only under --quick)


@pytest.hookimpl(trylast=True)  # after the deselections (-m, -k, --quick): the slices are of what runs
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under xdist, each worker's share of the long tests first (:mod:`longest_first`); every worker
    orders the same collection the same way."""
    workers = int(getattr(config, "workerinput", {}).get("workercount", 1))
    if workers > 1:
        items[:] = longest_first.order([item.nodeid for item in items], items, workers, longest_first.load())


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: Optional[pytest.Item]) -> Iterator[None]:
    """Under ``--quick``: where the log was before the test's setup (its module- and session-scoped
    fixtures' setup included, which an autouse function-scoped fixture only sees the end of)."""
    log = os.environ.get("PROCSV_TEST_QUICK_TF_LOG") if item.config.getoption("--quick") else None
    if log:
        item.stash[_QUICK_LOG_POS] = os.path.getsize(log) if os.path.exists(log) else 0
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """A failed test that ran a launch in its ``logdir`` reports what the run left (:func:`run_at_failure`).
    Under ``--quick``: a test whose setup, call or teardown (any fixture's) started a TensorFlow
    process, or one the guard cannot see, fails at its teardown, naming it."""
    outcome = yield
    if call.when == "call" and call.excinfo is not None and isinstance(item, pytest.Function) \
            and isinstance(item.funcargs.get("logdir"), str):
        outcome.get_result().sections.append(("procsv run at the failure", run_at_failure(item.funcargs["logdir"])))
    if call.when != "teardown" or _QUICK_LOG_POS not in item.stash:
        return
    log, before = os.environ["PROCSV_TEST_QUICK_TF_LOG"], item.stash[_QUICK_LOG_POS]
    if os.path.exists(log) and os.path.getsize(log) > before:
        with open(log) as fh:
            fh.seek(before)
            rep = outcome.get_result()
            rep.outcome = "failed"
            rep.longrepr = f"this test of the quick tier started a TensorFlow process (or one the guard cannot see); mark it slow:\n{fh.read()}"


def run_at_failure(path: str, lines: int = 4) -> str:
    """What a failed test's run left, for CI's report (a flake seen once is diagnosed from it): the last
    lifecycle records and each log's last lines, each cut at 200 characters."""
    def tail(file: str, n: int) -> str:
        try:
            with open(file, errors="backslashreplace") as fh:
                return "".join(line[:200].rstrip("\n") + "\n" for line in fh.readlines()[-n:])
        except OSError as exc:
            return f"({exc})\n"

    logs = os.path.join(path, "logs")
    parts = [f"== lifecycle.jsonl (last {5 * lines})\n" + tail(os.path.join(logs, "lifecycle.jsonl"), 5 * lines)]
    for name in sorted(os.listdir(logs)) if os.path.isdir(logs) else []:
        if name.endswith(".log"):
            parts.append(f"== {name} (last {lines})\n" + tail(os.path.join(logs, name), lines))
    return "".join(parts)


def quick_guard_env() -> dict[str, str]:
    """The part of this process's environment the quick tier's guard needs (empty without --quick): for
    a test that starts a process with an environment of its own."""
    return {k: os.environ[k] for k in ("PYTHONPATH", "PROCSV_TEST_QUICK_TF_LOG") if k in os.environ}


def quiet_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update({"TF_CPP_MIN_LOG_LEVEL": "3", "TF_ENABLE_ONEDNN_OPTS": "0", "PYTHONUNBUFFERED": "1"})
    env.pop("PROCSV_LOGDIR", None)
    env.pop("PROCSV_RUNTIME_DIR", None)
    env.update(extra)
    return env


def wait_for(cond: Callable[[], Any], timeout: float, interval: float = 0.05, what: str = "condition") -> Any:
    """Poll ``cond`` until it returns something truthy; fail the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


def launch(logdir: str, *target_args: str, target: str = "procsv.examples.digits", opts: tuple[str, ...] = (),
           env: Optional[dict[str, str]] = None, cwd: Optional[str] = None,
           preexec_fn: Optional[Callable[[], None]] = None) -> subprocess.Popen:
    """``procsv launch TARGET --logdir LOGDIR OPTS -- TARGET_ARGS``, a real launch, forked from this
    process's fork server (``pyfork.popen_python``) with ``--fork-prewarm`` where that server can run it:
    TensorFlow is imported there, so the launch grows its first zygote from a fork of itself (``"via":
    "fork"``) instead of importing TensorFlow again, about 2.3 s of CPU. Else (``--quick``; an
    environment that differs in a variable read at TensorFlow's import; ``preexec_fn``) it is the
    command as a shell starts it."""
    env = env or quiet_env()
    forked = preexec_fn is None and pyfork.forks(["-m", "procsv"], env, cwd or REPO)
    argv = ["-m", "procsv", "launch", target, "--logdir", logdir, *(("--fork-prewarm",) if forked else ()), *opts]
    if target_args:
        argv += ["--", *target_args]
    return pyfork.popen_python(argv, imports_tf=False, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env=env, cwd=cwd or REPO, start_new_session=True, preexec_fn=preexec_fn)


def status_json(logdir: str) -> Optional[dict[str, Any]]:
    out = run_python(["-m", "procsv", "status", logdir, "--json"], env=quiet_env(), timeout=30)
    if out.returncode != 0:
        return None
    return json.loads(out.stdout)


def raw_status(logdir: str) -> Optional[dict[str, Any]]:
    try:
        with open(os.path.join(logdir, ".procsv", "status.json")) as fh:
            return json.load(fh)
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def role_pid(logdir: str, role: str) -> Optional[int]:
    st = raw_status(logdir)
    if not st:
        return None
    for p in st.get("processes", []):
        if p["role"] == role:
            return p["pid"]
    return None


def wait_role_pid(logdir: str, role: str, timeout: float = 30) -> int:
    """The pid ``status.json`` names for ``role``, waiting until it names one: the watchdog
    rewrites the file at most every 0.5 s, so a trainer forked a moment ago (one that already
    committed a checkpoint, under load) may not be in it yet."""
    pid: int = wait_for(lambda: role_pid(logdir, role), timeout, what=f"status.json to name the {role}'s pid")
    return pid


def runtime_dir(pid: int) -> str:
    """The run's runtime directory, from its checkpoint or summary service ``pid``: where the socket it
    bound is. (Not its ``/proc`` environment: a service grown from a seed, the launch's first, shows
    the launch's there: ``services/seed.py``.)"""
    for conn in psutil.Process(pid).net_connections(kind="unix"):
        if isinstance(conn.laddr, str) and os.path.basename(conn.laddr) in ("checkpoint.sock", "summary.sock"):
            return os.path.dirname(conn.laddr)
    raise AssertionError(f"pid {pid} has bound no service socket: {psutil.Process(pid).net_connections(kind='unix')}")


def committed_steps(logdir: str) -> list[int]:
    folder = os.path.join(logdir, ".procsv", "checkpoints")
    try:
        names = os.listdir(folder)
    except FileNotFoundError:
        return []
    return sorted(int(n[len("model.ckpt-"):-len(".json")]) for n in names
                  if n.startswith("model.ckpt-") and n.endswith(".json"))


def lifecycle(logdir: str) -> list[dict[str, Any]]:
    """Every whole record of the run's ``lifecycle.jsonl``. A last line without its newline is a
    write in progress (a read concurrent with a write may see part of it: the kernel copies a write
    page by page) and is left for the next read, as procsv's own readers do."""
    try:
        with open(os.path.join(logdir, "logs", "lifecycle.jsonl")) as fh:
            return [json.loads(line) for line in fh if line.strip() and line.endswith("\n")]
    except FileNotFoundError:
        return []


def run_processes(logdir: str) -> list[psutil.Process]:
    """Every live process that belongs to the run in ``logdir``: by its environment, its command line, or
    its stdout or stderr (a log under ``logdir``: a process forked from another, such as a zygote grown
    from a fork of a watchdog forked by the fork server, shows that one's ``/proc`` environment and
    command line, but writes its own log)."""
    logdir = os.path.abspath(logdir)
    found = []
    for proc in psutil.process_iter(["pid", "cmdline", "status"]):
        try:
            if proc.info["status"] == psutil.STATUS_ZOMBIE or proc.pid == os.getpid():
                continue
            cmdline = proc.info["cmdline"] or []
            env_logdir = proc.environ().get("PROCSV_LOGDIR")
        except (psutil.Error, OSError):
            continue
        if env_logdir == logdir or any(os.path.abspath(a) == logdir for a in cmdline if a.startswith(("/", "."))) \
                or _writes_under(proc.pid, logdir):
            found.append(proc)
    return found


def _writes_under(pid: int, folder: str) -> bool:
    """Whether ``pid``'s stdout or stderr is a file under ``folder``."""
    for fd in (1, 2):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith(folder + os.sep):
            return True
    return False


@pytest.fixture(scope="session", autouse=True)
def fork_servers() -> Iterator[None]:
    """This process's fork server of direct runs (``run_python``), if a test started one, ends with the
    session (in the teardown of its last test: ``--cpu-log`` counts the rest of its CPU there)."""
    yield
    pyfork.close()


@pytest.fixture
def fresh_train_api():
    """Each test is a new program for ``procsv.train``: no global step yet, every warning not yet given.
    (Test modules of that API use it for every test: ``pytestmark = pytest.mark.usefixtures(...)``.)"""
    from procsv.trainer import once
    from procsv.trainer.monitored import hooks as api

    api.set_global_step(None)
    once._warned.clear()
    yield
    api.set_global_step(None)


@pytest.fixture(autouse=True)
def procsv_environment_unchanged() -> Iterator[None]:
    """Every test leaves this process's ``PROCSV_*`` variables as it found them (set them with
    ``monkeypatch``): a test that calls code writing the environment for a later Supervisor of the same
    process (a standby's promotion) leaked its values into every launch this xdist worker started after
    it (``quiet_env`` copies the worker's environment): a run skipped a step it never met."""
    before = {k: v for k, v in os.environ.items() if k.startswith("PROCSV_")}
    yield
    after = {k: v for k, v in os.environ.items() if k.startswith("PROCSV_")}
    if after != before:
        for k in set(after) - set(before):
            del os.environ[k]
        os.environ.update(before)
        pytest.fail(f"the test changed this process's PROCSV_ variables (use monkeypatch): before {before}, after {after}")


def _op_determinism() -> bool:
    """Whether TensorFlow's op determinism is on in this process (False where TensorFlow is not imported)."""
    if "tensorflow" not in sys.modules:
        return False
    from tensorflow.python.framework import config as tf_config

    return bool(tf_config.is_op_determinism_enabled())


@pytest.fixture(autouse=True)
def op_determinism_unchanged(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test that turns TensorFlow's op determinism on in this process (an example's or a program's
    ``main`` run in-process) must turn it off again itself (as ``test_keras_fit_again``'s two fits do): it is
    process-wide, and every later test of this xdist worker that builds a random op without a seed failed (a
    one-shot iterator of a ``tf.compat.v1`` graph in ``test_graph_hooks_tf``, after the long tests' order
    changed). One that leaves it on fails at its teardown, here, naming itself; it is turned off again first,
    so the worker's later tests run as they would have."""
    before = _op_determinism()
    yield
    if not before and _op_determinism():
        from tensorflow.python.framework import config as tf_config

        tf_config.disable_op_determinism()
        pytest.fail(f"{request.node.nodeid} turned TensorFlow's op determinism on in the xdist worker and left it "
                    "on (turned off again here): turn it off again in the test, as test_keras_fit_again does",
                    pytrace=False)


@pytest.fixture
def logdir(tmp_path):
    """A fresh logdir; at teardown every process of the run is killed (and the test fails if any was left)."""
    path = str(tmp_path / "run")
    yield path
    leftovers = kill_leftovers(path)
    assert not leftovers, f"processes of the run were left behind: {leftovers}"


def kill_leftovers(path: str) -> list[int]:
    """SIGKILL every process of the run in ``path`` still alive; return their pids."""
    leftovers = run_processes(path)
    for proc in leftovers:
        try:
            proc.send_signal(signal.SIGKILL)
        except psutil.Error:
            pass
    return [p.pid for p in leftovers]


def finish(proc: subprocess.Popen, timeout: float = 180) -> tuple[int, str, str]:
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        seen = run_forensics(proc.args)  # before the kill: what the run's logs say it was doing
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise AssertionError(f"launch did not finish in {timeout} s\nstdout:\n{out}\nstderr:\n{err}\n{seen}")
    return proc.returncode, out, err


def run_forensics(argv: Any, records: int = 25, lines: int = 8) -> str:
    """For a launch that did not finish: the last ``records`` records of its logdir's lifecycle and the
    last ``lines`` lines of each log of its newest attempt per process, so that a hang seen once (in CI)
    says where the run stood; empty if ``argv`` names no logdir."""
    args = [str(a) for a in argv] if isinstance(argv, (list, tuple)) else []
    if "--logdir" not in args or args.index("--logdir") + 1 >= len(args):
        return ""
    logs = os.path.join(args[args.index("--logdir") + 1], "logs")
    parts: list[str] = []
    try:
        with open(os.path.join(logs, "lifecycle.jsonl")) as fh:
            parts.append("lifecycle (last records):\n" + "".join(fh.readlines()[-records:]))
    except OSError as e:
        parts.append(f"lifecycle: {e}")
    newest: dict[str, tuple[int, str]] = {}
    for name in os.listdir(logs) if os.path.isdir(logs) else []:
        bits = name.split(".")
        if name.endswith(".log") and len(bits) == 3 and bits[1].isdigit():
            if int(bits[1]) >= newest.get(bits[0], (-1, ""))[0]:
                newest[bits[0]] = (int(bits[1]), name)
    for _, name in sorted(newest.values(), key=lambda v: v[1]):
        try:
            with open(os.path.join(logs, name), errors="replace") as fh:
                parts.append(f"{name} (last lines):\n" + "".join(fh.readlines()[-lines:]))
        except OSError as e:
            parts.append(f"{name}: {e}")
    return "\n".join(parts)


@pytest.fixture
def short_tmp():
    """A temp folder with a short path (under /tmp): pytest's own can be too long for the Unix
    socket paths of a runtime directory placed in it (107 bytes), e.g. under pytest-xdist."""
    import tempfile

    path = tempfile.mkdtemp(prefix="pt-", dir="/tmp")
    yield path
    shutil.rmtree(path, ignore_errors=True)


def seed_example_restores(logdir: str, step: int) -> None:
    """For the seed examples (``procsv/examples/seeds/``): the newest checkpoint is
    ``model.ckpt-<step>``, plain TF restores every value of it, and its weights are those of an
    uninterrupted run of ``step`` steps."""
    import tensorflow as tf

    from procsv.examples.seeds.model import weights_after

    latest = tf.train.latest_checkpoint(logdir)
    assert latest == os.path.join(logdir, f"model.ckpt-{step}")
    w, b, gs = tf.Variable(0.0), tf.Variable(0.0), tf.Variable(0, dtype=tf.int64)
    tf.train.Checkpoint(w=w, b=b, global_step=gs).restore(latest).assert_consumed()
    assert int(gs.numpy()) == step
    assert (float(w.numpy()), float(b.numpy())) == pytest.approx(weights_after(step), rel=1e-5)


def final_weights(logdir: str, step: Optional[int] = None) -> dict[str, Any]:
    """Every variable of the newest checkpoint of a digits run (read with plain TF), but save_counter; with
    ``step``, of its checkpoint of that step (``model.ckpt-<step>``)."""
    import tensorflow as tf

    path = tf.train.latest_checkpoint(logdir) if step is None else os.path.join(logdir, f"model.ckpt-{step}")
    reader = tf.train.load_checkpoint(path)
    # model weights are saved once, under the optimizer's _trainable_variables; slots and step too
    return {k: reader.get_tensor(k) for k in sorted(reader.get_variable_to_shape_map())
            if "VARIABLE_VALUE" in k and not k.startswith("save_counter")}


# an uninterrupted digits run's arguments, and a killed one's compared with it. 600 steps at 6 ms: the seconds its
# killed runs' kills count in (a checkpoint, a ready standby, a Slurm requeue) as 1200 steps at 3 ms gave them
# before, in half the steps (each CPU of the trainer and both services: 1.5-2.5 CPU-s a run less)
CLEAN_ARGS = ("--steps", "600", "--save-model-secs", "1000", "--step-delay", "0.006")


@pytest.fixture(scope="session")
def clean_weights(shared_result: Callable[[str, Callable[[str], None]], str]) -> dict[str, Any]:
    """The final weights of an uninterrupted digits run of ``CLEAN_ARGS`` (the same whatever the
    checkpoint schedule), run once per test session (``shared_result``: every worker reads it)."""
    def produce(logdir: str) -> None:
        # (no sleep after each step: the same weights, ~0.4 CPU-s and 2 s sooner; the killed runs compared
        # with it keep CLEAN_ARGS' pace)
        # (no restart: no hot standby)
        code, out, err = finish(launch(logdir, *CLEAN_ARGS, "--step-delay", "0", opts=("--standby", "fork")))
        assert code == 0, err

    return final_weights(shared_result("clean-digits", produce))


def _finetune_keras(folder: str) -> None:
    """``tests/programs/keras_finetune.py`` (the fine-tuning tutorial) under Keras's own BackupAndRestore,
    uninterrupted: its weights ``keras.npz``, its stdout ``keras.stdout``, its exit code and stderr
    ``keras.code`` and ``keras.stderr``."""
    done = run_python([os.path.join(PROGRAMS, "keras_finetune.py"), "keras", os.path.join(folder, "keras.npz"),
                       "--backup", os.path.join(folder, "keras")], env=quiet_env(), timeout=120)
    for ext, text in (("code", str(done.returncode)), ("stdout", done.stdout), ("stderr", done.stderr)):
        with open(os.path.join(folder, f"keras.{ext}"), "w") as fh:
            fh.write(text)


@pytest.fixture
def finetune_keras(shared_result: Callable[[str, Callable[[str], None]], str]) -> tuple[Any, str]:
    """(its exit code, stdout and stderr as run_python's result, the folder of its keras.npz): the fine-tuning
    tutorial's uninterrupted run under Keras's own callback, made once per session for the three tests that
    compare with it (test_keras_fit_again's two, test_keras_extra's SIGKILL: each ran its own before; the
    same program, arguments and seeds)."""
    from types import SimpleNamespace

    folder = shared_result("keras-finetune-keras", _finetune_keras)

    def read(ext: str) -> str:
        with open(os.path.join(folder, f"keras.{ext}")) as fh:
            return fh.read()

    return SimpleNamespace(returncode=int(read("code")), stdout=read("stdout"), stderr=read("stderr")), folder


def launch_and_kill_trainer_once(logdir: str, *target_args: str, target: str, opts: tuple[str, ...] = (),
                                 env: Optional[dict[str, str]] = None, past: int = 0) -> tuple[int, str, str]:
    """Launch ``target``, SIGKILL its trainer once a checkpoint past step 0 committed (and the
    watchdog saw the trainer ``past`` steps beyond it), and wait for the launch to end; returns
    ``finish``'s (code, stdout, stderr)."""
    proc = launch(logdir, *target_args, target=target, opts=opts, env=env)
    try:
        newest = wait_for(lambda: [s for s in committed_steps(logdir) if s > 0], 120, what="a committed checkpoint")[-1]
        if past:
            wait_for(lambda: (raw_status(logdir) or {}).get("step", 0) >= newest + past, 60,
                     what=f"step {newest + past}")
        os.kill(wait_role_pid(logdir, "trainer"), signal.SIGKILL)
    finally:
        code, out, err = finish(proc)
    return code, out, err


def sigkill_where_it_says(proc: subprocess.Popen, logdir: str, kill_file: str, what: str,
                          timeout: float = 240) -> tuple[int, str, str]:
    """A launched program writes its pid to ``kill_file`` at the point a test wants it killed: SIGKILL
    it there (it must be the launch's trainer), then wait for the launch to end; returns ``finish``'s
    (code, stdout, stderr). A launch still running when anything fails is killed with its group."""
    try:
        pid = int(wait_for(lambda: os.path.exists(kill_file) and open(kill_file).read(), timeout, what=what))
        assert pid == wait_role_pid(logdir, "trainer")
        os.kill(pid, signal.SIGKILL)
        return finish(proc, 300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()


def restores(logdir: str) -> list[int]:
    """The steps of the run's ``restored`` lifecycle records, in order."""
    return [e["step"] for e in lifecycle(logdir) if e["event"] == "restored"]


def trainer_of_attempt(logdir: str, attempt: int) -> Optional[int]:
    """The pid of the running trainer of ``attempt``, from status.json, or None."""
    for p in (raw_status(logdir) or {}).get("processes", []):
        if p["role"] == "trainer" and p.get("attempt") == attempt and p["state"] == "running":
            return int(p["pid"])
    return None


def sigkill_attempts_after_their_commits(logdir: str, attempts: int, rng: Any, max_delay: float,
                                         timeout: float = 120) -> list[int]:
    """SIGKILL trainer attempts 1..``attempts``, each at a random moment (up to ``max_delay`` s) after
    its first commit past step 0; returns the step each kill landed at (as far as the test can
    tell: status.json's step, or the newest commit when status.json lags it). An attempt after the
    first is killed only after its own restore and a commit past it: the killed attempt's snapshot
    in flight can still commit after the kill, and that commit is not one by the next attempt."""
    killed_at: list[int] = []
    last = 0
    for attempt in range(1, attempts + 1):
        if attempt > 1:
            mine = wait_for(lambda: restores(logdir)[attempt - 2:], timeout, what=f"trainer attempt {attempt}'s restore")
            last = max(last, mine[0])
        wait_for(lambda: committed_steps(logdir) and committed_steps(logdir)[-1] > last, timeout,
                 what=f"a commit by trainer attempt {attempt}")
        time.sleep(rng.uniform(0.0, max_delay))
        pid = wait_for(lambda: trainer_of_attempt(logdir, attempt), timeout, what=f"trainer attempt {attempt}")
        newest = committed_steps(logdir)[-1]
        killed_at.append(max((raw_status(logdir) or {}).get("step") or 0, newest))
        os.kill(pid, signal.SIGKILL)
        last = committed_steps(logdir)[-1]
    return killed_at


def case_results(folder: str, sides: tuple[tuple[str, list[str]], ...]) -> dict[str, dict[str, Any]]:
    """What ``tests/programs/tf1_cases.py`` printed for each side, read from ``<folder>/<side>.stdout``:
    side -> case -> its result (each ``result NAME JSON`` line); fails unless each side has exactly
    its ``names``."""
    found: dict[str, dict[str, Any]] = {}
    for side, names in sides:
        with open(os.path.join(folder, f"{side}.stdout")) as fh:
            stdout = fh.read()
        found[side] = {}
        for line in stdout.splitlines():
            if line.startswith("result "):
                name, _, value = line[len("result "):].partition(" ")
                found[side][name] = json.loads(value)
        assert sorted(found[side]) == sorted(names), stdout
    return found


@pytest.fixture(scope="session")
def shared_result(tmp_path_factory, worker_id):
    """shared_result(name, produce): the folder ``produce(folder)`` filled, made once per test
    session for every pytest-xdist worker (the first to ask makes it under an flock while the
    others wait for it). For expensive runs that several tests only read or copy: a run that
    failed is not kept, so the next test that needs it runs it again and fails the same way."""
    root = tmp_path_factory.getbasetemp()
    if worker_id != "master":
        root = root.parent  # pytest-xdist: the session's folder, above every worker's own
    root = root / "shared"
    root.mkdir(exist_ok=True)

    def get(name: str, produce: Callable[[str], None]) -> str:
        folder = root / name
        with open(root / f"{name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not (root / f"{name}.done").exists():
                shutil.rmtree(folder, ignore_errors=True)
                folder.mkdir()
                produce(str(folder))
                (root / f"{name}.done").touch()
        return str(folder)

    return get


def _installed(name: str) -> bool:
    try:
        importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def _install_plot_extra(target: str) -> None:
    wanted, done = ["matplotlib>=3.7"], set()
    while wanted:
        req = Requirement(wanted.pop())
        if req.name.lower() in done or (req.name != "matplotlib" and _installed(req.name)):
            continue
        done.add(req.name.lower())
        got = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", target, str(req)],
                             capture_output=True, text=True, timeout=600)
        if got.returncode != 0:
            pytest.fail(f"cannot install {req} from the package index for the plot test: {got.stderr.strip()[-500:]}")
        name = req.name.replace("-", "_").lower()
        meta = [m for m in glob.glob(os.path.join(target, "*.dist-info", "METADATA"))
                if os.path.basename(os.path.dirname(m)).lower().startswith(name + "-")]
        with open(meta[0]) as fh:
            for line in Parser().parse(fh).get_all("Requires-Dist") or []:
                dep = Requirement(line)
                if dep.marker is None or dep.marker.evaluate({"extra": ""}):
                    wanted.append(str(dep))


@pytest.fixture(scope="session")
def matplotlib_dir(shared_result: Callable[[str, Callable[[str], None]], str]) -> str:
    """A folder (for ``PYTHONPATH``) holding the ``plot`` extra's matplotlib and those of its
    dependencies this environment lacks (not a second NumPy or Pillow), from the package index,
    installed once per session. matplotlib is not in the test environment: TensorFlow's import loads
    Keras, which imports ``matplotlib.pyplot`` whenever it can, and with it installed every TensorFlow
    process the suite starts paid for that import too (0.5 s of CPU or more each)."""
    return shared_result("plot-extra", _install_plot_extra)


@contextlib.contextmanager
def ready_zygote(tmp_path):  # type: ignore[no-untyped-def]
    """A real zygote made by this process (TensorFlow imported, ready; it copies this process's
    stderr as it is now), with a layout and a runtime directory; SIGKILLed and reaped at the end."""
    from procsv.common.layout import Layout, RuntimeDir, release_runtime_dir
    from procsv.watchdog.prewarm import Zygote, zygote_env

    lay = Layout(str(tmp_path / "run"))
    lay.create()
    runtime = RuntimeDir.create()
    z = Zygote(zygote_env(lay.logdir, runtime.path), str(tmp_path / "zygote.log"), str(tmp_path))
    try:
        def ready() -> bool:
            z.reader.wait(0.2)
            z.pump()
            assert z.alive(), (tmp_path / "zygote.log").read_text()
            return z.ready

        wait_for(ready, 120, what="the zygote to import TensorFlow")
        yield z, lay, runtime.path
    finally:
        z.close(10)
        release_runtime_dir(runtime.path)


@contextlib.contextmanager
def on_one_core():  # type: ignore[no-untyped-def]
    """While open, this process runs on one of its cores only (the last it may use), so every child
    it starts meanwhile (and each of theirs) inherits that one core; on leaving, this process gets
    its cores back (its children keep the one). For tests that load the machine on purpose: a CPU
    burner and the run it slows share one core, and the suite's other workers keep the other. One
    burner there leaves the run's processes (two busy ones: a share of 1/3 core each) less CPU
    than two burners over two cores did (1/2 core each), and burns half the CPU."""
    mine = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {max(mine)})
    try:
        yield
    finally:
        os.sched_setaffinity(0, mine)


def burners(n: int = 1) -> list[subprocess.Popen]:
    """``n`` CPU-bound processes (load): start them inside ``on_one_core()``; the caller kills them."""
    return [subprocess.Popen([sys.executable, "-c", "while 1: pass"]) for _ in range(n)]


@contextlib.contextmanager
def cpu_burners_beside() -> Iterator[None]:
    """Two CPU-bound processes beside the run under procsv (the machine has two cores), unpinned,
    killed when the block ends (a test's plain reference runs run without them)."""
    procs = burners(2)
    try:
        yield
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def skipped_steps(logdir: str) -> list[int]:
    """The steps a launch skipped, as its ``logs/report.json`` says (``skipped_steps``)."""
    with open(os.path.join(logdir, "logs", "report.json")) as fh:
        return list(json.load(fh).get("skipped_steps") or [])


def proc_children(pid: int) -> list[int]:
    """The pids of ``pid``'s children, from /proc (every thread's list)."""
    out: list[int] = []
    for tid in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{tid}/children") as fh:
            out += [int(p) for p in fh.read().split()]
    return out

