"""One typed configuration per child, and one precedence rule (issue 66).

A child reads every ``PROCSV_*`` variable once, in :mod:`procsv.common.bootstrap` (its
:class:`~procsv.common.bootstrap.ChildConfig`), and hands the record on; no other module reads one.
Every setting that is both a program's argument and a ``procsv launch`` flag follows
:func:`~procsv.common.bootstrap.resolve`: the program's explicit argument, else the launch's value,
else the default. One test per such setting (``allow_reinit``'s is in ``test_restore_faults.py``).
"""

from __future__ import annotations

import ast
import os
from typing import Any, Optional

import pytest

from procsv.common import env
from procsv.common.bootstrap import ChildConfig, ChildContext, GroupConfig, LaunchSettings, Place, Resume, resolve

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_the_rule_is_the_argument_else_the_launch_else_the_default() -> None:
    assert resolve(5, 3, 7) == 5
    assert resolve(None, 3, 7) == 3
    assert resolve(None, None, 7) == 7
    assert resolve(0, 3, 7) == 0 and resolve(False, True, True) is False  # a falsy argument is still said


def test_the_record_holds_every_variable_a_child_is_given_typed() -> None:
    cfg = ChildConfig.parse({
        env.LOGDIR: "/runs/x", env.RUNTIME_DIR: "/run/p", env.ROLE: "worker1", env.ATTEMPT: "3", env.WATCHDOG: "1",
        env.PARENT_PID: "10", env.SUPERVISOR_PID: "11", env.DEATH_MUTEX: "/run/p/m", env.ZYGOTE_FDS: "3,4,5",
        env.PRELOAD: "numpy,,pandas", env.PREEMPT_SIGNAL: "12", env.RANK: "1", env.NPROC: "4", env.GROUP_HOSTS: "2",
        env.PS: "0", env.GROUP_PIN: "/runs/x/pin", env.GROUP_SNAPSHOT_STEPS: "50", env.GROUP_REMOTE: "1",
        env.GROUP_PEER_BIND: "10.0.0.1", env.GROUP_PEER_MAX_BYTES: "4096", env.STANDBY: "1", env.SHADOW_RUN: "0",
        env.SHADOW_MEMORY: "1000", env.SKIP_STEPS: "70,40", env.ROLLBACK_BEFORE: "70", env.LAUNCH_START_STEP: "12",
        env.CHECKPOINT_FAILURE_LIMIT: "0", env.ALLOW_REINIT: "1", env.ON_NONFINITE: "stop", env.ON_SPIKE: "off",
        env.MAX_SKIPS: "2",
        env.SKIP_WINDOW: "100", env.SAVE_DEADLINE: "6", env.SUMMARY_DEADLINE: "2", env.SUMMARY_CONTINUE: "tag",
        env.CHECKPOINT_NICE: "5", env.MEMORY_SNAPSHOTS: "0", env.NONFINITE_CHECK: "off", env.GRAPH_FAST_RUN: "0"})
    assert (cfg.logdir, cfg.runtime_dir, cfg.role, cfg.attempt, cfg.supervised) == ("/runs/x", "/run/p", "worker1", 3, True)
    assert (cfg.parent_pid, cfg.supervisor_pid, cfg.death_mutex) == (10, 11, "/run/p/m")
    assert cfg.zygote.preload == ("numpy", "pandas") and cfg.zygote.fds == "3,4,5" and cfg.preempt_signal == 12
    assert cfg.place == Place(rank=1, nproc=4, hosts=2, ps=0) and cfg.in_group
    assert cfg.group == GroupConfig(pin="/runs/x/pin", snapshot_steps="50", remote=True, peer_bind="10.0.0.1",
                                    peer_max_bytes="4096")
    assert (cfg.standby, cfg.shadow_run, cfg.shadow_memory) == (True, False, "1000")
    assert cfg.resume == Resume(skip_steps=(40, 70), rollback_before=70, launch_start_step=12)
    assert cfg.launch == LaunchSettings(checkpoint_failure_limit=0, allow_reinit=True, on_nonfinite="stop",
                                        on_spike="off", max_skips=2,
                                        skip_window=100, save_deadline=6.0, summary_deadline=2.0,
                                        summary_continue="tag", checkpoint_nice="5", memory_snapshots="0",
                                        nonfinite_check=False, graph_fast_run=False)
    ctx = ChildContext.from_config(cfg)
    assert ctx is not None and ctx.config is cfg and (ctx.rank, ctx.nproc, ctx.attempt) == (1, 4, 3)


def test_a_setting_the_launch_left_unset_is_none_so_the_program_or_the_default_decides() -> None:
    cfg = ChildConfig.parse({})
    assert cfg == ChildConfig() and ChildContext.from_config(cfg) is None  # plain python: no run
    assert cfg.launch == LaunchSettings() and cfg.launch.checkpoint_failure_limit is None
    assert (cfg.launch.allow_reinit, cfg.launch.on_nonfinite, cfg.launch.save_deadline) == (None, None, None)
    assert ChildConfig.parse({env.ALLOW_REINIT: "0"}).launch.allow_reinit is False  # the launch said: no
    assert ChildConfig.parse({env.ROLLBACK_BEFORE: ""}) == ChildConfig()  # said: this attempt is no rollback
    assert ChildConfig.parse({env.ROLLBACK_BEFORE: "x"}) == ChildConfig()  # not a step: as if unset
    assert ChildConfig.parse({env.LAUNCH_START_STEP: "-3"}) == ChildConfig()


def test_a_number_that_is_none_names_its_variable() -> None:
    with pytest.raises(ValueError, match="PROCSV_SAVE_DEADLINE='soon': not a number"):
        ChildConfig.parse({env.SAVE_DEADLINE: "soon"})
    with pytest.raises(ValueError, match="PROCSV_CHECKPOINT_FAILURE_LIMIT='3.5': not a whole number"):
        ChildConfig.parse({env.CHECKPOINT_FAILURE_LIMIT: "3.5"})


def test_a_promoted_standby_is_no_standby_and_takes_its_promotions_steps_and_bound() -> None:
    forked = ChildConfig.parse({env.STANDBY: "1", env.SKIP_STEPS: "40", env.ROLLBACK_BEFORE: "30"})
    assert forked.promoted(Resume((40, 70), None, 5)) == ChildConfig(resume=Resume((40, 70), None, 5))
    assert forked.promoted(Resume((), 90)) == ChildConfig(resume=Resume(rollback_before=90))


def _plain_supervisor(monkeypatch: pytest.MonkeyPatch, tmp_path: Any, launch: dict[str, str], **kw: Any) -> Any:
    """A Supervisor in plain python whose environment holds ``launch`` (what ``procsv launch`` gives a trainer)."""
    import tensorflow as tf

    import procsv

    for name in env.ALL:
        monkeypatch.delenv(name, raising=False)
    for name, value in launch.items():
        monkeypatch.setenv(name, value)
    return procsv.Supervisor(logdir=str(tmp_path / "run"), checkpoint={"w": tf.Variable([1.0])}, **kw)


@pytest.mark.parametrize("arg,launch,expected", [(None, None, 3), (None, "0", 0), (None, "3", 3), (5, None, 5),
                                                 (5, "3", 5), (5, "0", 5), (0, "3", 0)])
def test_checkpoint_failure_limit_is_the_programs_else_the_launchs(monkeypatch: pytest.MonkeyPatch, tmp_path: Any,
                                                                   arg: Optional[int], launch: Optional[str],
                                                                   expected: int) -> None:
    # before: the launch's always won, so under procsv launch (which always says 3, or 0 with
    # --on-checkpoint-failure continue) a program's checkpoint_failure_limit=5 was silently 3
    given = {} if arg is None else {"checkpoint_failure_limit": arg}
    sv = _plain_supervisor(monkeypatch, tmp_path, {} if launch is None else {env.CHECKPOINT_FAILURE_LIMIT: launch},
                           **given)
    assert sv._keeper.agent.commits.failure_limit == expected


@pytest.mark.parametrize("arg,launch,expected", [(None, None, "rollback"), (None, "stop", "stop"),
                                                 ("continue", None, "continue"), ("continue", "stop", "continue"),
                                                 ("rollback", "continue", "rollback")])
def test_on_nonfinite_is_the_programs_else_the_launchs(monkeypatch: pytest.MonkeyPatch, tmp_path: Any,
                                                       arg: Optional[str], launch: Optional[str], expected: str) -> None:
    sv = _plain_supervisor(monkeypatch, tmp_path, {} if launch is None else {env.ON_NONFINITE: launch},
                           on_nonfinite=arg)
    assert sv._rollback.watch.policy.value == expected


@pytest.mark.parametrize("arg,launch,expected", [(None, None, "warn"), (None, "rollback", "rollback"),
                                                 ("off", None, "off"), ("stop", "rollback", "stop"),
                                                 ("warn", "off", "warn")])
def test_on_spike_is_the_programs_else_the_launchs(monkeypatch: pytest.MonkeyPatch, tmp_path: Any,
                                                   arg: Optional[str], launch: Optional[str], expected: str) -> None:
    sv = _plain_supervisor(monkeypatch, tmp_path, {} if launch is None else {env.ON_SPIKE: launch}, on_spike=arg)
    assert sv._rollback.watch.spike_policy.value == expected
    assert (sv._rollback.watch.spikes is None) == (expected == "off")  # off: no history, no value read for it


def test_the_launchs_other_settings_reach_the_supervisors_collaborators(monkeypatch: pytest.MonkeyPatch,
                                                                        tmp_path: Any) -> None:
    # flags with no program argument: the launch's value, else the default
    sv = _plain_supervisor(monkeypatch, tmp_path, {env.MAX_SKIPS: "7", env.SKIP_WINDOW: "70", env.SAVE_DEADLINE: "6",
                                                   env.SUMMARY_DEADLINE: "2", env.NONFINITE_CHECK: "0"})
    watch = sv._rollback.watch
    assert (watch.budget.max_skips, watch.budget.skip_window) == (7, 70)
    assert sv._keeper.agent.commits.deadline_floor == 6.0 and sv._summaries._deadline == 2.0
    assert not sv._rollback.detecting
    sv = _plain_supervisor(monkeypatch, tmp_path, {})
    assert sv._keeper.agent.commits.deadline_floor == 30.0 and sv._summaries._deadline == 30.0
    assert sv._rollback.detecting


# --- no module but bootstrap reads a PROCSV_* variable --------------------------------------------------------

ROOTS = ("procsv", "services", "ipc")
# reads of the environment outside bootstrap, each with why it is not a child's configuration
ALLOWED = {
    "procsv/cli.py": "the launch's own entry: hands os.environ to pure functions (placement, the group's K)",
    "procsv/cluster.py": "TF_CONFIG, TensorFlow's own variable, read as TensorFlow reads it",
    "procsv/common/spawn.py": "copies the environment for a child it starts",
    "procsv/watchdog/onfailure.py": "copies the environment, less procsv's names, for the --on-failure command",
    "procsv/examples/elastic_digits.py": "an example program: TF_CONFIG (its plain run), and its sample log's "
                                         "attempt number (PROCSV_ATTEMPT: no public API says it yet)",
}


def _environ_reads(tree: ast.AST) -> list[int]:
    """The lines of ``tree`` that read ``os.environ`` or ``os.getenv`` (a write, ``setdefault`` of a
    variable the process sets for itself, ``clear`` and ``update`` are not reads)."""
    writes: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Assign, ast.AugAssign)):
            for target in (node.targets if isinstance(node, ast.Assign) else [node.target]):
                if isinstance(target, ast.Subscript):
                    writes.add(id(target.value))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                node.func.attr in ("setdefault", "clear", "update", "pop"):
            writes.add(id(node.func.value))
    lines = []
    for node in ast.walk(tree):
        is_environ = isinstance(node, ast.Attribute) and node.attr == "environ" and \
            isinstance(node.value, ast.Name) and node.value.id == "os"
        is_getenv = isinstance(node, ast.Attribute) and node.attr == "getenv" and \
            isinstance(node.value, ast.Name) and node.value.id == "os"
        if (is_environ and id(node) not in writes) or is_getenv:
            lines.append(node.lineno)
    return sorted(lines)


def _modules() -> list[str]:
    out = []
    for root in ROOTS:
        for folder, _, files in os.walk(os.path.join(REPO, root)):
            out += [os.path.relpath(os.path.join(folder, f), REPO) for f in files if f.endswith(".py")]
    return sorted(out)


def test_no_module_but_bootstrap_reads_the_environment() -> None:
    found = {}
    for path in _modules():
        if path == "procsv/common/bootstrap.py" or path in ALLOWED:
            continue
        with open(os.path.join(REPO, path)) as fh:
            lines = _environ_reads(ast.parse(fh.read()))
        if lines:
            found[path] = lines
    assert found == {}, f"read the environment outside procsv/common/bootstrap.py: {found}"


def test_the_check_finds_a_read_and_passes_over_a_write() -> None:
    planted = ast.parse("import os\nx = os.environ.get('PROCSV_RANK')\nos.environ['A'] = '1'\n"
                        "os.environ.setdefault('B', '2')\ny = os.getenv('C')\nz = dict(os.environ)\n")
    assert _environ_reads(planted) == [2, 5, 6]
    for path in ALLOWED:  # each allowed module still reads it (else its entry goes)
        with open(os.path.join(REPO, path)) as fh:
            assert _environ_reads(ast.parse(fh.read())), path


def test_every_procsv_name_is_in_env_all() -> None:
    # env.ALL is what the --on-failure command's environment is cleaned of (it missed PROCSV_GRAPH_FAST_RUN)
    names = {v for v in vars(env).values() if isinstance(v, str) and v.startswith("PROCSV_")}
    assert names == set(env.ALL)


def test_a_child_refuses_a_configuration_written_in_another_schema_version(tmp_path: Any) -> None:
    """The record is versioned across processes, not by a constant alone: the parent writes the version of
    the schema it wrote (``spawn.child_env``), and a child of another procsv install (upgraded in place under a
    running launch) stops at its start naming the mismatch, instead of reading the variables with another
    meaning. No version (a plain ``python train.py``) and this install's are read as before. A real checkpoint
    service given another version exits non-zero with that line."""
    import subprocess
    import sys

    from procsv.common.bootstrap import CONFIG_VERSION
    from procsv.common.spawn import child_env, service_argv

    assert ChildConfig.parse({}).version == CONFIG_VERSION
    assert ChildConfig.parse({env.CONFIG_VERSION: str(CONFIG_VERSION), env.ROLE: "checkpoint"}).role == "checkpoint"
    with pytest.raises(ValueError, match=rf"{env.CONFIG_VERSION}='{CONFIG_VERSION + 1}'.*different procsv installs"):
        ChildConfig.parse({env.CONFIG_VERSION: str(CONFIG_VERSION + 1)})
    written = child_env(role="checkpoint", attempt=1, logdir=str(tmp_path / "run"), runtime_dir=str(tmp_path),
                        supervised=False, base={})
    assert written[env.CONFIG_VERSION] == str(CONFIG_VERSION)
    (tmp_path / "run").mkdir()
    proc = subprocess.run(service_argv("checkpoint"), env={**os.environ, **written, env.CONFIG_VERSION: "999"},
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    assert f"{env.CONFIG_VERSION}='999': this process reads procsv's configuration version {CONFIG_VERSION}" \
        in proc.stderr, proc.stderr
