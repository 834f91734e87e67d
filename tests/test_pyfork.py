"""The tests' fork server of direct runs (tests/pyfork.py, tests/pyfork_server.py): a forked run is what
``python ARGV`` would be (exit code, signal, traceback, argv, sys.path, cwd, environment, output, atexit,
threads), a timeout kills it, and a run it cannot make faithfully starts afresh.

The quick ones use a server that imports nothing (no TensorFlow process); the one with TensorFlow is slow."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from typing import Iterator

import psutil
import pytest

import pyfork
from conftest import quiet_env


@pytest.fixture(scope="module")
def server() -> Iterator[pyfork.ForkServer]:
    """A fork server that imports nothing (the mechanism, without TensorFlow's import)."""
    srv = pyfork.ForkServer(dict(os.environ), preload=())
    yield srv
    srv.close()


def _run(server: pyfork.ForkServer, argv: list[str], env: dict[str, str] | None = None, cwd: str = "/",
         timeout: float = 60) -> pyfork.ForkedRun:
    return server.run(argv, dict(os.environ) if env is None else env, cwd, timeout, True, True)


def _program(tmp_path, text: str) -> str:  # type: ignore[no-untyped-def]
    path = tmp_path / "prog.py"
    path.write_text(textwrap.dedent(text))
    return str(path)


def test_a_forked_run_exits_with_the_programs_code_and_its_output_is_captured(server, tmp_path):
    prog = _program(tmp_path, """
        import sys
        print("out")
        print("err", file=sys.stderr)
        sys.exit(3)
    """)
    done = _run(server, [prog])
    assert done.forked and (done.returncode, done.stdout, done.stderr) == (3, "out\n", "err\n")
    assert _run(server, ["-c", "pass"]).returncode == 0
    said = _run(server, ["-c", "import sys; sys.exit('a message')"])
    assert (said.returncode, said.stderr) == (1, "a message\n")


def test_an_uncaught_exception_exits_1_with_the_programs_traceback_only(server, tmp_path):
    prog = _program(tmp_path, """
        def f():
            raise ValueError("boom")
        f()
    """)
    done = _run(server, [prog])
    assert done.returncode == 1
    assert done.stderr.splitlines() == ["Traceback (most recent call last):",
                                        f'  File "{prog}", line 4, in <module>', "    f()",
                                        f'  File "{prog}", line 3, in f', '    raise ValueError("boom")',
                                        "ValueError: boom"]
    fresh = subprocess.run([sys.executable, prog], capture_output=True, text=True, timeout=60)
    assert (fresh.returncode, fresh.stderr) == (done.returncode, done.stderr)


def test_a_run_killed_by_a_signal_returns_minus_the_signal(server):
    done = _run(server, ["-c", "import os, signal; os.kill(os.getpid(), signal.SIGTERM)"])
    assert done.returncode == -signal.SIGTERM


def test_argv_sys_path_cwd_and_the_environment_are_the_runs_own(server, tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "helper_mod_for_pyfork.py").write_text("WHERE = 'beside the program'\n")
    prog = str(tmp_path / "sub" / "prog.py")
    with open(prog, "w") as fh:
        fh.write(textwrap.dedent("""
            import json, os, sys
            import helper_mod_for_pyfork
            print(json.dumps({"argv": sys.argv, "path0": sys.path[0], "cwd": os.getcwd(), "name": __name__,
                              "file": __file__, "mine": os.environ.get("PYFORK_MINE"),
                              "server": os.environ.get("PYFORK_SERVER_ONLY"), "where": helper_mod_for_pyfork.WHERE,
                              "main": sys.modules["__main__"].__dict__ is globals()}))
        """))
    env = dict(os.environ, PYFORK_MINE="yes")
    env.pop("PYFORK_SERVER_ONLY", None)
    done = _run(server, ["sub/prog.py", "a", "b c"], env=env, cwd=str(tmp_path))
    fresh = subprocess.run([sys.executable, "sub/prog.py", "a", "b c"], env=env, cwd=str(tmp_path),
                           capture_output=True, text=True, timeout=60)
    assert done.returncode == fresh.returncode == 0, done.stderr + fresh.stderr
    assert done.stdout == fresh.stdout
    import json

    got = json.loads(done.stdout)
    assert got == {"argv": ["sub/prog.py", "a", "b c"], "path0": str(tmp_path / "sub"), "cwd": str(tmp_path),
                   "name": "__main__", "file": prog, "mine": "yes", "server": None, "where": "beside the program",
                   "main": True}


def test_dash_c_and_dash_m_runs_are_as_the_interpreters(server, tmp_path):
    (tmp_path / "pyfork_m_target.py").write_text("import sys\nprint(__name__, sys.argv)\n")
    code = "import os, sys; print(sys.argv, repr(sys.path[0]), os.getcwd())"
    for argv in (["-c", code, "x"], ["-m", "pyfork_m_target", "y"]):
        done = _run(server, argv, cwd=str(tmp_path))
        fresh = subprocess.run([sys.executable, *argv], cwd=str(tmp_path), capture_output=True, text=True, timeout=60)
        assert (done.returncode, done.stdout, done.stderr) == (fresh.returncode, fresh.stdout, fresh.stderr)


def test_atexit_handlers_run_and_threads_are_joined_before_the_run_ends(server):
    code = ("import atexit, threading, time\n"
            "atexit.register(lambda: print('atexit'))\n"
            "threading.Thread(target=lambda: (time.sleep(0.2), print('thread'))).start()\n"
            "print('main')")
    done = _run(server, ["-c", code])
    assert (done.returncode, done.stdout) == (0, "main\nthread\natexit\n")


def test_a_run_without_teardown_ends_as_the_interpreter_does_up_to_the_flush_of_its_streams(server):
    """``teardown=False`` (a ``python -m procsv ...`` run's default): the exit status and a ``SystemExit``'s
    message, the threads joined, the ``atexit`` handlers and the streams' flush as in a fresh process,
    then nothing of the modules' teardown (a finalizer there never runs)."""
    code = ("import atexit, sys, threading, time\n"
            "class Late:\n"
            "    def __del__(self):\n"
            "        print('teardown')\n"
            "late = Late()\n"
            "atexit.register(lambda: print('atexit'))\n"
            "threading.Thread(target=lambda: (time.sleep(0.2), print('thread'))).start()\n"
            "sys.stdout.write('main ')\n"  # no newline: still in the pipe's buffer at the end
            "sys.exit('bye')")
    fresh = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert (fresh.returncode, fresh.stdout, fresh.stderr) == (1, "main thread\natexit\nteardown\n", "bye\n")
    done = _run(server, ["-c", code])
    assert (done.returncode, done.stdout, done.stderr) == (fresh.returncode, fresh.stdout, fresh.stderr)
    cut = server.run(["-c", code], dict(os.environ), "/", 60, True, True, teardown=False)
    assert (cut.returncode, cut.stdout, cut.stderr) == (1, "main thread\natexit\n", "bye\n")
    assert server.run(["-c", "raise SystemExit(3)"], dict(os.environ), "/", 60, True, True, teardown=False).returncode == 3


def test_the_run_is_a_process_of_its_own_and_a_timeout_kills_it(server, tmp_path):
    pid_file = tmp_path / "pid"
    code = f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); print('hi', flush=True); time.sleep(60)"
    with pytest.raises(subprocess.TimeoutExpired) as got:
        _run(server, ["-c", code], timeout=2)
    assert got.value.output == "hi\n"
    pid = int(pid_file.read_text())
    assert pid not in (os.getpid(), server.proc.pid)
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    done = _run(server, ["-c", "import os; print(os.getpid(), os.getppid())"])
    assert done.stdout.split() == [str(done.pid), str(server.proc.pid)]


def test_an_environment_that_differs_in_an_import_time_variable_starts_afresh(server, monkeypatch):
    monkeypatch.setattr(pyfork, "_servers", [server])
    monkeypatch.setattr(pyfork, "MAX_SERVERS", 1)  # (no room for a server of its own: the next test)
    monkeypatch.delenv("PROCSV_TEST_QUICK_TF_LOG", raising=False)  # (the quick tier's runs all start afresh)
    code = "import os; print(os.environ.get('TF_CPP_MIN_LOG_LEVEL'), os.environ.get('PROCSV_X'))"
    base = dict(os.environ)
    same = pyfork.run_python(["-c", code], env=dict(base, PROCSV_X="1"), timeout=60)
    assert same.forked and same.stdout == f"{base.get('TF_CPP_MIN_LOG_LEVEL')} 1\n"
    for name in ("TF_CPP_MIN_LOG_LEVEL", "CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS", "KMP_AFFINITY", "PYTHONHASHSEED"):
        other = dict(base, **{name: "7"}) if base.get(name) != "7" else dict(base, **{name: "8"})
        done = pyfork.run_python(["-c", code], env=other, timeout=60)
        assert not done.forked and done.returncode == 0, name
    assert not pyfork.run_python(["-X", "dev", "-c", "pass"], timeout=60).forked  # an interpreter option
    assert not pyfork.run_python(["/no/such/program.py"], timeout=60).forked  # the interpreter's own refusal
    # TF_CONFIG is read when a strategy or cluster resolver is made, not at the import: a fork takes it on
    tf_config = pyfork.run_python(["-c", "import os; print(os.environ['TF_CONFIG'])"],
                                  env=dict(base, TF_CONFIG='{"task": {"type": "worker", "index": 1}}'), timeout=60)
    assert tf_config.forked and tf_config.stdout == '{"task": {"type": "worker", "index": 1}}\n'


def test_a_second_import_time_environment_gets_a_server_of_its_own_and_a_third_starts_afresh(server, monkeypatch):
    """Before, a process's first run decided its one server's environment: a worker whose first run set a ``TF_``
    variable started every later ordinary run afresh. Each server is still only ever asked for runs of its own
    import-time environment."""
    monkeypatch.setattr(pyfork, "_servers", [server])
    monkeypatch.setattr(pyfork, "PRELOAD", ())  # (the mechanism, without TensorFlow's import)
    monkeypatch.delenv("PROCSV_TEST_QUICK_TF_LOG", raising=False)
    code = "import os; print(os.environ.get('TF_CPP_MIN_LOG_LEVEL'), os.getppid())"
    base = dict(os.environ)
    level = "7" if base.get("TF_CPP_MIN_LOG_LEVEL") != "7" else "8"
    other = pyfork.run_python(["-c", code], env=dict(base, TF_CPP_MIN_LOG_LEVEL=level), timeout=60)
    try:
        assert len(pyfork._servers) == 2 and pyfork._servers[0] is server
        second = pyfork._servers[1]
        assert other.forked and other.stdout == f"{level} {second.proc.pid}\n"
        assert pyfork.import_time_env(second.env) == pyfork.import_time_env(dict(base, TF_CPP_MIN_LOG_LEVEL=level))
        plain = pyfork.run_python(["-c", code], env=base, timeout=60)  # the first environment: the first server
        assert plain.forked and plain.stdout == f"{base.get('TF_CPP_MIN_LOG_LEVEL')} {server.proc.pid}\n"
        third = pyfork.run_python(["-c", code], env=dict(base, OMP_NUM_THREADS="3"), timeout=60)
        assert not third.forked and third.returncode == 0 and len(pyfork._servers) == 2
    finally:
        if len(pyfork._servers) > 1:
            pyfork._servers[1].close()


def test_a_forked_runs_cpu_is_reported(server):
    before = server.reported
    _run(server, ["-c", "x = 0\nfor i in range(3_000_000): x += i"])
    assert server.reported - before > 0.05


@pytest.mark.slow
def test_a_fork_of_the_tensorflow_server_trains_as_a_fresh_process_does(tmp_path, monkeypatch):
    """The suite's server (TensorFlow imported, no op run): a forked program runs ops, eager and in a
    graph, and prints what the same program prints as a fresh process."""
    code = textwrap.dedent("""
        import sys
        import tensorflow as tf
        tf.random.set_seed(1)
        v = tf.Variable(tf.random.normal([4]))
        opt = tf.keras.optimizers.SGD(0.1)
        for _ in range(3):
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(v * v)
            opt.apply_gradients([(tape.gradient(loss, v), v)])
        print(v.numpy().tobytes().hex())
        with tf.Graph().as_default():
            with tf.compat.v1.Session() as sess:
                print(sess.run(tf.constant(2.0) * 3.0))
    """)
    monkeypatch.setattr(pyfork, "_servers", [])
    done = pyfork.run_python(["-c", code], env=quiet_env(), timeout=300)
    try:
        assert done.forked, "the TensorFlow server made no run"
        again = pyfork.run_python(["-c", code], env=quiet_env(), timeout=300)
        fresh = subprocess.run([sys.executable, "-c", code], env=quiet_env(), capture_output=True, text=True,
                               timeout=300)
        assert done.returncode == again.returncode == fresh.returncode == 0, done.stderr + fresh.stderr
        assert done.stdout == again.stdout == fresh.stdout
        # a procsv command imports no TensorFlow: its fork's stderr is a fresh command's, without what the
        # server's import wrote (which a forked TensorFlow program's begins with, as a fresh one's does)
        command = ["-m", "procsv", "status", str(tmp_path / "no-run")]
        forked = pyfork.run_python(command, env=quiet_env(), timeout=60)
        alone = subprocess.run([sys.executable, *command], env=quiet_env(), capture_output=True, text=True, timeout=60)
        assert forked.forked and alone.returncode == 2 and alone.stderr.startswith("procsv: ")
        assert (forked.returncode, forked.stdout, forked.stderr) == (alone.returncode, alone.stdout, alone.stderr)
    finally:
        pyfork.close()


def test_the_run_has_the_callers_cpu_affinity_and_umask(server):
    from conftest import on_one_core

    code = "import os; print(sorted(os.sched_getaffinity(0)), oct(os.umask(0)))"
    old = os.umask(0o027)
    try:
        with on_one_core():
            done = _run(server, ["-c", code])
            fresh = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    finally:
        os.umask(old)
    assert done.stdout == fresh.stdout
    assert done.stdout == f"[{max(os.sched_getaffinity(0))}] 0o27\n"


def test_a_run_started_in_the_background_gives_its_result_or_is_killed(server, monkeypatch):
    monkeypatch.setattr(pyfork, "_servers", [server])
    monkeypatch.delenv("PROCSV_TEST_QUICK_TF_LOG", raising=False)
    done = pyfork.start_python(["-c", "import sys; print('bg'); sys.exit(5)"]).result(60)
    assert done.forked and (done.returncode, done.stdout) == (5, "bg\n")
    slow = pyfork.start_python(["-c", "import time; print('up', flush=True); time.sleep(60)"])
    slow.kill()
    assert slow.result(60).returncode == -signal.SIGKILL
    with pytest.raises(AssertionError, match="did not finish in 0.5 s"):
        pyfork.start_python(["-c", "import time; time.sleep(60)"]).result(0.5)


def test_a_server_that_died_is_replaced(monkeypatch):
    monkeypatch.delenv("PROCSV_TEST_QUICK_TF_LOG", raising=False)
    dead = pyfork.ForkServer(dict(os.environ), preload=())
    monkeypatch.setattr(pyfork, "_servers", [dead])
    monkeypatch.setattr(pyfork, "PRELOAD", ())
    dead.proc.kill()
    dead.proc.wait()
    try:
        done = pyfork.run_python(["-c", "print('again')"], timeout=60)
        assert done.forked and done.stdout == "again\n" and pyfork._servers and pyfork._servers[0] is not dead
    finally:
        pyfork.close()


def test_the_servers_sockets_never_close_a_descriptor_the_program_opened_under_their_numbers(server):
    """The server's socket objects, copied into the child, are closed as objects there: closed by number
    only, each closed its number again once collected (after the program, before its atexit handlers),
    by then one of the program's (a ZeroMQ signaler's: ``Assertion failed: pfd.revents & POLLIN``)."""
    code = ("import atexit, os\n"
            "fds = [os.open(os.devnull, os.O_RDONLY) for _ in range(8)]\n"
            "atexit.register(lambda: [os.fstat(fd) for fd in fds] and print('all open'))")
    done = _run(server, ["-c", code])
    assert (done.returncode, done.stdout, done.stderr) == (0, "all open\n", "")
