"""The layout's rules, read from the code itself (pure: no TensorFlow, no process).

* no package folder under ``procsv/``, ``ipc/`` and ``services/`` holds more than 20 modules, and no
  module is over 400 lines (a newcomer finds the room, and the room is small);
* no import circle, counting imports inside functions and under ``if TYPE_CHECKING:``;
* within ``procsv/trainer/`` and ``procsv/watchdog/``, no circle between rooms either (a room is a
  module or a folder directly inside): every import runs down, none back up to a room that imports
  the importer's (the trainer's collaborators stand on the rooms they use, as the watchdog's do);
* ``procsv/watchdog/rules/`` (the decision function) reaches, through every import it makes and
  theirs, only the standard library's pure modules, procsv's error, exit-code and message-base
  types, and ``rules/`` itself: no clock of its own, no socket, no file;
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
import tomllib
from typing import Iterable, Optional

import pytest

REPO = pathlib.Path(__file__).resolve().parent.parent
# the folders of the repository and the package each installs as (pyproject.toml's package-dir)
ROOTS = {"procsv": "procsv", "ipc": "procsv.ipc", "services": "procsv.services"}
MAX_MODULES = 20
MAX_LINES = 400
RULES = "procsv.watchdog.rules"
# what rules/ may import: standard-library modules that do no I/O of their own (signal: its names
# and numbers only; random: the seeded generator the chaos plan is given), and procsv's vocabulary
RULES_STDLIB = {"__future__", "typing", "dataclasses", "enum", "math", "random", "signal", "collections",
                "functools", "itertools", "abc", "re"}
RULES_PROCSV = {"procsv.common.errors", "procsv.common.exitcodes", "procsv.ipc.message_base"}


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


# --------------------------------------------------------------------------- the repository


def test_no_package_folder_holds_more_than_20_modules_and_no_module_is_over_400_lines():
    crowded, long = [], []
    for folder in ROOTS:
        for d in [REPO / folder, *(p.parent for p in (REPO / folder).rglob("__init__.py"))]:
            mods = [p for p in d.glob("*.py") if p.name != "__init__.py"]
            if len(mods) > MAX_MODULES:
                crowded.append(f"{d.relative_to(REPO)} ({len(mods)})")
    for name, path in modules().items():
        n = len(path.read_text().splitlines())
        if n > MAX_LINES:
            long.append(f"{path.relative_to(REPO)} ({n} lines)")
    assert not crowded, f"folders over {MAX_MODULES} modules: {crowded}"
    assert not long, f"modules over {MAX_LINES} lines: {long}"


@pytest.mark.slow
def test_no_import_circle_anywhere():
    assert cycles(graph(modules())) == []


@pytest.mark.slow
def test_no_room_of_the_trainer_or_the_watchdog_imports_back_up():
    edges = graph(modules())
    assert room_cycles(edges, "procsv.trainer") == []
    assert room_cycles(edges, "procsv.watchdog") == []


@pytest.mark.slow
def test_the_decision_function_reaches_no_io_through_its_imports():
    edges = graph(modules())
    assert any(m.startswith(RULES + ".") for m in edges), "rules/ is where the decision function lives"
    assert impure(edges, RULES, RULES_STDLIB, RULES_PROCSV) == []


@pytest.mark.slow
def test_the_folders_import_in_the_allowed_direction():
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


def test_every_package_folder_is_listed_in_pyproject():
    config = tomllib.loads((REPO / "pyproject.toml").read_text())
    listed = set(config["tool"]["setuptools"]["packages"])
    folders = {name for name, path in modules().items() if path.name == "__init__.py"}
    assert folders - listed == set(), "package folders missing from [tool.setuptools] packages"
    assert listed - folders == set(), "[tool.setuptools] packages names folders that do not exist"


# --------------------------------------------------------------------------- the checks can fail


def _plant(tmp_path: pathlib.Path, files: dict[str, str]) -> dict[str, set[str]]:
    for rel, text in files.items():
        p = tmp_path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return graph(modules(tmp_path, {"procsv": "procsv"}))


def test_a_circle_through_a_function_level_or_type_checking_import_is_found(tmp_path):
    edges = _plant(tmp_path, {
        "procsv/__init__.py": "",
        "procsv/a.py": "def f():\n    from procsv import b\n",
        "procsv/b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from procsv.c import X\n",
        "procsv/c.py": "from procsv.a import f\nclass X: ...\n",
        "procsv/d.py": "from procsv import a\n",  # imports into the circle, not part of it
    })
    assert cycles(edges) == [["procsv.a", "procsv.b", "procsv.c"]]


def test_a_room_that_imports_back_up_is_found_though_no_module_circle_is(tmp_path):
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


def test_a_relative_import_and_a_parent_package_are_read_as_python_reads_them(tmp_path):
    edges = _plant(tmp_path, {
        "procsv/__init__.py": "from procsv.sub import leaf\n",  # the package imports its own module
        "procsv/sub/__init__.py": "",
        "procsv/sub/leaf.py": "from . import other\nfrom ..top import T\n",
        "procsv/sub/other.py": "",
        "procsv/top.py": "T = 1\n",
    })
    assert edges["procsv.sub.leaf"] == {"procsv.sub.other", "procsv.top"}
    assert cycles(edges) == []  # a module's parent package is not an import of it


def test_an_io_import_reached_through_another_module_is_reported(tmp_path):
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
