"""Issue 40: the seeds' examples as TF1 graph programs (``procsv/examples/seeds_tf1/``).

(a) Each example differs from its TensorFlow twin only in import lines: the twin is generated here
from the procsv file by swapping its procsv imports back to ``tensorflow.compat.v1.train``, and
nothing else in the file names procsv (but the shared model module, which imports TensorFlow
only). The twin runs under TensorFlow's own classes, as a plain ``python`` program (the twins one
after another in one process, ``tests/programs/tf1_twins.py``), and finishes
with a checkpoint a fresh-graph ``tf.compat.v1.train.Saver`` restores; for the MonitoredSession
family (whose saver hook saves between runs and at the end) that checkpoint is at ``--steps`` and
holds the variables of an uninterrupted plain-``Session`` run, bit for bit; the manual summaries
example writes its ``loss`` summaries at steps 0, 100 and 200.

(b) Each procsv file runs under ``procsv launch`` with one SIGKILL of the trainer mid-run and
finishes (exit 0); its newest checkpoint, found by ``tf.train.latest_checkpoint``, is
``model.ckpt-<steps>``, restores into a fresh graph with a TF1 ``Saver`` and holds the variables of
the uninterrupted plain run, bit for bit. An example whose (b) still waits for a piece of graph
mode (see ``PENDING``: the reason is in its mark) is a strict xfail, so it reports at once when
it starts passing.
"""

from __future__ import annotations

import ast
import difflib
import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest

from conftest import REPO, run_python, committed_steps, finish, launch, quiet_env, raw_status, status_json, wait_for, wait_role_pid

pytestmark = pytest.mark.slow

STEPS = 300
FOLDER = Path(REPO) / "procsv" / "examples" / "seeds_tf1"
PACKAGE = "procsv.examples.seeds_tf1"
TF_TRAIN = "tensorflow.compat.v1.train"
# the procsv modules an example may import names from, and the TensorFlow module of its twin
SWAPPED = {"procsv": TF_TRAIN, "procsv.train": TF_TRAIN}

SUPERVISOR = {"basic": (), "loop": ("--loop-secs", "0.5"), "manual_summaries": (), "retry": ("--abort-at-step", "170")}
MONITORED = {"monitored_session": (), "run_step_fn": (), "monitored_training": (), "singular_monitored": ()}
EXAMPLES = {**SUPERVISOR, **MONITORED}
REPLICAS = "replicas"  # the Supervisor page's "Use for multiple replicas": tests/test_ps_replicas.py
COMMON = ("--steps", str(STEPS), "--save-model-secs", "1", "--save-checkpoint-steps", "50", "--step-delay", "0.01")

# (b) for an example listed here is a strict xfail with the reason (none today: every example passes)
PENDING: dict[str, str] = {}


def examples_under_procsv() -> list[Any]:
    return [pytest.param(e, marks=pytest.mark.xfail(strict=True, reason=PENDING[e])) if e in PENDING else e
            for e in sorted(EXAMPLES)]


def test_the_folder_has_one_file_per_example_and_the_readme_says_how_the_replicas_one_runs() -> None:
    # replicas.py ("Use for multiple replicas") needs a cluster and names procsv.cluster besides its
    # imports, so it has no plain twin here: tests/test_ps_replicas.py runs it under --ps/--workers
    files = {p.stem for p in FOLDER.glob("*.py")} - {"__init__", "model"}
    assert files == set(EXAMPLES) | {REPLICAS}
    readme = (FOLDER / "README.md").read_text()
    assert "multiple replicas" in readme and "replicas.py" in readme and "--ps 1 --workers 2" in readme
    assert "not here" not in readme


def import_ranges(tree: ast.Module) -> list[tuple[int, int, ast.stmt]]:
    return [(n.lineno, n.end_lineno or n.lineno, n) for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]


def tf_twin(source: str) -> str:
    """``source`` with every ``from procsv[.train] import ...`` statement turned into ``from
    tensorflow.compat.v1.train import ...`` (the same names, the same lines); nothing else changes."""
    lines = source.splitlines(keepends=True)
    for first, last, node in import_ranges(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module in SWAPPED:
            head = f"from {node.module} import"
            assert lines[first - 1].lstrip().startswith(head), lines[first - 1]
            lines[first - 1] = lines[first - 1].replace(head, f"from {SWAPPED[node.module]} import", 1)
    return "".join(lines)


def procsv_uses(tree: ast.Module) -> list[str]:
    """Every use of procsv in ``tree`` other than an import of a swapped module or of the model:
    another procsv import, or the name ``procsv`` in the code."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "procsv":
            if node.module not in SWAPPED and not (node.module == PACKAGE and [a.name for a in node.names] == ["model"]):
                found.append(f"line {node.lineno}: from {node.module} import ...")
        elif isinstance(node, ast.Import):
            found += [f"line {node.lineno}: import {a.name}" for a in node.names if a.name.split(".")[0] == "procsv"]
        elif isinstance(node, ast.Name) and node.id == "procsv":
            found.append(f"line {node.lineno}: the name procsv")
    return found


@pytest.mark.parametrize("example", sorted(EXAMPLES))
def test_an_example_differs_from_its_tensorflow_twin_only_in_import_lines(example: str) -> None:
    import tensorflow as tf

    import procsv.train

    source = (FOLDER / f"{example}.py").read_text()
    twin = tf_twin(source)
    tree, twin_tree = ast.parse(source), ast.parse(twin)
    assert procsv_uses(tree) == []
    assert procsv_uses(twin_tree) == []  # the twin imports nothing of procsv's but the model
    swapped = [a.name for _, _, n in import_ranges(tree) if isinstance(n, ast.ImportFrom) and n.module in SWAPPED
               for a in n.names]
    assert swapped, "the example imports nothing from procsv"
    for name in swapped:  # the procsv file really runs procsv's class, the twin TensorFlow's own of that name
        ours, theirs = getattr(procsv.train, name), getattr(tf.compat.v1.train, name)
        assert ours is not theirs and ours.__module__.startswith("procsv."), name
    in_imports = {(k, i) for k, t in (("a", tree), ("b", twin_tree)) for first, last, _ in import_ranges(t)
                  for i in range(first, last + 1)}
    changed = []
    for op, a1, a2, b1, b2 in difflib.SequenceMatcher(None, source.splitlines(), twin.splitlines()).get_opcodes():
        if op != "equal":
            changed += [("a", i + 1) for i in range(a1, a2)] + [("b", i + 1) for i in range(b1, b2)]
    assert changed and set(changed) <= in_imports, [c for c in changed if c not in in_imports]


def test_the_model_imports_no_procsv() -> None:
    assert procsv_uses(ast.parse((FOLDER / "model.py").read_text())) == []


def restored(path: str) -> dict[str, Any]:
    from procsv.examples.seeds_tf1.model import checkpoint_variables

    return checkpoint_variables(path)


def assert_bit_equal(got: dict[str, Any], want: dict[str, Any]) -> None:
    import numpy as np

    assert sorted(got) == sorted(want) == ["b", "global_step", "w"]
    for name in want:
        assert np.array_equal(got[name], want[name]) and got[name].dtype == want[name].dtype, (name, got[name], want[name])


def run_every_twin(folder: str) -> None:
    """Run every example's TensorFlow twin as a plain ``python`` program, one after another in one
    process (``tests/programs/tf1_twins.py``: one TensorFlow import for all), each in
    ``folder/<example>``: the program, its logdir ``run``, and its exit code, stdout and stderr in
    files."""
    spec = []
    for example in sorted(EXAMPLES):
        here = Path(folder) / example
        here.mkdir()
        program = here / f"{example}_tf.py"
        program.write_text(tf_twin((FOLDER / f"{example}.py").read_text()))
        spec.append({"program": str(program), "argv": ["--logdir", str(here / "run"), *COMMON, *EXAMPLES[example]],
                     "cwd": str(here), "out": str(here)})
    (Path(folder) / "spec.json").write_text(json.dumps(spec))
    done = run_python([str(Path(REPO) / "tests" / "programs" / "tf1_twins.py"), str(Path(folder) / "spec.json")],
                      env=quiet_env(), cwd=folder, timeout=800)
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.fixture(scope="module")
def twins(shared_result: Any) -> Path:
    """The folder of ``run_every_twin``, made once per test session (every worker reads it)."""
    return Path(shared_result("seeds-tf1-twins", run_every_twin))


@pytest.mark.parametrize("example", sorted(EXAMPLES))
def test_the_tensorflow_twin_runs_under_tensorflows_own_classes(example: str, twins: Path) -> None:
    import tensorflow as tf

    from procsv.examples.seeds_tf1.model import variables_after

    here = twins / example
    logdir = str(here / "run")
    assert (here / "code").read_text() == "0", (here / "stderr").read_text()
    assert f"{example}: finished" in (here / "stdout").read_text()
    assert not os.path.exists(os.path.join(logdir, ".procsv"))  # TensorFlow's own classes ran: no procsv in it
    latest = tf.train.latest_checkpoint(logdir)
    assert latest is not None
    got = restored(latest)
    if example in MONITORED:  # the saver hook saves between runs and at the end: the uninterrupted run's values
        assert latest == os.path.join(logdir, f"model.ckpt-{STEPS}")
        assert_bit_equal(got, variables_after(STEPS))
    else:  # TF's Supervisor saves from a thread on a timer, and not at the end
        assert 0 <= int(got["global_step"]) <= STEPS
    if example == "manual_summaries":
        assert loss_summary_steps(logdir) == [0, 100, 200]


def loss_summary_steps(logdir: str) -> list[int]:
    """The steps of the ``loss`` scalars in ``logdir``'s event files (TensorBoard's reader)."""
    from tensorboard.backend.event_processing import event_accumulator as ea

    acc = ea.EventAccumulator(logdir, size_guidance={ea.SCALARS: 0})
    acc.Reload()
    return [e.step for e in acc.Scalars("loss")]


def launch_and_kill_once(logdir: str, example: str) -> tuple[int, str, str]:
    """Launch the procsv example, SIGKILL its trainer once a checkpoint past step 0 committed, wait
    for the end. A launch that ends before any such checkpoint is reported at once. No hot standby
    (``--standby fork``: the restart forks the pre-warmed trainer): no test here is about the standby, and
    the one a default launch prepares after the promotion waited unused to the end (0.3-0.6 CPU-s a launch). The
    program is given no ``--logdir`` of its own, as each example's docstring says to run it (its flag's default,
    None, is the launch's logdir): before, every run here passed it, and three of the examples (their hooks given
    ``FLAGS.logdir``) failed at their start when run as documented."""
    proc = launch(logdir, *COMMON, *EXAMPLES[example], target=f"{PACKAGE}.{example}", opts=("--standby", "fork"))
    try:
        wait_for(lambda: proc.poll() is not None or [s for s in committed_steps(logdir) if s > 0], 120,
                 what="a committed checkpoint")
        if proc.poll() is None:
            os.kill(wait_role_pid(logdir, "trainer"), signal.SIGKILL)
    finally:
        code, out, err = finish(proc)
    assert [s for s in committed_steps(logdir) if s > 0], f"no checkpoint before the end (exit {code}):\n{err[-3000:]}"
    return code, out, err


@pytest.mark.parametrize("example", examples_under_procsv())
def test_an_example_survives_a_sigkill_under_procsv_launch(example: str, logdir: str) -> None:
    import tensorflow as tf

    from procsv.examples.seeds_tf1.model import variables_after

    code, out, err = launch_and_kill_once(logdir, example)
    assert code == 0, err
    assert f"{example}: finished" in out
    st = status_json(logdir)
    assert st is not None and st["restarts"] == 1 and st["step"] == STEPS, st or raw_status(logdir)
    latest = tf.train.latest_checkpoint(logdir)
    assert latest == os.path.join(logdir, f"model.ckpt-{STEPS}")
    assert_bit_equal(restored(latest), variables_after(STEPS))
    if example == "loop":
        assert "print_loss: loss " in out
    if example == "retry":
        assert "retry: aborted at step 170; retrying" in out
    if example == "manual_summaries":  # summary_op=None: only the summaries computed by hand, every 100 steps, once
        assert loss_summary_steps(logdir) == [0, 100, 200]
