"""The layout's rules, read from the code itself (pure: no TensorFlow, no process).

* no package folder under ``procsv/``, ``ipc/`` and ``services/`` holds more than 20 modules (a
  newcomer finds the room);
* a module is as long as its one concern needs: one over 400 lines says so, in a docstring line
  ``One concern: <what>`` (the line count is no reason to split a class: a split made to meet it
  leaves half-classes, lambdas and joined lines);
* what hurts instead of what is long (issue 66), measured by ``tests/coupling_checks.py``: no reach
  into another procsv object's private names under ``procsv/trainer/`` (TensorFlow's, Keras's and
  the standard library's internals on one allow-list), at most 5 writes into other objects' fields
  per module outside the watchdog's observation function and executor (with the executor's
  bookkeeping), no class with more than 20 attributes, no mixin (a half of a class, reading what
  its subclass gives), no ``NotImplementedError`` stub but in an interface TensorFlow itself
  defines. Today's code breaks
  these: each check has a baseline of today's exact violations, which may only shrink (the test
  fails on a new one, and on a listed one that is gone, until it is taken off the list);
* no import circle, counting imports inside functions and under ``if TYPE_CHECKING:``;
* within ``procsv/trainer/`` and ``procsv/watchdog/``, no circle between rooms either (a room is a
  module or a folder directly inside): every import runs down, none back up to a room that imports
  the importer's (the trainer's collaborators stand on the rooms they use, as the watchdog's do);
* ``procsv/watchdog/rules/`` (the decision function) reaches, through every import it makes and
  theirs, only the standard library's pure modules, procsv's error, exit-code and message-base
  types, and ``rules/`` itself: no clock of its own, no socket, no file; so does each of the
  trainer's pure planners (``PURE_PLANNERS``: the checkpoint agent's step-boundary plan, the
  non-finite rollback's plan, the in-memory tier's schedule);
* the folders' direction: ``services/`` never imports the trainer's code, ``ipc/`` nothing of
  procsv but ``procsv.common.errors`` and itself, ``procsv/common/`` nothing of the processes;
* every package folder is listed in pyproject.toml (an editable install hides a missing one; a
  built wheel would lack it).

The checks run on the repository's files (``ast``); each is also run on a small planted tree, so
that a check that could never fail would be seen.
"""

from __future__ import annotations

import ast
import pathlib
import sys
import textwrap
import tomllib
from typing import Iterable, Mapping, Optional

import pytest

import coupling_checks as cc

REPO = pathlib.Path(__file__).resolve().parent.parent
# the folders of the repository and the package each installs as (pyproject.toml's package-dir)
ROOTS = {"procsv": "procsv", "ipc": "procsv.ipc", "services": "procsv.services"}
MAX_MODULES = 20
MAX_LINES = 400  # past this, a module's docstring says it is one concern
MAX_ATTRIBUTES = 20
MAX_FIELD_WRITES = 5  # per module
RULES = "procsv.watchdog.rules"
# what rules/ may import: standard-library modules that do no I/O of their own (signal: its names
# and numbers only; random: the seeded generator the chaos plan is given), and procsv's vocabulary
RULES_STDLIB = {"__future__", "typing", "dataclasses", "enum", "math", "random", "signal", "collections",
                "functools", "itertools", "abc", "re", "statistics"}
RULES_PROCSV = {"procsv.common.errors", "procsv.common.exitcodes", "procsv.ipc.message_base"}
# the trainer's pure planners, held to the same: the checkpoint agent's step-boundary plan (issue 66), the
# non-finite rollback's plan, the in-memory tier's schedule
PURE_PLANNERS = ("procsv.trainer.checkpoint.boundary_plan", "procsv.trainer.nonfinite.plan",
                 "procsv.trainer.checkpoint.memory_tier")


def modules(repo: pathlib.Path = REPO, roots: Optional[dict[str, str]] = None) -> dict[str, pathlib.Path]:
    """Every module of the packages, by its installed dotted name."""
    found: dict[str, pathlib.Path] = {}
    for folder, package in (roots or ROOTS).items():
        for path in sorted((repo / folder).rglob("*.py")):
            rel = path.relative_to(repo / folder).with_suffix("").parts
            parts = [package, *rel]
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(parts)] = path
    return found


def imports_of(name: str, path: pathlib.Path, known: Iterable[str]) -> set[str]:
    """Every module ``name`` imports, wherever the import stands (module level, a function, a
    TYPE_CHECKING block). ``from P import x`` counts as an import of ``P.x`` when that is a module,
    else of ``P``; the implicit import of a module's parent packages is not counted."""
    known = set(known)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            for alias in node.names:
                sub = f"{source}.{alias.name}"
                out.add(sub if sub in known else source)
    return out


def graph(mods: dict[str, pathlib.Path]) -> dict[str, set[str]]:
    return {name: imports_of(name, path, mods) for name, path in mods.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), and self-imports."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in edges:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1 or v in edges.get(v, ()):
                found.append(sorted(comp))

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10 * len(edges) + 100))
    try:
        for v in sorted(edges):
            if v not in index:
                visit(v)
    finally:
        sys.setrecursionlimit(limit)
    return found


def room_cycles(edges: dict[str, set[str]], package: str) -> list[list[str]]:
    """The circles between the rooms of ``package`` (each module or folder directly inside it): a
    module's imports of another room's modules are imports between the two rooms."""
    prefix = package + "."

    def room(module: str) -> Optional[str]:
        return module[len(prefix):].split(".")[0] if module.startswith(prefix) else None

    between: dict[str, set[str]] = {}
    for module, deps in edges.items():
        here = room(module)
        if here is None:
            continue
        between.setdefault(here, set()).update(r for r in map(room, deps) if r is not None and r != here)
    return cycles(between)


def reach(edges: dict[str, set[str]], start: str) -> dict[str, str]:
    """Every module imported, directly or not, by the modules under ``start``: name -> who imports it."""
    seen: dict[str, str] = {}
    todo = [m for m in edges if m == start or m.startswith(start + ".")]
    for m in todo:
        seen.setdefault(m, m)
    while todo:
        m = todo.pop()
        for dep in edges.get(m, ()):
            if dep not in seen:
                seen[dep] = m
                if dep in edges:
                    todo.append(dep)
    return seen


def impure(edges: dict[str, set[str]], start: str, stdlib: set[str], allowed: set[str]) -> list[str]:
    """What ``start``'s imports reach beyond the allowed: ``module (imported by who)``."""
    bad = []
    for dep, by in sorted(reach(edges, start).items()):
        if dep == start or dep.startswith(start + "."):
            continue
        if dep in allowed or dep.split(".")[0] in stdlib and not dep.startswith("procsv"):
            continue
        bad.append(f"{dep} (imported by {by})")
    return bad


def crowded_folders(repo: pathlib.Path = REPO, roots: Iterable[str] = ROOTS) -> list[str]:
    """The package folders (and top folders) holding more than MAX_MODULES modules: ``"path (n)"``."""
    crowded = []
    for folder in roots:
        for d in [repo / folder, *(p.parent for p in (repo / folder).rglob("__init__.py"))]:
            mods = [p for p in d.glob("*.py") if p.name != "__init__.py"]
            if len(mods) > MAX_MODULES:
                crowded.append(f"{d.relative_to(repo)} ({len(mods)})")
    return crowded


def ratchet(found: Mapping[str, int], baseline: Mapping[str, int]) -> list[str]:
    """How ``found`` differs from a baseline that may only shrink: a violation that is new or grew,
    and one that is gone or shrank (the baseline is then lowered to it, so that it stays exact)."""
    out = []
    for key in sorted(set(found) | set(baseline)):
        now, then = found.get(key, 0), baseline.get(key, 0)
        if now > then:
            out.append(f"new: {key} ({now}; the baseline allows {then})")
        elif now < then:
            out.append(f"fixed: {key} ({now}; the baseline says {then}: lower it, or take it off)")
    return out


# --------------------------------------------------------------------------- the baselines
#
# Today's violations of the coupling checks, exactly. They may only shrink: issue 66's refactor
# removes them. A new violation fails its test, and so does a listed one that is gone (lower the
# count, or take the line off). Never add a line to make a test pass.

# Private names of objects that are not procsv's, reached on purpose: TensorFlow's and Keras's
# internals (and two of the standard library's), by module and receiver. Not a baseline: these
# stay while procsv mirrors TF's behaviour, but each is still reached (the test checks it).
FOREIGN_PRIVATE = frozenset({
    # TensorFlow: trackables, checkpoint saveables, data structures
    "procsv.trainer.checkpoint.graph_shape:data_structures._DictWrapper",
    "procsv.trainer.checkpoint.graph_shape:obj._check_external_modification",
    "procsv.trainer.checkpoint.graph_shape:obj._check_self_external_modification",
    "procsv.trainer.checkpoint.graph_shape:obj._external_modification",
    "procsv.trainer.checkpoint.graph_shape:obj._maybe_initialize_trackable",
    "procsv.trainer.checkpoint.graph_shape:obj._non_append_mutation",
    "procsv.trainer.checkpoint.graph_shape:obj._self_external_modification",
    "procsv.trainer.checkpoint.graph_shape:obj._self_non_string_key",
    "procsv.trainer.checkpoint.graph_shape:obj._self_unconditional_checkpoint_dependencies",
    "procsv.trainer.checkpoint.graph_shape:obj._trackable_children",
    "procsv.trainer.checkpoint.graph_shape:optimizer._slots",
    "procsv.trainer.checkpoint.graph_shape:trackable._maybe_initialize_trackable",
    "procsv.trainer.checkpoint.graph_shape:type(obj)._maybe_initialize_trackable",
    "procsv.trainer.checkpoint.snapshot:spec._tensor",
    "procsv.trainer.nonfinite.scan:spec._tensor",
    # TensorFlow: graphs, sessions, variables, savers, tensors, functions
    "procsv.trainer.graph.defaults:graph._unsafe_unfinalize",
    "procsv.trainer.graph.defaults:setup.saver._var_list",
    "procsv.trainer.graph.fastrun:dtype._is_ref_dtype",
    "procsv.trainer.graph.fastrun:sess._closed",
    "procsv.trainer.graph.fastrun:sess._do_call",
    "procsv.trainer.graph.fastrun:session._make_callable_from_options",
    "procsv.trainer.graph.state:v._save_slice_info",
    "procsv.trainer.graph.state:value._save_slice_info",
    "procsv.trainer.graph.steps:var._graph_element",
    "procsv.trainer.monitored.graph_scaffold:training_saver._get_saver_or_default",
    "procsv.trainer.monitored.hook_support:training_util._get_or_create_global_step_read",
    "procsv.trainer.monitored.session_end:self._tf_graph._unsafe_unfinalize",
    "procsv.trainer.standby.warmup:concrete._call_flat",
    "procsv.trainer.summaries.values:value._datatype_enum",
    "procsv.trainer.summaries.values:value._numpy",
    "procsv.trainer.summaries.values:value._numpy_internal",
    "procsv.trainer.supervisor_setup:saver._keep_checkpoint_every_n_hours",
    "procsv.trainer.supervisor_setup:saver._max_to_keep",
    "procsv.trainer.keras.input_position:dataset._as_serialized_graph",
    # Keras: models and their epoch iterators
    "procsv.trainer.keras.fit:inp.epoch_iterator._distributed_dataset",
    "procsv.trainer.keras.fit:model._initial_epoch",
    "procsv.trainer.keras.input_position:inp.epoch_iterator._distributed_dataset",
    "procsv.trainer.keras.input_position:it._distributed_dataset",
    "procsv.trainer.keras.input_position:model._flatten_layers",
    "procsv.trainer.keras.input_position:model._symbolic_build",
    "procsv.trainer.keras.replay:model._loss_tracker",
    "procsv.trainer.keras.replay:model._make_function",
    "procsv.trainer.keras.step_warmup:epoch_iterator._distributed_dataset",
    # the standard library
    "procsv.trainer.keras.input_position:sys._getframe",
    "procsv.trainer.standby.wait:os._exit",
})

# Baseline: reaches into procsv's own private names under procsv/trainer/ (a SessionManager's
# may be TF's or procsv's: counted as procsv's). Module:receiver._name -> times.
PRIVATE_REACH_BASELINE = {
    "procsv.trainer.graph.session_manager:manager._local_init_op": 1,
    "procsv.trainer.graph.session_manager:manager._model_ready": 1,
    "procsv.trainer.graph.session_manager:manager._try_run_local_init_op": 1,
    "procsv.trainer.graph.supervised:manager._ready_op": 1,
    "procsv.trainer.graph.supervised:manager._try_run_local_init_op": 1,
    "procsv.trainer.graph.supervised:setup.session_manager._local_init_op": 1,
    "procsv.trainer.keras.fit:stale._original_train": 1,
    "procsv.trainer.monitored.scaffold:src._user_init_fn": 1,
    "procsv.trainer.session_type:sess._entered": 1,
}

# Where the watchdog's view is written, by design: the observation function and the executor, and
# the executor's record of what an action changed (bookkeeping.note, which the executor calls
# after each action; apart from it only so that it stays as pure as the rules).
FIELD_WRITERS = frozenset({"procsv.watchdog.observe", "procsv.watchdog.executor", "procsv.watchdog.rules.bookkeeping"})

# Baseline: modules writing more than MAX_FIELD_WRITES fields of other objects -> how many.
FIELD_WRITE_BASELINE = {
    "procsv.common.curve": 9,
    "procsv.trainer.checkpoint.agent": 7,
    "procsv.trainer.graph.session": 8,
    "procsv.trainer.graph.supervised": 8,
    "procsv.trainer.monitored.graph_hooked": 8,
    "procsv.trainer.monitored.graph_scaffold": 7,
    "procsv.watchdog.launcher": 7,
    "procsv.watchdog.rules.nonfinitelog": 7,
}

# Baseline: classes keeping more than MAX_ATTRIBUTES attributes -> how many.
ATTRIBUTE_BASELINE = {
    "procsv.services.checkpoint.service:CheckpointService": 24,
    "procsv.services.summary.service:SummaryService": 28,
    "procsv.trainer.checkpoint.memory:MemoryTier": 29,
    "procsv.trainer.keras.fit:BackupAndRestore": 30,
    "procsv.trainer.summaries.sender:SummarySender": 25,
    "procsv.trainer.supervisor:Supervisor": 33,
    "procsv.watchdog.config:LaunchConfig": 33,
    "procsv.watchdog.multihost.agent:NodeAgent": 23,
    "procsv.watchdog.publish.runmetrics:RunSnapshot": 22,
    "procsv.watchdog.rules.limits:Limits": 28,
    "procsv.watchdog.rules.state:ChildView": 53,
    "procsv.watchdog.rules.state:RunView": 54,
}

# Baseline: the mixins (each the other half of one class, which gives what it reads): none left.
MIXIN_BASELINE: frozenset[str] = frozenset()

# The interfaces TensorFlow itself defines, which procsv mirrors with its NotImplementedError
# (procsv's class -> TF's): not a baseline.
TF_INTERFACES = {
    "procsv.trainer.monitored.scaffold:SessionCreator": "tf.compat.v1.train.SessionCreator",
}

# Baseline: NotImplementedError stubs outside those interfaces (they were the mixins' halves): none left.
STUB_BASELINE: frozenset[str] = frozenset()


def _owner(stub: str) -> str:
    """``"module:Class.method"`` -> ``"module:Class"``."""
    module, _, qual = stub.partition(":")
    return f"{module}:{qual.rpartition('.')[0]}"


def private_reach_violations(mods: dict[str, pathlib.Path], foreign: frozenset[str] = FOREIGN_PRIVATE,
                             baseline: Mapping[str, int] = PRIVATE_REACH_BASELINE) -> list[str]:
    found = cc.private_reaches(mods, "procsv.trainer")
    return ratchet({k: n for k, n in found.items() if k not in foreign}, baseline)


def field_write_violations(mods: dict[str, pathlib.Path], baseline: Mapping[str, int] = FIELD_WRITE_BASELINE,
                           exempt: frozenset[str] = FIELD_WRITERS) -> list[str]:
    writes = cc.field_writes(mods, exempt)
    over = {m: len(w) for m, w in writes.items() if len(w) > MAX_FIELD_WRITES}
    return [f"{v}: {writes.get(v.split()[1], [])}" if v.startswith("new") else v for v in ratchet(over, baseline)]


def attribute_violations(mods: dict[str, pathlib.Path], baseline: Mapping[str, int] = ATTRIBUTE_BASELINE) -> list[str]:
    over = {c: len(a) for c, a in cc.class_attributes(mods).items() if len(a) > MAX_ATTRIBUTES}
    return ratchet(over, baseline)


def mixin_violations(mods: dict[str, pathlib.Path], baseline: frozenset[str] = MIXIN_BASELINE) -> list[str]:
    found = cc.mixins(mods)
    return [f"{v}: {found.get(v.split()[1], '')}" for v in ratchet(dict.fromkeys(found, 1), dict.fromkeys(baseline, 1))]


def stub_violations(mods: dict[str, pathlib.Path], interfaces: Iterable[str] = TF_INTERFACES,
                    baseline: frozenset[str] = STUB_BASELINE) -> list[str]:
    found = {s for s in cc.stubs(mods) if _owner(s) not in set(interfaces)}
    return ratchet(dict.fromkeys(found, 1), dict.fromkeys(baseline, 1))


# --------------------------------------------------------------------------- the repository


def test_no_package_folder_holds_more_than_20_modules() -> None:
    crowded = crowded_folders()
    assert not crowded, f"folders over {MAX_MODULES} modules: {crowded}"


def test_a_module_over_400_lines_says_in_its_docstring_that_it_is_one_concern() -> None:
    missing = cc.long_modules_without_one_concern(modules(), MAX_LINES)
    assert not missing, f"modules over {MAX_LINES} lines whose docstring has no line '{cc.ONE_CONCERN} <what>': {missing}"


@pytest.mark.slow
def test_the_trainer_reaches_into_no_private_name_of_procsv_beyond_the_baseline() -> None:
    bad = private_reach_violations(modules())
    assert not bad, "\n".join(bad)


@pytest.mark.slow
def test_every_foreign_private_name_on_the_allow_list_is_still_reached() -> None:
    found = cc.private_reaches(modules(), "procsv.trainer")
    assert sorted(FOREIGN_PRIVATE - set(found)) == [], "take these off FOREIGN_PRIVATE"
    assert not FOREIGN_PRIVATE & set(PRIVATE_REACH_BASELINE), "a reach is foreign or procsv's, not both"


@pytest.mark.slow
def test_no_module_writes_more_than_5_fields_of_other_objects_beyond_the_baseline() -> None:
    bad = field_write_violations(modules())
    assert not bad, "\n".join(bad)


@pytest.mark.slow
def test_no_class_keeps_more_than_20_attributes_beyond_the_baseline() -> None:
    bad = attribute_violations(modules())
    assert not bad, "\n".join(bad)


@pytest.mark.slow
def test_no_class_is_a_mixin_beyond_the_baseline() -> None:
    bad = mixin_violations(modules())
    assert not bad, "\n".join(bad)


@pytest.mark.slow
def test_no_function_is_a_not_implemented_stub_outside_tensorflows_interfaces_beyond_the_baseline() -> None:
    mods = modules()
    bad = stub_violations(mods)
    assert not bad, "\n".join(bad)
    owners = {_owner(s) for s in cc.stubs(mods)}
    assert sorted(set(TF_INTERFACES) - owners) == [], "take these off TF_INTERFACES: they have no stub any more"


@pytest.mark.slow
def test_no_import_circle_anywhere() -> None:
    assert cycles(graph(modules())) == []


@pytest.mark.slow
def test_no_room_of_the_trainer_or_the_watchdog_imports_back_up() -> None:
    edges = graph(modules())
    assert room_cycles(edges, "procsv.trainer") == []
    assert room_cycles(edges, "procsv.watchdog") == []


def lifecycle_readers(mods: Mapping[str, pathlib.Path], under: str = "procsv.trainer") -> list[str]:
    """Where a module under ``under`` names a run's lifecycle file (``<Layout>.lifecycle``): the record
    the watchdog writes for people, which no trainer reads a decision from (``ChildConfig.resume``)."""
    found = []
    for name, path in sorted(mods.items()):
        if name == under or name.startswith(under + "."):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Attribute) and node.attr == "lifecycle":
                    found.append(f"{name}:{node.lineno}")
    return found


def test_no_trainer_module_reads_the_lifecycle_file() -> None:
    assert lifecycle_readers(modules()) == []


def test_a_trainer_module_naming_the_lifecycle_file_is_found(tmp_path: pathlib.Path) -> None:
    (tmp_path / "procsv" / "trainer").mkdir(parents=True)
    (tmp_path / "procsv" / "__init__.py").write_text("")
    (tmp_path / "procsv" / "trainer" / "__init__.py").write_text("")
    (tmp_path / "procsv" / "trainer" / "reads.py").write_text("def bound(layout):\n    return open(layout.lifecycle)\n")
    (tmp_path / "procsv" / "trainer" / "clean.py").write_text('"""The lifecycle file is the watchdog\'s."""\n')
    mods = modules(tmp_path, {"procsv": "procsv"})
    assert lifecycle_readers(mods) == ["procsv.trainer.reads:2"]


@pytest.mark.slow
def test_the_decision_function_reaches_no_io_through_its_imports() -> None:
    edges = graph(modules())
    assert any(m.startswith(RULES + ".") for m in edges), "rules/ is where the decision function lives"
    assert impure(edges, RULES, RULES_STDLIB, RULES_PROCSV) == []


@pytest.mark.slow
@pytest.mark.parametrize("planner", PURE_PLANNERS)
def test_the_trainers_planning_functions_reach_no_io_through_their_imports(planner: str) -> None:
    edges = graph(modules())
    assert planner in edges, f"{planner} is where the decision lives"
    assert impure(edges, planner, RULES_STDLIB, RULES_PROCSV) == []


@pytest.mark.slow
def test_the_folders_import_in_the_allowed_direction() -> None:
    edges = graph(modules())

    def reaching(start: str, prefix: str) -> list[str]:
        return sorted(f"{d} (by {b})" for d, b in reach(edges, start).items() if d.startswith(prefix))

    assert reaching("procsv.services", "procsv.trainer") == []
    assert reaching("procsv.services", "procsv.watchdog") == []
    assert reaching(RULES, "procsv.watchdog.publish") == []
    assert reaching(RULES, "procsv.watchdog.executor") == []
    ipc = {d for m, deps in edges.items() if m.startswith("procsv.ipc") for d in deps if d.startswith("procsv")}
    assert {d for d in ipc if not d.startswith("procsv.ipc")} <= {"procsv.common.errors"}
    common = {d for m, deps in edges.items() if m.startswith("procsv.common") for d in deps
              if d.startswith("procsv") and not d.startswith("procsv.common")}
    assert {d for d in common if d.startswith(("procsv.trainer", "procsv.watchdog", "procsv.services"))} == set()


def test_every_package_folder_is_listed_in_pyproject() -> None:
    config = tomllib.loads((REPO / "pyproject.toml").read_text())
    listed = set(config["tool"]["setuptools"]["packages"])
    folders = {name for name, path in modules().items() if path.name == "__init__.py"}
    assert folders - listed == set(), "package folders missing from [tool.setuptools] packages"
    assert listed - folders == set(), "[tool.setuptools] packages names folders that do not exist"


# --------------------------------------------------------------------------- the checks can fail


def _plant_modules(tmp_path: pathlib.Path, files: dict[str, str]) -> dict[str, pathlib.Path]:
    for rel, text in files.items():
        p = tmp_path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return modules(tmp_path, {"procsv": "procsv"})


def _plant(tmp_path: pathlib.Path, files: dict[str, str]) -> dict[str, set[str]]:
    return graph(_plant_modules(tmp_path, files))


def test_a_circle_through_a_function_level_or_type_checking_import_is_found(tmp_path: pathlib.Path) -> None:
    edges = _plant(tmp_path, {
        "procsv/__init__.py": "",
        "procsv/a.py": "def f():\n    from procsv import b\n",
        "procsv/b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from procsv.c import X\n",
        "procsv/c.py": "from procsv.a import f\nclass X: ...\n",
        "procsv/d.py": "from procsv import a\n",  # imports into the circle, not part of it
    })
    assert cycles(edges) == [["procsv.a", "procsv.b", "procsv.c"]]


def test_a_room_that_imports_back_up_is_found_though_no_module_circle_is(tmp_path: pathlib.Path) -> None:
    edges = _plant(tmp_path, {
        "procsv/__init__.py": "",
        "procsv/trainer/__init__.py": "",
        "procsv/trainer/top.py": "from procsv.trainer.low import util\n",
        "procsv/trainer/low/__init__.py": "",
        "procsv/trainer/low/util.py": "",
        "procsv/trainer/low/other.py": "def f():\n    from procsv.trainer import top\n",  # back up, from another module
    })
    assert cycles(edges) == []  # no module imports itself back
    assert room_cycles(edges, "procsv.trainer") == [["low", "top"]]


def test_a_relative_import_and_a_parent_package_are_read_as_python_reads_them(tmp_path: pathlib.Path) -> None:
    edges = _plant(tmp_path, {
        "procsv/__init__.py": "from procsv.sub import leaf\n",  # the package imports its own module
        "procsv/sub/__init__.py": "",
        "procsv/sub/leaf.py": "from . import other\nfrom ..top import T\n",
        "procsv/sub/other.py": "",
        "procsv/top.py": "T = 1\n",
    })
    assert edges["procsv.sub.leaf"] == {"procsv.sub.other", "procsv.top"}
    assert cycles(edges) == []  # a module's parent package is not an import of it


def test_an_io_import_reached_through_another_module_is_reported(tmp_path: pathlib.Path) -> None:
    edges = _plant(tmp_path, {
        "procsv/__init__.py": "",
        "procsv/watchdog/__init__.py": "",
        "procsv/watchdog/rules/__init__.py": "",
        "procsv/watchdog/rules/decide.py": "import enum\nfrom procsv.common import errors\nfrom procsv.common.boot import X\n",
        "procsv/common/__init__.py": "",
        "procsv/common/errors.py": "",
        "procsv/common/boot.py": "import zmq\nX = 1\n",
    })
    bad = impure(edges, RULES, RULES_STDLIB, RULES_PROCSV)
    assert bad == ["procsv.common.boot (imported by procsv.watchdog.rules.decide)",
                   "zmq (imported by procsv.common.boot)"]


def test_a_folder_of_more_than_20_modules_is_found(tmp_path: pathlib.Path) -> None:
    _plant_modules(tmp_path, {
        "procsv/__init__.py": "",
        **{f"procsv/m{i}.py": "" for i in range(MAX_MODULES)},  # 20: room enough
        "procsv/big/__init__.py": "",
        **{f"procsv/big/m{i}.py": "" for i in range(MAX_MODULES + 1)},
    })
    assert crowded_folders(tmp_path, ["procsv"]) == [f"procsv/big ({MAX_MODULES + 1})"]


def test_a_long_module_is_found_unless_its_docstring_says_it_is_one_concern(tmp_path: pathlib.Path) -> None:
    body = "x = 1\n" * MAX_LINES
    mods = _plant_modules(tmp_path, {
        "procsv/__init__.py": "",
        "procsv/short.py": '"""No word of its concern."""\n' + "x = 1\n" * (MAX_LINES - 1),  # 400 lines
        "procsv/said.py": '"""The store.\n\nOne concern: the commit of a checkpoint.\n"""\n' + body,
        "procsv/silent.py": '"""The store, and much else."""\n' + body,
        "procsv/empty.py": '"""The store.\n\nOne concern:\n"""\n' + body,  # names nothing
        "procsv/buried.py": "# One concern: a comment is not the docstring\n" + body,
    })
    assert cc.long_modules_without_one_concern(mods, MAX_LINES) == [
        "procsv.buried (401 lines)", "procsv.empty (404 lines)", "procsv.silent (401 lines)"]


def test_a_reach_into_another_objects_private_name_is_found_and_one_into_its_own_is_not(tmp_path: pathlib.Path) -> None:
    mods = _plant_modules(tmp_path, {
        "procsv/__init__.py": "",
        "procsv/trainer/__init__.py": "",
        "procsv/trainer/a.py": "def _helper(): ...\n",
        "procsv/trainer/b.py": (
            "from procsv.trainer.a import _helper\n"
            "from . import a\n"
            "class B(Base):\n"
            "    def f(self, sv, other):\n"
            "        self._mine = cls_._x = 1\n"
            "        super()._up()\n"
            "        type(self)._count += 1\n"
            "        other.__class__, other.public\n"  # a dunder and a public name: not private
            "        sv._keeper.save()\n"
            "        sv._keeper = None\n"
            "        self.sv._rollback\n"
            "        getattr(sv, '_stop_quietly', None)\n"
            "        a._helper()\n"),
        "procsv/watchdog.py": "def f(sv): return sv._keeper\n",  # outside the trainer: not looked at
    })
    assert cc.private_reaches(mods, "procsv.trainer") == {
        "procsv.trainer.b:procsv.trainer.a._helper": 1,
        "procsv.trainer.b:cls_._x": 1,
        "procsv.trainer.b:sv._keeper": 2,
        "procsv.trainer.b:self.sv._rollback": 1,
        "procsv.trainer.b:sv._stop_quietly": 1,
        "procsv.trainer.b:a._helper": 1,
    }
    allowed = frozenset({"procsv.trainer.b:cls_._x"})
    baseline = {"procsv.trainer.b:sv._keeper": 2, "procsv.trainer.b:procsv.trainer.a._helper": 1,
                "procsv.trainer.b:self.sv._rollback": 1, "procsv.trainer.b:sv._stop_quietly": 1,
                "procsv.trainer.b:a._helper": 1}
    assert private_reach_violations(mods, allowed, baseline) == []
    assert private_reach_violations(mods, frozenset(), baseline) == [
        "new: procsv.trainer.b:cls_._x (1; the baseline allows 0)"]


def test_a_write_into_another_objects_field_is_found_unless_the_function_made_the_object(tmp_path: pathlib.Path) -> None:
    mods = _plant_modules(tmp_path, {
        "procsv/__init__.py": "",
        "procsv/a.py": (
            "class A:\n"
            "    def f(self, view, other):\n"
            "        self.mine = 1\n"
            "        self.state.step = 2\n"
            "        view.restart_at, view.failed = 3, True\n"
            "        view.count += 1\n"
            "        del other.cache\n"
            "        setattr(other, 'flag', True)\n"
            "        setattr(self, 'own', 1)\n"
            "        made = RunOptions()\n"
            "        made.trace_level = 3\n"
            "        made.debug.reset = True\n"
            "        got = self.find()\n"
            "        got.due = None\n"  # a found object, not made here
            "        def inner(): ...\n"
            "        inner.__name__ = 'x'\n"),
        "procsv/observe.py": "def seen(view):\n    view.a = view.b = view.c = view.d = view.e = view.f = 1\n",
    })
    writes = cc.field_writes(mods, frozenset({"procsv.observe"}))
    assert writes == {"procsv.a": ["4: self.state.step", "5: view.failed", "5: view.restart_at", "6: view.count",
                                   "7: other.cache", "8: other.flag", "14: got.due"]}
    assert field_write_violations(mods, {}, frozenset({"procsv.observe"})) == [
        "new: procsv.a (7; the baseline allows 0): " + str(writes["procsv.a"])]
    assert field_write_violations(mods, {"procsv.a": 7}, frozenset({"procsv.observe"})) == []
    assert field_write_violations(mods, {"procsv.a": 7}, frozenset()) == [  # the exemption is what spares observe
        "new: procsv.observe (6; the baseline allows 0): " + str(cc.field_writes(mods)["procsv.observe"])]


def test_a_class_with_more_than_20_attributes_is_found(tmp_path: pathlib.Path) -> None:
    fields = "".join(f"    f{i}: int = 0\n" for i in range(15))
    mods = _plant_modules(tmp_path, {
        "procsv/__init__.py": "",
        "procsv/a.py": "from typing import ClassVar\n"
                       + "class Twenty:\n" + fields + textwrap.dedent("""\
                           x: ClassVar[int] = 0  # the class's, not an instance's
                           def __init__(self):
                               self.s0 = self.s1 = self.s2 = self.s3 = self.s4 = 0
                               self.s0 += 1
                       class TwentyOne(Twenty):  # its own: only what it adds
                           def __init__(self):
                               self.extra = 1
                       """) + "class Wide:\n" + fields + textwrap.indent(textwrap.dedent("""\
                           __slots__ = ("a", "b")
                           def set(me):
                               me.s0, me.s1, me.s2 = 0, 1, 2
                               me.s3 = me.s4 = 3
                               def later():
                                   me.nested = 1
                       """), "    "),
    })
    attrs = cc.class_attributes(mods)
    assert len(attrs["procsv.a:Twenty"]) == MAX_ATTRIBUTES and "x" not in attrs["procsv.a:Twenty"]
    assert attrs["procsv.a:TwentyOne"] == {"extra"}
    assert len(attrs["procsv.a:Wide"]) == 23
    assert attribute_violations(mods, {}) == ["new: procsv.a:Wide (23; the baseline allows 0)"]


def test_a_class_that_reads_what_only_its_subclass_gives_is_found_as_a_mixin(tmp_path: pathlib.Path) -> None:
    mods = _plant_modules(tmp_path, {
        "procsv/__init__.py": "",
        "procsv/half.py": textwrap.dedent("""\
            class FinalCommit:
                commits: list[int]  # declared: the subclass gives it
                def commit(self):
                    return self.commits[-1]
            class LoggingMixin:
                pass
            """),
        "procsv/whole.py": textwrap.dedent("""\
            import threading
            from dataclasses import dataclass
            from typing import Protocol
            from procsv.half import FinalCommit
            class Agent(FinalCommit):  # the whole: it gives what its base reads
                def __init__(self):
                    self.commits = [1]
            class Base:
                limit = 3
                def __init__(self):
                    self.n = 0
            class Child(Base):
                def over(self):
                    return self.n > self.limit and self.more()
                def more(self):
                    return True
            @dataclass
            class Record:
                a: int
                def twice(self):
                    return 2 * self.a
            class Reader(Protocol):
                def read(self):
                    return self.source
            class Worker(threading.Thread):  # a base outside the tree: not judged
                def go(self):
                    return self.name
            """),
    })
    assert cc.mixins(mods) == {"procsv.half:FinalCommit": ["self.commits given by a subclass"],
                               "procsv.half:LoggingMixin": ["named a mixin"]}
    assert mixin_violations(mods, frozenset({"procsv.half:FinalCommit"})) == [
        "new: procsv.half:LoggingMixin (1; the baseline allows 0): ['named a mixin']"]


def test_a_not_implemented_stub_is_found_and_a_refusal_in_real_code_is_not(tmp_path: pathlib.Path) -> None:
    mods = _plant_modules(tmp_path, {
        "procsv/__init__.py": "",
        "procsv/a.py": textwrap.dedent("""\
            class SessionCreator:
                def create_session(self):
                    raise NotImplementedError(f"not for {self}")
            class Half:
                @property
                def in_flight(self):
                    \"\"\"The step in flight.\"\"\"
                    raise NotImplementedError
                def real(self, x):
                    if x:
                        raise NotImplementedError("no ragged tensors")
                    return x
            def todo():
                raise NotImplementedError()
            """),
    })
    assert cc.stubs(mods) == {"procsv.a:SessionCreator.create_session", "procsv.a:Half.in_flight", "procsv.a:todo"}
    assert stub_violations(mods, ["procsv.a:SessionCreator"], frozenset({"procsv.a:Half.in_flight"})) == [
        "new: procsv.a:todo (1; the baseline allows 0)"]


def test_the_ratchet_fails_on_a_new_violation_and_on_a_listed_one_that_is_gone() -> None:
    assert ratchet({"a": 2, "b": 1}, {"a": 2, "b": 1}) == []
    assert ratchet({"a": 3, "b": 1, "c": 1}, {"a": 2, "b": 1}) == [
        "new: a (3; the baseline allows 2)", "new: c (1; the baseline allows 0)"]
    assert ratchet({"a": 1}, {"a": 2, "b": 1}) == [
        "fixed: a (1; the baseline says 2: lower it, or take it off)",
        "fixed: b (0; the baseline says 1: lower it, or take it off)"]
